"""The OpenAI wire format of the team server: request bodies, errors and usage.

:class:`Limits` bounds what one client can hold: body and header size, message count and
length, queue length, connection count, the time to send request headers and the time a
request may take.  Sampling parameters of a request (temperature, max_tokens, ...) are accepted
and ignored: each role decodes as its config says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from marl.orchestrator.team import TeamResult, message_text


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


def usage(result: TeamResult) -> dict[str, int]:
    prompt = sum(t.prompt_tokens for t in result.transcript)
    completion = sum(t.completion_tokens for t in result.transcript)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def validation_error(exc: RequestValidationError) -> RequestError:
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
