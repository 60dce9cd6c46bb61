"""The environment's failures as one ``error:`` line and exit code 2, never a traceback: a
full disk, a read-only or missing folder, a path through a file (``OSError``), a hosted
model's endpoint that cannot answer (``EndpointError``), a user's game that raises or hangs
(any ``ReportedError``: its message is the line)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from marl.cli.common import fail
from marl.infra.budget import ReportedError


def _cause(exc: OSError) -> str:
    return exc.strerror or str(exc)


@contextmanager
def writing(path: str | Path, partial: Path | None = None) -> Iterator[None]:
    """Around a command's writes: an ``OSError`` ends it with ``cannot write PATH: why``
    (the file the system named, else ``path``), after removing the ``partial`` file a stream
    of writes left, so no cut-short output passes for a whole one."""
    try:
        yield
    except OSError as exc:
        if partial is not None and not partial.is_symlink() and partial.is_file():
            partial.unlink()  # a regular file only: never /dev/full, /dev/stdout and the like
        fail(f"cannot write {exc.filename or path}: {_cause(exc)}")


def _is_endpoint_error(exc: Exception) -> bool:
    """Whether ``exc`` is the openai backend's :class:`EndpointError`; looked up only once
    raised, so a command that never loads the model stack does not import it."""
    backend = sys.modules.get("marl.agents.openai_backend")
    return backend is not None and isinstance(exc, backend.EndpointError)


def _guarded(command: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except OSError as exc:
            out = kwargs.get("out")  # a write with no file named: most likely to --out
            fail(
                f"{exc.filename}: {_cause(exc)}"
                if exc.filename
                else f"cannot write {out}: {_cause(exc)}"
                if out
                else _cause(exc)
            )
        except ReportedError as exc:
            fail(str(exc))
        except Exception as exc:
            if not _is_endpoint_error(exc):
                raise
            fail(str(exc))

    return run


def guard(app: typer.Typer) -> None:
    """Every command of ``app`` (and of its groups) fails with one line on an ``OSError``
    that no :func:`writing` around it named more precisely, on an ``EndpointError`` and on a
    ``ReportedError``."""
    for info in app.registered_commands:
        info.callback = _guarded(info.callback)
    for group in app.registered_groups:
        guard(group.typer_instance)


def write_json(out: str, data: dict[str, Any]) -> None:
    """Write a command's result to ``--out`` as indented JSON, no partial file left on failure."""
    import json

    with writing(out, partial=Path(out)):
        Path(out).write_text(json.dumps(data, indent=1))
