"""The folders training writes and everything else reads, named in one place.

A run folder::

    RUN/metrics.jsonl                one JSON line per step
    RUN/checkpoints/step_000010/     one checkpoint (see marl.train.checkpoint for its contents)
    RUN/latest                       a file naming the newest complete checkpoint
    RUN/best                         the same for the lowest exploitability measured so far
    RUN/population.json              the least exploitable mixture of the run's snapshots

A checkpoint folder and an exported team folder share the names a team is loaded from:
``team.yaml`` (the resolved config), ``adapters/<role>/`` (PEFT folders),
``topology.safetensors`` (learned edge logits) and, in checkpoints, ``state.json``.

A pointer is followed only to a ``step_NNNNNN`` folder of its own run's ``checkpoints``: a
pointer file holding an absolute or ``../`` path never sends a reader (or ``export --force``)
outside the run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from marl.infra.atomic import atomic_write, sweep_temps

LATEST = "latest"
BEST = "best"
POINTERS = (LATEST, BEST)
CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
TEAM_FILE = "team.yaml"
STATE_FILE = "state.json"
ADAPTERS = "adapters"
TOPOLOGY_FILE = "topology.safetensors"
LEAGUE = "league"
POPULATION_FILE = "population.json"
LOCK_FILE = ".lock"
_STEP_NAME = re.compile(r"step_[0-9]{6,}")


class LayoutError(ValueError):
    """A run folder file that names something it may not (the message names the file)."""


def checkpoint_dir(run: Path, step: int) -> Path:
    return run / CHECKPOINTS / f"step_{step:06d}"


def adapter_folder(folder: Path, role: str) -> Path:
    """Where ``role``'s PEFT adapter lives in a checkpoint or exported team folder."""
    return folder / ADAPTERS / role


def snapshot_file(folder: Path, snapshot: str) -> Path:
    """Where a checkpoint keeps the weights of league snapshot ``snapshot`` (``snap:<step>``),
    tensors keyed ``<role>::<name>``."""
    return folder / LEAGUE / f"{snapshot.replace(':', '_')}.safetensors"


def point(run: Path, name: str, checkpoint: Path) -> None:
    """Make the pointer ``RUN/<name>`` name ``checkpoint``, atomically."""
    with atomic_write(run / name, folder=False) as tmp:
        tmp.write_text(checkpoint.name)


def _named(pointer: Path) -> Path:
    name = pointer.read_text(errors="replace").strip()
    if not _STEP_NAME.fullmatch(name):
        raise LayoutError(
            f"{pointer}: names {name[:80]!r}, not a checkpoint folder "
            f"step_NNNNNN under {pointer.parent / CHECKPOINTS}"
        )
    return pointer.parent / CHECKPOINTS / name


def pointed(run: Path, name: str = LATEST) -> Path | None:
    """The checkpoint folder the pointer ``RUN/<name>`` names (None without the pointer)."""
    pointer = run / name
    return _named(pointer) if pointer.is_file() else None


def latest_checkpoint(run: Path, name: str = LATEST) -> Path | None:
    """The checkpoint ``RUN/<name>`` names, if it is complete (its state is written last)."""
    path = pointed(run, name)
    return path if path is not None and (path / STATE_FILE).is_file() else None


def has_history(run: Path) -> bool:
    """Whether ``run`` holds a run's record: a ``latest`` pointer (of any kind), a checkpoint
    or a metrics log."""
    checkpoints = run / CHECKPOINTS
    return (
        (run / LATEST).exists()
        or (run / METRICS).exists()
        or (
            checkpoints.is_dir()
            and any(_STEP_NAME.fullmatch(p.name) for p in checkpoints.iterdir())
        )
    )


def resume_point(run: Path) -> Path | None:
    """The complete checkpoint a resume of ``run`` continues from; None for a folder with no
    history (a fresh start).  A history whose ``latest`` is missing, dangling or incomplete is
    refused, never restarted over: that would rewrite its metrics and checkpoints."""
    if not has_history(run):
        return None
    pointer = run / LATEST
    if not pointer.is_file():
        why = "is not a pointer file" if pointer.exists() else "is missing"
        raise LayoutError(
            f"{pointer} {why} but {run} holds a run: nothing was changed; write the name of "
            f"a complete checkpoint (a {run / CHECKPOINTS}/step_NNNNNN with {STATE_FILE}) "
            "into it to continue from there, or train into another --out"
        )
    path = latest_checkpoint(run)
    if path is None:
        raise LayoutError(
            f"{pointer} names {_named(pointer)}, which is missing or incomplete (no "
            f"{STATE_FILE}): nothing was changed; point it at a complete checkpoint to "
            "continue from there, or train into another --out"
        )
    return path


@contextlib.contextmanager
def run_lock(run: Path) -> Iterator[None]:
    """Hold ``RUN/.lock`` while one process writes ``run``: a second writer is refused at
    once; a writer that dies releases it (the system drops the lock with the process)."""
    run.mkdir(parents=True, exist_ok=True)
    fd = os.open(run / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LayoutError(
                f"{run} is being written by another process (it holds {run / LOCK_FILE}): "
                "wait for it to end, or train into another --out"
            ) from None
        yield
    finally:
        os.close(fd)


def sweep_orphans(run: Path) -> None:
    """Remove the temps (checkpoint folders, pointer files) a killed writer of ``run`` left.
    Only for the run's one writer, at its start: any temp then is an orphan."""
    for folder in (run, run / CHECKPOINTS):
        sweep_temps(folder, older_than=0.0)


class Resolved(NamedTuple):
    folder: Path  # the folder holding team.yaml
    run: Path | None  # the run it belongs to (its metrics), if any


def resolve(path: str | Path) -> Resolved:
    """What a path given by a user names: a run folder its latest checkpoint, a run's
    ``latest``/``best`` pointer file the checkpoint it names, a checkpoint inside a run
    itself (with its run); any other folder (an exported team) is used as it is."""
    path = Path(path)
    pointer = path / LATEST if path.is_dir() else path
    if pointer.name in POINTERS and pointer.is_file() and (pointer.parent / CHECKPOINTS).is_dir():
        return Resolved(_named(pointer), pointer.parent)
    if path.parent.name == CHECKPOINTS and (path.parent.parent / METRICS).is_file():
        return Resolved(path, path.parent.parent)
    return Resolved(path, None)


def why_missing(path: str | Path) -> str:
    """What a path a user gave lacks, and how to get it: a run's ``best`` is written only
    when training measures exploitability, its ``latest`` with its first checkpoint."""
    path = Path(path)
    run = path.parent
    if path.name == BEST and has_history(run):
        return (
            f"{path} does not exist: the run has no best checkpoint; training writes one when it "
            "measures exploitability (set train.eval_every in the team file, games with an exact "
            f"tree and a first role on the hf backend only); {run} names its latest checkpoint"
        )
    if path.name == LATEST and has_history(run):
        return f"{path} does not exist: the run has no complete checkpoint yet"
    return f"{path} does not exist"


def checkpoint_folder(path: str | Path) -> Path:
    """The folder a team is loaded from for ``path`` (see :func:`resolve`)."""
    return resolve(path).folder
