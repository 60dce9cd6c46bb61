"""The learner: GRPO updates of the LoRA adapters that live on one base model.

One learner per trainable base model.  It recomputes the log-probs of the sampled decisions
with gradients (free decoding: every completion token; choice decoding: ``log pi(a|s)`` over the
legal actions' texts), applies :func:`marl.loss.grpo_loss`, and reports per-agent gradient
norms (Dr. MAS's claim is about them): the gradient of each agent's share of the loss is
accumulated separately and its norm recorded before the optimizer step.  ``epochs`` passes over
a batch take one optimizer step each against the same sampling-time log-probs, so from the
second pass on the ratio leaves 1 and the clip bounds how far the policy moves (PPO's epochs,
TRL's ``num_iterations``).

The optimizer is a backend (:mod:`marl.optim`: torch AdamW or a DeepSpeed engine) behind a few
calls, so this algorithm exists once whichever backend applies the update.

With ``magnet = alpha > 0`` each trained adapter has a frozen twin ``<role>@magnet`` on the same
host (magnetic mirror descent, docs/algorithms.md#magnet-schedule): the loss adds
``alpha * KL(pi || magnet)``, exact over the legal actions in choice decoding.  It starts equal
to the adapter; the trainer moves it (:meth:`Learner.set_magnet`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import partial

import torch

from agents.hf import ModelHost
from agents.policy import scale_temperature
from marl.loss import exact_kl, grpo_loss, k3
from marl.optim import Optimizer, OptimizerFactory, TorchAdamW


@dataclass
class TrainItem:
    """One decision to learn from."""

    adapter: str
    agent: Hashable
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    candidate_ids: list[list[int]] | None = None  # choice decoding
    choice: int = 0
    temperature: float = 1.0  # the decision's sampling temperature (0: greedy)


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
    kl_magnet: float = 0.0


def magnet_adapter(adapter: str) -> str:
    """The name of ``adapter``'s magnet on its host."""
    return f"{adapter}@magnet"


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
        self.handles = [p.register_hook(partial(self._add, i))
                        for i, p in enumerate(params) if p.requires_grad]

    def _add(self, i: int, grad: torch.Tensor) -> None:
        g = grad.detach().to(torch.float32, copy=True)
        self.sums[i] = g if self.sums[i] is None else self.sums[i].add_(g)

    def squared_norm(self) -> float:
        return sum(float((s ** 2).sum()) for s in self.sums if s is not None) / self.scale() ** 2

    def __enter__(self) -> _GradTap:
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()


