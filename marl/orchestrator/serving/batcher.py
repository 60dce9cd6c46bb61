"""The team server's batcher: one worker thread that runs queued requests in batches.

A worker thread takes every request waiting (up to ``max_batch``) and runs those with the same
sampling parameters with one :meth:`Team.run_batch`, so their turns share model calls (a
request with a seed runs alone, on a team sampled as it asks: :mod:`.sampling`); when a batch
fails, its requests run again one by one, so only a bad one gets the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import random
import threading
from dataclasses import dataclass, field

from marl.orchestrator.serving.api import RequestError
from marl.orchestrator.serving.metrics import Metrics
from marl.orchestrator.serving.sampling import Sampling, sampled_team
from marl.orchestrator.team import NodeMessage, Team, TeamResult

log = logging.getLogger(__name__)


@dataclass
class Job:
    """A client's task: its turns, then its TeamResult or RequestError, arrive on ``events``
    (an asyncio queue of the server's loop, fed from the batcher thread)."""

    task: str
    loop: asyncio.AbstractEventLoop
    sampling: Sampling = Sampling()
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    turns_sent: int = 0

    def put(self, item: NodeMessage | TeamResult | RequestError) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: the server stopped
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)


def _failure(exc: Exception) -> RequestError:
    """Input a tokenizer rejects is the client's fault (400); anything else is ours (500)."""
    if isinstance(exc, UnicodeError):
        return RequestError(400, f"the team cannot read this input: {exc}")
    return RequestError(500, f"the team failed: {exc}", code="server_error")


def _groups(jobs: list[Job]) -> list[list[Job]]:
    """The jobs that may run as one batch: the same sampling, and no seed (a seeded job runs
    alone, so its samples do not depend on other requests)."""
    groups: dict[object, list[Job]] = {}
    for i, job in enumerate(jobs):
        key = i if job.sampling.seed is not None else job.sampling
        groups.setdefault(key, []).append(job)
    return list(groups.values())


class TeamBatcher:
    """Runs queued tasks in batches on one worker thread (the team's models are not
    thread-safe, and batching is what makes concurrent clients cheap)."""

    def __init__(
        self,
        team: Team,
        max_batch: int = 16,
        *,
        max_queue: int = 1024,
        metrics: Metrics | None = None,
    ) -> None:
        self.team, self.max_batch, self.max_queue = team, max_batch, max_queue
        self.metrics = metrics or Metrics()
        self.queue: queue.Queue[Job | None] = queue.Queue()
        self.pending = 0  # submitted and not yet answered
        self._lock = threading.Lock()
        self.rng = random.Random()  # the seeds of requests that give none
        self.thread = threading.Thread(target=self._loop, name="team-batcher", daemon=True)
        self.thread.start()

    def submit(
        self,
        task: str,
        loop: asyncio.AbstractEventLoop,
        samplings: list[Sampling] | None = None,
    ) -> list[Job]:
        """One job per sampling (a request's ``n`` choices), queued together or not at all."""
        samplings = samplings or [Sampling()]
        with self._lock:
            if self.pending + len(samplings) > self.max_queue:
                raise RequestError(
                    429,
                    f"{self.pending} requests are waiting; try again later",
                    code="rate_limit_exceeded",
                )
            self.pending += len(samplings)
        jobs = [Job(task, loop, s) for s in samplings]
        for job in jobs:
            self.queue.put(job)
        return jobs

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            jobs = [first]
            while len(jobs) < self.max_batch:
                try:
                    nxt = self.queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self.queue.put(None)
                    break
                jobs.append(nxt)
            for group in _groups(jobs):
                self.metrics.batch(len(group))
                self._run(group)
            with self._lock:
                self.pending -= len(jobs)

    def _run(self, jobs: list[Job]) -> None:
        """One ``run_batch``; if it raises, each job again on its own, so one bad request
        fails alone.  A rerun streams only the turns beyond those its client already has."""
        seen = [0] * len(jobs)

        def on_turn(i: int, turn: NodeMessage) -> None:
            seen[i] += 1
            if seen[i] > jobs[i].turns_sent:
                jobs[i].turns_sent += 1
                jobs[i].put(turn)

        sampling = jobs[0].sampling
        team = self.team
        if sampling != Sampling():
            seed = self.rng.randrange(2**31) if sampling.seed is None else sampling.seed
            team = sampled_team(team, sampling, seed)
        try:
            results = team.run_batch([j.task for j in jobs], on_turn=on_turn)
        except Exception as exc:
            if len(jobs) > 1:
                for j in jobs:
                    self._run([j])
                return
            error = _failure(exc)
            if error.status >= 500:
                log.error("the team failed on a request: %r", exc)
            jobs[0].put(error)
            return
        for j, r in zip(jobs, results, strict=True):
            self.metrics.result(r)
            j.put(r)
