"""[worker.fsdp]: FSDP2 mixed precision (no torch import: checking a config stays fast)."""

import attrs

from nanoverl_core.config import DType, settings_or_defaults


@attrs.define
class FSDPSettings:
    param_dtype: DType = "float32"
    """dtype of parameters in forward / backward (FSDP2 MixedPrecisionPolicy); "bfloat16" on GPU. Or leave it
    at model.dtype and set model.compute_dtype (autocast over the sharded model, as the hf worker does);
    set both only alike."""
    reduce_dtype: DType = "float32"
    """dtype of the gradient reduce-scatter; keep "float32"."""


def check_precision(config) -> None:
    """model.compute_dtype and param_dtype both choose the dtype forward / backward run in: a ConfigError
    when both are set (param_dtype other than model.dtype) and differ."""
    from nanoverl_core import ConfigError

    settings = settings_or_defaults(config.worker.settings, FSDPSettings)
    compute, param = config.model.compute_dtype, settings.param_dtype
    if compute and param != config.model.dtype and param != compute:
        raise ConfigError(f"model.compute_dtype = {compute!r} and worker.fsdp.param_dtype = {param!r} disagree on the "
                          "dtype forward / backward run in; set one of them (param_dtype = model.dtype leaves it to "
                          "compute_dtype), or both alike")
