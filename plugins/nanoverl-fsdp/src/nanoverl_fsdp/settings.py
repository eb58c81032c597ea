"""[worker.fsdp]: FSDP2 mixed precision (no torch import: checking a config stays fast)."""

import attrs

from nanoverl_core.config import DType


@attrs.define
class FSDPSettings:
    param_dtype: DType = "float32"
    """dtype of parameters in forward / backward (FSDP2 MixedPrecisionPolicy); "bfloat16" on GPU."""
    reduce_dtype: DType = "float32"
    """dtype of the gradient reduce-scatter; keep "float32"."""
