"""The rules of a team file that need its game built: the one place ``marl validate``, the
commands that load a team and the trainer check them, each as ``(path, message)`` problems.

The rules that need only the file are the config's own (:mod:`marl.config.rules`); the ones
that need the models loaded are the builder's (:func:`marl.agents.builder.build_roster`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from marl import games
from marl.config import GameConfig, TeamConfig
from marl.config.schema import PathProblem
from marl.games.analysis import tree_games
from marl.games.bots import bot_names
from marl.games.external import UnsupportedEnv
from marl.games.guard import GameError, trial
from marl.games.tasks import make_task, task_names
from marl.infra.seats import UNTRAINED
from marl.topologies import TopologyError, build_topology

#: A rule on a team and the seats (agent names) its game or task gives it.
SeatRule = Callable[[TeamConfig, list[str]], list[PathProblem]]


def is_task(game: GameConfig) -> bool:
    """A cooperative task of :mod:`marl.games.tasks` (not a game of the same name)."""
    return (
        game.entry_point is None
        and game.source == "registry"
        and game.name in task_names()
        and game.name not in games.names()
    )


def foreign(game: GameConfig) -> bool:
    """A game the project did not write: an entry point, a plugin or a TextArena game."""
    return (
        game.entry_point is not None
        or game.source != "registry"
        or game.name in games.registry.installed_plugins()
    )


def game_problems(game: GameConfig, *, tasks: bool) -> tuple[list[PathProblem], Any]:
    """The game section checked against the registry (the schema cannot import games): its
    name, entry point or source imports, ``kwargs`` fit, and a game the project did not write
    plays one random game (:func:`~marl.games.guard.trial`); the problems, and the game (or
    task) built when it builds.  With ``tasks`` a cooperative task's name is fine too: a team
    can answer it in free text."""
    problem = games.check_config(game, tasks=tasks)
    if problem is not None:
        return [(("game", problem[0]), problem[1])], None
    build = (
        (lambda: make_task(game.name, 0, **game.kwargs))
        if is_task(game)
        else (lambda: games.make_from_config(game))
    )
    field = "entry_point" if game.entry_point is not None else "name"
    try:
        made = build()
    except (GameError, UnsupportedEnv) as exc:
        return [(("game", field), str(exc))], None
    except Exception as exc:  # noqa: BLE001 - each game checks its own arguments its own way
        return [(("game", "kwargs"), f"{game.name} refuses these arguments: {exc}")], None
    try:
        if foreign(game):
            trial(games.make_from_config(game))
    except (GameError, UnsupportedEnv) as exc:
        return [(("game", field), str(exc))], None
    except Exception as exc:  # noqa: BLE001 - whatever a random game of it meets
        return [
            (("game", field), f"{game.name} fails when played: {type(exc).__name__}: {exc}")
        ], None
    return [], made


def task_seats(cfg: TeamConfig) -> list[PathProblem]:
    """A team-task run: a cooperative task, whose private views the team's agents all take."""
    if cfg.game.name not in task_names():
        return [
            (
                ("game", "name"),
                f"train.rollout team needs a cooperative task; {cfg.game.name!r} is none of "
                f"{', '.join(task_names())}",
            )
        ]
    try:
        views = make_task(cfg.game.name, 0, **cfg.game.kwargs).private_views
    except (TypeError, ValueError) as exc:
        return [(("game", "kwargs"), f"{cfg.game.name} refuses these arguments: {exc}")]
    agents = sum(r.count for r in cfg.roles)
    if len(views) <= agents:
        return []
    return [
        (
            ("roles",),
            f"the task has {len(views)} private views ({', '.join(views)}) but the team runs "
            f"only {agents} agents; use a task with fewer agents or a bigger team",
        )
    ]


def game_seats(cfg: TeamConfig, seats: list[str]) -> list[PathProblem]:
    """Agents fit the game's seats where the team plays them (self-play fills every seat;
    against bots or a league the team may have fewer agents)."""
    agents = sum(r.count for r in cfg.roles)
    league = cfg.train.league.opponents if cfg.train is not None else None
    problems: list[PathProblem] = []
    if agents > len(seats):
        problems.append(
            (("roles",), f"the team has {agents} agents but {cfg.game.name} has {len(seats)} seats")
        )
    elif league == "self" and agents != len(seats):
        problems.append(
            (
                ("train",),
                f"self-play puts the team in all {len(seats)} seats of {cfg.game.name} but it "
                f"has {agents} agents; add agents or set train.league.opponents: league",
            )
        )
    if league == "league" and len(seats) != 2:
        problems.append(
            (
                ("train", "league", "opponents"),
                f"league opponents need a two-seat game; {cfg.game.name} has {len(seats)}",
            )
        )
    return problems


