"""Prompt encoding: chat-templated, tail-truncated prompt ids, remembered per message list.

Chat templating and tokenising cost ~0.5 ms a prompt; small games repeat a few prompts
thousands of times, so a host keeps the ids (as int32 arrays: free text makes every prompt
new, so the memo fills up and starts again).
"""

from __future__ import annotations

import warnings
from array import array
from typing import TYPE_CHECKING, Any

from marl.agents.policy import Request

if TYPE_CHECKING:
    from marl.agents.host import ModelHost

PROMPT_MEMO = 20_000  # distinct message lists whose prompt ids a host remembers (~1-2 KB each)


class PromptEncoding:
    """Prompt and text ids (a :class:`ModelHost` part)."""

    tokenizer: Any
    truncations: int
    _prompt_memo: dict[tuple, tuple[array, bool]]

    def prompt_ids(
        self, messages: list[dict[str, str]], max_tokens: int = 1024
    ) -> tuple[list[int], bool]:
        """Chat-template the messages; keep the last ``max_tokens`` tokens if too long.

        The tail holds the current state and the legal moves, so it is what must survive.
        Returns the ids and whether they were truncated.
        """
        key = (tuple(tuple(sorted(m.items())) for m in messages), max_tokens)
        if key not in self._prompt_memo:
            if len(self._prompt_memo) >= PROMPT_MEMO:
                self._prompt_memo.clear()
            ids, cut = self._tokenise(messages, max_tokens)
            self._prompt_memo[key] = array("i", ids), cut
        ids, cut = self._prompt_memo[key]
        if cut:
            self.truncations += 1
            warnings.warn(
                f"prompt truncated to its last {max_tokens} tokens (decoding.max_prompt_tokens)",
                stacklevel=2,
            )
        return list(ids), cut

    def _tokenise(self, messages: list[dict[str, str]], max_tokens: int) -> tuple[list[int], bool]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = "\n\n".join(m["content"] for m in messages) + "\n\n"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= max_tokens:
            return ids, False
        return ids[-max_tokens:], True

    def text_ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def role_prompts(
    host: ModelHost, requests: list[Request], max_prompt_tokens: int, think_prompt: str = ""
) -> tuple[list[list[int]], list[bool]]:
    """Each request's prompt ids (``think_prompt`` after its last message, when given) and
    whether it was truncated: how every local backend builds its prompts."""
    out = []
    for r in requests:
        messages = r.messages
        if think_prompt:
            last = messages[-1]
            messages = [*messages[:-1], {**last, "content": f"{last['content']}\n{think_prompt}"}]
        out.append(host.prompt_ids(messages, max_prompt_tokens))
    prompts, cut = zip(*out, strict=True)
    return list(prompts), list(cut)
