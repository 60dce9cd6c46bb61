"""What every command group shares: failing with exit code 2, loading checked config files,
and keeping transformers quiet under the CLI's own spinners."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from pydantic import BaseModel

    from marl.config import Check, TeamConfig
    from marl.config.schema import PathProblem
    from marl.config.tournament import TournamentConfig
    from marl.orchestrator.team import Team

M = TypeVar("M", bound="BaseModel")


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit 2 (a usage or input problem)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def tournament_problems(cfg: TournamentConfig, base: Path) -> list[PathProblem]:
    """What a tournament file needs beyond the schema: a game that builds with its kwargs,
    then the tournament's own checks (sources exist, seats fit; paths relative to ``base``)."""
    from marl.agents.checks import game_problems

    problems, _ = game_problems(cfg.game, tasks=False)
    if problems:
        return problems
    from marl.orchestrator.arena.tournament import (
        source_problems,  # loads the model stack: only here
    )

    return source_problems(cfg, base)


def config_problems(cfg: BaseModel, file: str) -> list[PathProblem]:
    """The checks of whichever root ``cfg`` is (team or tournament) for a file at ``file``."""
    from marl.agents.checks import team_problems
    from marl.config.tournament import TournamentConfig

    if isinstance(cfg, TournamentConfig):
        return tournament_problems(cfg, Path(file).resolve().parent)
    return team_problems(cfg)  # type: ignore[arg-type]


def load_file(path: str, model: type[M], checks: Sequence[Check]) -> M:
    """Load ``path`` as ``model`` with extra ``checks``, or print its problems and exit 2."""
    from marl.config import ConfigError, load_config

    try:
        return load_config(path, model, checks=checks)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


def load_team(path: str) -> TeamConfig:
    """Load a team file, its game and seats checked too, or print its problems and exit 2."""
    from marl.agents.checks import team_problems
    from marl.config import TeamConfig

    return load_file(path, TeamConfig, [team_problems])


def load_runtime_team(source: str, seed: int = 0) -> Team:
    """A Team from a team YAML (untrained) or a trained team: an export, a run, RUN/best,
    RUN/latest or a checkpoint."""
    from pathlib import Path

    from marl.agents.models import ModelError
    from marl.infra.layout import checkpoint_folder, why_missing
    from marl.orchestrator.team import Team, TeamError
    from marl.topologies import TopologyError

    if not Path(source).exists():  # before any model loads
        fail(why_missing(source))
    try:
        if Path(source).is_file() and checkpoint_folder(source) == Path(source):  # not RUN/best
            return Team.from_config(load_team(source), seed=seed)
        return Team.load(source, seed=seed)
    except (ModelError, FileNotFoundError, TeamError, TopologyError) as exc:
        fail(str(exc))


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
