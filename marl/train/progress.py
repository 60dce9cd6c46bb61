"""A rich progress bar for training: ETA plus the figures people watch."""

from __future__ import annotations

import time
from datetime import timedelta

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text


class EtaColumn(ProgressColumn):
    """Time left: the steps' rate extrapolated, or the end of the wall-clock budget
    (``train.max_minutes``) when that comes first, as training then stops."""

    def __init__(self, max_minutes: float | None = None) -> None:
        super().__init__()
        self.deadline = time.monotonic() + 60 * max_minutes if max_minutes else None

    def render(self, task: Task) -> Text:
        left = [task.time_remaining] if task.time_remaining is not None else []
        if self.deadline is not None:
            left.append(max(0.0, self.deadline - time.monotonic()))
        if not left:
            return Text("-:--:--", style="progress.remaining")
        shown = str(timedelta(seconds=int(min(left))))
        budget = self.deadline is not None and min(left) == left[-1]
        return Text(shown + (" (budget)" if budget else ""), style="progress.remaining")


class TrainProgress:
    def __init__(
        self, console: Console, total: int, start: int = 0, max_minutes: float | None = None
    ) -> None:
        self.bar = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            EtaColumn(max_minutes),
            TextColumn("{task.fields[figures]}"),
            console=console,
        )
        self.task = self.bar.add_task("train", total=total, completed=start, figures="")

    def __enter__(self) -> TrainProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def update(self, result) -> None:
        m = result.metrics
        rewards = " ".join(
            f"{k.split('@')[0]}={v['reward']:+.2f}" for k, v in list(m["agents"].items())[:3]
        )
        learner = next(iter(m["learner"].values()), {})
        parts = [
            rewards,
            f"gnorm={learner.get('grad_norm', 0):.2f}",
            f"parse_err={m['parse_error_rate']:.0%}",
        ]
        if m.get("illegal_move_rate"):
            parts.append(f"illegal={m['illegal_move_rate']:.0%}")
        if "states" in m:
            parts.append(f"read_exploitability={m['states']['exploitability']:.3f}")
        if "eval" in m:
            parts += [f"{k}={v:.3f}" for k, v in m["eval"].items()]
        self.bar.update(self.task, completed=result.step, figures="  ".join(parts))
