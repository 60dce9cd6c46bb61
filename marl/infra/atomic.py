"""Write a folder or a file so that readers never see half of it.

The content is written into a temp sibling (same filesystem, so the rename is atomic), its
files are fsynced, and it is renamed into place; on an exception the temp is removed.  Temps
left by a killed writer are swept an hour later (a younger one may belong to a live writer),
or at once by a writer that knows it is the folder's only one (:func:`sweep_temps`).
"""

from __future__ import annotations

import glob
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_MARKER = ".tmp-"
STALE_SECONDS = 3600.0


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def sweep_temps(folder: Path, final: str | None = None, older_than: float = STALE_SECONDS) -> None:
    """Remove the temps in ``folder`` (of the one named ``final``, else of any) untouched for
    more than ``older_than`` seconds; 0 removes them all (the caller is the folder's only
    writer)."""
    now = time.time()
    for p in Path(folder).glob(f".{'*' if final is None else glob.escape(final)}{TMP_MARKER}*"):
        try:
            if older_than <= 0 or now - p.stat().st_mtime > older_than:
                _remove(p)
        except FileNotFoundError:
            pass


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_write(final: Path, *, folder: bool = True, overwrite: bool = True) -> Iterator[Path]:
    """Yield the temp path to fill (a fresh folder, or a file path to write when ``folder`` is
    False); on a clean exit it becomes ``final``.

    A replaced folder is removed just before the rename (readers then briefly find none, never
    a mix).  With ``overwrite=False`` an existing folder is never removed: the rename fails
    (``OSError``) when another writer published one first.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    sweep_temps(final.parent, final.name)
    tmp = final.parent / f".{final.name}{TMP_MARKER}{uuid.uuid4().hex[:12]}"
    if folder:
        tmp.mkdir()
    try:
        yield tmp
        for f in tmp.rglob("*") if folder else [tmp]:
            if f.is_file():
                _fsync(f)
        if folder and overwrite and final.exists():
            shutil.rmtree(final)
        (os.replace if overwrite else os.rename)(tmp, final)
    except BaseException:
        _remove(tmp)
        raise
    _fsync(final.parent)
