"""Hook implementations of nanoverl-vllm: lazy "module:attr" strings only (vLLM is imported on selection)."""

from nanoverl_core import hookimpl


@hookimpl
def register_rollouts(register):
    register("vllm", "nanoverl_vllm.rollout:make_rollout", settings="nanoverl_vllm.settings:VLLMSettings",
             description="offline vLLM engine in the trainer's process; weights synced in place after each update")
