"""Scoring: log-probs of given completions and of candidate texts, with gradients or not.

Candidate scoring walks a prefix tree: the prompts' common head once, each prompt's own tail
once, then every candidate of it, all through the KV cache (:mod:`.prefill`); a prompt's
candidates run as a token tree in the prompt's own row (a shared beginning once, with
gradients or not), and outside training the scores are remembered per adapter until a weight
they depend on changes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from marl.agents.host.prefill import MIN_HEAD, Prefill
from marl.agents.policy import scale_temperature
from marl.agents.precision import compute_dtype

#: Remembered candidate scores per adapter before its memo starts again.
MEMO_SIZE = 200_000


class Scoring(Prefill):
    """Sequence and candidate log-probs (a :class:`ModelHost` part)."""

    _memo: dict[str | None, dict[tuple, float]]
    _memo_version: dict[str | None, tuple[int, ...]]
    _active: str | None

    weights_version: Callable[[str | None], tuple[int, ...]]  # from Adapters

    def clear_score_memo(self) -> None:
        """Forget every remembered candidate score (the next calls compute them all)."""
        self._memo.clear()

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
        lcp = self._head(prompts) if len(seqs) > 1 else 0
        lcp = lcp if lcp >= MIN_HEAD else 0
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

    def pair_scores(
        self, prompts: list[list[int]], candidates: list[list[list[int]]]
    ) -> list[torch.Tensor]:
        """``log p(c | prompt)`` of every candidate from one forward over every (prompt +
        candidate) row, with no head shared: the number of forwards never depends on the
        batch, which ranks that gather parameters in each forward need (ZeRO-3).  Where
        the host shares prefixes, :meth:`candidate_scores` gives the same values with less
        work."""
        assert not self.share_prefix, "shared heads add a forward where the prompts share one"
        rows = [p for p, cs in zip(prompts, candidates, strict=True) for _ in cs]
        per = self.sequence_logprobs(rows, [c for cs in candidates for c in cs])
        return list(torch.stack([x.sum() for x in per]).split([len(cs) for cs in candidates]))

    def _tree_scores(
        self,
        prompts: list[list[int]],
        candidates: list[list[list[int]]],
        max_head: int | list[int] | None = None,
        rows: Callable[[torch.Tensor], None] | None = None,
        units: list[int] | None = None,
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """``log p(c | prompt)`` for every candidate of every prompt, each token run once,
        plus the prompts' hidden states after their heads and each prompt's head length.

        Three levels share their work through the KV cache: the common head of the prompts of
        one unit (:meth:`_unit_heads`; ``units[i]`` is prompt i's, default all one), each
        prompt's own tail (once per prompt), then its candidates as a token tree in the
        prompt's own row (:meth:`_packed_candidates`: a token that several candidates begin with
        runs once).  No work crosses units.  Only the positions that predict a candidate token
        go through the vocabulary projection.  ``rows(owner)``, if given, hears before each
        forward which prompt each of its batch rows serves (a head's row: its unit's first
        prompt).
        """
        heads, slot, firsts = self._unit_heads(prompts, max_head, units)
        if rows is not None and all(heads):
            rows(torch.tensor(firsts))
        cache, mask = self._heads_cache(heads, slot, nested=rows is None)
        hl = torch.tensor([len(heads[k]) if cache is not None else 0 for k in slot])
        tails = [p[h:] for p, h in zip(prompts, hl.tolist(), strict=True)]
        if rows is not None:
            rows(torch.arange(len(prompts)))
        hidden, cache, mask = self._extend(tails, hl, cache, mask)
        last = torch.tensor([len(t) - 1 for t in tails])
        first = hidden[torch.arange(len(prompts)), last.to(hidden.device)]  # predicts c[0]
        owner = torch.tensor([i for i, cs in enumerate(candidates) for _ in cs])
        flat = [c for cs in candidates for c in cs]
        picks = [first[owner]]  # [pairs, hidden]: the state before each candidate's 1st token
        if max(len(c) for c in flat) > 1:  # each prompt's candidates as a tree in its own row
            if rows is not None:
                rows(torch.arange(len(prompts)))
            picks.append(self._packed_candidates(candidates, hl + last + 1, cache, mask))
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
        return list(tok.sum(1).split([len(cs) for cs in candidates])), hidden, hl

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
        outside ``torch.no_grad``.  Contexts of one prompt (several reasonings sampled at an
        information state) run that prompt once (:meth:`_prompt_units`).
        """
        scores, hidden, heads = self._context_scores(prompts, contexts, candidates)
        logps, ents = [], []
        for i, (p, r, head) in enumerate(zip(prompts, reasonings, heads.tolist(), strict=True)):
            step = self._logits(
                hidden[i, len(p) - 1 - head : len(p) + len(r) - 1 - head]
            ) / scale_temperature(temperature)
            logsm = F.log_softmax(step, dim=-1)
            logps.append(logsm.gather(1, torch.tensor(r, device=step.device)[:, None]).squeeze(1))
            if entropy:
                ents.append(-(logsm.exp() * logsm).sum(-1))
        return logps, ents, scores

    def move_scores(
        self,
        prompts: list[list[int]],
        contexts: list[list[int]],
        candidates: list[list[list[int]]],
    ) -> list[torch.Tensor]:
        """:meth:`reasoned_stats`'s ``log p(c | context)`` alone, from the same forwards: where
        the reasoning's tokens are not needed, their positions skip the vocabulary projection
        (a sixth of a pass over 32-token reasonings)."""
        return self._context_scores(prompts, contexts, candidates)[0]

    def _context_scores(
        self,
        prompts: list[list[int]],
        contexts: list[list[int]],
        candidates: list[list[list[int]]],
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """:meth:`_tree_scores` of think contexts: heads end inside each prompt (the positions
        that predict the reasoning stay the context's own); a repeated prompt runs once."""
        return self._tree_scores(
            contexts,
            candidates,
            max_head=[len(p) - 1 for p in prompts],
            units=self._prompt_units(prompts),
        )

    def separate_scores(
        self,
        prompts: list[list[int]],
        candidates: list[list[list[int]]],
        rows: Callable[[torch.Tensor], None],
        units: list[int] | None = None,
    ) -> list[torch.Tensor]:
        """``log p(c | prompt)`` for distinct ``prompts``, with no work shared between units
        (default: every prompt its own; the prompts of one unit run their common head once):
        every batch row of every forward serves one unit, and ``rows(owner)`` hears before
        the forward runs which prompt each row serves (a head's row: its unit's first).  What
        each unit contributes to a gradient can then be read off its rows' activations
        (per-state Jacobians: the policy-target objective's ``RowGrads``)."""
        if units is None:
            return self._tree_scores(prompts, candidates, max_head=0, rows=rows)[0]
        return self._tree_scores(prompts, candidates, rows=rows, units=units)[0]

    def candidate_scores(
        self, prompts: list[list[int]], candidates: list[list[list[int]]]
    ) -> list[torch.Tensor]:
        """``log p(candidate | prompt)`` (summed over its tokens) for each request's candidates,
        each prompt's candidates as a token tree in its own row (:meth:`_packed_candidates`),
        with gradients or without.

        Identical (prompt, candidate) pairs are computed once, and outside training they are
        remembered until a weight changes: in small games most decisions repeat a few
        information states, so this cuts the work by an order of magnitude.
        """
        memo = not torch.is_grad_enabled() and not self.model.training
        known = self._memo.setdefault(self._active, {}) if memo else {}
        if memo:
            version = self.weights_version(self._active)
            if version != self._memo_version.get(self._active) or len(known) > MEMO_SIZE:
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
        for group in self._clusters(distinct):
            scores = self._tree_scores(
                [distinct[g] for g in group],
                [[uniq_c[i] for i in pair_ids[g]] for g in group],
            )[0]
            idx = torch.tensor([i for g in group for i in pair_ids[g]], device=self.device)
            new = new.index_put((idx,), torch.cat(scores))
        if not memo:
            return [new[[index[k] for k in row]] for row in rows]
        known.update({k: float(new[i]) for k, i in index.items()})
        return [torch.tensor([known[k] for k in row], device=self.device) for row in rows]
