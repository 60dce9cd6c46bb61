"""Serve a team behind an OpenAI-compatible API: a FastAPI app under uvicorn.

- ``GET /v1/models``: the one model served, named after the team;
- ``POST /v1/chat/completions``: the team runs on the last user message and its answer is the
  assistant message; ``stream: true`` answers with server-sent events
  (``chat.completion.chunk`` objects, then ``data: [DONE]``): each agent's turn as it finishes
  (``delta.reasoning_content``, the turn itself under ``marl.turn``, and an SSE comment so
  proxies see progress), then the answer as ``delta.content``;
  ``stream_options.include_usage`` adds a usage chunk;
- ``GET /health``, ``GET /metrics`` (Prometheus text format), ``GET /docs`` (the API schema).

Concurrent requests are batched: a worker thread takes every request waiting (up to
``max_batch``) and runs them with one :meth:`Team.run_batch`, so their turns share model calls;
when a batch fails, its requests run again one by one, so only a bad one gets the error.
Sampling parameters of the request (temperature, max_tokens, ...) are ignored: each role
decodes as its config says.  The server binds 127.0.0.1 unless told otherwise; ``api_key``
makes it require ``Authorization: Bearer <key>``.  :class:`Limits` bounds what one client can
hold: body and header size, message count and length, queue length, connection count, the time
to send request headers and the time a request may take.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import queue
import socket
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from marl.orchestrator.team import NodeMessage, Team, TeamResult, message_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """What one client may take of the server; over a limit it gets a 4xx, never a hang."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_header_bytes: int = 16 * 1024  # h11's incomplete-event limit: a request line + headers
    max_messages: int = 1024
    max_task_chars: int = 200_000
    max_queue: int = 1024  # requests waiting or running; 429 beyond
    max_connections: int = 2048  # uvicorn answers 503 beyond
    header_timeout_s: float = 10.0  # a connection that sends no complete request head is closed
    # longer than clients keep idle connections (httpx, hence the openai client: 5 s), so a
    # client never sends on a connection the server is closing at that very moment
    keep_alive_s: float = 15.0
    request_timeout_s: float = 600.0  # 504 when the team has not answered by then


class RequestError(Exception):
    """A bad request, answered in OpenAI's error format."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str = "invalid_request_error",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(
            {
                "error": {
                    "message": str(self),
                    "type": self.code,
                    "param": self.param,
                    "code": self.code,
                }
            },
            status_code=self.status,
            headers=headers,
        )


# ----- request bodies


class ChatMessage(BaseModel):
    """One OpenAI chat message; fields the team does not read (name, tool calls) may come."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``; sampling parameters are accepted and ignored."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None


def last_user_message(messages: list[ChatMessage], limits: Limits = Limits()) -> str:
    """The task: the text of the last ``user`` message, checked against ``limits`` and for
    text a tokenizer takes (UTF-8 encodable: no lone surrogates)."""
    if len(messages) > limits.max_messages:
        raise RequestError(400, f"more than {limits.max_messages} messages", param="messages")
    for m in reversed(messages):
        if m.role == "user":
            if m.content is None:
                raise RequestError(400, "a user message needs text 'content'", param="messages")
            text = message_text(m.content)
            if len(text) > limits.max_task_chars:
                raise RequestError(
                    400,
                    f"the user message is over {limits.max_task_chars} characters",
                    param="messages",
                )
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RequestError(
                    400,
                    f"the user message is not valid Unicode: {exc.reason} at character {exc.start}",
                    param="messages",
                ) from None
            return text
    raise RequestError(400, "no message with role 'user' in 'messages'", param="messages")


# ----- metrics

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, value: float) -> None:
        self.sum, self.count = self.sum + value, self.count + 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [
            f'{name}_bucket{{{labels}{sep}le="{b:g}"}} {c}'
            for b, c in zip(self.buckets, self.counts, strict=True)
        ]
        tag = f"{{{labels}}}" if labels else ""
        return [
            *out,
            f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}',
            f"{name}_sum{tag} {self.sum:.6f}",
            f"{name}_count{tag} {self.count}",
        ]


