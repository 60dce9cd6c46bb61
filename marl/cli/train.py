"""``marl train`` and ``marl plot``: learning, and its curves."""

from __future__ import annotations

from typing import Annotated

import typer

from marl.cli.common import fail, load_team, quiet_transformers
from marl.cli.errors import writing


def train_cmd(
    config: Annotated[str, typer.Argument(help="Team YAML file with a `train` section.")],
    out: Annotated[str, typer.Option("--out", help="Run folder.")] = "runs/latest",
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the last checkpoint in --out.")
    ] = False,
    address: Annotated[
        str | None,
        typer.Option(help="Ray cluster address (default: the config's, else a local Ray)."),
    ] = None,
    steps: Annotated[int | None, typer.Option(help="Override train.steps.")] = None,
    max_minutes: Annotated[
        float | None, typer.Option(help="Override train.max_minutes (wall-clock budget).")
    ] = None,
) -> None:
    """Train the team's adapters with multi-agent GRPO; metrics in OUT/metrics.jsonl."""
    quiet_transformers()
    from pathlib import Path

    from rich.console import Console

    from marl.agents.host.adapters import AdapterMismatch
    from marl.agents.models import ModelError
    from marl.infra.actors import RayStartError
    from marl.infra.layout import LayoutError, has_history, run_lock
    from marl.train.trainer import TrainingError

    cfg = load_team(config)
    if cfg.train is None:
        fail(f"{config}: no `train` section (see docs/schema.json)")
    cfg = cfg.replace(
        train=cfg.train.with_overrides(steps=steps, max_minutes=max_minutes, address=address)
    )
    if not resume and has_history(Path(out)):
        fail(f"{out} already holds a run: add --resume to continue it, or choose another --out")
    console = Console()
    try:
        with writing(out), run_lock(Path(out)):  # one trainer per run folder
            trainer = _train(cfg, out, resume, console)
    except (
        TrainingError,
        ModelError,
        LayoutError,
        RayStartError,
        FileNotFoundError,
        AdapterMismatch,
    ) as exc:
        fail(str(exc))
    console.print(
        f"done: {trainer.step} steps; metrics {Path(out) / 'metrics.jsonl'}, "
        f"checkpoints {Path(out) / 'checkpoints'}"
    )


def _train(cfg, out: str, resume: bool, console):
    """Build the trainer (resuming where asked) and fit it with a progress bar."""
    from pathlib import Path

    from marl.infra.layout import checkpoint_dir
    from marl.train.progress import TrainProgress
    from marl.train.trainer import Trainer

    with writing(out), console.status("Starting the trainer (models, workers)..."):
        trainer = Trainer(cfg, Path(out), resume=resume)
    if resume:
        console.print(
            f"resumed from step {trainer.step} ({checkpoint_dir(Path(out), trainer.step)})"
            if trainer.step
            else f"nothing to resume in {out}: starting at step 0",
            markup=False,
        )
    with (
        writing(out),
        TrainProgress(
            console, cfg.train.steps, start=trainer.step, max_minutes=cfg.train.max_minutes
        ) as bar,
    ):
        trainer.fit(on_step=bar.update)
    return trainer


def plot_cmd(
    run: Annotated[str, typer.Argument(help="Run folder (with metrics.jsonl).")],
    out: Annotated[str | None, typer.Option(help="PNG path (default RUN/curves.png).")] = None,
) -> None:
    """Write PNG learning curves of a run."""
    from pathlib import Path

    from marl.train.plots import plot_run

    metrics = Path(run) / "metrics.jsonl"
    if not metrics.is_file():
        fail(f"{metrics} not found")
    if not metrics.read_text(errors="replace").strip():
        fail(f"{metrics} holds no steps yet")
    with writing(out or Path(run) / "curves.png"):
        path = plot_run(Path(run), Path(out) if out else None)
    typer.echo(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
    app.command("plot")(plot_cmd)
