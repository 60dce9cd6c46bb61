"""Where each training step's metrics go: ``train.loggers`` names entries of :data:`LOGGERS`.

- ``jsonl``: ``RUN/metrics.jsonl``, one JSON object per step; what ``marl plot`` reads.
- ``wandb``: Weights & Biases (the ``wandb`` extra), metrics flattened to ``a/b/c`` keys.
  Without an API key (``WANDB_API_KEY`` unset and no netrc entry for the W&B host) the run is
  offline, under ``RUN/wandb/offline-run-*`` (``wandb sync`` uploads it later), so training
  never waits on a login prompt or a network; ``WANDB_MODE`` set by the user wins.

A logger is opened when training starts at ``start_step`` (0 for a fresh run, the checkpoint's
step for a resumed one).  Steps after ``start_step`` are about to be replayed, so what a logger
holds of them is dropped: metrics.jsonl keeps only lines up to ``start_step`` (and never a torn
last line a kill or a full disk left); W&B drops any
step at or below the last one it has for the run, so the replayed steps are kept only once.
"""

from __future__ import annotations

import importlib.util
import json
import netrc
import os
import secrets
import string
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import numpy as np

from marl.config import TeamConfig
from marl.infra.jsonl import complete_lines
from marl.infra.layout import METRICS, LayoutError


class MetricsLogger(Protocol):
    def log(self, metrics: dict) -> None:
        """Record one step's metrics (``metrics["step"]`` is the step)."""

    def close(self, ok: bool = True) -> None:
        """Flush and release; ``ok`` is False when training stopped on an error."""


def jsonable(x):
    """``json.dumps`` default for the numpy scalars that metrics may hold."""
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON-able: {type(x)}")


def line_step(path: Path, number: int, line: str) -> int:
    """The step of line ``number`` of a metrics log, or a located error that changes nothing
    (a damaged line in the middle is not a torn write, so it is not cut)."""
    try:
        step = json.loads(line)["step"]
        if isinstance(step, int):
            return step
        why = f"its step is {step!r}"
    except (ValueError, KeyError, TypeError) as exc:
        why = f"not a metrics line ({type(exc).__name__})"
    raise LayoutError(
        f"{path}:{number}: {why}; nothing was changed: repair or remove that line to resume"
    )


class JsonlLogger:
    def __init__(
        self, run_dir: Path, cfg: TeamConfig, start_step: int, last: dict | None = None
    ) -> None:
        """``last``: the metrics saved with the checkpoint at ``start_step``, written if the
        run died after the checkpoint but before its line.  A start at step 0 keeps nothing:
        even a step-0 line (the untrained policy's evaluation) is logged again."""
        self.path = run_dir / METRICS
        lines = complete_lines(self.path)[0] if start_step > 0 else []  # a torn line is cut
        steps = [(ln, line_step(self.path, i, ln)) for i, ln in enumerate(lines, 1) if ln.strip()]
        keep = [ln for ln, step in steps if step <= start_step]
        if (
            last is not None
            and last["step"] == start_step
            and not any(step == start_step for _, step in steps)
        ):
            keep.append(json.dumps(last, default=jsonable))
        self.path.write_text("".join(ln + "\n" for ln in keep))
        self.file = self.path.open("a")

    def log(self, metrics: dict) -> None:
        self.file.write(json.dumps(metrics, default=jsonable) + "\n")
        self.file.flush()

    def close(self, ok: bool = True) -> None:
        self.file.close()


def flatten(metrics: dict, prefix: str = "") -> dict[str, float | int | bool]:
    """Nested metrics as ``{"a/b/c": number}``; non-numbers (None) are left out."""
    out: dict[str, float | int | bool] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "/"))
        elif isinstance(value, bool | int | float | np.number):
            out[name] = value.item() if isinstance(value, np.generic) else value
    return out


def wandb_has_api_key() -> bool:
    """What ``wandb.login`` would find without asking: ``WANDB_API_KEY`` or a netrc entry."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbLogger:
    ID_FILE = "wandb-run-id"

    def __init__(
        self, run_dir: Path, cfg: TeamConfig, start_step: int, last: dict | None = None
    ) -> None:
        import wandb

        id_file = run_dir / self.ID_FILE
        resume = start_step > 0 and id_file.is_file()
        run_id = (
            id_file.read_text().strip()
            if resume
            else "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
        )
        id_file.write_text(run_id + "\n")
        mode = (
            None
            if os.environ.get("WANDB_MODE")
            else ("online" if wandb_has_api_key() else "offline")
        )
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "marl-teams",
            name=run_dir.name,
            id=run_id,
            resume="allow" if resume else None,
            dir=str(run_dir),
            mode=mode,
            config=cfg.model_dump(mode="json", by_alias=True),
        )

    def log(self, metrics: dict) -> None:
        self.run.log(flatten(metrics), step=int(metrics["step"]))

    def close(self, ok: bool = True) -> None:
        self.run.finish(exit_code=0 if ok else 1)


LOGGERS: dict[str, type] = {"jsonl": JsonlLogger, "wandb": WandbLogger}
_EXTRAS = {"wandb": "wandb"}  # logger -> the module it needs (and the extra that installs it)


def unavailable(names: list[str]) -> str | None:
    """A one-line reason why the named loggers cannot run here, or None."""
    for name in names:
        if name not in LOGGERS:
            return f"unknown logger {name!r}; known: {', '.join(LOGGERS)}"
        module = _EXTRAS.get(name)
        if module and importlib.util.find_spec(module) is None:
            return (
                f"train.loggers has {name!r} but {module} is not installed: "
                f"pip install 'marl-teams[{module}]'"
            )
    return None


def open_loggers(
    names: list[str], run_dir: Path, cfg: TeamConfig, start_step: int, last: dict | None = None
) -> list[MetricsLogger]:
    opened: list[MetricsLogger] = []
    try:
        for name in dict.fromkeys(names):
            opened.append(LOGGERS[name](run_dir, cfg, start_step, last))
    except BaseException:
        for lg in opened:
            lg.close(ok=False)
        raise
    return opened
