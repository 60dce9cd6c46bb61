"""The learner: GRPO updates of the LoRA adapters that live on one base model.

One learner per trainable base model.  It recomputes the log-probs of the sampled decisions
with gradients (free decoding: every completion token; choice decoding: ``log pi(a|s)`` over the
legal actions' texts; think decoding: every reasoning token, then the choice after it as one
more "token"), applies :func:`marl.train.loss.grpo_loss`, and reports per-agent gradient
norms (Dr. MAS's claim is about them): the gradient of each agent's share of the loss is
accumulated separately and its norm recorded before the optimizer step.  ``epochs`` passes over
a batch take one optimizer step each against the same sampling-time log-probs, so from the
second pass on the ratio leaves 1 and the clip bounds how far the policy moves (PPO's epochs,
TRL's ``num_iterations``).

The optimizer is a backend (:mod:`marl.train.optim`: torch AdamW or a DeepSpeed engine) behind a few
calls, so this algorithm exists once whichever backend applies the update.

With ``magnet = alpha > 0`` each trained adapter has a frozen twin ``<role>@magnet`` on the same
host (magnetic mirror descent, docs/algorithms.md#magnet-schedule): the loss adds
``alpha * KL(pi || magnet)``, exact over the legal actions in choice decoding.  It starts equal
to the adapter; the trainer moves it (:meth:`Learner.set_magnet`).

With ``target_eta > 0`` (choice decoding) an update is not a GRPO step: every information
state of the batch gets MMD's closed-form target from the policy, the magnet and its action
values (:mod:`marl.train.targets`), and ``fit_steps`` steps (the optimizer's, or Gauss-Newton
steps) fit the policy to those targets.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from functools import partial

import torch

from marl.agents.host import ModelHost
from marl.agents.policy import scale_temperature
from marl.agents.precision import autocast
from marl.config import TeamConfig
from marl.train.loss import exact_kl, grpo_loss, k3
from marl.train.optim import Optimizer, OptimizerFactory, TorchAdamW
from marl.train.targets import (
    Fit,
    RowGrads,
    action_values,
    fit,
    gauss_newton_fit,
    mmd_target,
    target_kl,
)


@dataclass
class TrainItem:
    """One decision to learn from."""

    adapter: str
    agent: Hashable
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    candidate_ids: list[list[int]] | None = None  # choice and think decoding
    choice: int = 0
    # think decoding: the context the choice was scored after; completion_ids are the
    # reasoning tokens, old_logprobs theirs followed by the choice's
    choice_prompt_ids: list[int] | None = None
    temperature: float = 1.0  # the decision's sampling temperature (0: greedy)
    weights: list[float] | None = None  # truncated importance weights (mismatch tis)
    action_values: list[float] | None = None  # Q(s, a) per legal action, from branching

    @property
    def kind(self) -> str:
        """The decoding that produced it: free, choice or think."""
        if self.choice_prompt_ids is not None:
            return "think"
        return "free" if self.candidate_ids is None else "choice"

    @property
    def tokens(self) -> int:
        """What it weighs in the token-averaged loss: its completion tokens (free), one for
        the choice, or both (think)."""
        return {
            "free": len(self.completion_ids),
            "choice": 1,
            "think": len(self.completion_ids) + 1,
        }[self.kind]


@dataclass
class UpdateStats:
    loss: float
    grad_norm: float
    agent_grad_norms: dict[str, float]
    clip_frac: float
    kl: float
    entropy: float
    tokens: int
    skipped: bool = False
    mismatch: float | None = None  # mean |log pi_engine - log pi_learner| (corrections only)
    kl_magnet: float = 0.0
    fit_residual: float | None = None  # policy targets: KL(target || pi) after the fit


def magnet_adapter(adapter: str) -> str:
    """The name of ``adapter``'s magnet on its host."""
    return f"{adapter}@magnet"


