"""``marl play``: a team plays its game against itself, a bot, a checkpoint or a person."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.common import fail, load_team, quiet_transformers
from cli.errors import writing


def play_cmd(
    config: Annotated[str, typer.Argument(help="Team YAML file.")],
    game: Annotated[str | None, typer.Option(help="Game (default: the config's).")] = None,
    episodes: Annotated[int, typer.Option(min=1, help="Games to play.")] = 10,
    against: Annotated[str | None, typer.Option(
        help="Opponent: a bot name (random, heuristic, optimal) or a checkpoint/adapter "
             "folder. Default: self-play.")] = None,
    human: Annotated[bool, typer.Option("--human", help="You play the other seat.")] = False,
    seed: Annotated[int, typer.Option(help="First episode seed.")] = 0,
    concurrency: Annotated[int, typer.Option(min=1, help="Games played at once.")] = 16,
    out: Annotated[str, typer.Option(help="Transcripts JSONL.")] = "transcripts.jsonl",
    mode: Annotated[str | None, typer.Option(
        help="Decoding mode of every hf/vllm role: free or choice (default: each role's)."
    )] = None,
    temperature: Annotated[float | None, typer.Option(
        min=0.0, help="Sampling temperature of every hf/vllm role, 0 = greedy (default: each "
        "role's; a choice-mode temperature is often too hot for free text).")] = None,
) -> None:
    """Play the team's game and print wins/draws/losses per seat and the parse-error rate."""
    quiet_transformers()
    from pathlib import Path

    from rich.console import Console
    from rich.progress import Progress

    import games
    from agents import Agent
    from agents.builder import build_roster
    from agents.models import ModelError
    from agents.scripted import HumanPolicy
    from orchestrator.participants import ParticipantLoader
    from orchestrator.play import play, report_table

    cfg = load_team(config)
    if game is not None:
        problem = games.check_name(game)
        if problem is not None:
            fail(problem)
        cfg = cfg.with_game(game)
    if mode is not None and mode not in ("free", "choice"):
        fail(f"--mode must be free or choice, got {mode!r}")
    cfg = cfg.with_decoding(mode=mode, temperature=temperature)
    try:
        n_seats = len(games.make_from_config(cfg.game).possible_agents)
    except (TypeError, ValueError) as exc:
        fail(f"{config}: game.kwargs {cfg.game.kwargs} do not fit {cfg.game.name}: {exc}")
    n_agents = sum(r.count for r in cfg.roles)
    if against is None and not human and n_agents < n_seats:
        anchors = cfg.train.league.anchors if cfg.train is not None else []
        if not anchors:
            fail(f"{config}: {n_agents} agent(s) for the {n_seats} seats of "
                 f"{cfg.game.name}: pass --against (a bot or a checkpoint) or --human")
        against = anchors[0]
        typer.echo(f"playing against {against} (the config's first league anchor; "
                   "--against to choose)", err=True)
    console = Console()
    try:
        with console.status(f"Loading team {cfg.name}..."):
            roster = build_roster(cfg, seed=seed)
            opponents = None
            if human:
                opponents = [Agent("human", "human", HumanPolicy(), mode="free")]
                concurrency = 1
            elif against is not None:
                loader = ParticipantLoader(cfg.game.name, seed=seed + 1, hosts=roster.hosts)
                opponents = [loader.load(against)]
    except (ModelError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    if opponents:
        opponents = opponents * (n_seats - 1)
    with (writing(out, partial=Path(out)),
          Progress(console=console, transient=True, disable=human) as bar):
        task = bar.add_task(f"{cfg.game.name}", total=episodes)
        report = play(roster, cfg.game, None, episodes, opponents, seed=seed,
                      concurrency=concurrency, transcripts=Path(out),
                      on_episode=lambda ep: bar.advance(task))
    console.print(report_table(report, title=f"{cfg.name} on {cfg.game.name}"))
    console.print(f"transcripts: {out}")


def register(app: typer.Typer) -> None:
    app.command("play")(play_cmd)
