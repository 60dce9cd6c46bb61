"""A small chat-generation helper, so every caller prompts instruct models the same way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from marl.agents.policy import greedy

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Messages = Sequence[Mapping[str, str]]


def render_prompt(tokenizer: PreTrainedTokenizerBase, prompt_or_messages: str | Messages) -> str:
    """Prompt text ending where the assistant's answer starts.

    A plain string becomes one user message. With a chat template the template is applied
    (instruct models answer far better in their trained format); without one, messages are
    joined as ``role: content`` lines.
    """
    messages: Messages = (
        [{"role": "user", "content": prompt_or_messages}]
        if isinstance(prompt_or_messages, str)
        else prompt_or_messages
    )
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=False
        )
    if isinstance(prompt_or_messages, str):
        return prompt_or_messages
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_or_messages: str | Messages,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    seed: int | None = None,
) -> str:
    """Answer text for one prompt or chat; ``temperature <= 0`` is greedy.

    Sampling is pure temperature sampling (no top-k/top-p), reproducible with ``seed``
    without disturbing the global RNG.
    """
    import torch

    text = render_prompt(tokenizer, prompt_or_messages)
    enc = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(model.device)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id
    kwargs: dict[str, object] = {
        "max_new_tokens": max_new_tokens,
        "pad_token_id": pad_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if greedy(temperature):
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0)
    devices = [model.device.index or 0] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.inference_mode():
        if seed is not None:
            torch.manual_seed(seed)
        out = model.generate(**enc, **kwargs)
    new_tokens = out[0, enc["input_ids"].shape[1] :]
    return tokenizer.decode(new_tokens, skip_special_tokens=True).strip()
