"""Configs: the team schema (``marl-teams/v1``), the tournament schema
(``marl-teams/tournament/v1``, :mod:`marl.config.tournament`) and their loader.

A leaf package (pydantic, yaml and the standard library only) so that every other package can
read configs.  The recipes (team and tournament YAML files) live in the repository's
``configs/`` folder: data, not code.
"""

from marl.config.loader import (
    Check,
    ConfigError,
    Problem,
    load_config,
    load_config_text,
    validate_file,
)
from marl.config.schema import (
    SCHEMA_ID,
    AdapterConfig,
    DecodingConfig,
    GameConfig,
    RoleConfig,
    TeamConfig,
    TopologyConfig,
    TopologyLearningConfig,
    json_schema,
)

__all__ = [
    "SCHEMA_ID",
    "AdapterConfig",
    "Check",
    "ConfigError",
    "DecodingConfig",
    "GameConfig",
    "Problem",
    "RoleConfig",
    "TeamConfig",
    "TopologyConfig",
    "TopologyLearningConfig",
    "json_schema",
    "load_config",
    "load_config_text",
    "validate_file",
]
