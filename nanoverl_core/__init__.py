"""nanoverl core: RLBatch, typed config, the synchronous trainer, plugin hooks and CPU built-ins.

Names that need torch are imported on first use, so `nanoverl-train plugins` and plugin modules
(which import `hookimpl` from here) stay cheap.
"""

from importlib import import_module

from .config import Config, load_config
from .errors import ConfigError, DataError, PluginError, RewardError, UserError
from .hookspecs import hookimpl
from .plugins import Registry, load_registry

__version__ = "0.1.0"

_LAZY = {"RLBatch": "batch", "SamplingParams": "rollout", "responses_to_batch": "rollout",
         "TorchActor": "workers", "TorchCritic": "workers", "Workers": "workers"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'nanoverl_core' has no attribute {name!r}")


__all__ = ["RLBatch", "Config", "load_config", "hookimpl", "Registry", "load_registry", "SamplingParams",
           "responses_to_batch", "TorchActor", "TorchCritic", "Workers", "UserError", "ConfigError",
           "DataError", "PluginError", "RewardError", "__version__"]
