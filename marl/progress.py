"""A rich progress bar for training: ETA plus the figures people watch."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class TrainProgress:
    def __init__(self, console: Console, total: int, start: int = 0) -> None:
        self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                            TextColumn("{task.fields[figures]}"), console=console)
        self.task = self.bar.add_task("train", total=total, completed=start, figures="")

    def __enter__(self) -> TrainProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def update(self, result) -> None:
        m = result.metrics
        rewards = " ".join(f"{k.split('@')[0]}={v['reward']:+.2f}"
                           for k, v in list(m["agents"].items())[:3])
        learner = next(iter(m["learner"].values()), {})
        parts = [rewards, f"gnorm={learner.get('grad_norm', 0):.2f}",
                 f"parse_err={m['parse_error_rate']:.0%}"]
        if "eval" in m:
            parts += [f"{k}={v:.3f}" for k, v in m["eval"].items()]
        self.bar.update(self.task, completed=result.step, figures="  ".join(parts))
