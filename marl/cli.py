"""The ``marl`` command line: one typer app, sub-apps per concern."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="marl-teams: teams of LLM agents that learn together.")
models_app = typer.Typer(no_args_is_help=True, help="The model registry.")
app.add_typer(models_app, name="models")


# --- configs: validate / schema ---

def _game_name_check(cfg: object) -> list[tuple[tuple[str, ...], str]]:
    """Check ``game.name`` against the game registry; skipped while the registry is empty."""
    try:
        import games
        known = games.names()
    except Exception as exc:  # a half-written game module must not break validation
        typer.echo(f"warning: game registry unavailable ({exc}); game names not checked",
                   err=True)
        return []
    name = cfg.game.name  # type: ignore[attr-defined]
    if known and name not in known:
        return [(("game", "name"), f"unknown game {name!r}; known: {', '.join(known)}")]
    return []


@app.command("validate")
def validate_cmd(
    files: Annotated[list[str], typer.Argument(metavar="FILE...", help="Team YAML files.")],
) -> None:
    """Check team files; prints FILE:LINE:COL: path: message per problem (exit 2 if any)."""
    from configs import validate_file

    failed = False
    for file in files:
        problems = validate_file(file, checks=[_game_name_check])
        for problem in problems:
            typer.echo(str(problem))
        if problems:
            failed = True
        else:
            typer.secho(f"{file}: ok", fg=typer.colors.GREEN)
    if failed:
        raise typer.Exit(2)


@app.command("schema")
def schema_cmd(
    out: Annotated[str | None, typer.Option("--out", help="Write the JSON Schema here.")] = None,
) -> None:
    """Print the JSON Schema of team files (for editors and docs/schema.json)."""
    import json

    from configs import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        from pathlib import Path

        Path(out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    app()
