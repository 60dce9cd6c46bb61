"""What every command group shares: failing with exit code 2, loading checked config files,
and keeping transformers quiet under the CLI's own spinners."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from pydantic import BaseModel

    from marl.config import Check, GameConfig, TeamConfig
    from marl.config.schema import PathProblem
    from marl.config.tournament import TournamentConfig
    from marl.orchestrator.team import Team

M = TypeVar("M", bound="BaseModel")


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit 2 (a usage or input problem)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def game_problems(game: GameConfig, *, tasks: bool) -> tuple[list[PathProblem], int | None]:
    """The game section checked against the registry (the schema cannot import games): its
    name, entry point or source imports, ``kwargs`` fit; the problems, and the number of seats
    when it is a game that builds.  With ``tasks`` a cooperative task's name is fine too: a
    team can answer it in free text."""
    from marl import games
    from marl.games.tasks import make_task, task_names

    problem = games.check_config(game, tasks=tasks)
    if problem is not None:
        return [(("game", problem[0]), problem[1])], None
    is_task = (
        game.entry_point is None
        and game.source == "registry"
        and game.name in task_names()
        and game.name not in games.names()
    )
    build = (
        (lambda: make_task(game.name, 0, **game.kwargs))
        if is_task
        else (lambda: games.make_from_config(game))
    )
    try:
        made = build()
    except Exception as exc:  # noqa: BLE001 - each game checks its own arguments its own way
        return [(("game", "kwargs"), f"{game.name} refuses these arguments: {exc}")], None
    seats = getattr(made, "possible_agents", None)
    return [], None if seats is None else len(seats)


def team_problems(cfg: TeamConfig) -> list[PathProblem]:
    """What a team file needs beyond the schema: a known game or task that takes its
    ``game.kwargs``, and agents that fit the game's seats where the team plays them (self-play
    fills every seat; against bots or a league the team may have fewer agents)."""
    from marl.topologies import TopologyError, build_topology  # the team's graph must build too

    problems, seats = game_problems(cfg.game, tasks=True)
    try:
        build_topology(cfg)
    except TopologyError as exc:
        problems.append((("topology",), str(exc)))
    if seats is None or cfg.rollout_kind() != "game":
        return problems
    agents = sum(r.count for r in cfg.roles)
    league = cfg.train.league.opponents if cfg.train is not None else None
    if agents > seats:
        problems.append(
            (("roles",), f"the team has {agents} agents but {cfg.game.name} has {seats} seats")
        )
    elif league == "self" and agents != seats:
        problems.append(
            (
                ("train",),
                f"self-play puts the team in all {seats} seats of "
                f"{cfg.game.name} but it has {agents} agents; add agents "
                "or set train.league.opponents: league",
            )
        )
    if league == "league" and seats != 2:
        problems.append(
            (
                ("train", "league", "opponents"),
                f"league opponents need a two-seat game; {cfg.game.name} has {seats}",
            )
        )
    return problems


def tournament_problems(cfg: TournamentConfig, base: Path) -> list[PathProblem]:
    """What a tournament file needs beyond the schema: a game that builds with its kwargs,
    then the tournament's own checks (sources exist, seats fit; paths relative to ``base``)."""
    problems, seats = game_problems(cfg.game, tasks=False)
    if problems:
        return problems
    from marl.orchestrator.arena.tournament import (
        source_problems,  # loads the model stack: only here
    )

    return source_problems(cfg, base)


def config_problems(cfg: BaseModel, file: str) -> list[PathProblem]:
    """The checks of whichever root ``cfg`` is (team or tournament) for a file at ``file``."""
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
    from marl.config import TeamConfig

    return load_file(path, TeamConfig, [team_problems])


def load_runtime_team(source: str, seed: int = 0) -> Team:
    """A Team from a team YAML (untrained) or a trained team: an export, a run, RUN/best,
    RUN/latest or a checkpoint."""
    from pathlib import Path

    from marl.agents.models import ModelError
    from marl.infra.layout import checkpoint_folder
    from marl.orchestrator.team import Team, TeamError
    from marl.topologies import TopologyError

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
