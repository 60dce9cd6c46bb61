"""``marl games list``: every game a config can name, with what a team file needs to know:
seats, kind, keyword arguments, the game's bots and the exact evaluations it has."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from marl.cli import output
from marl.cli.common import fail
from marl.cli.output import Json

games_app = typer.Typer(no_args_is_help=True, help="The games a team can play.")

#: The exact evaluations of ``marl eval``, each with what a game needs for it: an exact tree
#: (exploitability of a policy), or perfect information (exact outcomes against a bot with
#: fixed action probabilities).
EXACT_EVALS: dict[str, Callable[[Any], bool]] = {
    "exploitability": lambda env: hasattr(env, "root_state"),
    "outcomes vs bots": lambda env: getattr(env, "perfect_information", False),
}


def _arguments(factory: Any, fixed: dict[str, Any]) -> dict[str, Any]:
    """The factory's keyword arguments: ``kwargs`` (name -> default), ``required`` (the ones
    without a default) and ``open_ended`` (it takes ``**kwargs``)."""
    import inspect

    from marl.games.registry import parameters

    params, open_ended = parameters(factory)
    shown = {**{n: p.default for n, p in params.items()}, **fixed}
    return {
        "kwargs": {n: v for n, v in shown.items() if v is not inspect.Parameter.empty},
        "required": [n for n, v in shown.items() if v is inspect.Parameter.empty],
        "open_ended": open_ended,
    }


def _entry(game: Any, source: str, fixed: dict[str, Any] | None = None) -> dict[str, Any]:
    """One game's listing: name, source, seats, kind, bots, exact evaluations, kwargs."""
    from marl import games
    from marl.games.bots import bot_names
    from marl.games.tasks import CooperativeGame, task_names

    env = games.make_from_config(game)
    if isinstance(env, CooperativeGame):
        kind = "cooperative"
        if game.source == "registry" and game.name in task_names():
            kind += " (also a team task)"
    else:
        kind = "competitive" if env.zero_sum else "general-sum"
    return {
        "name": game.name,
        "source": source,
        "seats": len(env.possible_agents),
        "kind": kind,
        "bots": bot_names(game.name),
        "exact": [name for name, has in EXACT_EVALS.items() if has(env)],
        **_arguments(games.registry.factory_of(game), fixed or {}),
    }


def _entry_point(spec: str) -> dict[str, Any]:
    """The listing of an own env factory, or one ``error:`` line (exit 2) when it does not
    import, refuses its arguments or builds no env."""
    from marl.agents.checks import game_problems
    from marl.config import GameConfig

    game = GameConfig(entry_point=spec)
    problems, _ = game_problems(game, tasks=False)  # imports, builds, plays one game
    if problems:
        fail(f"--entry-point {spec}: {problems[0][1]}")
    try:
        return _entry(game, "entry_point")
    except Exception as exc:  # noqa: BLE001 - a user's factory fails its own way
        fail(f"--entry-point {spec}: the factory fails: {type(exc).__name__}: {exc}")


def _listing(entry_point: list[str]) -> list[dict[str, Any]]:
    """Every registered game and plugin, the team tasks, TextArena's games (or why not) and
    the ``--entry-point`` factories; the factories are checked first."""
    from marl import games
    from marl.config import GameConfig
    from marl.games import textarena
    from marl.games.registry import installed_plugins
    from marl.games.tasks import task_names

    own = [_entry_point(spec) for spec in entry_point]
    plugins = installed_plugins()
    rows = [
        _entry(GameConfig(name=n), f"plugin {plugins[n].value}" if n in plugins else "registry")
        for n in games.names()
    ]
    for name in sorted(set(task_names()) - set(games.names())):
        rows.append(
            {"name": name, "source": "registry", "seats": "team"}
            | {"kind": "cooperative task (free text)", "bots": [], "exact": []}
            | {"kwargs": {}, "required": [], "open_ended": False}
        )
    try:
        for name in textarena.names():
            game = GameConfig(name=name, source="textarena")
            rows.append(_entry(game, "textarena", textarena.default_kwargs(name)))
    except ImportError as exc:
        rows.append({"name": "(TextArena)", "source": "textarena", "unavailable": str(exc)})
    return rows + own


def _cells(row: dict[str, Any]) -> list[str]:
    if "unavailable" in row:
        return [row["name"], row["source"], "", "", "", "", row["unavailable"]]
    kwargs = ", ".join(
        [*row["required"], *(f"{k}={v!r}" for k, v in row["kwargs"].items())]
        + (["..."] if row["open_ended"] else [])
    )
    return [
        row["name"],
        row["source"],
        str(row["seats"]),
        row["kind"],
        ", ".join(row["bots"]) or "-",
        ", ".join(row["exact"]) or "-",
        kwargs,
    ]


@games_app.command("list")
def games_list_cmd(
    entry_point: Annotated[
        list[str] | None,
        typer.Option("--entry-point", help="Also show an own env factory, 'pkg.module:factory'."),
    ] = None,
    json_out: Json = False,
) -> None:
    """Show every game: seats, competitive or cooperative, its bots, its exact evaluations
    (exploitability: `marl eval exploitability`; outcomes vs bots: `marl eval against`) and
    its keyword arguments with their defaults."""
    rows = _listing(entry_point or [])
    if json_out:
        output.emit(rows)
        return
    columns = ("name", "source", "seats", "kind", "bots", "exact eval", "kwargs (defaults)")
    shown = output.table("marl-teams games", dict.fromkeys(columns, "left"))
    for row in rows:
        shown.add_row(*_cells(row))
    output.show(output.console(), shown)


def register(app: typer.Typer) -> None:
    app.add_typer(games_app, name="games")
