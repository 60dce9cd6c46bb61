"""The team server's FastAPI app: routes, server-sent events and the guard middleware.

- ``GET /v1/models``: the one model served, named after the team;
- ``POST /v1/chat/completions``: the team runs on the last user message and its answer is the
  assistant message; ``stream: true`` answers with server-sent events
  (``chat.completion.chunk`` objects, then ``data: [DONE]``): each agent's turn as it finishes
  (``delta.reasoning_content``, the turn itself under ``marl.turn``, and an SSE comment so
  proxies see progress), then the answer as ``delta.content``;
  ``stream_options.include_usage`` adds a usage chunk;
- ``GET /health``, ``GET /metrics`` (Prometheus text format), ``GET /docs`` (the API schema).

``api_key`` makes every route but the docs require ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from marl.orchestrator.serving.api import (
    ChatCompletionRequest,
    Limits,
    RequestError,
    last_user_message,
    usage,
    validation_error,
)
from marl.orchestrator.serving.batcher import Job, TeamBatcher
from marl.orchestrator.serving.metrics import Metrics
from marl.orchestrator.team import NodeMessage, Team, TeamResult


def _pieces(text: str, size: int = 4) -> list[str]:
    """The answer in a few word groups (the team answers at once; clients join deltas)."""
    words = text.split(" ")
    return [
        " ".join(words[i : i + size]) + (" " if i + size < len(words) else "")
        for i in range(0, len(words), size)
    ] or [""]


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


def create_app(
    team: Team,
    *,
    api_key: str | None = None,
    max_batch: int = 16,
    model_id: str | None = None,
    limits: Limits = Limits(),
) -> FastAPI:
    """The ASGI app serving ``team``; its batcher thread stops when the app shuts down."""
    model_id = model_id or team.name
    metrics = Metrics()
    batcher = TeamBatcher(team, max_batch, max_queue=limits.max_queue, metrics=metrics)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        batcher.close()

    app = FastAPI(
        title=f"marl-teams: {model_id}",
        lifespan=lifespan,
        description="An OpenAI-compatible API for a team of LLM agents.",
        exception_handlers=ERROR_HANDLERS,
    )
    app.state.batcher, app.state.metrics, app.state.model_id = batcher, metrics, model_id
    public = frozenset(
        p
        for p in (app.docs_url, app.openapi_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)
        if p
    )
    app.add_middleware(_Guard, limits=limits, metrics=metrics, api_key=api_key, public=public)
    _add_routes(app, team, limits)
    return app


async def _on_request_error(_request: Request, exc: RequestError) -> JSONResponse:
    return exc.response()


async def _on_invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
    return validation_error(exc).response()


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code in (404, 405):
        return RequestError(
            exc.status_code,
            f"no route {request.method} {request.url.path}",
            code="not_found" if exc.status_code == 404 else "method_not_allowed",
        ).response()
    return RequestError(exc.status_code, str(exc.detail)).response()


#: Every error the app answers, in OpenAI's error format.
ERROR_HANDLERS: dict[Any, Callable] = {
    RequestError: _on_request_error,
    RequestValidationError: _on_invalid,
    StarletteHTTPException: _on_http_error,
}


def _add_routes(app: FastAPI, team: Team, limits: Limits) -> None:
    batcher: TeamBatcher = app.state.batcher
    metrics: Metrics = app.state.metrics
    model_id: str = app.state.model_id
    model_card = {
        "id": model_id,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "marl-teams",
    }

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

    @app.get("/metrics", response_class=Response)
    async def prometheus() -> Response:
        return Response(metrics.render(batcher.pending), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest) -> JSONResponse | StreamingResponse:
        return await _complete(body, batcher, model_id, limits)


async def _complete(
    body: ChatCompletionRequest, batcher: TeamBatcher, model_id: str, limits: Limits
) -> JSONResponse | StreamingResponse:
    """``POST /v1/chat/completions``: the team's answer, whole or as server-sent events."""
    if body.model is not None and body.model != model_id:
        raise RequestError(
            404,
            f"model {body.model!r} is not served here; this server serves {model_id!r}",
            code="model_not_found",
            param="model",
        )
    task = last_user_message(body.messages, limits)
    job = batcher.submit(task, asyncio.get_running_loop())
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model_id}
    deadline = time.monotonic() + limits.request_timeout_s
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(
            _sse(job, meta, include_usage, deadline),
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
    while True:
        item = await _next(job, deadline)
        if isinstance(item, RequestError):
            return item.response()
        if isinstance(item, TeamResult):
            return JSONResponse(_completion(meta, item))


def _completion(meta: dict[str, Any], result: TeamResult) -> dict[str, Any]:
    """A ``chat.completion`` object; the team's messages and transcript under ``marl``."""
    return {
        **meta,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "logprobs": None,
                "message": {"role": "assistant", "content": result.answer},
            }
        ],
        "usage": usage(result),
        "marl": {
            "messages": result.messages,
            "decided_by": result.decided_by,
            "transcript": [t.to_dict() for t in result.transcript],
        },
    }


async def _next(job: Job, deadline: float) -> NodeMessage | TeamResult | RequestError:
    """The job's next event, or a 504 once the request has run past its time."""
    try:
        return await asyncio.wait_for(job.events.get(), max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        return RequestError(504, "the team did not answer in time", code="timeout")


async def _sse(
    job: Job, meta: dict[str, Any], include_usage: bool, deadline: float
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
        yield "data: " + json.dumps({**meta, "choices": [], "usage": usage(item)}) + "\n\n"
    yield "data: [DONE]\n\n"
