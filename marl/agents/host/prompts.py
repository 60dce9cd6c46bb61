"""Prompt encoding: chat-templated prompt ids, cut in the middle when too long, remembered per
message list.

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
CUT = "\n[...]\n"  # where a prompt too long lost its middle


class PromptEncoding:
    """Prompt and text ids (a :class:`ModelHost` part)."""

    tokenizer: Any
    truncations: int
    _prompt_memo: dict[tuple, tuple[array, bool]]

    def prompt_ids(
        self, messages: list[dict[str, str]], max_tokens: int = 1024
    ) -> tuple[list[int], bool]:
        """Chat-template the messages; if longer than ``max_tokens``, keep the first and the
        last tokens, half the budget each, and cut the middle (marked :data:`CUT`).

        The head holds the rules, the tail the current state and the legal moves: both must
        survive; what goes is the oldest history.  Returns the ids and whether they were cut.
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
                f"prompt cut to {max_tokens} tokens in its middle (decoding.max_prompt_tokens)",
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
        cut = self.text_ids(CUT)
        if 2 * len(cut) > max_tokens:
            cut = []
        head = (max_tokens - len(cut)) // 2
        return ids[:head] + cut + ids[len(ids) - (max_tokens - len(cut) - head) :], True

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


def action_ids(host: ModelHost, requests: list[Request]) -> list[list[list[int]]]:
    """Each request's legal actions as token ids: the candidates every local backend scores."""
    return [[host.text_ids(t) for t in r.action_texts] for r in requests]
