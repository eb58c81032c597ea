"""nanoverl-vllm: a vLLM rollout engine colocated with the trainer, with in-place weight sync.

Registered name: rollout `vllm`. vLLM itself is imported only when that name is selected (by
`nanoverl_vllm.engine`), so `nanoverl-train plugins` works without it.
"""

__version__ = "0.4.0"

SUPPORTED_VLLM = ">=0.32,<0.33"
"""vLLM releases this plugin is verified against (PEP 440); checked when the rollout is imported."""
