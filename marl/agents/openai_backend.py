"""A policy served by any OpenAI-compatible ``/v1/chat/completions`` endpoint.

Hosted models, a local server (vLLM, llama.cpp, ``marl serve``) or a judge can then sit in a
seat.  Only free decoding: the chat API samples text and cannot score arbitrary candidates.
Requests of one batch go out concurrently on a thread pool.

A failed endpoint is never an answer: a game would count an empty text as the model's
unparsed move and a team would return it.  Connection errors, timeouts, 429 and 5xx are
retried with exponential backoff (``tries`` attempts, ``backoff * 2**k`` seconds between
them); then, or at once for any other 4xx or a malformed answer, :class:`EndpointError` names
the URL and the cause.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from marl.agents.policy import Request, Response, register_backend


class EndpointError(RuntimeError):
    """A hosted endpoint that could not answer; the message names its URL and the cause."""


def _retryable(status: int) -> bool:
    return status == 429 or status >= 500


def _server_message(r: httpx.Response) -> str:
    """The error text of an answer: OpenAI's ``error.message`` when present, else the body."""
    try:
        error = r.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return str(message or r.text.strip()[:200] or r.reason_phrase)


def _usage(usage: object) -> tuple[int, int] | None:
    """``(prompt_tokens, completion_tokens)`` of an answer's ``usage``, when it has them."""
    try:
        return int(usage["prompt_tokens"]), int(usage["completion_tokens"])  # type: ignore
    except (KeyError, TypeError, ValueError):
        return None


class OpenAIPolicy:
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        temperature: float = 1.0,
        max_new_tokens: int = 64,
        timeout: float = 60.0,
        max_workers: int = 8,
        seed: int | None = None,
        tries: int = 3,
        backoff: float = 0.5,
    ) -> None:
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        if api_key_env and not key:
            raise ValueError(f"environment variable {api_key_env} (the API key) is not set")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.url = base_url.rstrip("/")
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self.model, self.temperature, self.max_new_tokens = model, temperature, max_new_tokens
        self.seed = seed
        self.tries, self.backoff = max(1, tries), backoff
        self.pool = ThreadPoolExecutor(max_workers=max_workers)
        self.errors = 0  # failed attempts, retried ones included: a flaky endpoint shows here

    def reseed(self, seed: int) -> None:
        self.seed = seed

    def chat(self, messages: list[dict]) -> str:
        """One completion's text, after up to ``tries`` attempts; else :class:`EndpointError`."""
        return self.complete(messages).text

    def complete(self, messages: list[dict]) -> Response:
        """One completion with the token counts the server reports (``usage``): a hosted
        turn costs its tokens like a local one, though no token ids come back."""
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_new_tokens,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        where = f"{self.url}/chat/completions"
        for attempt in range(self.tries):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                r = self.client.post("/chat/completions", json=body)
            except httpx.HTTPError as exc:
                self.errors += 1
                cause = f"{type(exc).__name__}: {exc}"
                continue
            if r.is_success:
                try:
                    answer = r.json()
                    text = answer["choices"][0]["message"]["content"] or ""
                except (KeyError, IndexError, ValueError, TypeError) as exc:
                    self.errors += 1
                    raise EndpointError(
                        f"{where} answered without choices[0].message.content "
                        f"({type(exc).__name__}: {exc})"
                    ) from None
                return Response(
                    text=text, temperature=self.temperature, usage=_usage(answer.get("usage"))
                )
            self.errors += 1
            cause = f"HTTP {r.status_code}: {_server_message(r)}"
            if not _retryable(r.status_code):
                raise EndpointError(f"{where} refused the request ({cause})")
        raise EndpointError(f"{where} failed after {self.tries} tries ({cause})")

    def _one(self, request: Request) -> Response:
        return self.complete(request.messages)

    def act(self, requests: list[Request]) -> list[Response]:
        return list(self.pool.map(self._one, requests))

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.client.close()


@register_backend("openai")
def openai_policy(**kwargs) -> OpenAIPolicy:
    return OpenAIPolicy(**kwargs)
