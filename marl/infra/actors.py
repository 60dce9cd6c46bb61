"""Ray, started one way, and a pool of actors that survives actors dying.

:class:`ActorPool` hands chunks of work to its actors, the next chunk to the next free actor.
An actor that dies (node lost, OOM kill) is replaced by a fresh one from the pool's ``spawn``
and its chunk is replayed there; callers make chunks replayable (seeds come with the work).
A pool that keeps losing actors within one call (more than ``max_replacements``, by default
twice its size) stops with :class:`ActorPoolError` instead of retrying forever.  Each actor is
handed the caller's wall-clock budget (:mod:`marl.infra.budget`) before its work, and a
:class:`~marl.infra.budget.ReportedError` an actor raises reaches the caller as itself.

Ray is imported when first needed, so importing this module costs nothing.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlparse

from marl.infra import budget

CONNECT_TIMEOUT_S = 10.0


class ActorPoolError(RuntimeError):
    """The pool's actors kept dying; the message says how often and the last cause."""


class RayStartError(RuntimeError):
    """The Ray cluster asked for cannot be reached; the message names its address."""


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast on a ``host:port`` (or ``ray://host:port``) nothing listens on: ``ray.init``
    itself retries such an address for minutes without a word."""
    url = urlparse(address if "://" in address else f"tcp://{address}")
    try:
        host, port = url.hostname, url.port
    except ValueError:
        host, port = None, None
    if host is None or port is None:
        return  # "auto", "local" and the like: Ray resolves them itself
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise RayStartError(
            f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}"
        ) from None


def start_ray(address: str | None = None) -> None:
    """Join the cluster at ``address``, unless Ray is running already. None starts a local
    Ray of this process's own, never one another program's cluster wrote to Ray's address
    file (which a bare ``ray.init()`` would join)."""
    import ray

    if not ray.is_initialized():
        if address is not None:
            check_reachable(address)
        ray.init(
            address=address or "local",
            include_dashboard=False,
            log_to_driver=False,
            ignore_reinit_error=True,
        )


class ActorPool:
    """``size`` actors made by ``spawn`` (a fresh, ready-to-use actor per call)."""

    def __init__(
        self, spawn: Callable[[], Any], size: int, max_replacements: int | None = None
    ) -> None:
        self.spawn = spawn
        self.actors = [spawn() for _ in range(size)]
        self.max_replacements = 2 * size if max_replacements is None else max_replacements
        self.replaced = 0  # over the pool's life

    def map(
        self,
        method: str,
        chunks: Sequence[Any],
        *args: Any,
        on_result: Callable[[Any], None] | None = None,
        prepare: Callable[[Any], None] | None = None,
    ) -> list[Any]:
        """``actor.<method>(chunk, *args)`` for every chunk, chunk ``i`` first to actor ``i``;
        the results in chunk order, and to ``on_result`` as each arrives.  ``prepare(actor)``
        is called before each chunk goes to an actor (a replacement's replay too), to queue
        calls that must run first.  Errors raised by the method itself propagate (as Ray's
        ``RayTaskError``; a ``ReportedError`` as itself)."""
        return self._run(method, [(c, *args) for c in chunks], on_result, prepare)

    def one(self, method: str, *args: Any, prepare: Callable[[Any], None] | None = None) -> Any:
        """``actor.<method>(*args)`` on the first actor, or its replacement if it dies."""
        return self._run(method, [args], prepare=prepare)[0]

    def _run(
        self,
        method: str,
        calls: Sequence[tuple],
        on_result: Callable[[Any], None] | None = None,
        prepare: Callable[[Any], None] | None = None,
    ) -> list[Any]:
        """The calls' results in order, call ``i`` first to actor ``i`` (see :meth:`map`)."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError, WorkerCrashedError

        todo = deque(range(len(calls)))
        free = deque(range(len(self.actors)))
        running: dict[Any, tuple[int, int]] = {}  # result ref -> (actor slot, call)
        results: dict[int, Any] = {}
        lost = 0
        while todo or running:
            while todo and free:
                slot, i = free.popleft(), todo.popleft()
                self.actors[slot].__ray_call__.remote(_adopt_budget, budget.deadline())
                if prepare is not None:
                    prepare(self.actors[slot])
                running[getattr(self.actors[slot], method).remote(*calls[i])] = (slot, i)
            (ref,), _ = ray.wait(list(running), num_returns=1)
            slot, i = running.pop(ref)
            try:
                results[i] = ray.get(ref)
            except RayTaskError as exc:
                if isinstance(exc.cause, budget.ReportedError):
                    raise exc.cause from None
                raise
            except (RayActorError, WorkerCrashedError) as exc:
                lost += 1
                if lost > self.max_replacements:
                    cause = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                    raise ActorPoolError(
                        f"actors keep dying: {lost} lost while running {method!r} on "
                        f"{len(calls)} chunks ({self.max_replacements} replacements allowed); "
                        f"last: {cause}"
                    ) from None
                self.actors[slot] = self.spawn()
                self.replaced += 1
                todo.appendleft(i)
            else:
                if on_result is not None:
                    on_result(results[i])
            free.append(slot)
        return [results[i] for i in range(len(calls))]

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)


def _adopt_budget(actor: Any, when: float | None) -> None:
    """Run inside an actor (``__ray_call__``): its budget is the caller's."""
    budget.adopt(when)
