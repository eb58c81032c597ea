"""The typed config (being split into a package: schema, structuring, component tables, loading)."""

from .schema import *  # noqa: F401,F403
from .schema import COMPONENTS, apply_override, component_settings, config_from_dict, load_config  # noqa: F401
