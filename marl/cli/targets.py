"""What a command's target names, checked before any model loads: a bot of the game, a team
file, or a trained team (a run, ``RUN/best``, ``RUN/latest``, a checkpoint, an exported team,
a run's ``population.json``), and the game a trained team or team file carries with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from marl.cli.common import fail, load_file

if TYPE_CHECKING:
    from marl.config import GameConfig


def carried_game(target: str) -> tuple[GameConfig, Path] | None:
    """The game ``target`` was made for, with its arguments, and the file that says so (a team
    file, a folder's ``team.yaml``, a ``population.json``); None for a name that is no
    existing path."""
    from marl.config import GameConfig, TeamConfig
    from marl.infra.layout import POPULATION_FILE, TEAM_FILE, LayoutError, checkpoint_folder

    path = Path(target)
    if not path.exists():
        return None
    if path.is_file() and path.name == POPULATION_FILE:
        try:
            return GameConfig(name=json.loads(path.read_text(encoding="utf-8"))["game"]), path
        except (ValueError, KeyError, TypeError):
            fail(f"{path}: not a population file written by `marl eval population`")
    try:
        folder = checkpoint_folder(path)
    except LayoutError as exc:
        fail(str(exc))
    file = path if folder == path and path.is_file() else folder / TEAM_FILE
    if not file.is_file():
        fail(f"{target}: neither a team file nor a run, checkpoint or exported team folder")
    return load_file(str(file), TeamConfig, []).game, file


def target_game(target: str, given: str | None, default: str) -> GameConfig:
    """The game to evaluate ``target`` on: the one a trained team carries, with its arguments
    (a ``--game`` that contradicts it is refused: the policy was trained for that game), else
    ``--game``, else a team file's game, else ``default``."""
    from marl.config import GameConfig
    from marl.infra.layout import POPULATION_FILE

    carried = carried_game(target)
    path = Path(target)
    team_file = carried is not None and carried[1] == path and path.name != POPULATION_FILE
    if carried is None or given is not None and team_file:
        return GameConfig(name=default if given is None else given)
    game, file = carried
    if given is not None and given != game.name:
        fail(
            f"--game {given} contradicts {target}, which plays {game.name} ({file}); "
            "leave --game out to evaluate it on its own game"
        )
    return game


def check_target(target: str, game: str) -> None:
    """Exit 2 unless ``target`` is a bot of ``game`` or an existing path (say what a missing
    one lacks, e.g. a run's ``best`` before any exploitability was measured)."""
    from marl.agents.participants import bot_name
    from marl.games.bots import bot_names
    from marl.infra.layout import has_history, why_missing

    path = Path(target)
    if bot_name(target, game) is not None or path.exists():
        return
    if has_history(path.parent):
        fail(why_missing(path))
    fail(
        f"{target!r} is neither a bot of {game} ({', '.join(bot_names(game))}) "
        "nor an existing team file, run, checkpoint or exported team folder"
    )


def check_folder(target: str) -> None:
    """Exit 2 unless ``target`` (a run, ``RUN/best``, a checkpoint or an export) exists."""
    from marl.infra.layout import why_missing

    if not Path(target).exists():
        fail(why_missing(target))


def check_think_target(target: str, game: str, option: str) -> None:
    """Exit 2 unless ``target`` seats a policy that writes a reasoning before its move (the
    role a participant is seated as decodes ``think`` with ``think_tokens > 0`` on the hf
    backend): what ``option`` needs.  Reads the team file only; no model loads."""
    from marl.agents.participants import bot_name, participant_role
    from marl.config import TeamConfig
    from marl.infra.layout import POPULATION_FILE

    need = f"{option} needs a think-mode policy (decoding.mode: think, think_tokens > 0)"
    if bot_name(target, game) is not None:
        fail(f"{need}; {target} is a bot of {game}")
    carried = carried_game(target)
    if carried is None:
        fail(f"{need}; {target} is no team file, run, checkpoint or exported team folder")
    if carried[1].name == POPULATION_FILE:
        fail(f"{need}; {target} is a mixture of snapshots")
    role = participant_role(load_file(str(carried[1]), TeamConfig, []))
    decoding = role.decoding
    if role.backend != "hf" or decoding.mode != "think" or decoding.think_tokens == 0:
        fail(
            f"{need}; {target} seats role {role.name!r}, which decodes in {decoding.mode} mode "
            f"(think_tokens {decoding.think_tokens}, backend {role.backend})"
        )