def reward_scales_name_seats(cfg: TeamConfig, seats: list[str]) -> list[PathProblem]:
    assert cfg.train is not None
    unknown = sorted(set(cfg.train.reward_scales) - set(seats))
    if not unknown:
        return []
    return [
        (
            ("train", "reward_scales"),
            f"train.reward_scales names {unknown}; the seats of {cfg.game.name} are "
            f"{', '.join(seats)}",
        )
    ]


def bots_exist(cfg: TeamConfig, seats: list[str]) -> list[PathProblem]:
    """League anchors and the branches' players are bots of the game (anchors: or folders, or
    the untrained self)."""
    assert cfg.train is not None
    bots = bot_names(cfg.game.name)
    problems: list[PathProblem] = [
        (
            ("train", "league", "anchors", i),
            f"league anchor {a!r} is neither a bot of {cfg.game.name} ({', '.join(bots)}) "
            f"nor a folder nor {UNTRAINED}",
        )
        for i, a in enumerate(cfg.train.league.anchors)
        if a not in bots and a != UNTRAINED and not Path(a).is_dir()
    ]
    if cfg.train.branch_rollout not in ("policy", *bots):
        problems.append(
            (
                ("train", "branch_rollout"),
                f"train.branch_rollout {cfg.train.branch_rollout!r} is neither policy nor a "
                f"bot of {cfg.game.name} ({', '.join(bots)})",
            )
        )
    return problems


def states_need_a_tree(cfg: TeamConfig, seats: list[str]) -> list[PathProblem]:
    """A states rollout visits the information states of the game's exact tree."""
    assert cfg.train is not None
    if cfg.train.rollout != "states" or hasattr(games.make(cfg.game.name), "root_state"):
        return []
    return [
        (
            ("train", "rollout"),
            f"train.rollout states visits every information state of an exact game tree; "
            f"{cfg.game.name} has none (games that do: {', '.join(tree_games())})",
        )
    ]


def scripted_bots_exist(cfg: TeamConfig) -> list[PathProblem]:
    """A role of backend scripted names a bot of the game in ``model``."""
    bots = bot_names(cfg.game.name)
    return [
        (
            ("roles", i, "model"),
            f"role {role.name!r} is scripted but {cfg.game.name} has no bot {role.model!r}; "
            f"its bots: {', '.join(bots)}",
        )
        for i, role in enumerate(cfg.roles)
        if role.backend == "scripted" and role.model not in bots
    ]


#: The rules of a train section against the seats of its game (a team task: its agents).
TRAIN_RULES: tuple[SeatRule, ...] = (reward_scales_name_seats, bots_exist, states_need_a_tree)


def team_problems(cfg: TeamConfig) -> list[PathProblem]:
    """What a team file needs of its game: a known game or task that takes its
    ``game.kwargs``, scripted roles that name its bots, a topology that builds, agents that
    fit the seats, and a train section whose names (seats, bots) the game has."""
    problems, made = game_problems(cfg.game, tasks=True)
    problems += scripted_bots_exist(cfg)
    try:
        build_topology(cfg)
    except TopologyError as exc:
        problems.append((("topology",), str(exc)))
    if made is None:
        return problems
    if cfg.rollout_kind() == "team":
        if cfg.train is None:
            return problems  # the team runtime answers it
        problems += task_seats(cfg)
        seats = [a for r in cfg.roles for a in r.instance_names()]
    elif hasattr(made, "possible_agents"):
        seats = list(made.possible_agents)
        problems += game_seats(cfg, seats)
    elif cfg.train is not None:  # a task, and the team is to train in seats it has not
        return [*problems, (("game", "name"), str(games.check_name(cfg.game.name)))]
    else:
        return problems  # a task played outside training: the team runtime answers it
    if cfg.train is not None:
        problems += [p for rule in TRAIN_RULES for p in rule(cfg, seats)]
    return problems
