"""The OpenAI wire format of the team server: request bodies, errors and usage.

:class:`Limits` bounds what one client can hold: body and header size, message count and
length, choices per request, queue length, requests at once, the time to send request headers
and body and the time a request may take.

A request's sampling parameters (:data:`SAMPLING`: temperature, top_p, max_tokens or
max_completion_tokens, n, stop, seed) are honoured (:mod:`.sampling`); any other parameter is
a 400 naming it, unless it is one OpenAI clients send with its neutral value
(:data:`NEUTRAL`).  Message content is a string or a list of OpenAI text parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from marl.games.tasks import task_names
from marl.orchestrator.team import Team, TeamResult, message_text


@dataclass(frozen=True)
class Limits:
    """What one client may take of the server; over a limit it gets a 4xx, never a hang."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_header_bytes: int = 16 * 1024  # h11's incomplete-event limit: a request line + headers
    max_messages: int = 1024
    max_task_chars: int = 200_000
    max_choices: int = 8  # n
    max_queue: int = 1024  # team runs waiting or running; 429 beyond
    max_requests: int = 2048  # requests being read or answered at once; 503 beyond (not /health)
    header_timeout_s: float = 10.0  # a connection that sends no complete request head is closed
    body_timeout_s: float = 30.0  # a request whose body has not all come by then gets a 408
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
    """One OpenAI chat message; fields the team does not read (name, tool calls) may come.
    Its content is text: a string, or a list of ``{"type": "text", "text": ...}`` parts."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, content: str | list[dict[str, Any]] | None) -> Any:
        for i, part in enumerate(content if isinstance(content, list) else []):
            if part.get("type") != "text":
                raise ValueError(
                    f"part {i} is of type {part.get('type')!r}: this team reads text parts only"
                )
            if not isinstance(part.get("text"), str):
                raise ValueError(f"part {i} needs a string 'text'")
        return content


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


#: The sampling parameters the server honours.
SAMPLING = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "n", "stop", "seed")
#: Parameters the server does not support, accepted only with these neutral values (what
#: clients send by default); a parameter sent as null is absent.
NEUTRAL: dict[str, Any] = {
    "logprobs": False,
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "tools": [],
}


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``: the messages and the sampling parameters honoured
    (:data:`SAMPLING`); anything else is refused by name."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, le=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=4096)
    n: int = Field(1, ge=1)
    stop: list[str] = Field(default_factory=list, max_length=4)
    seed: int | None = Field(None, ge=0, lt=2**63)
    user: str | None = None  # an end user's id, for the operator: no effect on the answer

    @model_validator(mode="before")
    @classmethod
    def _drop_neutral(cls, data: Any) -> Any:
        """Nulls and :data:`NEUTRAL` values are the defaults they stand for."""
        if not isinstance(data, dict):
            return data
        return {
            k: v for k, v in data.items() if v is not None and (k not in NEUTRAL or v != NEUTRAL[k])
        }

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, stop: Any) -> Any:
        """A string is a list of one."""
        return [stop] if isinstance(stop, str) else stop

    @field_validator("stop")
    @classmethod
    def _stops(cls, stops: list[str]) -> list[str]:
        if any(not s for s in stops):
            raise ValueError("stop strings may not be empty")
        return stops


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


def game_of(team: Team) -> str | None:
    """The game ``team`` was made to play, when it is one rather than a cooperative task:
    served, its agents answer chat messages in free text, which they were not trained for."""
    name = team.cfg.game.name
    return None if name in task_names() else name


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
    if first["type"] == "extra_forbidden":
        return RequestError(
            400,
            f"unsupported parameter {param!r}: this server honours "
            f"{', '.join(SAMPLING)}, stream and stream_options",
            param=param,
        )
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return RequestError(400, f"{param or 'body'}: {first['msg']}{more}", param=param)
