"""``marl games list``: every game a config can name, with what a team file needs to know."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from marl.cli.common import fail

games_app = typer.Typer(no_args_is_help=True, help="The games a team can play.")


def _kwargs(factory: Any, fixed: dict[str, Any]) -> str:
    """``name=default`` for each keyword argument (``name`` alone when it has none)."""
    import inspect

    from marl.games.registry import parameters

    params, open_ended = parameters(factory)
    shown = {**{n: p.default for n, p in params.items()}, **fixed}
    parts = [n if v is inspect.Parameter.empty else f"{n}={v!r}" for n, v in shown.items()]
    return ", ".join([*parts, *(["..."] if open_ended else [])])


def _row(game: Any, source: str, fixed: dict[str, Any] | None = None) -> list[str]:
    """name, source, seats, kind, kwargs, exact evaluation for a game section."""
    from marl import games
    from marl.games.tasks import CooperativeGame, task_names

    env = games.make_from_config(game)
    if isinstance(env, CooperativeGame):
        kind = "cooperative"
        if game.source == "registry" and game.name in task_names():
            kind += " (also a team task)"
    else:
        kind = "competitive" if env.zero_sum else "general-sum"
    exact = "yes" if hasattr(env, "root_state") else "no"
    return [
        game.name,
        source,
        str(len(env.possible_agents)),
        kind,
        _kwargs(games.registry.factory_of(game), fixed or {}),
        exact,
    ]


@games_app.command("list")
def games_list_cmd(
    entry_point: Annotated[
        list[str] | None,
        typer.Option("--entry-point", help="Also show an own env factory, 'pkg.module:factory'."),
    ] = None,
) -> None:
    """Show every game: seats, competitive or cooperative, keyword arguments with their
    defaults, and whether an exact evaluation (exploitability) exists."""
    from rich.console import Console
    from rich.table import Table

    from marl import games
    from marl.agents.checks import game_problems
    from marl.config import GameConfig
    from marl.games import textarena
    from marl.games.registry import installed_plugins
    from marl.games.tasks import task_names

    table = Table(title="marl-teams games")
    for column in ("name", "source", "seats", "kind", "kwargs (defaults)", "exact eval"):
        table.add_column(column, overflow="fold")
    plugins = installed_plugins()
    for name in games.names():
        source = f"plugin {plugins[name].value}" if name in plugins else "registry"
        table.add_row(*_row(GameConfig(name=name), source))
    for name in sorted(set(task_names()) - set(games.names())):
        table.add_row(name, "registry", "team", "cooperative task (free text)", "", "no")
    try:
        for name in textarena.names():
            table.add_row(
                *_row(
                    GameConfig(name=name, source="textarena"),
                    "textarena",
                    textarena.default_kwargs(name),
                )
            )
    except ImportError as exc:
        table.add_row("(TextArena)", "textarena", "", "", str(exc), "")
    for spec in entry_point or []:
        game = GameConfig(entry_point=spec)
        problems, _ = game_problems(game, tasks=False)  # imports, builds, plays one game
        if problems:
            fail(f"--entry-point {spec}: {problems[0][1]}")
        table.add_row(*_row(game, "entry_point"))
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(games_app, name="games")