class Metrics:
    """Counters for ``/metrics`` in Prometheus' text format (written by hand: a few series)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self.latency: dict[str, _Histogram] = {}
        self.tokens = {"prompt": 0, "completion": 0}
        self.batches = _Histogram(_BATCH_BUCKETS)

    def request(self, method: str, route: str, status: int, seconds: float) -> None:
        with self.lock:
            self.requests[method, route, status] += 1
            self.latency.setdefault(route, _Histogram(_LATENCY_BUCKETS)).observe(seconds)

    def result(self, result: TeamResult) -> None:
        with self.lock:
            self.tokens["prompt"] += sum(t.prompt_tokens for t in result.transcript)
            self.tokens["completion"] += sum(t.completion_tokens for t in result.transcript)

    def batch(self, size: int) -> None:
        with self.lock:
            self.batches.observe(size)

    def render(self, pending: int) -> str:
        with self.lock:
            out = [
                "# HELP marl_requests_total HTTP requests answered.",
                "# TYPE marl_requests_total counter",
            ]
            out += [
                f'marl_requests_total{{method="{m}",route="{r}",status="{s}"}} {n}'
                for (m, r, s), n in sorted(self.requests.items())
            ]
            out += [
                "# HELP marl_request_duration_seconds Time to the last byte of the answer.",
                "# TYPE marl_request_duration_seconds histogram",
            ]
            for route, hist in sorted(self.latency.items()):
                out += hist.lines("marl_request_duration_seconds", f'route="{route}"')
            out += [
                "# HELP marl_tokens_total Tokens the team's models read and wrote.",
                "# TYPE marl_tokens_total counter",
            ]
            out += [f'marl_tokens_total{{kind="{k}"}} {n}' for k, n in self.tokens.items()]
            out += [
                "# HELP marl_batch_size Requests per Team.run_batch call.",
                "# TYPE marl_batch_size histogram",
                *self.batches.lines("marl_batch_size"),
            ]
            out += [
                "# HELP marl_pending_requests Requests waiting or running.",
                "# TYPE marl_pending_requests gauge",
                f"marl_pending_requests {pending}",
            ]
        return "\n".join(out) + "\n"


# ----- the batcher


@dataclass
class _Job:
    """A client's task: its turns, then its TeamResult or RequestError, arrive on ``events``
    (an asyncio queue of the server's loop, fed from the batcher thread)."""

    task: str
    loop: asyncio.AbstractEventLoop
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
        self.queue: queue.Queue[_Job | None] = queue.Queue()
        self.pending = 0  # submitted and not yet answered
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name="team-batcher", daemon=True)
        self.thread.start()

    def submit(self, task: str, loop: asyncio.AbstractEventLoop) -> _Job:
        with self._lock:
            if self.pending >= self.max_queue:
                raise RequestError(
                    429,
                    f"{self.pending} requests are waiting; try again later",
                    code="rate_limit_exceeded",
                )
            self.pending += 1
        job = _Job(task, loop)
        self.queue.put(job)
        return job

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
            self.metrics.batch(len(jobs))
            self._run(jobs)
            with self._lock:
                self.pending -= len(jobs)

    def _run(self, jobs: list[_Job]) -> None:
        """One ``run_batch``; if it raises, each job again on its own, so one bad request
        fails alone.  A rerun streams only the turns beyond those its client already has."""
        seen = [0] * len(jobs)

        def on_turn(i: int, turn: NodeMessage) -> None:
            seen[i] += 1
            if seen[i] > jobs[i].turns_sent:
                jobs[i].turns_sent += 1
                jobs[i].put(turn)

        try:
            results = self.team.run_batch([j.task for j in jobs], on_turn=on_turn)
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


# ----- the app


def _usage(result: TeamResult) -> dict[str, int]:
    prompt = sum(t.prompt_tokens for t in result.transcript)
    completion = sum(t.completion_tokens for t in result.transcript)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _pieces(text: str, size: int = 4) -> list[str]:
    """The answer in a few word groups (the team answers at once; clients join deltas)."""
    words = text.split(" ")
    return [
        " ".join(words[i : i + size]) + (" " if i + size < len(words) else "")
        for i in range(0, len(words), size)
    ] or [""]


