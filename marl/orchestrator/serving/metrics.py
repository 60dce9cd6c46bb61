"""The server's Prometheus metrics (``GET /metrics``), through ``prometheus_client``.

Each app has its own registry, so several servers in one process (tests, notebooks) count
apart: requests by method, route and status; time to the last byte by route; the tokens the
team's models read and wrote; requests per ``Team.run_batch``; requests waiting or running.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from marl.orchestrator.team import TeamResult

#: The methods counted by name; any other is counted as ``OTHER`` (and a path no route
#: matches as route ``other``), so no client can grow the series without bound.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """The series of one server, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "marl_requests", "HTTP requests answered.", ["method", "route", "status"], registry=r
        )
        self.latency = Histogram(
            "marl_request_duration_seconds",
            "Time to the last byte of the answer.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "marl_tokens", "Tokens the team's models read and wrote.", ["kind"], registry=r
        )
        for kind in ("prompt", "completion"):
            self.tokens.labels(kind)
        self.batches = Histogram(
            "marl_batch_size",
            "Requests per Team.run_batch call.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.pending = Gauge("marl_pending_requests", "Requests waiting or running.", registry=r)

    def request(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in METHODS else "OTHER"
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def result(self, result: TeamResult) -> None:
        self.tokens.labels("prompt").inc(sum(t.prompt_tokens for t in result.transcript))
        self.tokens.labels("completion").inc(sum(t.completion_tokens for t in result.transcript))

    def batch(self, size: int) -> None:
        self.batches.observe(size)

    def render(self, pending: int) -> bytes:
        """The text exposition format, with ``pending`` requests."""
        self.pending.set(pending)
        return generate_latest(self.registry)
