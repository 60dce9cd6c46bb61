"""``marl validate`` and ``marl schema``: team and tournament files without running anything."""

from __future__ import annotations

from typing import Annotated

import typer

from marl.cli.common import config_problems


def validate_cmd(
    files: Annotated[
        list[str], typer.Argument(metavar="FILE...", help="Team or tournament YAML files.")
    ],
) -> None:
    """Check team and tournament files, including what running them needs (the game takes
    its kwargs, the agents fit its seats, the sources exist): every problem of every file in
    one run, as FILE:LINE:COL: path: message (exit 2 if any file has one)."""
    from marl.config import validate_file

    failed = False
    for file in files:
        problems = validate_file(file, checks=[lambda cfg, f=file: config_problems(cfg, f)])
        for problem in problems:
            typer.echo(str(problem))
        if problems:
            failed = True
        else:
            typer.secho(f"{file}: ok", fg=typer.colors.GREEN)
    if failed:
        raise typer.Exit(2)


def schema_cmd(
    out: Annotated[str | None, typer.Option("--out", help="Write the JSON Schema here.")] = None,
    tournament: Annotated[
        bool,
        typer.Option(
            "--tournament", help="Tournament files instead (docs/tournament.schema.json)."
        ),
    ] = False,
    markdown: Annotated[
        bool,
        typer.Option(
            "--markdown", help="The settings reference as Markdown (docs/configuration.md)."
        ),
    ] = False,
) -> None:
    """Print the JSON Schema of team files (for editors and docs/schema.json), or with
    --markdown the reference of every setting (docs/configuration.md)."""
    import json
    from pathlib import Path

    from marl.config import json_schema
    from marl.config.docs import markdown as reference
    from marl.config.tournament import TournamentConfig

    if markdown:
        text = reference()
    else:
        schema = json_schema(TournamentConfig) if tournament else json_schema()
        text = json.dumps(schema, indent=2) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        Path(out).write_text(text, encoding="utf-8")


def register(app: typer.Typer) -> None:
    app.command("validate")(validate_cmd)
    app.command("schema")(schema_cmd)
