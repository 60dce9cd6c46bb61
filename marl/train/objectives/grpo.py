"""The GRPO step: clipped policy-gradient updates against the sampling-time log-probs.

Per token ``t`` of a decision with advantage ``A`` (math in docs/algorithms.md#the-grpo-loss,
:func:`marl.train.loss.grpo_loss`):

    L = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)  [+ dual clip, KL, entropy, magnet]
    r_t = pi_theta(t) / pi_old(t)

``epochs`` passes over a batch take one optimizer step each against the same sampling-time
log-probs, so from the second pass on the ratio leaves 1 and the clip bounds how far the policy
moves (PPO's epochs, TRL's ``num_iterations``).  Each agent's share of the loss is accumulated
apart and the norm of its gradient recorded (Dr. MAS).

Behaviour corrections (:data:`marl.train.learner.CORRECTIONS`; math in
:mod:`marl.train.loss`): every one but ``none`` makes the ratio's old log-probs the learner's
own, computed before the update (the proximal policy pi_prox); the weighting ones also weigh
each token by ``w_t = pi_prox(t) / pi_behav(t)``, truncated at a cap (``tis``:
``train.mismatch.cap``, the engine's numerics; ``truncated_is``: ``train.async.is_cap``) or not
(``decoupled``: decoupled PPO for stale asynchronous rollouts).  The update reports the mean
``|log pi_behav - log pi_prox|`` (``mismatch``) and the weights' mean, largest ratio and clipped
fraction (``is_weights``).  With a magnet the loss adds ``alpha * KL(pi || magnet)``, exact
over the legal actions in choice decoding.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace

import torch

from marl.train.learner import Learner, TrainItem, UpdateStats
from marl.train.loss import exact_kl, grpo_loss, importance_weights, k3
from marl.train.objectives import register_objective
from marl.train.ranks import Ranks


@dataclass
class Behaviour:
    """What a correction measures over the tokens it relabels: the gap
    ``|log pi_behav - log pi_prox|`` and, with a ``cap``, the importance weights."""

    cap: float | None
    gap: float = 0.0
    tokens: int = 0
    weight: float = 0.0  # the weights' sum, after the cap
    top: float = 0.0  # the largest ratio pi_prox / pi_behav, before it
    clipped: int = 0  # tokens whose ratio the cap cut

    def add(
        self, behav: torch.Tensor, prox: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor | None:
        """Count the tokens of ``mask``; their weights (None without a cap)."""
        self.gap += float(((behav - prox).abs() * mask).sum())
        self.tokens += int(mask.sum())
        if self.cap is None:
            return None
        w, raw = importance_weights(prox, behav, mask, self.cap)
        self.weight += float(w.sum())
        self.top = max(self.top, float(raw.max()))
        self.clipped += int(((raw > self.cap) * mask).sum())
        return w

    def total(self, ranks: Ranks) -> Behaviour:
        """The sums (and the largest ratio) over a learner group's ranks."""
        gap, tokens, weight, clipped = ranks.sum([self.gap, self.tokens, self.weight, self.clipped])
        return Behaviour(self.cap, gap, int(tokens), weight, ranks.max(self.top), int(clipped))

    @property
    def mismatch(self) -> float | None:
        return self.gap / self.tokens if self.tokens else None

    @property
    def weights(self) -> dict[str, float] | None:
        """The weights' mean, the largest ratio and the fraction of tokens the cap cut."""
        if self.cap is None or not self.tokens:
            return None
        n = self.tokens
        return {"mean": self.weight / n, "max": self.top, "clipped": self.clipped / n}


def _item_weights(items: list[TrainItem], mask: torch.Tensor) -> torch.Tensor:
    """The items' own per-token weights (set by ``_relabel``), padded like ``mask``."""
    weights = torch.zeros_like(mask)
    for i, it in enumerate(items):
        weights[i, : len(it.weights)] = torch.tensor(it.weights, device=mask.device)
    return weights


