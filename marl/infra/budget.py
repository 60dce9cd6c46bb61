"""A process's wall-clock budget (``train.max_minutes``): when it ends, and the one-line error a
call that outlives it, or fails in a way only the user can mend, raises.

The budget is an absolute time (``time.time()``), so it means the same in every process of a
run: :class:`~marl.infra.actors.ActorPool` hands it to its actors before their work, and the
calls they make into user code (:mod:`marl.games.guard`) stop at it too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

_deadline: float | None = None


class ReportedError(RuntimeError):
    """An error whose message is the whole report for the user (one line that names what
    failed): raised inside a Ray actor, the pool's caller gets it as itself, not Ray's
    traceback dump."""


def deadline() -> float | None:
    """When this process's budget ends (``time.time()``), or None: no budget."""
    return _deadline


def adopt(when: float | None) -> None:
    """Take ``when`` as this process's budget (what an actor is handed by its pool)."""
    global _deadline
    _deadline = when


def remaining() -> float:
    """Seconds left of the budget (negative once it is over; infinite without one)."""
    return float("inf") if _deadline is None else _deadline - time.time()


@contextmanager
def budget(minutes: float | None) -> Iterator[None]:
    """This process's budget is ``minutes`` from now (None: none) while the block runs."""
    before = _deadline
    adopt(None if minutes is None else time.time() + 60 * minutes)
    try:
        yield
    finally:
        adopt(before)
