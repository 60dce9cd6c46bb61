"""Serve a team behind an OpenAI-compatible API (standard library HTTP server, no extra deps).

- ``GET /v1/models``: the one model served, named after the team;
- ``POST /v1/chat/completions``: the team runs on the last user message and its answer is the
  assistant message; ``stream: true`` answers with server-sent events (``chat.completion.chunk``
  objects, then ``data: [DONE]``), sending an SSE comment per finished agent turn meanwhile
  so proxies do not time out; ``stream_options.include_usage`` adds a usage chunk.
- ``GET /health``.

Concurrent requests are batched: a worker thread takes every request waiting (up to
``max_batch``) and runs them with one :meth:`Team.run_batch`, so their turns share model calls.
Sampling parameters of the request (temperature, max_tokens, ...) are ignored: each role
decodes as its config says.  The server binds 127.0.0.1 unless told otherwise; ``api_key``
makes it require ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from orchestrator.team import NodeMessage, Team, TeamResult, message_text

MAX_BODY = 4 * 1024 * 1024
_DONE = object()


class RequestError(Exception):
    """A bad request, answered in OpenAI's error format."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


def last_user_message(messages: Any) -> str:
    """The task: the text of the last ``user`` message of an OpenAI ``messages`` list."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list", param="messages")
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if not isinstance(content, str | list):
                raise RequestError(400, "a user message needs text 'content'", param="messages")
            return message_text(content)
    raise RequestError(400, "no message with role 'user' in 'messages'", param="messages")


@dataclass
class _PendingRequest:
    """A client's task waiting for the batcher: its result arrives on ``future``."""

    task: str
    future: Future = field(default_factory=Future)
    events: queue.Queue | None = None  # turns as they finish, for streaming


class TeamBatcher:
    """Runs queued tasks in batches on one worker thread (the team's models are not
    thread-safe, and batching is what makes concurrent clients cheap)."""

    def __init__(self, team: Team, max_batch: int = 16) -> None:
        self.team, self.max_batch = team, max_batch
        self.queue: queue.Queue[_PendingRequest | None] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="team-batcher", daemon=True)
        self.thread.start()

    def submit(self, task: str, stream: bool = False) -> _PendingRequest:
        job = _PendingRequest(task, events=queue.Queue() if stream else None)
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
            self._run(jobs)

    def _run(self, jobs: list[_PendingRequest]) -> None:
        def on_turn(i: int, turn: NodeMessage) -> None:
            if jobs[i].events is not None:
                jobs[i].events.put(turn)

        try:
            results = self.team.run_batch([j.task for j in jobs], on_turn=on_turn)
        except Exception as exc:  # every waiting client gets the error, the server lives on
            for j in jobs:
                j.future.set_exception(exc)
        else:
            for j, r in zip(jobs, results, strict=True):
                j.future.set_result(r)
        for j in jobs:
            if j.events is not None:
                j.events.put(_DONE)


