"""The guard in front of every route of the team server (ASGI middleware).

- the API key (constant-time comparison; the ``public`` paths, the API docs, need none);
- the body: 413 past ``Limits.max_body_bytes`` (before the app reads past it), 408 when it
  has not all come within ``Limits.body_timeout_s`` of the request head (a client sending a
  body slowly, or part of one, holds nothing longer);
- ``Limits.max_requests`` requests read or answered at once, 503 beyond; ``/health`` is
  always answered, so a health check sees the server alive under any load;
- each answer's status and time to its last byte in :class:`Metrics`.

A refusal whose body is left unread closes the connection (``Connection: close``), so the rest
of the body never passes for a request.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException

from marl.orchestrator.serving.api import Limits, RequestError
from marl.orchestrator.serving.metrics import Metrics

#: Always answered, whatever the load.
HEALTH = "/health"
#: Answers after which the connection is closed: the request's body may be unread.
CLOSING = frozenset({401, 408, 413, 503})
CLOSE = (b"connection", b"close")


class Guard:
    """The middleware; ``public`` paths need no API key."""

    def __init__(
        self,
        app: Any,
        limits: Limits,
        metrics: Metrics,
        api_key: str | None,
        public: frozenset[str],
    ) -> None:
        self.app, self.limits, self.metrics, self.public = app, limits, metrics, public
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()
        self.active = 0  # requests being read or answered

    def refusal(self, scope: dict) -> RequestError | None:
        """Why the request is refused before the app sees it, if it is."""
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"0")
        limit = self.limits.max_body_bytes
        if (
            self.expected is not None
            and scope["path"] not in self.public
            and not hmac.compare_digest(headers.get(b"authorization", b""), self.expected)
        ):
            return RequestError(
                401, "missing or wrong API key (Authorization: Bearer ...)", code="invalid_api_key"
            )
        if length.isdigit() and int(length) > limit:
            return RequestError(413, f"the request body is over {limit} bytes")
        if self.active >= self.limits.max_requests and scope["path"] != HEALTH:
            return RequestError(
                503,
                f"{self.active} requests are being served; try again later",
                code="server_busy",
            )
        return None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]

        async def observed_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if status[0] in CLOSING:
                    message = {**message, "headers": [*message["headers"], CLOSE]}
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                route = getattr(scope.get("route"), "path", "other")
                self.metrics.request(scope["method"], route, status[0], time.perf_counter() - start)

        error = self.refusal(scope)
        if error is not None:
            await error.response()(scope, receive, observed_send)
            return
        self.active += 1
        try:
            await self.app(scope, self._bounded(receive), observed_send)
        finally:
            self.active -= 1

    def _bounded(self, receive: Callable) -> Callable:
        """``receive``, the body held to the size and time limits (once it has all come,
        waiting for a disconnect is the app's business, unbounded)."""
        limit, timeout = self.limits.max_body_bytes, self.limits.body_timeout_s
        deadline = asyncio.get_running_loop().time() + timeout
        received, done = 0, False

        async def bounded_receive() -> dict:
            nonlocal received, done
            if done:
                return await receive()
            try:
                message = await asyncio.wait_for(
                    receive(), deadline - asyncio.get_running_loop().time()
                )
            except TimeoutError:  # FastAPI passes HTTPExceptions from body reading through
                raise StarletteHTTPException(
                    408, f"the request body did not all come within {timeout:g} s"
                ) from None
            received += len(message.get("body", b""))
            done = message["type"] != "http.request" or not message.get("more_body")
            if received > limit:
                raise StarletteHTTPException(413, f"the request body is over {limit} bytes")
            return message

        return bounded_receive
