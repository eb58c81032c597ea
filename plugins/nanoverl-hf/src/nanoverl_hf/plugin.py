"""Hook implementations of nanoverl-hf: lazy "module:attr" strings only."""

from nanoverl_core import hookimpl


@hookimpl
def register_workers(register):
    register("hf", "nanoverl_hf.workers:make_workers",
             description="transformers causal LM policy / reference, token-classification value model")


@hookimpl
def register_rollouts(register):
    register("hf", "nanoverl_hf.rollout:make_rollout", settings="nanoverl_hf.settings:HFRolloutSettings",
             description="batched transformers generate() with KV cache, sharing the actor's weights "
                         "([rollout.hf] share_prompts)")


@hookimpl
def register_rewards(register):
    register("gsm8k", "nanoverl_hf.rewards:gsm8k",
             description="1 if the answer after '####' (else the last number) equals the GSM8K ground truth")
    register("reward_model", "nanoverl_hf.reward_model:reward_model",
             settings="nanoverl_hf.reward_model:RewardModelSettings",
             description="a local sequence-classification model's score of each (prompt, response), batched")
