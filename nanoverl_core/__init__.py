"""nanoverl core: RLBatch, typed config, the synchronous trainer, plugin hooks and CPU built-ins.

Names that need torch are imported on first use, so `nanoverl-train plugins` and plugin modules
(which import `hookimpl` from here) stay cheap.

Public modules, the only ones a plugin imports (tests/test_layout.py holds every plugin to this list):

    nanoverl_core             hookimpl, RLBatch, Config, load_config, load_registry, TorchActor, the errors
    nanoverl_core.agents      agents on an OpenAI client: AgentRollout, the endpoint, Transcript (merging calls)
    nanoverl_core.algos       RL math: masked reductions, KL, losses, advantages, groups
    nanoverl_core.batch       RLBatch, the dict of tensors every stage passes on
    nanoverl_core.config      the typed config classes, load_config
    nanoverl_core.data        prompt loading and collation
    nanoverl_core.dist        ranks, RNG forks, process groups, the rollout split across ranks
    nanoverl_core.env         multi-turn episodes: EnvStep, Turn, tool_environment, EpisodeRollout
    nanoverl_core.errors      one error type per kind of user mistake
    nanoverl_core.hookspecs   the hooks a plugin implements and the rules every backend follows
    nanoverl_core.plugins     Registry, load_registry
    nanoverl_core.protocols   the Actor / Critic / Rollout / Tracker protocols
    nanoverl_core.reward      the reward runtime: scoring (RewardScorer), call conventions, the worker pool
    nanoverl_core.rollout     SamplingParams, responses_to_batch, stop ids, per-row seeds
    nanoverl_core.testing     contract checks for a new backend
    nanoverl_core.workers     TorchActor / TorchCritic (the PPO mechanics), the strategies they are composed
                              of (DataParallel, Weights; SingleProcess, FullWeights), the ForwardPass a
                              micro-batch reaches the model through, and through the package's names its
                              prompt KV sharing, LM-head chunking, autocast and checkpoint I/O

The trainer (`nanoverl_core.trainer`), the CLI and the built-ins are the core's own.
"""

from importlib import import_module

from .config import Config, load_config
from .errors import ConfigError, DataError, PluginError, RewardError, RolloutError, UserError
from .hookspecs import hookimpl
from .plugins import Registry, load_registry

__version__ = "0.4.0"

_LAZY = {"RLBatch": "batch", "SamplingParams": "rollout", "responses_to_batch": "rollout",
         "TorchActor": "workers", "TorchCritic": "workers", "Workers": "protocols"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'nanoverl_core' has no attribute {name!r}")


__all__ = ["RLBatch", "Config", "load_config", "hookimpl", "Registry", "load_registry", "SamplingParams",
           "responses_to_batch", "TorchActor", "TorchCritic", "Workers", "UserError", "ConfigError",
           "DataError", "PluginError", "RewardError", "RolloutError", "__version__"]
