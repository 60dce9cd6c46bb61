"""The transformers backend: one base model in memory, one LoRA adapter per role.

Several roles share a :class:`ModelHost`; each role's :class:`HFPolicy` names its adapter, and
the host switches adapters per batch (PEFT ``set_adapter``), so the base weights exist once.
A role without an adapter runs the base with adapters disabled (that is also the frozen
reference a KL term compares against).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import random
import warnings
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model

from marl.agents.attention import use_gqa_sdpa
from marl.agents.policy import (
    Request,
    Response,
    choice_probs,
    choice_response,
    greedy,
    register_backend,
    scale_temperature,
)
from marl.agents.precision import autocast, compute_dtype

PROMPT_MEMO = 20_000  # distinct message lists whose prompt ids a host remembers (~1-2 KB each)


def left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and attention mask: generation continues every row at the same column."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def _common_prefix(seqs: list[list[int]]) -> int:
    """Length of the longest common prefix, leaving every sequence at least one own token."""
    n = min(len(s) for s in seqs) - 1
    first = seqs[0]
    for i in range(max(n, 0)):
        if any(s[i] != first[i] for s in seqs):
            return i
    return max(n, 0)


def head_clusters(prompts: list[list[int]]) -> list[list[int]]:
    """Group prompt indices whose prompts share a head of at least 16 tokens.

    Prompts of one seat share the system prompt and the rules; scoring runs such a head once
    for the whole group (see ``ModelHost.candidate_scores``).  Identical prompts always share a
    group; indices keep their order within a group.
    """
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and _common_prefix([prompts[groups[-1][0]], prompts[i]]) >= 16:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [sorted(g) for g in groups]


class AdapterMismatch(ValueError):
    """A saved adapter that does not fit the adapter configured under its name."""


class ModelHost:
    """A base causal LM plus named LoRA adapters, with batched scoring and generation."""

    def __init__(self, model: torch.nn.Module, tokenizer) -> None:
        use_gqa_sdpa(model)
        self.model = model.eval()  # inference by default; the learner switches to train()
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
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
        self._prompt_memo: dict[tuple, tuple[array, bool]] = {}  # chat templating and
        # tokenising cost ~0.5 ms a prompt; small games repeat a few prompts thousands of times
        # (ids kept as int32 arrays: free text makes every prompt new, so the memo fills up)
        # transformers 5 renamed the KV-cache argument; older releases (vLLM pins one) differ
        forward = inspect.signature(type(model).forward).parameters
        self._cache_kw = "cache" if "cache" in forward else "past_key_values"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def add_adapter(
        self,
        name: str,
        r: int = 8,
        alpha: int = 16,
        dropout: float = 0.0,
        targets: Sequence[str] = ("q_proj", "v_proj"),
        seed: int = 0,
    ) -> None:
        """Attach a fresh LoRA adapter (B = 0, so it starts equal to the base model).

        A is drawn under ``seed`` (not the global RNG), so a run is reproducible.  Targets
        that name no module of the model are a :class:`~marl.agents.models.ModelError`.
        """
        from marl.agents.models import ModelError

        cfg = LoraConfig(
            r=r,
            lora_alpha=alpha,
            lora_dropout=dropout,
            target_modules=list(targets),
            task_type="CAUSAL_LM",
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            try:
                if isinstance(self.model, PeftModel):
                    self.model.add_adapter(name, cfg)
                else:
                    self.model = get_peft_model(self.model, cfg, adapter_name=name).eval()
                    self._active = name
            except ValueError as exc:
                raise ModelError(
                    f"role {name!r}: adapter.targets {list(targets)} match no "
                    f"module of the model ({exc})"
                ) from None
        self.adapters.append(name)
        self._forget(name)

    def save_adapter(self, name: str, path: str | Path) -> None:
        """Write one adapter as a PEFT folder (adapter_config.json + safetensors weights)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(path), selected_adapters=[name], safe_serialization=True)
        nested = path / name  # PEFT nests non-default adapters in a sub-folder
        if nested.is_dir():
            for f in nested.iterdir():
                f.replace(path / f.name)
            nested.rmdir()

    def load_adapter(self, name: str, path: str | Path, trainable: bool = False) -> None:
        """Load a saved PEFT folder as adapter ``name``, reading JSON and safetensors only.

        A ``name`` the host already holds (a role's adapter, built from its config) takes the
        folder's weights, and the two must agree: a different rank, alpha or set of tensors
        would otherwise load a different network silently (:class:`AdapterMismatch`).  A new
        ``name`` is attached with the folder's own settings.
        """
        path = Path(path)
        conf_file, weights_file = path / "adapter_config.json", path / "adapter_model.safetensors"
        if not conf_file.is_file() or not weights_file.is_file():
            raise FileNotFoundError(
                f"{path} is not a PEFT adapter folder (needs "
                "adapter_config.json and adapter_model.safetensors)"
            )
        if name in self.adapters:
            self._fill_adapter(name, path)
            return
        # PEFT reads adapter_model.safetensors when it is there (checked above), never pickle
        if isinstance(self.model, PeftModel):
            self.model.load_adapter(str(path), adapter_name=name, is_trainable=trainable)
        else:
            self.model = PeftModel.from_pretrained(
                self.model, str(path), adapter_name=name, is_trainable=trainable
            ).eval()
            self._active = name
        self.adapters.append(name)
        self._forget(name)

    def _fill_adapter(self, name: str, path: Path) -> None:
        """The weights of the PEFT folder ``path`` into the existing adapter ``name``."""
        from safetensors.torch import load_file

        saved = json.loads((path / "adapter_config.json").read_text())
        current = self.model.peft_config[name]
        for key in ("r", "lora_alpha"):
            if saved.get(key) != getattr(current, key):
                raise AdapterMismatch(
                    f"{path} has {key}={saved.get(key)} but the config says {getattr(current, key)}"
                )
        weights = load_file(str(path / "adapter_model.safetensors"))
        expected = set(self.adapter_weights(name))
        if set(weights) != expected:
            diff = sorted(set(weights) ^ expected)
            raise AdapterMismatch(
                f"{path} holds other tensors than the configured adapter "
                f"(e.g. {diff[:2]}); check adapter.targets in team.yaml"
            )
        self.set_adapter_weights(name, weights)

    @contextlib.contextmanager
    def use(self, adapter: str | None) -> Iterator[None]:
        """Run the block with ``adapter`` active, or with every adapter disabled for ``None``;
        the adapter active before comes back afterwards (PEFT's ``set_adapter`` also makes the
        active adapter the only trainable one, so a nested block must hand it back). Blocks
        nest either way: an adapter's block inside the base model's switches the layers on."""
        if not isinstance(self.model, PeftModel):
            if adapter is not None:
                raise KeyError(f"no adapter {adapter!r}: this model has none")
            yield
        elif adapter is None:
            previous, self._active = self._active, None
            disabled, self._disabled = self._disabled, True
            try:
                with self.model.disable_adapter():
                    yield
            finally:
                self._active, self._disabled = previous, disabled
                if previous is not None:  # a nested block may have activated another
                    self._set_adapter(previous)
        else:
            if adapter not in self.adapters:
                raise KeyError(f"no adapter {adapter!r}; known: {self.adapters}")
            previous, disabled = self._active, self._disabled
            if disabled:  # inside use(None): switch the layers back on for this block
                self.model.base_model.enable_adapter_layers()
                self._disabled = False
            self._set_adapter(adapter)
            self._active = adapter
            try:
                yield
            finally:
                if previous is not None and previous != adapter:
                    self._set_adapter(previous)
                if disabled:
                    self.model.base_model.disable_adapter_layers()
                    self._disabled = True
                if previous is not None or disabled:  # else the adapter stays set, and active
                    self._active = previous

    def _set_adapter(self, adapter: str) -> None:
        """PEFT's ``set_adapter`` walks every module (~25 ms) and a rollout step asks for the
        same adapter hundreds of times: call it only when PEFT has another one active."""
        if getattr(self.model, "active_adapter", None) != adapter:
            self.model.set_adapter(adapter)

    def _forget(self, adapter: str) -> None:
        """An adapter was added or removed: its remembered scores and the owner map go."""
        self._memo.pop(adapter, None)
        self._owners = None

    def weights_version(self, adapter: str | None) -> tuple[int, ...]:
        """Changes whenever a parameter that ``adapter``'s scores depend on (its own and the
        base's) is written in place (optimizer steps, loading): torch bumps a tensor's version
        counter on every in-place operation."""
        if self._owners is None:
            self._owners = defaultdict(list)
            for name, p in self.model.named_parameters():
                owner = None
                if "lora_" in name:
                    owner = next((a for a in self.adapters if f".{a}." in f"{name}."), "?")
                self._owners[owner].append(p)
        base, own = self._owners[None], self._owners.get(adapter, []) if adapter else []
        return (len(base), sum(p._version for p in base), len(own), sum(p._version for p in own))

    # ----- tokenisation
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

    # ----- batched compute
    def sequence_logprobs(
        self, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0
    ) -> list[torch.Tensor]:
        """Per-token ``log softmax(logits / T)`` of each completion given its prompt, ``T``
        the sampling temperature (:func:`~marl.agents.policy.scale_temperature`).

        One right-padded forward over every (prompt + completion).  Gradients flow when called
        outside ``torch.no_grad`` (the learner uses this same function).
        """
        return self.sequence_stats(prompts, completions, temperature)[0]

    def sequence_stats(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        temperature: float = 1.0,
        entropy: bool = False,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Token log-probs and, if asked, the full-vocabulary entropy at each completion token."""
        seqs = [p + c for p, c in zip(prompts, completions, strict=True)]
        # The prompts of a batch share a long head (system prompt, rules): run it once and
        # let every sequence attend to that one cached copy.
        lcp = _common_prefix(prompts) if len(seqs) > 1 else 0
        lcp = lcp if lcp >= 16 else 0
        cache, mask = self._shared_heads([seqs[0][:lcp]], [0] * len(seqs))
        hidden, _, _ = self._extend(
            [q[lcp:] for q in seqs], torch.full((len(seqs),), lcp), cache, mask
        )
        logits = self._logits(hidden)
        logps, ents = [], []
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            # logits at position t predict token t+1 (positions counted after the shared head)
            step = logits[i, len(p) - 1 - lcp : len(p) + len(c) - 1 - lcp] / scale_temperature(
                temperature
            )
            logsm = F.log_softmax(step, dim=-1)
            tgt = torch.tensor(c, device=step.device)
            logps.append(logsm.gather(1, tgt[:, None]).squeeze(1))
            if entropy:
                ents.append(-(logsm.exp() * logsm).sum(-1))
        return logps, ents

    def _base(self) -> torch.nn.Module:
        return self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on chosen hidden states (float32), with the model's logit soft-cap."""
        logits = self._base().get_output_embeddings()(hidden).float()
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap else logits

    def _extend(
        self,
        rows: list[list[int]],
        start: torch.Tensor,
        cache: Any = None,
        past_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """Run right-padded ``rows`` after ``cache`` (whose valid slots ``past_mask`` marks);
        row i's first token sits at position ``start[i]``.  Returns the hidden states, the
        extended cache and its mask."""
        decoder = self._base().get_decoder()
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        new = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            new[i, : len(r)] = 1
        mask = new if past_mask is None else torch.cat([past_mask, new], 1)
        positions = start[:, None] + torch.arange(width)
        dev = self.device
        out = decoder(
            input_ids=ids.to(dev),
            attention_mask=mask.to(dev),
            position_ids=positions.to(dev),
            use_cache=True,
            **({self._cache_kw: cache} if cache is not None else {}),
        )
        cache = out["cache"] if "cache" in out else out["past_key_values"]
        return out.last_hidden_state, cache, mask

    def _shared_heads(
        self, heads: list[list[int]], owner: list[int]
    ) -> tuple[Any, torch.Tensor | None]:
        """Run each head once (right-padded together); row i of the returned cache and mask
        is head ``owner[i]``'s, for the rows to extend.  Empty heads: nothing to share."""
        if not all(heads):
            return None, None
        _, cache, mask = self._extend(heads, torch.zeros(len(heads), dtype=torch.long))
        rows = torch.tensor(owner)
        cache.batch_select_indices(rows.to(self.device))
        return cache, mask[rows]

    def _tree_scores(
        self,
        prompts: list[list[int]],
        candidates: list[list[list[int]]],
        max_head: int | None = None,
        rows: Callable[[torch.Tensor], None] | None = None,
    ) -> tuple[list[torch.Tensor], torch.Tensor, int]:
        """``log p(c | prompt)`` for every candidate of every prompt, each token run once,
        plus the prompts' hidden states after the shared head and that head's length (at
        most ``max_head``).

        Three levels share their work through the KV cache: the prompts' common head (once),
        each prompt's own tail (once per prompt), then the candidates (once per pair).  Only
        the positions that predict a candidate token go through the vocabulary projection.
        ``rows(owner)``, if given, hears before each forward after the head which prompt
        each of its batch rows serves.
        """
        head = _common_prefix(prompts) if len(prompts) > 1 else len(prompts[0]) - 1
        head = head if max_head is None else min(head, max_head)
        tails = [p[head:] for p in prompts]
        cache, mask = self._shared_heads([prompts[0][:head]], [0] * len(prompts))
        if rows is not None:
            rows(torch.arange(len(prompts)))
        hidden, cache, mask = self._extend(tails, torch.full((len(prompts),), head), cache, mask)
        last = torch.tensor([len(t) - 1 for t in tails])
        first = hidden[torch.arange(len(prompts)), last.to(hidden.device)]  # predicts c[0]
        owner = torch.tensor([i for i, cs in enumerate(candidates) for _ in cs])
        flat = [c for cs in candidates for c in cs]
        picks = [first[owner]]  # [pairs, hidden]: the state before each candidate's 1st token
        if max(len(c) for c in flat) > 1:
            if rows is not None:
                rows(owner)
            cache.batch_select_indices(owner.to(self.device))
            rest, _, _ = self._extend(
                [c[:-1] for c in flat], head + last[owner] + 1, cache, mask[owner]
            )
            picks.append(rest)
        logits = self._logits(torch.cat([picks[0][:, None], *picks[1:]], 1))
        logp = F.log_softmax(logits, dim=-1)
        width = logits.shape[1]
        target = torch.zeros((len(flat), width), dtype=torch.long)
        valid = torch.zeros((len(flat), width), dtype=torch.bool)
        for i, c in enumerate(flat):
            target[i, : len(c)] = torch.tensor(c)
            valid[i, : len(c)] = True
        dev = logp.device
        tok = logp.gather(2, target.to(dev)[..., None]).squeeze(2) * valid.to(dev)
        return list(tok.sum(1).split([len(cs) for cs in candidates])), hidden, head

    def reasoned_stats(
        self,
        prompts: list[list[int]],
        reasonings: list[list[int]],
        contexts: list[list[int]],
        candidates: list[list[list[int]]],
        temperature: float = 1.0,
        entropy: bool = False,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Think-then-act in one pass: each reasoning's token log-probs at ``temperature``
        (and their full-vocabulary entropies, if asked) and ``log p(c | context)`` of each
        candidate, from one forward over each context.

        Context i is prompt i, then reasoning i (its final end-of-sequence token may be
        left out: the position that predicts it is still in the context), then a separator;
        so the positions that predict the reasoning are the context's own.  Gradients flow
        outside ``torch.no_grad``.
        """
        scores, hidden, head = self._tree_scores(
            contexts, candidates, max_head=min(len(p) for p in prompts) - 1
        )
        logps, ents = [], []
        for i, (p, r) in enumerate(zip(prompts, reasonings, strict=True)):
            step = self._logits(
                hidden[i, len(p) - 1 - head : len(p) + len(r) - 1 - head]
            ) / scale_temperature(temperature)
            logsm = F.log_softmax(step, dim=-1)
            logps.append(logsm.gather(1, torch.tensor(r, device=step.device)[:, None]).squeeze(1))
            if entropy:
                ents.append(-(logsm.exp() * logsm).sum(-1))
        return logps, ents, scores

    def separate_scores(
        self,
        prompts: list[list[int]],
        candidates: list[list[list[int]]],
        rows: Callable[[torch.Tensor], None],
    ) -> list[torch.Tensor]:
        """``log p(c | prompt)`` for distinct ``prompts``, with no work shared between them:
        every batch row of every forward serves one prompt, which ``rows(owner)`` hears
        before the forward runs.  What each prompt contributes to a gradient can then be
        read off its rows' activations (per-state Jacobians, ``marl.train.targets.RowGrads``)."""
        return self._tree_scores(prompts, candidates, max_head=0, rows=rows)[0]

    def candidate_scores(
        self, prompts: list[list[int]], candidates: list[list[list[int]]]
    ) -> list[torch.Tensor]:
        """``log p(candidate | prompt)`` (summed over its tokens) for each request's candidates.

        Identical (prompt, candidate) pairs are computed once, and outside training they are
        remembered until a weight changes: in small games most decisions repeat a few
        information states, so this cuts the work by an order of magnitude.
        """
        memo = not torch.is_grad_enabled() and not self.model.training
        known = self._memo.setdefault(self._active, {}) if memo else {}
        if memo:
            version = self.weights_version(self._active)
            if version != self._memo_version.get(self._active) or len(known) > 200_000:
                known.clear()
                self._memo_version[self._active] = version
        dtype = compute_dtype(self.device)  # bf16 and fp32 scores are remembered apart
        index: dict[tuple, int] = {}
        uniq_p: list[list[int]] = []
        uniq_c: list[list[int]] = []
        rows = []
        for p, cs in zip(prompts, candidates, strict=True):
            row = []
            for c in cs:
                key = (tuple(p), tuple(c), dtype)
                if key not in index and key not in known:
                    index[key] = len(uniq_p)
                    uniq_p.append(p)
                    uniq_c.append(c)
                row.append(key)
            rows.append(row)
        by_prompt: dict[tuple, list[int]] = {}
        for i, prompt in enumerate(uniq_p):
            by_prompt.setdefault(tuple(prompt), []).append(i)
        distinct = [list(k) for k in by_prompt]
        pair_ids = list(by_prompt.values())
        new = torch.zeros(len(uniq_p), device=self.device)
        for group in head_clusters(distinct):
            scores = self._tree_scores(
                [distinct[g] for g in group], [[uniq_c[i] for i in pair_ids[g]] for g in group]
            )[0]
            idx = torch.tensor([i for g in group for i in pair_ids[g]], device=self.device)
            new = new.index_put((idx,), torch.cat(scores))
        if not memo:
            return [new[[index[k] for k in row]] for row in rows]
        known.update({k: float(new[i]) for k, i in index.items()})
        return [torch.tensor([known[k] for k in row], device=self.device) for row in rows]

    def adapter_weights(self, name: str) -> dict[str, torch.Tensor]:
        """The adapter's tensors (CPU copies), keyed without the adapter name: what learners
        send to rollout workers and checkpoints store."""
        from peft import get_peft_model_state_dict

        sd = get_peft_model_state_dict(self.model, adapter_name=name)
        return {k: v.detach().cpu().clone() for k, v in sd.items()}

    def set_adapter_weights(self, name: str, weights: dict[str, torch.Tensor]) -> None:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.model, weights, adapter_name=name)
        bad = [k for k in result.unexpected_keys if "lora_" in k]
        if bad:
            raise KeyError(f"adapter weights do not fit adapter {name!r}: {bad[:3]}")

    def delete_adapter(self, name: str) -> None:
        self.model.delete_adapter(name)
        self.adapters.remove(name)
        self._forget(name)

    def _prefilled(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """The batch as ``generate`` takes it, each shared head already in the KV cache.

        Prompts that share a head (:func:`head_clusters`: a seat's system prompt and rules)
        have it run once per cluster; row i is laid out as its cluster's head (right-padded
        to the longest head) followed by its own tail (left-padded), with the mask marking
        the real tokens.  ``generate`` reads positions off the mask, so every token keeps
        the position it has in its own prompt: the same distribution as without sharing.
        Returns ids, mask and the cache (None: no two prompts share a head).
        """
        pad = self.tokenizer.pad_token_id
        clusters = head_clusters(prompts) if len(prompts) > 1 else []
        if all(len(c) == 1 for c in clusters):
            return *left_pad(prompts, pad), None
        heads, owner = [], [0] * len(prompts)
        for k, cluster in enumerate(clusters):
            heads.append(prompts[cluster[0]][: _common_prefix([prompts[i] for i in cluster])])
            for i in cluster:
                owner[i] = k
        cache, head_mask = self._shared_heads(heads, owner)
        if cache is None:
            return *left_pad(prompts, pad), None
        head_ids = torch.full(head_mask.shape, pad, dtype=torch.long)
        for i, k in enumerate(owner):
            head_ids[i, : len(heads[k])] = torch.tensor(heads[k])
        tail_ids, tail_mask = left_pad(
            [p[len(heads[k]) :] for p, k in zip(prompts, owner, strict=True)], pad
        )
        return (torch.cat([head_ids, tail_ids], 1), torch.cat([head_mask, tail_mask], 1), cache)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
        share_prefix: bool = True,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample completions for a batch; returns token ids and their log-probs.

        With ``share_prefix`` the heads that prompts share are computed once
        (:meth:`_prefilled`); without, the batch is simply left-padded.  Log-probs are of the
        sampling distribution ``softmax(logits / T)`` (``T = 1`` for greedy:
        :func:`~marl.agents.policy.scale_temperature`), cut at the first end-of-sequence token.
        """
        pad = self.tokenizer.pad_token_id
        eos = self.tokenizer.eos_token_id
        ids, mask, cache = (
            self._prefilled(prompts) if share_prefix else (*left_pad(prompts, pad), None)
        )
        width = ids.shape[1]
        argmax = greedy(temperature)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                max_new_tokens=max_new_tokens,
                do_sample=not argmax,
                temperature=None if argmax else temperature,
                top_p=None if argmax else top_p,
                top_k=None,
                pad_token_id=pad,
                eos_token_id=eos,
                output_logits=True,
                return_dict_in_generate=True,
                **({self._cache_kw: cache} if cache is not None else {}),
            )
        new = out.sequences[:, width:]
        scale = scale_temperature(temperature)
        # log softmax(z)[token] = z[token] - logsumexp(z), step by step: no (batch, steps,
        # vocab) log-prob tensor (0.5-1.3 s and 400 MB per call at B = 32, 32 steps, 49k vocab)
        cols = []
        for i, x in enumerate(out.logits):
            z = x.float() / scale
            cols.append(z.gather(1, new[:, i : i + 1]).squeeze(1) - torch.logsumexp(z, dim=-1))
        tok_logp = torch.stack(cols, 1)
        completions, logprobs = [], []
        for row, lp in zip(new.tolist(), tok_logp.tolist(), strict=True):
            n = row.index(eos) + 1 if eos in row else len(row)
            completions.append(row[:n])
            logprobs.append(lp[:n])
        return completions, logprobs


#: What separates the reasoning from the move in think decoding: the candidates are scored
#: after ``prompt + reasoning + THINK_SEPARATOR``.
THINK_SEPARATOR = "\nMove: "
MODES = ("free", "choice", "think")


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


def think_contexts(
    host: ModelHost, prompts: list[list[int]], reasoning: list[list[int]]
) -> list[list[int]]:
    """What each choice is scored after: prompt, reasoning (its end-of-sequence token
    dropped), :data:`THINK_SEPARATOR`."""
    eos, sep = host.tokenizer.eos_token_id, host.text_ids(THINK_SEPARATOR)
    return [
        p + (r[:-1] if r and r[-1] == eos else r) + sep
        for p, r in zip(prompts, reasoning, strict=True)
    ]


def think_responses(
    host: ModelHost,
    requests: list[Request],
    prompts: list[list[int]],
    reasoning: list[list[int]],
    logps: list[list[float]],
    contexts: list[list[int]],
    cands: list[list[list[int]]],
    scores: list[list[float]],
    cut: list[bool],
    temperature: float,
    rng: random.Random,
) -> list[Response]:
    """A choice sampled after each reasoning; the response carries the reasoning's and the
    choice's log-probs for the learner, and both in its text for transcripts."""
    out = []
    for req, p, r, lp, ctx, cs, s, t in zip(
        requests, prompts, reasoning, logps, contexts, cands, scores, cut, strict=True
    ):
        picked = choice_response(req, p, cs, s, temperature, rng, t)
        text = host.tokenizer.decode(r, skip_special_tokens=True).strip()
        out.append(
            dataclasses.replace(
                picked,
                text=f"{text}{THINK_SEPARATOR}{picked.text}",
                completion_ids=r,
                logprobs=lp + picked.logprobs,
                choice_prompt_ids=ctx,
            )
        )
    return out


class HFPolicy:
    """One role on a :class:`ModelHost`: its adapter (or none) and its decoding settings."""

    def __init__(
        self,
        host: ModelHost,
        adapter: str | None = None,
        mode: str = "free",
        temperature: float = 1.0,
        max_new_tokens: int = 64,
        top_p: float = 1.0,
        max_prompt_tokens: int = 1024,
        precision: str = "fp32",
        seed: int = 0,
        think_tokens: int = 48,
        think_prompt: str = "",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"decoding mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.host, self.adapter, self.mode, self.precision = host, adapter, mode, precision
        self.temperature, self.max_new_tokens, self.top_p = temperature, max_new_tokens, top_p
        self.max_prompt_tokens = max_prompt_tokens
        self.think_tokens, self.think_prompt = think_tokens, think_prompt
        self.rng = random.Random(seed)

    @property
    def reasons(self) -> bool:
        """Think mode with a reasoning budget (with none it is choice mode, prompt and all)."""
        return self.mode == "think" and self.think_tokens > 0

    @property
    def sampled_table(self) -> bool:
        """Whether :meth:`probabilities` is a sample: the choice distribution after one
        sampled reasoning (greedy reasoning is one fixed path, so exact)."""
        return self.reasons and not greedy(self.temperature)

    def reseed(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def _seed(self) -> int:
        return self.rng.randrange(2**31 - 1)

    def _compute(self) -> contextlib.AbstractContextManager:
        """This role's precision, on the device the host is on now (Ray may move it)."""
        return autocast(self.precision, self.host.device)

    def _prompts(self, requests: list[Request]) -> tuple[list[list[int]], list[bool]]:
        return role_prompts(
            self.host, requests, self.max_prompt_tokens, self.think_prompt if self.reasons else ""
        )

    def act(self, requests: list[Request]) -> list[Response]:
        if not requests:
            return []
        prompts, cut = self._prompts(requests)
        with self.host.use(self.adapter), self._compute():
            if self.reasons:
                return self._think(requests, prompts, cut)
            if self.mode != "free":
                return self._choose(requests, prompts, cut)
            comps, logps = self.host.generate(
                prompts, self.max_new_tokens, self.temperature, self.top_p, self._seed()
            )
        tok = self.host.tokenizer
        return [
            Response(
                text=tok.decode(c, skip_special_tokens=True),
                prompt_ids=p,
                completion_ids=c,
                logprobs=lp,
                truncated_prompt=t,
                temperature=self.temperature,
            )
            for p, c, lp, t in zip(prompts, comps, logps, cut, strict=True)
        ]

    @torch.no_grad()
    def _scores(
        self, requests: list[Request], prompts: list[list[int]]
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Candidate token ids and ``log p(text_a | prompt)`` of every legal action."""
        cands = [[self.host.text_ids(t) for t in r.action_texts] for r in requests]
        scores = [s.tolist() for s in self.host.candidate_scores(prompts, cands)]
        return cands, scores

    def _choose(
        self, requests: list[Request], prompts: list[list[int]], cut: list[bool]
    ) -> list[Response]:
        """Sample from the normalised candidate scores."""
        cands, scores = self._scores(requests, prompts)
        return [
            choice_response(req, p, cs, s, self.temperature, self.rng, t)
            for req, p, cs, s, t in zip(requests, prompts, cands, scores, cut, strict=True)
        ]

    def _reason(
        self, prompts: list[list[int]]
    ) -> tuple[list[list[int]], list[list[float]], list[list[int]]]:
        """Sampled reasoning per prompt, its token log-probs, and the context the choice is
        scored after: prompt, reasoning (its end-of-sequence token dropped), separator."""
        reasoning, logps = self.host.generate(
            prompts, self.think_tokens, self.temperature, self.top_p, self._seed()
        )
        return reasoning, logps, think_contexts(self.host, prompts, reasoning)

    def _think(
        self, requests: list[Request], prompts: list[list[int]], cut: list[bool]
    ) -> list[Response]:
        """Reason, then choose after the reasoning; both parts' log-probs go to the learner."""
        reasoning, logps, contexts = self._reason(prompts)
        cands, scores = self._scores(requests, contexts)
        return think_responses(
            self.host,
            requests,
            prompts,
            reasoning,
            logps,
            contexts,
            cands,
            scores,
            cut,
            self.temperature,
            self.rng,
        )

    def probabilities(self, requests: list[Request]) -> list[list[float]]:
        """The choice distribution over each request's legal actions: how table policies
        are read off a model.  Exact, with ``choice`` semantics whatever this policy's mode,
        except for a reasoning policy: the distribution after one sampled reasoning
        (:attr:`sampled_table`), an unbiased one-sample estimate of its table."""
        prompts, _ = self._prompts(requests)
        with self.host.use(self.adapter), self._compute():
            if self.reasons:
                prompts = self._reason(prompts)[2]
            _, scores = self._scores(requests, prompts)
        return [choice_probs(s, self.temperature) for s in scores]


@register_backend("hf")
def hf_policy(host: ModelHost, **kwargs) -> HFPolicy:
    return HFPolicy(host, **kwargs)
