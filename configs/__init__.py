"""Configs: the team schema (``marl-teams/v1``), the tournament schema
(``marl-teams/tournament/v1``, :mod:`configs.tournament`), their loader, and example files.

A leaf package (pydantic, yaml and the standard library only) so that every other package can
read configs.  Example team YAML files live next to this module and ship as package data.
"""

from pathlib import Path

from configs.loader import Check, ConfigError, Problem, load_config, load_config_text, validate_file
from configs.schema import (
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

#: The folder holding the example team files shipped with the package.
EXAMPLES_DIR = Path(__file__).parent


def examples() -> list[Path]:
    """The example files (``configs/*.yaml``: teams and tournaments), sorted by name."""
    return sorted(EXAMPLES_DIR.glob("*.yaml"))


__all__ = [
    "EXAMPLES_DIR",
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
    "examples",
    "json_schema",
    "load_config",
    "load_config_text",
    "validate_file",
]
