"""The typed config: `from nanoverl_core.config import Config, load_config, AlgorithmConfig, ...`.

    schema.py      the attrs classes, one per section, a docstring and the real default at every field;
                   the lists of names a key may take (LOSS_AGG_MODES, KL_ESTIMATORS), each written once
    rules.py       cross-field rules, one function per section (`Config.validate` runs them)
    structure.py   strict cattrs structuring and unknown-key checks, each mistake one `error:` line
    components.py  a selected component's own settings table, [<section>.<name>]
    load.py        files and dotted overrides -> a validated Config; the caller passes the plugin registry
"""

from .components import COMPONENTS, component_settings
from .load import apply_override, config_from_dict, load_config
from .schema import (KL_ESTIMATORS, LOSS_AGG_MODES, ActorConfig, AlgorithmConfig, Config, CriticConfig, DataConfig,
                     EnvironmentConfig, KLEstimator, LoraConfig, LossAggMode, ModelConfig, OptimConfig, ReferenceConfig, RewardComponent,
                     RewardConfig, RolloutConfig, RolloutCorrectionConfig, TrackingConfig, TrainerConfig, WorkerConfig)

__all__ = ["COMPONENTS", "KL_ESTIMATORS", "LOSS_AGG_MODES", "ActorConfig", "AlgorithmConfig", "Config", "CriticConfig",
           "DataConfig", "EnvironmentConfig", "KLEstimator", "LoraConfig", "LossAggMode", "ModelConfig", "OptimConfig", "ReferenceConfig",
           "RewardComponent", "RewardConfig", "RolloutConfig", "RolloutCorrectionConfig", "TrackingConfig",
           "TrainerConfig", "WorkerConfig", "apply_override", "component_settings", "config_from_dict", "load_config"]
