"""The typed config: `from nanoverl_core.config import Config, load_config, AlgorithmConfig, ...`.

    schema.py      the attrs classes, one per section, a docstring and the real default at every field;
                   the lists of names a key may take (LOSS_AGG_MODES, KL_ESTIMATORS, CORRECTION_LEVELS,
                   RS_KL_OPTIONS), each written once
    domains.py     value domains declared at the field (at_least, above, between, finite; the path kinds
                   folder and python_file): the check and its error line in one declaration
    rules.py       cross-field rules, one function per section (`Config.validate` runs them)
    structure.py   strict cattrs structuring and unknown-key checks, each mistake one `error:` line;
                   MOVED_KEYS, the keys that moved into a component's table
    components.py  a selected component's own settings table, [<section>.<name>]; settings_or_defaults
    load.py        files and dotted overrides -> a validated Config; the caller passes the plugin registry
"""

from .components import COMPONENTS, component_settings, settings_or_defaults
from .domains import (Number, OutOfDomain, PathKind, above, at_least, between, data_files, finite, folder, model_source,
                      python_file)
from .load import apply_override, config_from_dict, load_config
from .schema import (CORRECTION_LEVELS, KL_ESTIMATORS, LOSS_AGG_MODES, RS_KL_OPTIONS, ActorConfig, AlgorithmConfig,
                     Config, CriticConfig, DataConfig, DType, EnvironmentConfig, KLEstimator, LoraConfig, LossAggMode,
                     ModelConfig, OptimConfig, ReferenceConfig, RewardComponent, RewardConfig, RolloutConfig,
                     RolloutCorrectionConfig, TeacherConfig, TrackingConfig, TrainerConfig, WorkerConfig)
from .structure import MOVED_KEYS, drop_moved_keys

__all__ = ["COMPONENTS", "CORRECTION_LEVELS", "KL_ESTIMATORS", "LOSS_AGG_MODES", "MOVED_KEYS", "RS_KL_OPTIONS",
           "ActorConfig", "AlgorithmConfig", "Config", "CriticConfig", "DType", "DataConfig", "EnvironmentConfig",
           "KLEstimator", "LoraConfig", "LossAggMode", "ModelConfig", "OptimConfig", "ReferenceConfig", "RewardComponent",
           "RewardConfig", "RolloutConfig", "RolloutCorrectionConfig", "TeacherConfig", "TrackingConfig", "TrainerConfig",
           "WorkerConfig", "Number", "OutOfDomain", "PathKind", "above", "at_least", "between", "finite", "folder", "python_file",
           "data_files", "model_source",
           "apply_override", "component_settings", "config_from_dict", "drop_moved_keys",
           "load_config", "settings_or_defaults"]
