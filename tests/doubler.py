"""An actor class for the actor-pool tests, in a module of its own so that a Ray worker
starting one imports only this (not torch and the trainer through a test module)."""

from __future__ import annotations

import os

from marl.infra import budget


class Doubler:
    """Doubles numbers; exits its process on a chunk holding -1 while ``poison`` exists
    (removing it first when ``once``), as a node loss would end it mid-chunk; raises a
    ``ReportedError`` on a chunk holding -2."""

    def work(self, chunk: list[int], poison: str, once: bool) -> list[int]:
        if -2 in chunk:
            raise budget.ReportedError("game x: step raised ValueError: -2")
        if -1 in chunk and os.path.exists(poison):
            if once:
                os.remove(poison)
            os._exit(1)
        return [2 * x for x in chunk]

    def pid(self) -> int:
        return os.getpid()

    def deadline(self, chunk: list[int], *_: object) -> float | None:
        """The wall-clock budget its pool handed it."""
        return budget.deadline()