def _validation_error(exc: RequestValidationError) -> RequestError:
    """FastAPI's validation errors as one OpenAI-style 400 naming the first bad field."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    if first["type"] == "json_invalid":
        return RequestError(400, f"the body is not valid JSON: {first['msg']}")
    loc = [str(p) for p in first["loc"] if p != "body"]
    if not loc and first["type"] in ("model_attributes_type", "dict_type", "missing"):
        return RequestError(400, "the body must be a JSON object")
    param = ".".join(loc) or None
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return RequestError(400, f"{param or 'body'}: {first['msg']}{more}", param=param)


class _Guard:
    """ASGI middleware in front of every route: the API key (constant-time comparison; the
    ``public`` paths, the API docs, need none), the body bound (413 before the app reads
    past it), and each answer's status and time to its last byte in :class:`Metrics`."""

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

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status, limit = time.perf_counter(), [500], self.limits.max_body_bytes
        headers = dict(scope["headers"])
        received = 0

        async def counted_receive() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:  # FastAPI passes HTTPExceptions from body reading through
                raise StarletteHTTPException(413, f"the request body is over {limit} bytes")
            return message

        async def observed_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                route = getattr(scope.get("route"), "path", "other")
                self.metrics.request(scope["method"], route, status[0], time.perf_counter() - start)

        length = headers.get(b"content-length", b"0")
        if (
            self.expected is not None
            and scope["path"] not in self.public
            and not hmac.compare_digest(headers.get(b"authorization", b""), self.expected)
        ):
            error = RequestError(
                401, "missing or wrong API key (Authorization: Bearer ...)", code="invalid_api_key"
            )
        elif length.isdigit() and int(length) > limit:
            error = RequestError(413, f"the request body is over {limit} bytes")
        else:
            await self.app(scope, counted_receive, observed_send)
            return
        response = error.response()
        response.headers["Connection"] = "close"  # the unread body must not become a request
        await response(scope, receive, observed_send)


def create_app(  # noqa: C901 (to split)
    team: Team,
    *,
    api_key: str | None = None,
    max_batch: int = 16,
    model_id: str | None = None,
    limits: Limits = Limits(),
) -> FastAPI:
    """The ASGI app serving ``team``; its batcher thread stops when the app shuts down."""
    model_id = model_id or team.name
    created = int(time.time())
    metrics = Metrics()
    batcher = TeamBatcher(team, max_batch, max_queue=limits.max_queue, metrics=metrics)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        batcher.close()

    async def on_request_error(_request: Request, exc: RequestError) -> JSONResponse:
        return exc.response()

    async def on_invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code in (404, 405):
            return RequestError(
                exc.status_code,
                f"no route {request.method} {request.url.path}",
                code="not_found" if exc.status_code == 404 else "method_not_allowed",
            ).response()
        return RequestError(exc.status_code, str(exc.detail)).response()

    app = FastAPI(
        title=f"marl-teams: {model_id}",
        lifespan=lifespan,
        description="An OpenAI-compatible API for a team of LLM agents.",
        exception_handlers={
            RequestError: on_request_error,
            RequestValidationError: on_invalid,
            StarletteHTTPException: on_http_error,
        },
    )
    app.state.batcher, app.state.metrics, app.state.model_id = batcher, metrics, model_id
    public = frozenset(
        p
        for p in (app.docs_url, app.openapi_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)
        if p
    )
    app.add_middleware(_Guard, limits=limits, metrics=metrics, api_key=api_key, public=public)

    model_card = {"id": model_id, "object": "model", "created": created, "owned_by": "marl-teams"}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "team": team.name}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card]}

    @app.get("/v1/models/{model}")
    async def model(model: str) -> dict[str, Any]:
        if model != model_id:
            raise RequestError(404, f"model {model!r} is not served here", code="not_found")
        return model_card

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(
            metrics.render(batcher.pending), media_type="text/plain; version=0.0.4"
        )

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest) -> JSONResponse | StreamingResponse:
        if body.model is not None and body.model != model_id:
            raise RequestError(
                404,
                f"model {body.model!r} is not served here; this server serves {model_id!r}",
                code="model_not_found",
                param="model",
            )
        task = last_user_message(body.messages, limits)
        job = batcher.submit(task, asyncio.get_running_loop())
        meta = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": model_id,
        }
        deadline = time.monotonic() + limits.request_timeout_s
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(
                _sse(job, meta, usage, deadline),
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
            )
        while True:
            item = await _next(job, deadline)
            if isinstance(item, RequestError):
                return item.response()
            if isinstance(item, TeamResult):
                return JSONResponse(
                    {
                        **meta,
                        "object": "chat.completion",
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "logprobs": None,
                                "message": {"role": "assistant", "content": item.answer},
                            }
                        ],
                        "usage": _usage(item),
                        "marl": {
                            "messages": item.messages,
                            "decided_by": item.decided_by,
                            "transcript": [t.to_dict() for t in item.transcript],
                        },
                    }
                )

    return app


