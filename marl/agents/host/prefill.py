"""Shared heads in the KV cache: run what many prompts begin with once.

Prompts of one seat share the system prompt and the rules; scoring and generation run such a
head once (right-padded with the other heads), then let every row continue from its head's
cached keys and values, each token at the position it has in its own prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from peft import PeftModel

#: Shortest head worth sharing between prompts (tokens).
MIN_HEAD = 16


def left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and attention mask: generation continues every row at the same column."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def common_prefix(seqs: list[list[int]]) -> int:
    """Length of the longest common prefix, leaving every sequence at least one own token."""
    n = min(len(s) for s in seqs) - 1
    first = seqs[0]
    for i in range(max(n, 0)):
        if any(s[i] != first[i] for s in seqs):
            return i
    return max(n, 0)


@dataclass
class PrefixTree:
    """Token sequences as a tree: each node a token (``ids``, ``depth``), ``ancestors[a, b]``
    whether node b is on node a's path (itself included), and each sequence's node path."""

    ids: list[int]
    depth: list[int]
    ancestors: torch.Tensor
    paths: list[list[int]]


def _prefix_tree(seqs: list[list[int]]) -> PrefixTree:
    """The prefix tree of ``seqs``: a shared beginning is one path of nodes."""
    node_of: dict[tuple[int, int], int] = {}
    ids: list[int] = []
    parent: list[int] = []
    paths = []
    for seq in seqs:
        at, path = -1, []
        for tok in seq:
            at = node_of.setdefault((at, tok), len(ids))
            if at == len(ids):
                ids.append(tok)
                parent.append(path[-1] if path else -1)
            path.append(at)
        paths.append(path)
    ancestors = torch.eye(len(ids), dtype=torch.bool)
    for n, p in enumerate(parent):
        if p >= 0:
            ancestors[n] |= ancestors[p]
    depth = ancestors.sum(1).sub(1).tolist()
    return PrefixTree(ids, depth, ancestors, paths)


def head_clusters(prompts: list[list[int]]) -> list[list[int]]:
    """Group prompt indices whose prompts share a head of at least :data:`MIN_HEAD` tokens.

    Prompts of one seat share the system prompt and the rules; scoring runs such a head once
    for the whole group (see ``ModelHost.candidate_scores``).  Identical prompts always share a
    group; indices keep their order within a group.
    """
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and common_prefix([prompts[groups[-1][0]], prompts[i]]) >= MIN_HEAD:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [sorted(g) for g in groups]


class Prefill:
    """The host's forwards over the decoder with a shared KV cache (a :class:`ModelHost` part).

    ``share_prefix = False`` runs every row in full: no head is computed once (what a
    benchmark compares against)."""

    model: torch.nn.Module
    tokenizer: Any
    share_prefix: bool
    share_prompts: bool
    _cache_kw: str
    device: torch.device

    def _head(self, seqs: list[list[int]]) -> int:
        """The common prefix of ``seqs`` (0 when prefix sharing is off)."""
        return common_prefix(seqs) if self.share_prefix else 0

    def _clusters(self, prompts: list[list[int]]) -> list[list[int]]:
        """:func:`head_clusters`, or one prompt per cluster when prefix sharing is off."""
        if self.share_prefix:
            return head_clusters(prompts)
        return [[i] for i in sorted(range(len(prompts)), key=lambda i: prompts[i])]

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

    def _packed_candidates(
        self,
        candidates: list[list[list[int]]],
        start: torch.Tensor,
        cache: Any,
        past_mask: torch.Tensor,
    ) -> torch.Tensor:
        """The hidden states that predict each candidate's tokens after its first, every
        prompt's candidates as a prefix tree packed into that prompt's own row of ``cache``.

        Each tree node is one token, run once for every candidate that begins with its path
        (``[propose 2 ...`` once for all proposals that keep 2 of the first item), at position
        ``start[i] + depth``; it sees the prompt (the valid slots of ``past_mask``) and its own
        ancestors only (a tree mask).  The prompt's KV cache is read in place, not copied once
        per candidate.  Returns [pairs, longest - 1, hidden], pairs in the candidates' order;
        positions past a candidate's end are padding.  Gradients flow through the tree as
        through separate rows (the gradient of a shared node sums its candidates')."""
        trees = [_prefix_tree([c[:-1] for c in cs]) for cs in candidates]
        width = max(len(t.ids) for t in trees)
        longest = max(len(c) for cs in candidates for c in cs) - 1
        ids = torch.full((len(trees), width), self.tokenizer.pad_token_id, dtype=torch.long)
        positions = torch.zeros((len(trees), width), dtype=torch.long)
        seen = torch.zeros((len(trees), width, width), dtype=torch.bool)
        where = torch.zeros((sum(map(len, candidates)), longest), dtype=torch.long)
        row_of = torch.tensor([i for i, cs in enumerate(candidates) for _ in cs])
        k = 0
        for i, tree in enumerate(trees):
            n = len(tree.ids)
            ids[i, :n] = torch.tensor(tree.ids, dtype=torch.long)
            positions[i, :n] = int(start[i]) + torch.tensor(tree.depth, dtype=torch.long)
            seen[i, :n, :n] = tree.ancestors
            for path in tree.paths:
                where[k, : len(path)] = torch.tensor(path, dtype=torch.long)
                k += 1
        past = past_mask.bool()[:, None, :].expand(-1, width, -1)
        dev = self.device
        out = self._base().get_decoder()(
            input_ids=ids.to(dev),
            attention_mask=torch.cat([past, seen], 2)[:, None].to(dev),
            position_ids=positions.to(dev),
            use_cache=True,
            **{self._cache_kw: cache},
        )
        return out.last_hidden_state[row_of.to(dev)[:, None], where.to(dev)]

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

    def _prompt_units(self, prompts: list[list[int]]) -> list[int] | None:
        """Units of identical prompts where some prompt repeats (scoring and generation then run
        each distinct prompt once, after the head all share); else None (one unit)."""
        index: dict[tuple, int] = {}
        units = [index.setdefault(tuple(p), len(index)) for p in prompts]
        repeats = len(index) < len(prompts)
        return units if repeats and self.share_prefix and self.share_prompts else None

    def _unit_heads(
        self,
        prompts: list[list[int]],
        max_head: int | list[int] | None,
        units: list[int] | None,
    ) -> tuple[list[list[int]], list[int], list[int]]:
        """Per unit, its prompts' common head (at most ``max_head`` tokens, or the least of its
        prompts' ``max_head[i]``; a lone prompt's: all but its last token); per prompt, its
        unit's index among those heads; per head, its unit's first prompt."""
        members: dict[int, list[int]] = {}
        for i, u in enumerate(units or [0] * len(prompts)):
            members.setdefault(u, []).append(i)
        heads = []
        for m in members.values():
            h = self._head([prompts[i] for i in m]) if len(m) > 1 else len(prompts[m[0]]) - 1
            cap = min(max_head[i] for i in m) if isinstance(max_head, list) else max_head
            heads.append(prompts[m[0]][: h if cap is None else min(h, cap)])
        slot = [0] * len(prompts)
        for k, m in enumerate(members.values()):
            for i in m:
                slot[i] = k
        return heads, slot, [m[0] for m in members.values()]

    def _heads_cache(
        self, heads: list[list[int]], slot: list[int], nested: bool
    ) -> tuple[Any, torch.Tensor | None]:
        """:meth:`_shared_heads` of the units' heads; ``nested``: what the heads themselves
        begin with (a seat's system prompt and rules) runs once for all of them first, where
        it is at least :data:`MIN_HEAD` tokens (not when each unit's work must stay its own)."""
        common = common_prefix(heads) if nested and len(heads) > 1 and all(heads) else 0
        if common < MIN_HEAD or not self.share_prefix:
            return self._shared_heads(heads, slot)
        cache, mask = self._shared_heads([heads[0][:common]], [0] * len(heads))
        start = torch.full((len(heads),), common)
        _, cache, mask = self._extend([h[common:] for h in heads], start, cache, mask)
        rows = torch.tensor(slot)
        cache.batch_select_indices(rows.to(self.device))
        return cache, mask[rows]

    def _prefilled(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """The batch as ``generate`` takes it, each shared head already in the KV cache.

        Prompts that share a head (:func:`head_clusters`: a seat's system prompt and rules)
        have it run once per cluster; where prompts repeat (a group of samples per state),
        each distinct prompt runs once but for its last token (:meth:`_prompt_units`), after
        what all of them begin with.  Row i is laid out as its head (right-padded to the
        longest head) followed by its own tail (left-padded), with the mask marking the real
        tokens.  ``generate`` reads positions off the mask, so every token keeps the
        position it has in its own prompt: the same distribution as without sharing.
        Returns ids, mask and the cache (None: no two prompts share a head).
        """
        pad = self.tokenizer.pad_token_id
        units = self._prompt_units(prompts) if len(prompts) > 1 else None
        if units is not None:
            heads, owner, _ = self._unit_heads(prompts, None, units)
            cache, head_mask = self._heads_cache(heads, owner, nested=True)
        else:
            heads, owner = self._cluster_heads(prompts)
            cache, head_mask = self._shared_heads(heads, owner) if heads else (None, None)
        if cache is None:
            return *left_pad(prompts, pad), None
        head_ids = torch.full(head_mask.shape, pad, dtype=torch.long)
        for i, k in enumerate(owner):
            head_ids[i, : len(heads[k])] = torch.tensor(heads[k])
        tail_ids, tail_mask = left_pad(
            [p[len(heads[k]) :] for p, k in zip(prompts, owner, strict=True)], pad
        )
        return (torch.cat([head_ids, tail_ids], 1), torch.cat([head_mask, tail_mask], 1), cache)

    def _cluster_heads(self, prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
        """Per :func:`head_clusters` cluster, its prompts' common head; per prompt, its
        cluster's index.  No heads where no two prompts share one."""
        clusters = self._clusters(prompts) if len(prompts) > 1 else []
        if all(len(c) == 1 for c in clusters):
            return [], []
        heads, owner = [], [0] * len(prompts)
        for k, cluster in enumerate(clusters):
            heads.append(prompts[cluster[0]][: self._head([prompts[i] for i in cluster])])
            for i in cluster:
                owner[i] = k
        return heads, owner