class TeamServer(ThreadingHTTPServer):
    """An HTTP server for one team; ``url`` is the OpenAI ``base_url``."""

    daemon_threads = True

    def __init__(self, team: Team, host: str = "127.0.0.1", port: int = 8000, *,
                 model_id: str | None = None, api_key: str | None = None,
                 max_batch: int = 16) -> None:
        self.team = team
        self.model_id = model_id or team.name
        self.api_key = api_key
        self.created = int(time.time())
        self.batcher = TeamBatcher(team, max_batch)
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> threading.Thread:
        """Serve on a background thread (tests, notebooks); stop with :meth:`stop`."""
        thread = threading.Thread(target=self.serve_forever, name="team-server", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.batcher.close()

    def __enter__(self) -> TeamServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def make_server(team: Team, host: str = "127.0.0.1", port: int = 8000,
                **kwargs: Any) -> TeamServer:
    """A bound (not yet serving) server; ``port=0`` picks a free port (see ``.url``)."""
    return TeamServer(team, host, port, **kwargs)


class _Handler(BaseHTTPRequestHandler):
    server: TeamServer
    protocol_version = "HTTP/1.1"
    server_version = "marl-teams"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        pass  # quiet by default; the CLI prints one line at start

    # ----- plumbing
    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, err: RequestError) -> None:
        self._send_json(err.status, {"error": {"message": str(err), "type": err.code,
                                               "param": err.param, "code": err.code}})

    def _authorized(self) -> bool:
        key = self.server.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._error(RequestError(401, "missing or wrong API key (Authorization: Bearer ...)",
                                 code="invalid_api_key"))
        return False

    def _read_body(self) -> bytes:
        """Read the whole body first, whatever the answer will be: on a kept-alive connection
        an unread body would be parsed as the next request."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise RequestError(400, "bad Content-Length") from None
        if length > MAX_BODY:
            self.close_connection = True
            raise RequestError(413, f"request body over {MAX_BODY} bytes")
        return self.rfile.read(length) if length > 0 else b""

    @staticmethod
    def _json_body(raw: bytes) -> dict[str, Any]:
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object")
        return body

    # ----- routes
    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        if not self._authorized():
            return
        path = self.path.split("?", 1)[0].rstrip("/")
        model = {"id": self.server.model_id, "object": "model", "created": self.server.created,
                 "owned_by": "marl-teams"}
        if path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [model]})
        elif path == f"/v1/models/{self.server.model_id}":
            self._send_json(200, model)
        elif path == "/health":
            self._send_json(200, {"status": "ok", "team": self.server.team.name})
        else:
            self._error(RequestError(404, f"no route GET {path}", code="not_found"))

    def do_POST(self) -> None:  # noqa: N802 (stdlib naming)
        try:
            raw = self._read_body()
        except RequestError as err:
            self._error(err)
            return
        if not self._authorized():
            return
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            if path != "/v1/chat/completions":
                raise RequestError(404, f"no route POST {path}", code="not_found")
            body = self._json_body(raw)
            model = body.get("model", self.server.model_id)
            if model != self.server.model_id:
                raise RequestError(404, f"model {model!r} is not served here; this server "
                                        f"serves {self.server.model_id!r}",
                                   code="model_not_found", param="model")
            task = last_user_message(body.get("messages"))
            stream = bool(body.get("stream", False))
            usage = bool((body.get("stream_options") or {}).get("include_usage", False))
        except RequestError as err:
            self._error(err)
            return
        job = self.server.batcher.submit(task, stream=stream)
        if stream:
            self._stream(job, usage)
            return
        try:
            result: TeamResult = job.future.result()
        except Exception as exc:
            self._error(RequestError(500, f"the team failed: {exc}", code="server_error"))
            return
        self._send_json(200, self._completion(result))

    # ----- responses
    def _meta(self) -> dict[str, Any]:
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
                "model": self.server.model_id}

    @staticmethod
    def _usage(result: TeamResult) -> dict[str, int]:
        prompt = sum(t.prompt_tokens for t in result.transcript)
        completion = sum(t.completion_tokens for t in result.transcript)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    def _completion(self, result: TeamResult) -> dict[str, Any]:
        return {**self._meta(), "object": "chat.completion",
                "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                             "message": {"role": "assistant", "content": result.answer}}],
                "usage": self._usage(result),
                "marl": {"messages": result.messages, "decided_by": result.decided_by,
                         "transcript": [t.to_dict() for t in result.transcript]}}

    def _stream(self, job: _PendingRequest, include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        meta = {**self._meta(), "object": "chat.completion.chunk"}

        def event(data: str) -> None:
            self.wfile.write(data.encode())
            self.wfile.flush()

        def chunk(delta: dict[str, Any], finish: str | None = None) -> None:
            event("data: " + json.dumps({**meta, "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})
                  + "\n\n")

        try:
            chunk({"role": "assistant", "content": ""})
            assert job.events is not None
            while (item := job.events.get()) is not _DONE:
                event(f": {item.node} done\n\n")  # an SSE comment: clients skip it
            try:
                result: TeamResult = job.future.result()
            except Exception as exc:
                event("data: " + json.dumps({"error": {"message": f"the team failed: {exc}",
                                                       "type": "server_error"}}) + "\n\n")
                return
            for piece in _pieces(result.answer):
                chunk({"content": piece})
            chunk({}, "stop")
            if include_usage:
                event("data: " + json.dumps({**meta, "choices": [],
                                             "usage": self._usage(result)}) + "\n\n")
            event("data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; the batch it was in still completes for the others


def _pieces(text: str, size: int = 4) -> list[str]:
    """The answer in a few word groups (the team answers at once; clients join deltas)."""
    words = text.split(" ")
    return [" ".join(words[i:i + size]) + (" " if i + size < len(words) else "")
            for i in range(0, len(words), size)] or [""]


class ServeError(Exception):
    """The server cannot start: its address is taken or not this machine's."""


#: Hosts only this machine reaches; any other is served with a warning unless a key guards it.
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def serve(team: Team, host: str = "127.0.0.1", port: int = 8000, *, api_key: str | None = None,
          **kwargs: Any) -> None:
    """Serve until Ctrl-C: print the URL once bound (stdout, one line, so a parent process can
    read it), warn on stderr when a non-loopback host is open without ``api_key``."""
    try:
        server = make_server(team, host, port, api_key=api_key, **kwargs)
    except OSError as exc:
        raise ServeError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    if host not in LOOPBACK and api_key is None:
        print(f"warning: serving on {host} without an API key: whoever reaches it can run "
              "the team", file=sys.stderr, flush=True)
    print(f"serving team {team.name!r} on {server.url} (model {server.model_id!r}); "
          "Ctrl-C to stop", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.batcher.close()


__all__ = ["LOOPBACK", "RequestError", "ServeError", "TeamBatcher", "TeamServer",
           "last_user_message", "make_server", "serve"]
