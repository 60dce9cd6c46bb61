"""The ``marl`` command line: one typer app, sub-apps per concern."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="marl-teams: teams of LLM agents that learn together.")
models_app = typer.Typer(no_args_is_help=True, help="The model registry.")
app.add_typer(models_app, name="models")


if __name__ == "__main__":
    app()
