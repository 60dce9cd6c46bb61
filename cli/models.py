"""``marl models list`` and ``marl chat``: the model registry and one question to a model."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.common import fail, quiet_transformers

models_app = typer.Typer(no_args_is_help=True, help="The model registry.")


@models_app.command("list")
def models_list_cmd() -> None:
    """Show registered models, where their weights come from, and whether they are cached."""
    from rich.console import Console
    from rich.table import Table

    from agents.models import DEFAULT_MODEL, ModelError, list_models, marl_home

    table = Table(title="marl-teams models")
    table.add_column("name", no_wrap=True)
    for column in ("description", "source", "cached"):
        table.add_column(column)
    for spec in list_models():
        if not spec.cache:
            cached = "n/a (in memory)"
        elif spec.is_cached():
            cached = "[green]yes[/green]"
        else:
            cached = "no (converted on first use)"
            if spec.check_available is not None:
                try:
                    spec.check_available()
                except ModelError as exc:
                    cached = f"[red]not installed[/red]: {exc}"
        table.add_row(spec.name, spec.description, spec.source, cached)
    console = Console()
    console.print(table)
    console.print(f"default: {DEFAULT_MODEL}; cache: {marl_home() / 'models'} ($MARL_HOME)",
                  highlight=False)


def chat_cmd(
    prompt: Annotated[str, typer.Argument(help="What to ask.")],
    model: Annotated[str | None, typer.Option(
        "--model", "-m", help="Registry name, Hugging Face id or local path "
        "(default: smollm2-135m-instruct).")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Answer length cap.")] = 128,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy.")] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
) -> None:
    """Ask a model one question and print its answer (chat template applied)."""
    quiet_transformers()
    from rich.console import Console

    from agents.models import DEFAULT_MODEL, MODEL_REGISTRY, ModelError, generate, load_model

    ref = model or DEFAULT_MODEL
    spec = MODEL_REGISTRY.get(ref)
    status = (f"Converting {ref} (first use only, under a minute)..."
              if spec is not None and spec.needs_build() else f"Loading {ref}...")
    console = Console(stderr=True)
    try:
        with console.status(status):
            lm, tokenizer = load_model(ref)
        with console.status("Generating..."):
            answer = generate(lm, tokenizer, prompt, max_new_tokens=max_new_tokens,
                              temperature=temperature, seed=seed)
    except ModelError as exc:
        fail(str(exc))
    typer.echo(answer)


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
    app.command("chat")(chat_cmd)
