"""``marl tournament``: play (or resume) a tournament, rate it, write its report."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from marl.cli import output
from marl.cli.common import fail, load_file, quiet_transformers
from marl.cli.errors import writing
from marl.cli.output import Json


def tournament_cmd(
    config: Annotated[
        str, typer.Argument(help="Tournament YAML file (schema marl-teams/tournament/v1).")
    ],
    out: Annotated[
        str,
        typer.Option(
            "--out",
            help="Folder for matches.jsonl and the report; rerun with the same folder to resume.",
        ),
    ] = "runs/tournament",
    json_out: Json = False,
) -> None:
    """Play a tournament, resuming from OUT/matches.jsonl, then rate it: ratings.csv,
    payoff.csv and report.html (with PNG charts) in OUT, the rating table on screen."""
    quiet_transformers()
    from pathlib import Path

    from rich.progress import MofNCompleteColumn, Progress

    from marl.agents.models import ModelError
    from marl.config.tournament import TournamentConfig
    from marl.infra.actors import RayStartError
    from marl.orchestrator.arena.report import ratings_table, write_report
    from marl.orchestrator.arena.tournament import Tournament, TournamentError, source_problems

    base = Path(config).parent
    cfg = load_file(config, TournamentConfig, [lambda c: source_problems(c, base)])
    console = output.console(json_out)
    try:
        with writing(out):
            tournament = Tournament(cfg, out, base)
            with console.status("Loading participants..."):
                tournament.load()
            columns = (*Progress.get_default_columns(), MofNCompleteColumn())
            with Progress(*columns, console=console, transient=True) as bar:
                task = bar.add_task(
                    f"{cfg.name}: games", total=tournament.total, completed=tournament.resumed
                )
                result = tournament.run(on_game=lambda rec: bar.advance(task))
    except (TournamentError, ModelError, RayStartError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    with writing(out):
        files = write_report(result.report, Path(out), title=cfg.name)
    if json_out:
        output.emit(_ratings_doc(result, cfg, files))
        return
    output.show(console, ratings_table(result.report, title=f"{cfg.name} on {cfg.game.name}"))
    console.print(
        f"{len(result.records)} games ({result.resumed} read back from "
        f"{Path(out) / 'matches.jsonl'}, {result.played} played); report: "
        f"{files['report.html']}",
        highlight=False,
        soft_wrap=True,
    )


def _ratings_doc(result: Any, cfg: Any, files: dict[str, Any]) -> dict[str, Any]:
    """``--json``: the ratings best first with every view's figures, and the files written."""
    import dataclasses

    report = result.report
    return {
        "name": cfg.name,
        "game": cfg.game.name,
        "anchor": report.anchor,
        "ranked_by": "nash_average" if report.by_return else "rating",
        "ratings": [dataclasses.asdict(r) for r in report.ratings],
        "seat_scores": report.seat_scores,
        "first_seat_advantage": report.home,
        "notes": report.notes,
        "games": len(result.records),
        "resumed": result.resumed,
        "played": result.played,
        "files": {name: str(path) for name, path in files.items()},
    }


def register(app: typer.Typer) -> None:
    app.command("tournament")(tournament_cmd)
