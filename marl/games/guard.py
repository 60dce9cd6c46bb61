"""Calls into game code the project did not write (a team file's entry point, an installed
plugin, TextArena), each bounded in time and, when it fails, one line that names the game, the
call and what went wrong.

A call runs in a daemon thread the caller waits for, at most ``timeout`` seconds
(``game.call_timeout_s``) and at most :data:`GRACE_S` past the process's wall-clock budget
(``train.max_minutes``, :mod:`marl.infra.budget`): a call that sleeps or loops forever then
raises :class:`GameError` instead of hanging the command, and the thread is left to the
process's exit.  Anything the call raises, ``SystemExit`` and ``KeyboardInterrupt`` from a
``sys.exit`` in the user's module included, becomes a :class:`GameError` too.  A
``GameError`` raised in a Ray worker reaches the driver as itself (a ``ReportedError``).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from marl.infra import budget

#: Seconds a game call may still run once the wall-clock budget is over.
GRACE_S = 5.0
T = TypeVar("T")


class GameError(budget.ReportedError):
    """A call into a game failed or did not return: ``game NAME: CALL raised ...``."""


def _what(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def call(game: str, what: str, timeout: float, fn: Callable[..., T], /, *args: Any, **kw: Any) -> T:
    """``fn(*args, **kw)``, the call ``what`` of game ``game``, within ``timeout`` seconds
    (and the budget); its result, or :class:`GameError` (the original as ``__cause__``)."""
    limit = min(timeout, max(budget.remaining(), 0.0) + GRACE_S)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kw)
        except BaseException as exc:  # noqa: BLE001 - sys.exit in user code is a failure too
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"game {game}: {what}", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        why = (
            f"did not return within game.call_timeout_s ({timeout:g} s)"
            if limit == timeout
            else f"was still running {GRACE_S:g} s after the run's --max-minutes budget ran out; "
            "the run keeps its last complete checkpoint"
        )
        raise GameError(f"game {game}: {what} {why}")
    if "error" in box:
        raise GameError(f"game {game}: {what} raised {_what(box['error'])}") from box["error"]
    return box["value"]


def trial(env: Any, seed: int = 0) -> None:
    """One game of ``env`` (a TextGame) with uniformly random legal moves, every seat's view
    read at each turn: the calls a real game makes, so ``marl validate`` meets a game that
    fails when played before any model loads.  Its errors are the calls' own."""
    rng = random.Random(seed)
    env.reset(seed=seed)
    while env.agents:
        agent = env.agent_selection
        legal = env.legal_actions(agent)
        env.observe(agent)
        env.step(rng.choice(legal) if legal else None)
