"""The team server's FastAPI app: routes, server-sent events, behind :class:`.guard.Guard`.

- ``GET /v1/models``: the one model served, named after the team, with what the team was
  made for under ``marl`` (a game team also says ``X-Marl-Game-Team: <game>`` in every
  answer: served, its agents write free text, which they were not trained for);
- ``POST /v1/chat/completions``: the team runs on the last user message and its answer is the
  assistant message (``n`` runs, ``n`` choices; the sampling parameters of :mod:`.sampling`);
  ``stream: true`` answers with server-sent events
  (``chat.completion.chunk`` objects, then ``data: [DONE]``): each agent's turn as it finishes
  (``delta.reasoning_content``, the turn itself under ``marl.turn``, and an SSE comment so
  proxies see progress), then the answer as ``delta.content``;
  ``stream_options.include_usage`` adds a usage chunk;
- ``GET /health``, ``GET /metrics`` (Prometheus text format), ``GET /docs`` (the API schema).

``api_key`` makes every route but the docs require ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import asyncio
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
    game_of,
    last_user_message,
    usage,
    validation_error,
)
from marl.orchestrator.serving.batcher import Job, TeamBatcher
from marl.orchestrator.serving.guard import Guard
from marl.orchestrator.serving.metrics import Metrics
from marl.orchestrator.serving.sampling import (
    Sampling,
    finish_reason,
    stopped,
    unsupported,
)
from marl.orchestrator.team import NodeMessage, Team, TeamResult


def _pieces(text: str, size: int = 4) -> list[str]:
    """The answer in a few word groups (the team answers at once; clients join deltas)."""
    words = text.split(" ")
    return [
        " ".join(words[i : i + size]) + (" " if i + size < len(words) else "")
        for i in range(0, len(words), size)
    ] or [""]


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
    app.add_middleware(Guard, limits=limits, metrics=metrics, api_key=api_key, public=public)
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


def _model_card(team: Team, model_id: str) -> dict[str, Any]:
    """The ``/v1/models`` entry; under ``marl``, what the team was made for and how it is
    served (a game team answers chat messages in free text, which it was not trained for)."""
    game = game_of(team)
    return {
        "id": model_id,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "marl-teams",
        "marl": {
            "team": team.name,
            "made_for": "game" if game is not None else "task",
            "game": team.cfg.game.name,
            "served_as": "free-text chat",
        },
    }


def _add_routes(app: FastAPI, team: Team, limits: Limits) -> None:
    batcher: TeamBatcher = app.state.batcher
    metrics: Metrics = app.state.metrics
    model_id: str = app.state.model_id
    model_card = _model_card(team, model_id)
    game = game_of(team)
    # every answer of a game team says so: its agents were trained to play, not to chat
    headers = {} if game is None else {"X-Marl-Game-Team": game}

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
        response = await _complete(body, team, batcher, model_id, limits)
        response.headers.update(headers)
        return response


def _sampling(body: ChatCompletionRequest, team: Team, limits: Limits) -> Sampling:
    """The request's sampling, refused (400, naming the parameter) where the team cannot
    honour it."""
    if body.n > limits.max_choices:
        raise RequestError(400, f"n is over {limits.max_choices}", param="n")
    if body.n > 1 and body.stream:
        raise RequestError(400, "n > 1 is not streamed; ask without stream", param="n")
    sampling = Sampling.of(body)
    refused = unsupported(team, sampling)
    if refused is not None:
        param, why = refused
        raise RequestError(400, f"{param}: {why}", param=param)
    return sampling


async def _complete(
    body: ChatCompletionRequest, team: Team, batcher: TeamBatcher, model_id: str, limits: Limits
) -> JSONResponse | StreamingResponse:
    """``POST /v1/chat/completions``: the team's answers (``n``), whole or as server-sent
    events."""
    if body.model is not None and body.model != model_id:
        raise RequestError(
            404,
            f"model {body.model!r} is not served here; this server serves {model_id!r}",
            code="model_not_found",
            param="model",
        )
    task = last_user_message(body.messages, limits)
    sampling = _sampling(body, team, limits)
    samplings = [sampling.choice(i) for i in range(body.n)]
    jobs = batcher.submit(task, asyncio.get_running_loop(), samplings)
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model_id}
    deadline = time.monotonic() + limits.request_timeout_s
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(
            _sse(jobs[0], meta, include_usage, deadline, body.stop),
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
    results = []
    for job in jobs:
        while isinstance(item := await _next(job, deadline), NodeMessage):
            pass
        if isinstance(item, RequestError):
            return item.response()
        results.append(item)
    return JSONResponse(_completion(meta, results, samplings, body.stop))


def _choice(i: int, result: TeamResult, sampling: Sampling, stops: list[str]) -> dict[str, Any]:
    answer, found = stopped(result.answer, stops)
    return {
        "index": i,
        "finish_reason": finish_reason(result, sampling, found),
        "logprobs": None,
        "message": {"role": "assistant", "content": answer},
    }


def _completion(
    meta: dict[str, Any], results: list[TeamResult], samplings: list[Sampling], stops: list[str]
) -> dict[str, Any]:
    """A ``chat.completion`` object, a choice per result; usage sums them, and the first
    one's messages and transcript are under ``marl``."""
    totals = [usage(r) for r in results]
    first = results[0]
    return {
        **meta,
        "object": "chat.completion",
        "choices": [
            _choice(i, r, s, stops) for i, (r, s) in enumerate(zip(results, samplings, strict=True))
        ],
        "usage": {k: sum(t[k] for t in totals) for k in totals[0]},
        "marl": {
            "messages": first.messages,
            "decided_by": first.decided_by,
            "transcript": [t.to_dict() for t in first.transcript],
        },
    }


async def _next(job: Job, deadline: float) -> NodeMessage | TeamResult | RequestError:
    """The job's next event, or a 504 once the request has run past its time."""
    try:
        return await asyncio.wait_for(job.events.get(), max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        return RequestError(504, "the team did not answer in time", code="timeout")


async def _sse(
    job: Job, meta: dict[str, Any], include_usage: bool, deadline: float, stops: list[str]
) -> AsyncIterator[str]:
    """The job's events as server-sent ``chat.completion.chunk`` events (its answer cut at
    the first of ``stops``)."""
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
    answer, found = stopped(item.answer, stops)
    for piece in _pieces(answer):
        yield chunk({"content": piece})
    yield chunk({}, finish_reason(item, job.sampling, found))
    if include_usage:
        yield "data: " + json.dumps({**meta, "choices": [], "usage": usage(item)}) + "\n\n"
    yield "data: [DONE]\n\n"
