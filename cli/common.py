"""What every command group shares: failing with exit code 2, loading checked config files,
and keeping transformers quiet under the CLI's own spinners."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from pydantic import BaseModel

    from configs import Check, TeamConfig
    from configs.schema import PathProblem
    from configs.tournament import TournamentConfig

M = TypeVar("M", bound="BaseModel")


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit 2 (a usage or input problem)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def game_name_problems(cfg: TeamConfig | TournamentConfig) -> list[PathProblem]:
    """A file's ``game.name`` checked against the registry (the schema cannot import games);
    a cooperative task's name is fine too: a team can answer it in free text."""
    import games

    problem = games.check_name(cfg.game.name, tasks=True)
    return [] if problem is None else [(("game", "name"), problem)]


def load_file(path: str, model: type[M], checks: Sequence[Check]) -> M:
    """Load ``path`` as ``model`` with extra ``checks``, or print its problems and exit 2."""
    from configs import ConfigError, load_config

    try:
        return load_config(path, model, checks=checks)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


def load_team(path: str) -> TeamConfig:
    """Load a team file, its game name checked too, or print its problems and exit 2."""
    from configs import TeamConfig

    return load_file(path, TeamConfig, [game_name_problems])


def quiet_transformers() -> None:
    """Silence transformers' progress bars and info logs; the CLI shows its own spinner."""
    import os
    import warnings

    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF loader uses bare tqdm; read at import
    warnings.filterwarnings("ignore", module="transformers")
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    hub_logging.set_verbosity_error()  # its per-retry warnings when the hub is unreachable
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
