"""``marl models list``, ``marl models check`` and ``marl chat``: the model registry, a probe
of every role's model in a team, and one question to a model."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from marl.cli import output
from marl.cli.common import fail, load_team, quiet_transformers
from marl.cli.output import Json

if TYPE_CHECKING:
    from marl.config.schema import RoleConfig

models_app = typer.Typer(no_args_is_help=True, help="The model registry.")


@models_app.command("list")
def models_list_cmd(json_out: Json = False) -> None:
    """Show registered models, where their weights come from, and whether they are cached."""
    from marl.agents.models import DEFAULT_MODEL, ModelError, list_models, marl_home

    rows = []
    for spec in list_models():
        if not spec.cache:
            cached = "n/a (in memory)"
        elif spec.is_cached():
            cached = "yes"
        else:
            cached = "no (converted on first use)"
            if spec.check_available is not None:
                try:
                    spec.check_available()
                except ModelError as exc:
                    cached = f"not installed: {exc}"
        rows.append(
            {"name": spec.name, "description": spec.description}
            | {"source": spec.source, "cached": cached}
        )
    cache = marl_home() / "models"
    if json_out:
        output.emit({"models": rows, "default": DEFAULT_MODEL, "cache": str(cache)})
        return
    shown = output.table("marl-teams models", dict.fromkeys(rows[0] if rows else (), "left"))
    for row in rows:
        shown.add_row(*row.values())
    console = output.console()
    output.show(console, shown)
    console.print(
        f"default: {DEFAULT_MODEL}; cache: {cache} ($MARL_HOME)", highlight=False, soft_wrap=True
    )


PING = [{"role": "user", "content": "Say ok."}]


def _probe_local(role: RoleConfig, loaded: dict[str, tuple]) -> None:
    """The weights load (from the registry, its cache or the hub) and generate one token."""
    from marl.agents.models import generate, load_model

    if role.model not in loaded:
        loaded[role.model] = load_model(role.model)
    generate(*loaded[role.model], PING, max_new_tokens=1)


def _probe_openai(role: RoleConfig, loaded: dict[str, tuple]) -> None:
    """One tiny chat request to the configured endpoint with its key."""
    from marl.agents.openai_backend import OpenAIPolicy

    assert role.endpoint is not None  # the schema requires it for this backend
    policy = OpenAIPolicy(
        role.endpoint.base_url,
        role.model,
        role.endpoint.api_key_env,
        temperature=0.0,
        max_new_tokens=1,
        timeout=30.0,
        max_workers=1,
    )
    try:
        policy.chat(PING)
    finally:
        policy.close()


#: How each backend's model is probed; scripted bots and humans have nothing to reach.
PROBES: dict[str, Callable[[RoleConfig, dict[str, tuple]], None]] = {
    "hf": _probe_local,
    "vllm": _probe_local,
    "openai": _probe_openai,
    "scripted": lambda role, loaded: None,
    "human": lambda role, loaded: None,
}


@models_app.command("check")
def models_check_cmd(
    team: Annotated[str, typer.Argument(help="Team YAML file.")],
    json_out: Json = False,
) -> None:
    """Probe every role's model: local weights load and generate a token, a hosted endpoint
    answers a tiny chat request.  Exit code 2 if any role fails."""
    quiet_transformers()
    cfg = load_team(team)
    loaded: dict[str, tuple] = {}  # roles on one base model load it once
    rows = []
    console = output.console(json_out)
    for role in cfg.roles:
        start = time.perf_counter()
        try:
            with console.status(f"Probing {role.name} ({role.backend} {role.model})..."):
                PROBES[role.backend](role, loaded)
            status = "ok"
        except Exception as exc:  # noqa: BLE001 - a probe reports whatever stops a role
            status = f"failed: {exc}"
        rows.append(
            {"role": role.name, "backend": role.backend, "model": role.model}
            | {"status": status, "seconds": round(time.perf_counter() - start, 3)}
        )
    if json_out:
        output.emit({"team": cfg.name, "roles": rows})
    else:
        shown = output.table(
            f"models of team {cfg.name}",
            {"role": "left", "backend": "left", "model": "left", "status": "left"}
            | {"latency": "right"},
        )  # a long URL folds rather than loses its end
        for row in rows:
            shown.add_row(*list(row.values())[:4], f"{row['seconds']:.2f} s")
        output.show(console, shown)
    failed = [row["role"] for row in rows if row["status"] != "ok"]
    if failed:
        fail(f"{len(failed)} of {len(cfg.roles)} roles failed: {', '.join(failed)}")


def chat_cmd(
    prompt: Annotated[str, typer.Argument(help="What to ask.")],
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="Registry name, Hugging Face id or local path (default: smollm2-135m-instruct).",
        ),
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Answer length cap.")] = 128,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy.")] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
) -> None:
    """Ask a model one question and print its answer (chat template applied)."""
    quiet_transformers()
    from rich.console import Console

    from marl.agents.models import DEFAULT_MODEL, MODEL_REGISTRY, ModelError, generate, load_model

    ref = model or DEFAULT_MODEL
    spec = MODEL_REGISTRY.get(ref)
    status = (
        f"Converting {ref} (first use only, under a minute)..."
        if spec is not None and spec.needs_build()
        else f"Loading {ref}..."
    )
    console = Console(stderr=True)
    try:
        with console.status(status):
            lm, tokenizer = load_model(ref)
        with console.status("Generating..."):
            answer = generate(
                lm,
                tokenizer,
                prompt,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed,
            )
    except ModelError as exc:
        fail(str(exc))
    typer.echo(answer)


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
    app.command("chat")(chat_cmd)
