"""The transformers backend's model host: one base model in memory, one LoRA adapter per role.

Several roles share a :class:`ModelHost`; each role's policy names its adapter.  The host is
made of one part per concern:

- :mod:`.adapters`: add, load (checked), save, weights in and out, activation per block, the
  adapters' parameters and settings for the learner;
- :mod:`.prompts`: chat-templated prompt ids, remembered;
- :mod:`.prefill`: shared prompt heads run once into the KV cache;
- :mod:`.scoring`: sequence log-probs and prefix-tree candidate scores, remembered;
- :mod:`.generation`: sampling, and think decoding's contexts.
"""

from __future__ import annotations

import inspect

import torch

from marl.agents.attention import use_gqa_sdpa
from marl.agents.host.adapters import Adapters
from marl.agents.host.generation import Generation
from marl.agents.host.prompts import PromptEncoding
from marl.agents.host.scoring import Scoring


class ModelHost(Adapters, PromptEncoding, Scoring, Generation):
    """A base causal LM plus named LoRA adapters, with batched scoring and generation.

    ``share_prefix = False`` turns off running the prompts' shared heads once (every row is
    run in full, as libraries without prefix sharing do); ``share_prompts = False`` turns off
    running a repeated prompt once, in generation and for the think contexts after it (they
    share the one head common to all instead): switches for benchmarks.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, share_prefix: bool = True) -> None:
        use_gqa_sdpa(model)
        self.model = model.eval()  # inference by default; the learner switches to train()
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.share_prefix = share_prefix
        self.share_prompts = True
        self.adapters: list[str] = []
        self.truncations = 0
        # candidate scores by adapter (None: base), then (prompt, candidate, compute dtype):
        # small games revisit a few states all the time.  An adapter's entries last until its
        # weights or the base's change, so frozen league snapshots keep theirs while the
        # policy trains
        self._memo: dict[str | None, dict[tuple, float]] = {}
        self._memo_version: dict[str | None, tuple[int, ...]] = {}
        self._owners: dict[str | None, list[torch.Tensor]] | None = None
        self._active: str | None = None
        self._disabled = False  # inside a use(None) block: PEFT's adapter layers are off
        self._prompt_memo = {}
        # transformers 5 renamed the KV-cache argument; older releases (vLLM pins one) differ
        forward = inspect.signature(type(model).forward).parameters
        self._cache_kw = "cache" if "cache" in forward else "past_key_values"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the frozen base is stored in (adapters are fp32 whatever it is)."""
        return self.model.get_input_embeddings().weight.dtype
