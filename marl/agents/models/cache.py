"""Where models live on disk, and how a model directory is written so readers never see half of one.

A conversion can be killed (Ctrl-C, OOM) or raced by a second process. Both are handled by
building into a temp directory next to the final one and publishing it with a single rename
(:func:`marl.infra.atomic.atomic_write`): the final directory either does not exist or is complete.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from marl.infra.atomic import atomic_write

MANIFEST_NAME = "marl-model.json"
"""Written last into a model directory; its presence marks the directory as complete."""


def marl_home() -> Path:
    """Root of everything marl-teams caches; ``$MARL_HOME`` or ``~/.cache/marl-teams``."""
    return Path(os.environ.get("MARL_HOME") or "~/.cache/marl-teams").expanduser()


def model_cache_dir(name: str) -> Path:
    """Cache directory of registry model ``name`` (may not exist yet)."""
    return marl_home() / "models" / name


def is_complete(path: Path) -> bool:
    """True when ``path`` is a published model directory (it carries the manifest)."""
    return (path / MANIFEST_NAME).is_file()


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest written by :func:`atomic_model_dir`."""
    return json.loads((path / MANIFEST_NAME).read_text())


def atomic_model_dir(
    final: Path,
    write: Callable[[Path], None],
    manifest: Mapping[str, Any] | None = None,
) -> Path:
    """Publish a directory produced by ``write(tmp_dir)`` at ``final``, atomically.

    ``write`` fills a fresh temp dir in ``final.parent`` (same filesystem, so the rename is
    atomic). On any exception the temp dir is deleted and nothing appears at ``final``. If
    another process published ``final`` first, ours is discarded and theirs is used.
    """
    if is_complete(final):
        return final
    if final.exists():
        raise FileExistsError(
            f"{final} exists but is not a complete model directory (no {MANIFEST_NAME}); "
            "delete it and retry"
        )
    try:
        with atomic_write(final, overwrite=False) as tmp:
            os.chmod(tmp, 0o755)  # the cache is meant to be shareable, whatever the umask
            write(tmp)
            record = {"name": final.name, "created": time.time(), **(manifest or {})}
            (tmp / MANIFEST_NAME).write_text(json.dumps(record, indent=2, default=str))
    except OSError:
        if is_complete(final):  # a concurrent writer published it first: use theirs
            return final
        raise
    return final