async def _next(job: _Job, deadline: float) -> NodeMessage | TeamResult | RequestError:
    """The job's next event, or a 504 once the request has run past its time."""
    try:
        return await asyncio.wait_for(job.events.get(), max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        return RequestError(504, "the team did not answer in time", code="timeout")


async def _sse(
    job: _Job, meta: dict[str, Any], include_usage: bool, deadline: float
) -> AsyncIterator[str]:
    """The job's events as server-sent ``chat.completion.chunk`` events."""
    meta = {**meta, "object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        return (
            "data: "
            + json.dumps(
                {
                    **meta,
                    "choices": [
                        {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                    ],
                    **extra,
                }
            )
            + "\n\n"
        )

    yield chunk({"role": "assistant", "content": ""})
    while isinstance(item := await _next(job, deadline), NodeMessage):
        yield f": {item.node} done\n\n"  # an SSE comment: progress for proxies, skipped by clients
        yield chunk(
            {"reasoning_content": f"{item.node}: {item.text}\n\n"},
            marl={"turn": {"node": item.node, **item.to_dict()}},
        )
    if isinstance(item, RequestError):
        yield (
            "data: "
            + json.dumps({"error": {"message": str(item), "type": item.code, "code": item.code}})
            + "\n\n"
        )
        return
    for piece in _pieces(item.answer):
        yield chunk({"content": piece})
    yield chunk({}, "stop")
    if include_usage:
        yield "data: " + json.dumps({**meta, "choices": [], "usage": _usage(item)}) + "\n\n"
    yield "data: [DONE]\n\n"


# ----- the server


class _H11WithHeaderTimeout(H11Protocol):
    """uvicorn's h11 protocol, closing a connection that has not sent a whole request head
    within ``header_timeout_s`` (uvicorn times out idle kept-alive connections only)."""

    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _head_timeout(self) -> None:
        if self.cycle is None and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)


class ServeError(Exception):
    """The server cannot start: its address is taken or not this machine's."""


#: Hosts only this machine reaches; any other is served with a warning unless a key guards it.
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class TeamServer:
    """uvicorn serving :func:`create_app` on a socket bound at construction (so ``port=0``
    has its port, and a taken address fails here); ``url`` is the OpenAI ``base_url``."""

    def __init__(
        self,
        team: Team,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        limits: Limits = Limits(),
        **app_kwargs: Any,
    ) -> None:
        self.app = create_app(team, limits=limits, **app_kwargs)
        self.batcher: TeamBatcher = self.app.state.batcher
        self.model_id: str = self.app.state.model_id
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(2048)
        except OSError:
            self.socket.close()
            self.batcher.close()
            raise
        self.server_address = self.socket.getsockname()
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                log_level="warning",
                access_log=False,
                lifespan="on",
                http=functools.partial(
                    _H11WithHeaderTimeout, header_timeout_s=limits.header_timeout_s
                ),
                timeout_keep_alive=limits.keep_alive_s,
                limit_concurrency=limits.max_connections,
                h11_max_incomplete_event_size=limits.max_header_bytes,
                timeout_graceful_shutdown=5,
            )
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"

    def serve_forever(self) -> None:
        """Serve on this thread until SIGINT/SIGTERM (uvicorn's handlers), then shut down."""
        self.server.run(sockets=[self.socket])

    def start(self) -> None:
        """Serve on a background thread (tests, notebooks); stop with :meth:`stop`."""
        self._thread = threading.Thread(target=self.serve_forever, name="team-server", daemon=True)
        self._thread.start()
        while not self.server.started and self._thread.is_alive():
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.socket.close()
        self.batcher.close()

    def __enter__(self) -> TeamServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def make_server(team: Team, host: str = "127.0.0.1", port: int = 8000, **kwargs: Any) -> TeamServer:
    """A bound (not yet serving) server; ``port=0`` picks a free port (see ``.url``)."""
    return TeamServer(team, host, port, **kwargs)


def serve(
    team: Team,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    api_key: str | None = None,
    **kwargs: Any,
) -> None:
    """Serve until Ctrl-C: print the URL once bound (stdout, one line, so a parent process can
    read it), warn on stderr when a non-loopback host is open without ``api_key``."""
    try:
        server = make_server(team, host, port, api_key=api_key, **kwargs)
    except OSError as exc:
        raise ServeError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    if host not in LOOPBACK and api_key is None:
        print(
            f"warning: serving on {host} without an API key: whoever reaches it can run the team",
            file=sys.stderr,
            flush=True,
        )
    print(
        f"serving team {team.name!r} on {server.url} (model {server.model_id!r}); Ctrl-C to stop",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # uvicorn shut down, then raised the signal again
        pass
    finally:
        server.stop()


__all__ = [
    "LOOPBACK",
    "ChatCompletionRequest",
    "Limits",
    "Metrics",
    "RequestError",
    "ServeError",
    "TeamBatcher",
    "TeamServer",
    "create_app",
    "last_user_message",
    "make_server",
    "serve",
]
