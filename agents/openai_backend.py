"""A policy served by any OpenAI-compatible ``/v1/chat/completions`` endpoint.

Hosted models, a local server (vLLM, llama.cpp, ``marl serve``) or a judge can then sit in a
seat.  Only free decoding: the chat API samples text and cannot score arbitrary candidates.
Requests of one batch go out concurrently on a thread pool; a failed request becomes an empty
answer (the game counts it as an unparsed move) and is counted in ``errors``.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import httpx

from agents.policy import Request, Response, register_backend


class OpenAIPolicy:
    def __init__(self, base_url: str, model: str, api_key_env: str | None = None,
                 temperature: float = 1.0, max_new_tokens: int = 64, timeout: float = 60.0,
                 max_workers: int = 8, seed: int | None = None) -> None:
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        if api_key_env and not key:
            raise ValueError(f"environment variable {api_key_env} (the API key) is not set")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers,
                                   timeout=timeout)
        self.model, self.temperature, self.max_new_tokens = model, temperature, max_new_tokens
        self.seed = seed
        self.pool = ThreadPoolExecutor(max_workers=max_workers)
        self.errors = 0

    def reseed(self, seed: int) -> None:
        self.seed = seed

    def _one(self, request: Request) -> Response:
        body = {"model": self.model, "messages": request.messages,
                "temperature": self.temperature, "max_tokens": self.max_new_tokens}
        if self.seed is not None:
            body["seed"] = self.seed
        try:
            r = self.client.post("/chat/completions", json=body)
            r.raise_for_status()
            text = r.json()["choices"][0]["message"]["content"] or ""
        except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError):
            self.errors += 1
            text = ""
        return Response(text=text, temperature=self.temperature)

    def act(self, requests: list[Request]) -> list[Response]:
        return list(self.pool.map(self._one, requests))

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.client.close()


@register_backend("openai")
def openai_policy(**kwargs) -> OpenAIPolicy:
    return OpenAIPolicy(**kwargs)
