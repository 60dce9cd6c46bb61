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

import re
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


def checkpoint_folder(path: str | Path) -> Path:
    """The folder a team is loaded from for ``path`` (see :func:`resolve`)."""
    return resolve(path).folder
