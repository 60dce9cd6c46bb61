"""Append-only JSON-lines files read back after a kill: a line counts once its newline is
written, so whatever follows the last newline is a torn write, cut off rather than parsed."""

from __future__ import annotations

from pathlib import Path


def complete_lines(path: Path) -> tuple[list[str], int]:
    """The complete lines of ``path`` (none when it is missing) and how many bytes of a torn
    last line follow them."""
    data = path.read_bytes() if path.exists() else b""
    end = data.rfind(b"\n") + 1
    return data[:end].decode("utf-8", errors="replace").splitlines(), len(data) - end
