"""[rollout.vllm]: the engine's own settings (no vLLM or torch import: checking a config stays fast)."""

import attrs


@attrs.define
class VLLMSettings:
    gpu_memory_utilization: float = attrs.field(default=0.5, validator=[attrs.validators.gt(0),
                                                                         attrs.validators.le(1)])
    """Fraction of accelerator memory the engine may take (weights + KV cache); ignored on CPU."""