class Learner:
    """Owns the optimizer of the given adapters on ``host``."""

    def __init__(self, host: ModelHost, adapters: list[str], lr: float, clip_low: float = 0.2,
                 clip_high: float = 0.28, kl: float = 0.0, entropy: float = 0.0,
                 max_grad_norm: float = 1.0, micro_batch: int = 16, epochs: int = 1,
                 optimizer: OptimizerFactory = TorchAdamW, magnet: float = 0.0) -> None:
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        self.host, self.adapters, self.epochs = host, list(adapters), epochs
        self.clip_low, self.clip_high, self.kl, self.entropy = clip_low, clip_high, kl, entropy
        self.max_grad_norm, self.micro_batch = max_grad_norm, micro_batch
        self.params = [p for n, p in host.model.named_parameters()
                       if "lora_" in n and any(f".{a}." in n for a in self.adapters)]
        if not self.params:
            raise ValueError(f"no LoRA parameters found for adapters {self.adapters}")
        for p in self.params:
            p.requires_grad_(True)
        self.optimizer: Optimizer = optimizer(host.model, self.params, lr=lr,
                                              max_grad_norm=max_grad_norm)
        self.magnet = magnet
        if magnet > 0:
            self._add_magnets()

    # ----- the magnet: a frozen copy of each adapter
    def _add_magnets(self) -> None:
        """``<role>@magnet`` per adapter, with its settings and (at first) its weights."""
        start = self.weights()
        for a in self.adapters:
            conf = self.host.model.peft_config[a]
            self.host.add_adapter(magnet_adapter(a), r=conf.r, alpha=conf.lora_alpha,
                                  dropout=conf.lora_dropout, targets=sorted(conf.target_modules))
        self.set_magnet(start)

    def set_magnet(self, weights: dict[str, dict[str, torch.Tensor]]) -> None:
        """The magnets take ``weights`` (per adapter): ``rho <- pi`` when they are the policy's."""
        for a in self.adapters:
            self.host.set_adapter_weights(magnet_adapter(a), weights[a])

    # ----- the loss of one micro-batch
    def _micro_loss(self, items: list[TrainItem], n_total: int):
        """Loss of ``items`` scaled by their share of the batch's tokens."""
        choice = items[0].candidate_ids is not None
        logp_fn = self._choice_logp if choice else self._free_logp
        adv = torch.tensor([it.advantage for it in items], device=self.host.device)
        rho = self._magnet_logp(items) if self.magnet > 0 else None
        logp, old, mask, ent, dists = logp_fn(items)
        ref = None
        if self.kl > 0:  # the frozen reference is the base with adapters disabled
            with torch.no_grad(), self.host.use(None):
                ref = logp_fn(items)[0]
        mag = None
        if rho is not None:  # exact over the legal actions; free text: k3 on the sampled tokens
            mag = (torch.stack([exact_kl(lp, r) for lp, r in zip(dists, rho, strict=True)])
                   [:, None] if choice else k3(logp, rho))
        parts = grpo_loss(logp, old, adv, mask, self.clip_low, self.clip_high, ref, self.kl,
                          ent, self.entropy, mag, self.magnet)
        share = float(mask.sum()) / n_total
        return parts, share

    def _magnet_logp(self, items: list[TrainItem]):
        """The magnet's log-probs of ``items``: per decision its distribution over the legal
        actions (choice decoding), else its token log-probs [decisions, tokens]."""
        adapter = items[0].adapter
        with torch.no_grad(), self.host.use(magnet_adapter(adapter)):
            rho = (self._choice_dists(items) if items[0].candidate_ids is not None
                   else self._free_logp(items)[0])
        with self.host.use(adapter):  # back to the policy (trainable again): use() stays set
            pass
        return rho

    def _choice_dists(self, items: list[TrainItem]) -> list[torch.Tensor]:
        """Per decision, log pi over its legal actions at its sampling temperature."""
        scores = self.host.candidate_scores([it.prompt_ids for it in items],
                                            [it.candidate_ids for it in items])
        return [torch.log_softmax(s / scale_temperature(it.temperature), 0)
                for it, s in zip(items, scores, strict=True)]

    def _choice_logp(self, items: list[TrainItem]):
        """(log pi of the choices, old, mask, entropies, the distributions)."""
        logp, ent = [], []
        dists = self._choice_dists(items)
        for it, lp in zip(items, dists, strict=True):
            logp.append(lp[it.choice])
            ent.append(-(lp.exp() * lp).sum())
        logp_t = torch.stack(logp)[:, None]
        old = torch.tensor([it.old_logprobs[0] for it in items], device=logp_t.device)[:, None]
        return logp_t, old, torch.ones_like(old), torch.stack(ent), dists

    def _free_logp(self, items: list[TrainItem]):
        """(token log-probs, old, mask, entropies, None) padded to [decisions, tokens]."""
        want_ent = self.entropy > 0
        per, ents = self.host.sequence_stats([it.prompt_ids for it in items],
                                             [it.completion_ids for it in items],
                                             items[0].temperature, entropy=want_ent)
        width = max(len(x) for x in per)
        dev = self.host.device
        logp = torch.zeros(len(items), width, device=dev)
        old = torch.zeros(len(items), width, device=dev)
        mask = torch.zeros(len(items), width, device=dev)
        for i, (x, it) in enumerate(zip(per, items, strict=True)):
            logp[i, : len(x)] = x
            old[i, : len(x)] = torch.tensor(it.old_logprobs, device=dev)
            mask[i, : len(x)] = 1
        ent = torch.stack([e.mean() for e in ents]) if want_ent else None
        return logp, old, mask, ent, None

    def _chunks(self, group: list[TrainItem]) -> list[list[TrainItem]]:
        """Micro-batches of at most ``micro_batch`` distinct sequences.

        Items are ordered by prompt so repeated information states share a micro-batch and
        are computed once (see ``ModelHost.candidate_scores``).
        """
        group = sorted(group, key=lambda it: (it.prompt_ids, it.completion_ids))
        chunks: list[list[TrainItem]] = []
        seen: set = set()
        for it in group:
            keys = ({(tuple(it.prompt_ids), tuple(c)) for c in it.candidate_ids}
                    if it.candidate_ids is not None else {id(it)})
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
        items = [it for it in items if it.completion_ids or it.candidate_ids]
        n_total = sum(1 if it.candidate_ids is not None else len(it.completion_ids)
                      for it in items)
        for _ in range(self.epochs):
            stats = self._step(items, n_total)
            if stats.skipped:
                break
        return stats

    def _step(self, items: list[TrainItem], n_total: int) -> UpdateStats:
        """Accumulate the loss of every item, per agent, then take one clipped step."""
        self.optimizer.zero_grad()
        by_agent: dict[tuple, list[TrainItem]] = defaultdict(list)
        for it in items:
            by_agent[(it.adapter, it.candidate_ids is not None, str(it.agent))].append(it)
        totals = defaultdict(float)
        agent_norms: dict[str, float] = {}
        self.host.model.train()
        try:
            for (adapter, _, agent), group in sorted(by_agent.items(), key=lambda kv: kv[0]):
                with (self.host.use(adapter),
                      _GradTap(self.params, lambda: self.optimizer.loss_scale) as tap):
                    for chunk in self._chunks(group):
                        parts, share = self._micro_loss(chunk, n_total)
                        if not torch.isfinite(parts.loss):
                            self.optimizer.discard()
                            return UpdateStats(float("nan"), float("nan"), {}, 0, 0, 0,
                                               n_total, skipped=True)
                        self.optimizer.backward(parts.loss * share)
                        totals["loss"] += float(parts.loss.detach()) * share
                        totals["clip"] += parts.clip_frac * share
                        totals["kl"] += parts.kl * share
                        totals["ent"] += parts.entropy * share
                        totals["kl_magnet"] += parts.kl_magnet * share
                key = f"{adapter}/{agent}"
                agent_norms[key] = math.sqrt(agent_norms.get(key, 0.0) ** 2
                                             + tap.squared_norm())
        finally:
            self.host.model.eval()
        norm = self.optimizer.step()  # clips; applies nothing when the norm is not finite
        if not math.isfinite(norm):
            return UpdateStats(totals["loss"], norm, agent_norms, 0, 0, 0, n_total, skipped=True)
        return UpdateStats(totals["loss"], norm, agent_norms, totals["clip"], totals["kl"],
                           totals["ent"], n_total, kl_magnet=totals["kl_magnet"])

    # ----- state for workers and checkpoints
    def weights(self) -> dict[str, dict[str, torch.Tensor]]:
        with self.optimizer.full_params():
            return {a: self.host.adapter_weights(a) for a in self.adapters}

    def optimizer_state(self) -> dict:
        return self.optimizer.state_dict()

    def load(self, weights: dict[str, dict[str, torch.Tensor]],
             optimizer_state: dict | None = None) -> None:
        """Set the adapters (through the optimizer, which may keep master copies of them)
        and, if given, the optimizer's state."""
        with self.optimizer.full_params(write=True):
            for adapter in self.adapters:
                self.host.set_adapter_weights(adapter, weights[adapter])
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