#: How the ratio's old log-probs relate to the sampling engine's (train.mismatch).
CORRECTIONS = ("none", "recompute", "tis")


def mismatch_correction(cfg: TeamConfig, roles: list[str]) -> str:
    """``train.mismatch.correction`` for the learner of ``roles``, ``auto`` resolved:
    recompute when one of them samples on an engine other than the learner's (vllm)."""
    assert cfg.train is not None
    c = cfg.train.mismatch.correction
    if c != "auto":
        return c
    return "recompute" if any(cfg.role(r).backend == "vllm" for r in roles) else "none"


class _GradTap:
    """Sums what each backward adds to the gradient of the parameters that require grad.

    The norm of one agent's share of the gradient cannot be read as a difference of ``.grad``
    before and after its micro-batches once an optimizer moves gradients out of ``.grad`` as
    they arrive (ZeRO-2/3), so it is taken from tensor hooks, which see every backward's
    contribution before any backend handles it.
    """

    def __init__(self, params: list[torch.nn.Parameter], scale: Callable[[], float]) -> None:
        self.scale = scale
        self.sums: list[torch.Tensor | None] = [None] * len(params)
        self.handles = [
            p.register_hook(partial(self._add, i)) for i, p in enumerate(params) if p.requires_grad
        ]

    def _add(self, i: int, grad: torch.Tensor) -> None:
        g = grad.detach().to(torch.float32, copy=True)
        self.sums[i] = g if self.sums[i] is None else self.sums[i].add_(g)

    def squared_norm(self) -> float:
        return sum(float((s**2).sum()) for s in self.sums if s is not None) / self.scale() ** 2

    def __enter__(self) -> _GradTap:
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()


def _state_key(it: TrainItem) -> tuple:
    """What identifies a choice decision's information state on its adapter."""
    return (it.adapter, tuple(it.prompt_ids), tuple(map(tuple, it.candidate_ids)), it.temperature)