@register_objective("grpo")
class GRPO:
    """The clipped GRPO step of a :class:`~marl.train.learner.Learner`."""

    def __init__(self, learner: Learner) -> None:
        self.learner, self.cfg = learner, learner.cfg

    def update(self, items: list[TrainItem]) -> UpdateStats:
        """``epochs`` passes over the batch, each one clipped optimizer step; the stats are
        the last pass's.  A pass with a non-finite loss or gradient applies nothing and ends
        the update, reported as skipped (a further pass would start from the same weights)."""
        n_total = sum(it.tokens for it in items)
        correct = self.learner.correction != "none"
        # one pass: the old log-probs the correction asks for are the loss forward's own,
        # detached (the same weights), so no pass of their own is needed
        own_old = correct and self.cfg.epochs == 1
        seen = Behaviour(self.learner.weight_cap)
        if correct and items and not own_old:
            items, seen = self._relabel(items)
        for _ in range(self.cfg.epochs):
            stats = self._step(items, n_total, own_old)
            if stats.skipped:
                break
        if not own_old:
            stats.mismatch, stats.is_weights = seen.mismatch, seen.weights
        return stats

    def _micro_loss(self, items: list[TrainItem], n_total: int, seen: Behaviour | None = None):
        """Loss of ``items`` scaled by their share of the batch's tokens, its forwards in
        the learner's precision (the backward follows the forward's dtypes).

        With ``seen`` the ratio's old log-probs are this forward's own, detached: what the
        correction would recompute before a one-pass update (the same weights), so the ratio
        is exactly 1 and carries the gradient; a weighting correction weighs each token by
        ``min(pi_prox / pi_behav, cap)``; ``seen`` gathers the gap and the weights."""
        learner, cfg = self.learner, self.cfg
        choice = items[0].kind == "choice"
        adv = torch.tensor([it.advantage for it in items], device=learner.host.device)
        with learner.compute():
            rho = learner.magnet_logp(items) if learner.cfg.magnet.alpha > 0 else None
            dists = learner.choice_dists(items) if choice else None
            logp, old, mask, ent = (
                learner.choice_logp(items, dists) if choice else learner.logp_fn(items[0])(items)
            )
            weights = None
            if seen is not None:
                behav, old = old, logp.detach()
                weights = seen.add(behav, old, mask)
            ref = None
            if cfg.kl > 0:  # the frozen reference is the base with adapters disabled
                with torch.no_grad(), learner.host.use(None):
                    ref = learner.logp_fn(items[0])(items)[0]
            mag = None
            if rho is not None:  # exact over the legal actions; text: k3 on the sampled tokens
                mag = (
                    torch.stack([exact_kl(lp, r) for lp, r in zip(dists, rho, strict=True)])[
                        :, None
                    ]
                    if choice
                    else k3(logp, rho)
                )
            parts = grpo_loss(
                logp,
                old,
                adv,
                mask,
                cfg.clip_low,
                cfg.clip_high,
                ref,
                cfg.kl,
                ent,
                cfg.entropy,
                _item_weights(items, mask) if items[0].weights is not None else weights,
                mag,
                learner.cfg.magnet.alpha,
                cfg.dual_clip,
            )
        share = float(mask.sum()) / n_total
        return parts, share

    @torch.no_grad()
    def _relabel(self, items: list[TrainItem]) -> tuple[list[TrainItem], Behaviour]:
        """The items with the learner's own log-probs as the ratio's old ones (and, for a
        weighting correction, per-token weights ``min(pi_prox / pi_behav, cap)``), plus what
        was seen over their tokens: the mean ``|log pi_behav - log pi_prox|`` (verl,
        OpenRLHF) and the weights."""
        out, seen = [], Behaviour(self.learner.weight_cap)
        by_adapter: dict[tuple, list[TrainItem]] = defaultdict(list)
        for it in items:
            by_adapter[(it.adapter, it.kind)].append(it)
        for (adapter, _), group in sorted(by_adapter.items()):
            logp_fn = self.learner.logp_fn(group[0])
            with self.learner.host.use(adapter):
                for chunk in self.learner.chunks(group):
                    logp = logp_fn(chunk)[0]
                    for i, it in enumerate(chunk):
                        mine = logp[i, : len(it.old_logprobs)]
                        behav = torch.tensor(it.old_logprobs, device=mine.device)
                        w = seen.add(behav, mine, torch.ones_like(mine))
                        weights = None if w is None else w.tolist()
                        out.append(replace(it, old_logprobs=mine.tolist(), weights=weights))
        return out, seen

    def _step(self, items: list[TrainItem], n_total: int, own_old: bool = False) -> UpdateStats:
        """Accumulate the loss of every item, per agent, then take one clipped step;
        ``own_old``: the ratio's old log-probs are this pass's own (see ``_micro_loss``).
        In a learner group each rank runs its share (:mod:`marl.train.ranks`) and the sums
        are the group's."""
        ranks = self.learner.ranks
        self.learner.optimizer.zero_grad()
        by_agent: dict[tuple, list[TrainItem]] = defaultdict(list)
        for it in items:
            by_agent[(it.adapter, it.kind, str(it.agent))].append(it)
        totals = dict.fromkeys(("loss", "clip", "kl", "ent", "kl_magnet"), 0.0)
        seen = Behaviour(self.learner.weight_cap) if own_old else None
        agent_norms: dict[str, float] = {}
        with self.learner.training():
            for (adapter, _, agent), group in sorted(by_agent.items(), key=lambda kv: kv[0]):
                with (
                    self.learner.host.use(adapter),
                    self.learner.grad_tap() as tap,
                ):
                    for chunk, counts in ranks.schedule(group, self.learner.chunks):
                        if not self._accumulate(chunk, counts, n_total, seen, totals):
                            self.learner.optimizer.discard()
                            return UpdateStats(
                                float("nan"), float("nan"), {}, 0, 0, 0, n_total, skipped=True
                            )
                    squared = tap.squared_norm()
                key = f"{adapter}/{agent}"
                agent_norms[key] = math.sqrt(agent_norms.get(key, 0.0) ** 2 + squared)
        totals = dict(zip(totals, ranks.sum(list(totals.values())), strict=True))
        seen = seen.total(ranks) if seen is not None else Behaviour(None)
        norm = self.learner.optimizer.step()  # clips; applies nothing when the norm is not finite
        if not math.isfinite(norm):
            return UpdateStats(totals["loss"], norm, agent_norms, 0, 0, 0, n_total, skipped=True)
        return UpdateStats(
            totals["loss"],
            norm,
            agent_norms,
            totals["clip"],
            totals["kl"],
            totals["ent"],
            n_total,
            kl_magnet=totals["kl_magnet"],
            mismatch=seen.mismatch,
            is_weights=seen.weights,
        )

    def _accumulate(
        self,
        chunk: list[TrainItem],
        counts: bool,
        n_total: int,
        seen: Behaviour | None,
        totals: dict,
    ) -> bool:
        """Backward of one micro-batch's share of the loss, its stats added to ``totals`` and
        ``seen`` (nothing from a rank's zero-weight padding, ``counts`` false); false when the
        loss is not finite on some rank."""
        if seen is not None and not counts:
            seen = Behaviour(seen.cap)  # measured, then dropped
        parts, share = self._micro_loss(chunk, n_total, seen)
        if self.learner.ranks.any(not bool(torch.isfinite(parts.loss))):
            return False
        share = share if counts else 0.0
        self.learner.optimizer.backward(parts.loss * share)
        totals["loss"] += float(parts.loss.detach()) * share
        totals["clip"] += parts.clip_frac * share
        totals["kl"] += parts.kl * share
        totals["ent"] += parts.entropy * share
        totals["kl_magnet"] += parts.kl_magnet * share
        return True
