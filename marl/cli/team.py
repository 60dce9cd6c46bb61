"""``marl export``, ``marl serve`` and ``marl topology show``: a trained team as a product."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from marl.cli.common import fail, load_runtime_team, load_team, quiet_transformers
from marl.cli.errors import writing

topology_app = typer.Typer(no_args_is_help=True, help="Communication topologies.")


def export_cmd(
    run: Annotated[
        str,
        typer.Argument(
            help="Run folder (its latest checkpoint), RUN/best, "
            "RUN/latest, a checkpoint or an exported team."
        ),
    ],
    out: Annotated[str, typer.Option("--out", help="Folder to write the team to.")],
    force: Annotated[
        bool, typer.Option("--force", help="Replace --out if it is an earlier export.")
    ] = False,
    threshold: Annotated[float, typer.Option(help="Keep learned edges with p above this.")] = 0.5,
) -> None:
    """Write a self-contained team: team.yaml, LoRA adapters, model card (README.md)."""
    from marl.config import ConfigError
    from marl.infra.layout import LayoutError
    from marl.orchestrator.serving.export import ExportError, export_run
    from marl.topologies import TopologyError

    try:
        with writing(out):
            path = export_run(run, out, overwrite=force, threshold=threshold)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    except (ExportError, LayoutError, TopologyError, FileNotFoundError) as exc:
        fail(str(exc))
    typer.echo(f"exported to {path} (load: Team.load({str(path)!r}); serve: marl serve {path})")


def serve_cmd(
    team: Annotated[
        str,
        typer.Argument(
            help="Exported team folder (or a run, RUN/best, a checkpoint or team YAML)."
        ),
    ],
    port: Annotated[int, typer.Option(min=0, max=65535, help="0 picks a free port.")] = 8000,
    host: Annotated[
        str, typer.Option(help="Interface to bind (loopback by default).")
    ] = "127.0.0.1",
    api_key_env: Annotated[
        str | None,
        typer.Option(help="Require `Authorization: Bearer $VAR` (name of the variable)."),
    ] = None,
    max_batch: Annotated[int, typer.Option(min=1, help="Requests batched together.")] = 16,
) -> None:
    """Serve the team as an OpenAI-compatible API (/v1/chat/completions, /v1/models), with
    /health, /metrics (Prometheus) and /docs."""
    quiet_transformers()
    from rich.console import Console

    from marl.orchestrator.serving.serve import (
        ServeError,
        exposure_warning,
        game_warning,
        open_server,
        ready_line,
        run_until_interrupted,
    )

    key = None
    if api_key_env is not None:
        key = os.environ.get(api_key_env)
        if not key:
            fail(f"environment variable {api_key_env} (the API key) is not set")
    with Console(stderr=True).status(f"Loading {team}..."):
        runtime = load_runtime_team(team)
    try:
        server = open_server(runtime, host, port, api_key=key, max_batch=max_batch)
    except ServeError as exc:
        fail(str(exc))
    for warning in (exposure_warning(host, key), game_warning(runtime)):
        if warning is not None:
            typer.echo(f"warning: {warning}", err=True)
    typer.echo(ready_line(server, runtime))
    run_until_interrupted(server)


@topology_app.command("show")
def topology_show_cmd(
    source: Annotated[
        str, typer.Argument(help="Team YAML, or an exported team, run or checkpoint folder.")
    ],
    png: Annotated[str | None, typer.Option("--png", help="Also draw it to this PNG.")] = None,
) -> None:
    """Print the team's topology as Mermaid; learned edge probabilities as widths when the
    folder holds topology.safetensors."""
    from pathlib import Path

    from marl.infra.layout import checkpoint_folder
    from marl.topologies import LearnableTopology, TopologyError, build_topology
    from marl.topologies.render import draw_png, to_mermaid

    path = Path(source)
    folder = checkpoint_folder(path)
    if folder == path and path.is_file():  # a team file, not a run's pointer
        folder = None
    if folder is not None and not (folder / "team.yaml").is_file():
        fail(f"{source}: neither a team file nor a folder with team.yaml")
    cfg = load_team(str(path if folder is None else folder / "team.yaml"))
    learned = None if folder is None else folder / "topology.safetensors"
    try:
        if learned is not None and learned.is_file():
            graph = LearnableTopology.load(learned)
        else:
            graph = build_topology(cfg)
    except (TopologyError, ValueError) as exc:
        fail(str(exc))
    typer.echo(to_mermaid(graph), nl=False)
    if png is not None:
        draw_png(graph, png, title=cfg.name)
        typer.echo(f"wrote {png}", err=True)


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)
    app.command("serve")(serve_cmd)
    app.add_typer(topology_app, name="topology")