class Learner:
    """Owns the optimizer of the given adapters on ``host``."""

    def __init__(
        self,
        host: ModelHost,
        adapters: list[str],
        lr: float,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        kl: float = 0.0,
        entropy: float = 0.0,
        max_grad_norm: float = 1.0,
        micro_batch: int = 16,
        epochs: int = 1,
        precision: str = "fp32",
        optimizer: OptimizerFactory = TorchAdamW,
        correction: str = "none",
        tis_cap: float = 2.0,
        magnet: float = 0.0,
        target_eta: float = 0.0,
        fit_steps: int = 10,
        solver: str = "adam",
        ridge: float = 1e-6,
        dual_clip: float | None = None,
    ) -> None:
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        autocast(precision, host.device)  # refuses what this device cannot compute in, now
        if correction not in CORRECTIONS:
            raise ValueError(f"correction must be one of {CORRECTIONS}, got {correction!r}")
        self.correction, self.tis_cap = correction, tis_cap
        self.host, self.adapters, self.epochs = host, list(adapters), epochs
        self.precision = precision
        self.clip_low, self.clip_high, self.kl, self.entropy = clip_low, clip_high, kl, entropy
        self.dual_clip = dual_clip
        self.max_grad_norm, self.micro_batch = max_grad_norm, micro_batch
        self.params = host.adapter_parameters(*self.adapters)
        self.adapter_params = {a: host.adapter_parameters(a) for a in self.adapters}
        if not self.params:
            raise ValueError(f"no LoRA parameters found for adapters {self.adapters}")
        for p in self.params:
            p.requires_grad_(True)
        self.optimizer: Optimizer = optimizer(
            host.model, self.params, lr=lr, max_grad_norm=max_grad_norm
        )
        self.magnet = magnet
        self.target_eta, self.fit_steps, self._lr = target_eta, fit_steps, lr
        self.solver, self.ridge = solver, ridge
        if magnet > 0:
            self._add_magnets()

    # ----- the magnet: a frozen copy of each adapter
    def _add_magnets(self) -> None:
        """``<role>@magnet`` per adapter, with its settings and (at first) its weights."""
        start = self.weights()
        for a in self.adapters:
            conf = self.host.adapter_config(a)
            self.host.add_adapter(
                magnet_adapter(a),
                r=conf.r,
                alpha=conf.lora_alpha,
                dropout=conf.lora_dropout,
                targets=sorted(conf.target_modules),
            )
        self.set_magnet(start)

    def set_magnet(self, weights: dict[str, dict[str, torch.Tensor]]) -> None:
        """The magnets take ``weights`` (per adapter): ``rho <- pi`` when they are the policy's."""
        for a in self.adapters:
            self.host.set_adapter_weights(magnet_adapter(a), weights[a])

    # ----- the loss of one micro-batch
    def _micro_loss(self, items: list[TrainItem], n_total: int, gaps: list | None = None):
        """Loss of ``items`` scaled by their share of the batch's tokens, its forwards in
        the learner's precision (the backward follows the forward's dtypes).

        With ``gaps`` the ratio's old log-probs are this forward's own, detached: what the
        correction would recompute before a one-pass update (the same weights), so the ratio
        is exactly 1 and carries the gradient; ``tis`` weighs each token by
        ``min(pi_learner / pi_engine, cap)``; ``gaps`` gathers the mismatch."""
        choice = items[0].kind == "choice"
        adv = torch.tensor([it.advantage for it in items], device=self.host.device)
        with autocast(self.precision, self.host.device):
            rho = self._magnet_logp(items) if self.magnet > 0 else None
            dists = self._choice_dists(items) if choice else None
            logp, old, mask, ent = (
                self._choice_logp(items, dists) if choice else self._logp_fn(items[0])(items)
            )
            tis = None
            if gaps is not None:
                engine, old = old, logp.detach()
                gaps[0] += float(((engine - old).abs() * mask).sum())
                gaps[1] += int(mask.sum())
                if self.correction == "tis":
                    tis = (old - engine).exp().clamp(max=self.tis_cap) * mask
            ref = None
            if self.kl > 0:  # the frozen reference is the base with adapters disabled
                with torch.no_grad(), self.host.use(None):
                    ref = self._logp_fn(items[0])(items)[0]
            weights = tis
            if items[0].weights is not None:
                weights = torch.zeros_like(mask)
                for i, it in enumerate(items):
                    weights[i, : len(it.weights)] = torch.tensor(it.weights, device=mask.device)
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
                self.clip_low,
                self.clip_high,
                ref,
                self.kl,
                ent,
                self.entropy,
                weights,
                mag,
                self.magnet,
                self.dual_clip,
            )
        share = float(mask.sum()) / n_total
        return parts, share

    def _magnet_logp(self, items: list[TrainItem]):
        """The magnet's log-probs of ``items``: per decision its distribution over the legal
        actions (choice decoding), else its token log-probs [decisions, tokens]."""
        adapter = items[0].adapter
        with torch.no_grad(), self.host.use(magnet_adapter(adapter)):
            rho = (
                self._choice_dists(items)
                if items[0].kind == "choice"
                else self._logp_fn(items[0])(items)[0]
            )
        return rho

    def _choice_dists(self, items: list[TrainItem]) -> list[torch.Tensor]:
        """Per decision, log pi over its legal actions at its sampling temperature."""
        scores = self.host.candidate_scores(
            [it.prompt_ids for it in items], [it.candidate_ids for it in items]
        )
        return [
            torch.log_softmax(s / scale_temperature(it.temperature), 0)
            for it, s in zip(items, scores, strict=True)
        ]

    def _logp_fn(self, item: TrainItem) -> Callable:
        """The log-prob recomputation of ``item``'s kind (a micro-batch holds one kind)."""
        return {"free": self._free_logp, "choice": self._choice_logp, "think": self._think_logp}[
            item.kind
        ]

    def _choice_logp(self, items: list[TrainItem], dists: list[torch.Tensor] | None = None):
        """(log pi of the choices, old, mask, entropies), from ``dists`` when computed."""
        logp, ent = [], []
        for it, lp in zip(items, dists or self._choice_dists(items), strict=True):
            logp.append(lp[it.choice])
            ent.append(-(lp.exp() * lp).sum())
        logp_t = torch.stack(logp)[:, None]
        old = torch.tensor([it.old_logprobs[0] for it in items], device=logp_t.device)[:, None]
        return logp_t, old, torch.ones_like(old), torch.stack(ent)

    def _free_logp(self, items: list[TrainItem]):
        """(token log-probs, old, mask, entropies) padded to [decisions, tokens]."""
        want_ent = self.entropy > 0
        per, ents = self.host.sequence_stats(
            [it.prompt_ids for it in items],
            [it.completion_ids for it in items],
            items[0].temperature,
            entropy=want_ent,
        )
        ent = torch.stack([e.mean() for e in ents]) if want_ent else None
        return (*self._padded(items, per), ent)

    def _think_logp(self, items: list[TrainItem]):
        """Per row: the reasoning tokens' log-probs, then ``log pi(choice | prompt,
        reasoning)``; the entropy is the mean over those positions (vocabulary, then legal
        actions)."""
        want_ent = self.entropy > 0
        per, ents, scores = self.host.reasoned_stats(
            [it.prompt_ids for it in items],
            [it.completion_ids for it in items],
            [it.choice_prompt_ids for it in items],
            [it.candidate_ids for it in items],
            items[0].temperature,
            entropy=want_ent,
        )
        rows, ent = [], []
        for i, (it, x, s) in enumerate(zip(items, per, scores, strict=True)):
            lp = torch.log_softmax(s / scale_temperature(it.temperature), 0)
            rows.append(torch.cat([x, lp[it.choice : it.choice + 1]]))
            if want_ent:
                ent.append(torch.cat([ents[i], -(lp.exp() * lp).sum()[None]]).mean())
        return (*self._padded(items, rows), torch.stack(ent) if want_ent else None)

    def _padded(self, items: list[TrainItem], rows: list[torch.Tensor]):
        """Right-padded ``[decisions, tokens]`` log-probs, the items' old ones and the mask."""
        width = max(len(x) for x in rows)
        dev = self.host.device
        logp = torch.zeros(len(items), width, device=dev)
        old = torch.zeros(len(items), width, device=dev)
        mask = torch.zeros(len(items), width, device=dev)
        for i, (x, it) in enumerate(zip(rows, items, strict=True)):
            logp[i, : len(x)] = x
            old[i, : len(x)] = torch.tensor(it.old_logprobs, device=dev)
            mask[i, : len(x)] = 1
        return logp, old, mask

    def _chunks(self, group: list[TrainItem]) -> list[list[TrainItem]]:
        """Micro-batches of at most ``micro_batch`` distinct sequences.

        Items are ordered by prompt so repeated information states share a micro-batch and
        are computed once (see ``ModelHost.candidate_scores``).
        """
        group = sorted(group, key=lambda it: (it.prompt_ids, it.completion_ids))
        chunks: list[list[TrainItem]] = []
        seen: set = set()
        for it in group:
            keys = (
                {(tuple(it.prompt_ids), tuple(c)) for c in it.candidate_ids}
                if it.kind == "choice"
                else {id(it)}
            )
            if not chunks or len(seen | keys) > self.micro_batch:
                chunks.append([])
                seen = set()
            chunks[-1].append(it)
            seen |= keys
        return chunks

    # ----- an update: ``epochs`` optimizer steps on one batch
    def update(self, items: list[TrainItem], lr: float | None = None) -> UpdateStats:
        """``epochs`` passes over the batch (at ``lr`` when given), each one clipped optimizer
        step; the stats are the last pass's.  A pass with a non-finite loss or gradient
        applies nothing and ends the update, reported as skipped (a further pass would start
        from the same weights)."""
        if lr is not None:
            self.optimizer.set_lr(lr)
            self._lr = lr
        items = [it for it in items if it.completion_ids or it.candidate_ids]
        if self.target_eta > 0:
            return self._fit(items)
        n_total = sum(it.tokens for it in items)
        # one pass: the old log-probs the correction asks for are the loss forward's own,
        # detached (the same weights), so no pass of their own is needed
        own_old = self.correction != "none" and self.epochs == 1
        mismatch = None
        if self.correction != "none" and items and not own_old:
            items, mismatch = self._relabel(items)
        for _ in range(self.epochs):
            stats = self._step(items, n_total, own_old)
            if stats.skipped:
                break
        if not own_old:
            stats.mismatch = mismatch
        return stats

    @torch.no_grad()
    def _relabel(self, items: list[TrainItem]) -> tuple[list[TrainItem], float]:
        """The items with the learner's own log-probs as the ratio's old ones (and, for
        ``tis``, per-token weights ``min(pi_learner / pi_engine, cap)``), plus the mean
        ``|log pi_engine - log pi_learner|`` over their tokens (verl, OpenRLHF)."""
        out, diffs = [], []
        by_adapter: dict[tuple, list[TrainItem]] = defaultdict(list)
        for it in items:
            by_adapter[(it.adapter, it.kind)].append(it)
        for (adapter, _), group in sorted(by_adapter.items()):
            logp_fn = self._logp_fn(group[0])
            with self.host.use(adapter):
                for chunk in self._chunks(group):
                    logp = logp_fn(chunk)[0]
                    for i, it in enumerate(chunk):
                        mine = logp[i, : len(it.old_logprobs)]
                        engine = torch.tensor(it.old_logprobs, device=mine.device)
                        diffs.append((engine - mine).abs())
                        w = None
                        if self.correction == "tis":
                            w = (mine - engine).exp().clamp(max=self.tis_cap).tolist()
                        out.append(replace(it, old_logprobs=mine.tolist(), weights=w))
        return out, float(torch.cat(diffs).mean())

    def _step(self, items: list[TrainItem], n_total: int, own_old: bool = False) -> UpdateStats:
        """Accumulate the loss of every item, per agent, then take one clipped step;
        ``own_old``: the ratio's old log-probs are this pass's own (see ``_micro_loss``)."""
        self.optimizer.zero_grad()
        by_agent: dict[tuple, list[TrainItem]] = defaultdict(list)
        for it in items:
            by_agent[(it.adapter, it.kind, str(it.agent))].append(it)
        totals = defaultdict(float)
        gaps = [0.0, 0]  # sum |log pi_engine - log pi_learner| over tokens, tokens
        agent_norms: dict[str, float] = {}
        self.host.model.train()
        try:
            for (adapter, _, agent), group in sorted(by_agent.items(), key=lambda kv: kv[0]):
                with (
                    self.host.use(adapter),
                    _GradTap(self.params, lambda: self.optimizer.loss_scale) as tap,
                ):
                    for chunk in self._chunks(group):
                        parts, share = self._micro_loss(chunk, n_total, gaps if own_old else None)
                        if not torch.isfinite(parts.loss):
                            self.optimizer.discard()
                            return UpdateStats(
                                float("nan"), float("nan"), {}, 0, 0, 0, n_total, skipped=True
                            )
                        self.optimizer.backward(parts.loss * share)
                        totals["loss"] += float(parts.loss.detach()) * share
                        totals["clip"] += parts.clip_frac * share
                        totals["kl"] += parts.kl * share
                        totals["ent"] += parts.entropy * share
                        totals["kl_magnet"] += parts.kl_magnet * share
                key = f"{adapter}/{agent}"
                agent_norms[key] = math.sqrt(agent_norms.get(key, 0.0) ** 2 + tap.squared_norm())
        finally:
            self.host.model.eval()
        norm = self.optimizer.step()  # clips; applies nothing when the norm is not finite
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
            mismatch=gaps[0] / gaps[1] if own_old and gaps[1] else None,
        )

    # ----- policy targets: MMD's closed-form step, fitted
    def _fit(self, items: list[TrainItem]) -> UpdateStats:  # noqa: C901 (to split)
        """Targets for the batch's information states, then ``fit_steps`` clipped optimizer
        steps on their mean KL(target || pi) (:func:`marl.train.targets.fit`: the best weights
        kept); ``loss`` is the KL before the fit (the step's size), ``fit_residual`` after."""
        if any(it.kind != "choice" for it in items):
            raise ValueError("policy targets need choice decoding")
        keys = [_state_key(it) for it in items]
        states: dict[tuple, TrainItem] = {}
        for key, it in zip(keys, items, strict=True):
            states.setdefault(key, it)
        q = action_values(
            keys,
            [it.choice for it in items],
            [it.advantage for it in items],
            [len(it.candidate_ids) for it in items],
            [it.action_values for it in items],
        )
        by_adapter: dict[str, list[tuple]] = defaultdict(list)
        for key in states:
            by_adapter[key[0]].append(key)
        rho: dict[tuple, torch.Tensor] = {}
        if self.magnet > 0:
            with torch.no_grad(), autocast(self.precision, self.host.device):
                for group in by_adapter.values():
                    rho.update(
                        zip(group, self._magnet_logp([states[k] for k in group]), strict=True)
                    )
        targets: dict[tuple, torch.Tensor] = {}
        kl_mag, ent = [], []

        def target(key: tuple, logp: torch.Tensor) -> torch.Tensor:
            """The state's target, made from the policy at its first scoring (the fit's
            start), so that scoring is also the fit's first forward."""
            if key not in targets:
                lp = logp.detach().float()
                r = rho[key].float() if key in rho else torch.zeros_like(lp)
                targets[key] = mmd_target(
                    lp, r, torch.tensor(q[key], device=lp.device), self.target_eta, self.magnet
                )
                if self.magnet > 0:
                    kl_mag.append(float(exact_kl(lp, r)))
                ent.append(float(-(lp.exp() * lp).sum()))
            return targets[key]

        n = len(states)
        agent_norms: dict[str, float] = {}
        grad_norm = [0.0]

        def loss(grad: bool) -> float:
            self.optimizer.zero_grad()
            total, finite = 0.0, True
            self.host.model.train(grad)
            try:
                for adapter, group in sorted(by_adapter.items()):
                    with (
                        self.host.use(adapter),
                        torch.set_grad_enabled(grad),
                        _GradTap(self.params, lambda: self.optimizer.loss_scale) as tap,
                    ):
                        for chunk in self._chunks([states[k] for k in group]):
                            with autocast(self.precision, self.host.device):
                                dists = self._choice_dists(chunk)
                                part = (
                                    torch.stack(
                                        [
                                            target_kl(lp.float(), target(_state_key(it), lp))
                                            for it, lp in zip(chunk, dists, strict=True)
                                        ]
                                    ).sum()
                                    / n
                                )
                            finite = finite and bool(torch.isfinite(part))
                            if grad and finite:
                                self.optimizer.backward(part)
                            total += float(part.detach())
                    if grad:
                        agent_norms[adapter] = math.sqrt(tap.squared_norm())
            finally:
                self.host.model.eval()
            return total if finite else math.inf

        def step(lr: float) -> None:
            self.optimizer.set_lr(lr)
            grad_norm[0] = self.optimizer.step()  # applies nothing when it is not finite

        if self.solver == "gauss_newton":
            result = self._gauss_newton(by_adapter, states, targets, loss, loss(False))
        else:
            result = fit(loss, step, self.weights, self.load, self._lr, self.fit_steps)
        return UpdateStats(
            result.first,
            grad_norm[0],
            agent_norms,
            0.0,
            0.0,
            sum(ent) / n,
            len(items),
            skipped=not math.isfinite(result.best),
            kl_magnet=sum(kl_mag) / n if kl_mag else 0.0,
            fit_residual=result.best,
        )

    def _gauss_newton(
        self,
        by_adapter: dict[str, list[tuple]],
        states: dict[tuple, TrainItem],
        targets: dict[tuple, torch.Tensor],
        loss: Callable[[bool], float],
        first: float,
    ) -> Fit:
        """Per adapter, ``fit_steps`` Gauss-Newton steps of its states' logit differences
        (``log pi(a) - log pi(a_0)``) towards the targets' (:func:`gauss_newton_fit`), from
        the KL ``first`` at the start."""
        best = first
        for adapter, group in sorted(by_adapter.items()):
            params = self.adapter_params[adapter]

            def linearise(
                adapter: str = adapter, group: list[tuple] = group, params: list = params
            ) -> tuple[torch.Tensor, torch.Tensor]:
                jac, residual = [], []
                with self.host.use(adapter):
                    for chunk in self._chunks([states[k] for k in group]):
                        j, r = self._state_jacobian(chunk, params, targets)
                        jac.append(j)
                        residual.append(r)
                return torch.cat(jac), torch.cat(residual)

            best = gauss_newton_fit(
                linearise, params, lambda: loss(False), self.ridge, self.fit_steps, best
            ).best
        return Fit(first, best)

    def _state_jacobian(
        self,
        chunk: list[TrainItem],
        params: list[torch.nn.Parameter],
        targets: dict[tuple, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The logit differences of ``chunk``'s states (distinct): their Jacobian over
        ``params`` ([rows, P], a row per (state, action > 0)) and their residuals to the
        targets.  The states are scored without shared work, so one backward pass per action
        index gives every state's row (:class:`marl.train.targets.RowGrads`)."""
        with (
            RowGrads(self.host.model, params, len(chunk)) as rows,
            autocast(self.precision, self.host.device),
        ):
            scores = self.host.separate_scores(
                [it.prompt_ids for it in chunk], [it.candidate_ids for it in chunk], rows.owner
            )
        dists = [
            torch.log_softmax(s.float() / scale_temperature(it.temperature), 0)
            for it, s in zip(chunk, scores, strict=True)
        ]
        width = max(len(d) for d in dists)
        per_action = []
        for a in range(1, width):
            total = sum(d[a] - d[0] for d in dists if len(d) > a)
            torch.autograd.grad(total, params, retain_graph=a < width - 1, allow_unused=True)
            per_action.append(rows.take())
        jac, residual = [], []
        for k, (it, d) in enumerate(zip(chunk, dists, strict=True)):
            t = targets[_state_key(it)]
            jac.extend(per_action[a - 1][k] for a in range(1, len(d)))
            residual.append((t[1:] - t[0]) - (d[1:] - d[0]).detach())
        return torch.stack(jac), torch.cat(residual)

    # ----- state for workers and checkpoints
    def weights(self) -> dict[str, dict[str, torch.Tensor]]:
        with self.optimizer.full_params():
            return {a: self.host.adapter_weights(a) for a in self.adapters}

    def optimizer_state(self) -> dict:
        return self.optimizer.state_dict()

    def load(
        self, weights: dict[str, dict[str, torch.Tensor]], optimizer_state: dict | None = None
    ) -> None:
        """Set the adapters (through the optimizer, which may keep master copies of them)
        and, if given, the optimizer's state."""
        with self.optimizer.full_params(write=True):
            for adapter in self.adapters:
                self.host.set_adapter_weights(adapter, weights[adapter])
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
