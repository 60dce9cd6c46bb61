"""The learner: updates of the LoRA adapters that live on one base model.

One learner per trainable base model.  Its core here recomputes the log-probs of the sampled
decisions with gradients (free decoding: every completion token; choice decoding:
``log pi(a|s)`` over the legal actions' texts; think decoding: every reasoning token, then the
choice after it as one more "token"), in micro-batches, and owns the optimizer, the per-agent
gradient norms (Dr. MAS's claim is about them: each agent's share of the gradient is tapped
before the optimizer step) and the adapters' weights in and out.

What an update does with those log-probs is an objective (:mod:`marl.train.objectives`),
chosen from the config: the GRPO step (:mod:`marl.train.objectives.grpo`) or, with
``train.policy_target.eta > 0``, MMD's closed-form targets fitted by the model
(:mod:`marl.train.objectives.policy_target`; think roles:
:mod:`marl.train.objectives.think_target`).

The optimizer is a backend (:mod:`marl.train.optim`: torch AdamW or a DeepSpeed engine) behind a
few calls, so each objective exists once whichever backend applies the update.

With ``train.magnet.alpha > 0`` each trained adapter has a frozen twin ``<role>@magnet`` on the
same host (magnetic mirror descent, docs/algorithms.md#magnet-schedule) that both objectives
pull towards.  It starts equal to the adapter; the trainer moves it
(:meth:`Learner.set_magnet`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from functools import partial

import torch

from marl.agents.host import ModelHost
from marl.agents.policy import scale_temperature, score_divisors
from marl.agents.precision import autocast
from marl.agents.rollout import Turn
from marl.config import TeamConfig
from marl.config.train import TrainConfig
from marl.train.magnet import start_share
from marl.train.objectives import OBJECTIVES, objective_name
from marl.train.optim import Optimizer, OptimizerFactory, TorchAdamW
from marl.train.ranks import Ranks


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
    choice_score: str = "sum"  # choice and think: how the moves were scored (CHOICE_SCORES)
    weights: list[float] | None = None  # importance weights pi_prox / pi_behav (CORRECTIONS)
    action_values: list[float] | None = None  # Q(s, a) per legal action, from branching
    answer_ids: list[list[int]] | None = None  # free decoding: each legal move's own answer

    @classmethod
    def of_turn(cls, t: Turn, advantage: float) -> TrainItem:
        """The decision ``t`` of a game or task, with its ``advantage``, on its role's adapter."""
        return cls(
            adapter=t.role,
            agent=f"{t.role}/{t.agent}",
            prompt_ids=t.prompt_ids,
            completion_ids=t.completion_ids,
            old_logprobs=t.logprobs,
            advantage=advantage,
            candidate_ids=t.candidate_ids,
            choice=t.choice or 0,
            choice_prompt_ids=t.choice_prompt_ids,
            temperature=t.temperature,
            choice_score=t.choice_score,
            action_values=t.action_values,
            answer_ids=t.answer_ids,
        )

    def log_pi(self, logps: torch.Tensor) -> torch.Tensor:
        """log pi over the legal actions from the candidates' summed log-probs ``logps``, as
        the policy sampled it: scored by ``choice_score``, at the decision's temperature."""
        assert self.candidate_ids is not None, "a choice or think decision"
        divisors = score_divisors(self.candidate_ids, self.choice_score)
        scale = torch.tensor(divisors, dtype=logps.dtype, device=logps.device)
        return torch.log_softmax(logps / scale / scale_temperature(self.temperature), 0)

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
    is_weights: dict[str, float] | None = None  # weighting corrections: mean, max, clipped


def magnet_adapter(adapter: str) -> str:
    """The name of ``adapter``'s magnet on its host."""
    return f"{adapter}@magnet"


#: How the ratio's old log-probs relate to the behaviour policy's (the one that sampled:
#: another engine, train.mismatch, or older weights, train.async): every correction but
#: ``none`` recomputes them with the learner's weights before the update (the proximal
#: policy), and each name maps to the cap of its token weights min(pi_prox / pi_behav, cap)
#: read off the train section (None: no weights; inf: untruncated).
CORRECTIONS: dict[str, Callable[[TrainConfig], float | None]] = {
    "none": lambda tc: None,
    "recompute": lambda tc: None,
    "tis": lambda tc: tc.mismatch.cap,
    "decoupled": lambda tc: math.inf,
    "truncated_is": lambda tc: tc.asynchrony.is_cap,
}


def ratio_correction(cfg: TeamConfig, roles: list[str]) -> str:
    """The correction of the learner of ``roles``: ``train.async.correction`` when rollouts
    may be stale (``max_staleness > 0``), else ``train.mismatch.correction`` with ``auto``
    resolved: recompute when one of them samples on an engine other than the learner's
    (vllm)."""
    tc = cfg.train
    assert tc is not None
    if tc.asynchrony.max_staleness > 0:
        return tc.asynchrony.correction
    c = tc.mismatch.correction
    if c != "auto":
        return c
    return "recompute" if any(cfg.role(r).backend == "vllm" for r in roles) else "none"


class GradTap:
    """Sums what each backward adds to the gradient of the parameters that require grad.

    The norm of one agent's share of the gradient cannot be read as a difference of ``.grad``
    before and after its micro-batches once an optimizer moves gradients out of ``.grad`` as
    they arrive (ZeRO-2/3), so it is taken from tensor hooks, which see every backward's
    contribution before any backend handles it.  In a learner group each rank taps its own
    share, and the shares are summed over the ranks before the norm is taken.
    """

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        scale: Callable[[], float],
        ranks: Ranks | None = None,
    ) -> None:
        self.scale, self.params, self.ranks = scale, params, ranks or Ranks()
        self.sums: list[torch.Tensor | None] = [None] * len(params)
        self.handles = [
            p.register_hook(partial(self._add, i)) for i, p in enumerate(params) if p.requires_grad
        ]

    def _add(self, i: int, grad: torch.Tensor) -> None:
        g = grad.detach().to(torch.float32, copy=True)
        self.sums[i] = g if self.sums[i] is None else self.sums[i].add_(g)

    def squared_norm(self) -> float:
        if self.ranks.world > 1:  # every rank's share of this agent's gradient, summed
            self.sums = [
                torch.zeros_like(p, dtype=torch.float32) if s is None else s
                for p, s in zip(self.params, self.sums, strict=True)
            ]
            self.ranks.sum_tensors(self.sums)
        return sum(float((s**2).sum()) for s in self.sums if s is not None) / self.scale() ** 2

    def __enter__(self) -> GradTap:
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()


class Learner:
    """Owns the optimizer of the given adapters on ``host``; ``cfg`` is the team's ``train``
    section (as TRL's trainers take their config), ``correction`` the resolved correction of
    the ratio's old log-probs (:func:`ratio_correction`, :data:`CORRECTIONS`)."""

    def __init__(
        self,
        cfg: TrainConfig,
        host: ModelHost,
        adapters: list[str],
        optimizer: OptimizerFactory = TorchAdamW,
        correction: str = "none",
    ) -> None:
        if cfg.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {cfg.epochs}")
        autocast(cfg.precision, host.device)  # refuses what this device cannot compute in, now
        if correction not in CORRECTIONS:
            raise ValueError(f"correction must be one of {list(CORRECTIONS)}, got {correction!r}")
        self.cfg, self.host, self.adapters = cfg, host, list(adapters)
        self.correction, self.lr = correction, cfg.lr
        self.weight_cap = CORRECTIONS[correction](cfg)
        self.params = host.adapter_parameters(*self.adapters)
        self.adapter_params = {a: host.adapter_parameters(a) for a in self.adapters}
        if not self.params:
            raise ValueError(f"no LoRA parameters found for adapters {self.adapters}")
        for p in self.params:
            p.requires_grad_(True)
        self.optimizer: Optimizer = optimizer(
            host.model, self.params, lr=cfg.lr, max_grad_norm=cfg.max_grad_norm
        )
        self.ranks = Ranks.current()  # after the optimizer, which may start a group of one
        if self.optimizer.collective_forwards:  # one forward per micro-batch on every rank
            host.share_prefix = False  # the learner's own host (runtime: learner_roster)
        self.magnet_share = 1.0  # the magnet adapters' share of the magnet (set_magnet)
        if cfg.magnet.alpha > 0:
            self._add_magnets()
        self.objective = OBJECTIVES[objective_name(cfg)](self)

    # ----- an update
    def update(self, items: list[TrainItem], lr: float | None = None) -> UpdateStats:
        """One update of the objective on the batch (at ``lr`` when given); decisions with
        nothing to learn from (no completion, no candidates) are left out."""
        if lr is not None:
            self.optimizer.set_lr(lr)
            self.lr = lr
        items = [it for it in items if it.completion_ids or it.candidate_ids]
        return self.objective.update(items)

    def compute(self) -> contextlib.AbstractContextManager:
        """The learner's precision (``train.precision``) for the forwards in the block."""
        return autocast(self.cfg.precision, self.host.device)

    @contextlib.contextmanager
    def training(self, mode: bool = True) -> Iterator[None]:
        """The model in train mode (``mode``) for the block, in eval mode after it."""
        self.host.model.train(mode)
        try:
            yield
        finally:
            self.host.model.eval()

    def grad_tap(self) -> GradTap:
        """What the block's backwards add to the trained parameters' gradient."""
        return GradTap(self.params, lambda: self.optimizer.loss_scale, self.ranks)

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
        self.set_magnet(start, start_share(self.cfg.magnet))

    def set_magnet(self, weights: dict[str, dict[str, torch.Tensor]], share: float = 1.0) -> None:
        """The magnets take ``weights`` (per adapter): ``rho <- pi`` when they are the policy's;
        ``share``: the adapters' share of the magnet, the rest uniform (``magnet.start``)."""
        for a in self.adapters:
            self.host.set_adapter_weights(magnet_adapter(a), weights[a])
        self.magnet_share = share

    def magnet_logp(self, items: list[TrainItem]):
        """The magnet's log-probs of ``items``: per decision its distribution over the legal
        actions (choice decoding), else its token log-probs [decisions, tokens]."""
        adapter = items[0].adapter
        with torch.no_grad(), self.host.use(magnet_adapter(adapter)):
            rho = (
                self.choice_dists(items)
                if items[0].kind == "choice"
                else self.logp_fn(items[0])(items)[0]
            )
        return rho

    # ----- log-prob passes
    def choice_scores(self, items: list[TrainItem]) -> list[torch.Tensor]:
        """Per decision, ``log p(text_a | prompt)`` of each legal action's candidate."""
        score = (
            self.host.pair_scores
            if self.optimizer.collective_forwards
            else self.host.candidate_scores
        )
        return score([it.prompt_ids for it in items], [it.candidate_ids for it in items])

    def choice_dists(
        self, items: list[TrainItem], scores: list[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """Per decision, log pi over its legal actions at its sampling temperature (from
        ``scores`` when computed)."""
        scores = scores or self.choice_scores(items)
        return [it.log_pi(s) for it, s in zip(items, scores, strict=True)]

    def logp_fn(self, item: TrainItem) -> Callable:
        """The log-prob recomputation of ``item``'s kind (a micro-batch holds one kind)."""
        return {"free": self.free_logp, "choice": self.choice_logp, "think": self.think_logp}[
            item.kind
        ]

    def choice_logp(self, items: list[TrainItem], dists: list[torch.Tensor] | None = None):
        """(log pi of the choices, old, mask, entropies), from ``dists`` when computed."""
        logp, ent = [], []
        for it, lp in zip(items, dists or self.choice_dists(items), strict=True):
            logp.append(lp[it.choice])
            ent.append(-(lp.exp() * lp).sum())
        logp_t = torch.stack(logp)[:, None]
        old = torch.tensor([it.old_logprobs[0] for it in items], device=logp_t.device)[:, None]
        return logp_t, old, torch.ones_like(old), torch.stack(ent)

    def free_logp(self, items: list[TrainItem]):
        """(token log-probs, old, mask, entropies) padded to [decisions, tokens]."""
        want_ent = self.cfg.entropy > 0
        per, ents = self.host.sequence_stats(
            [it.prompt_ids for it in items],
            [it.completion_ids for it in items],
            items[0].temperature,
            entropy=want_ent,
        )
        ent = torch.stack([e.mean() for e in ents]) if want_ent else None
        return (*self._padded(items, per), ent)

    def reasoned(self, items: list[TrainItem], entropy: bool = False):
        """Per think decision, from one forward over its context: its reasoning tokens'
        log-probs, their full-vocabulary entropies (when ``entropy``) and log pi over its legal
        actions after the reasoning."""
        per, ents, scores = self.host.reasoned_stats(
            [it.prompt_ids for it in items],
            [it.completion_ids for it in items],
            [it.choice_prompt_ids for it in items],
            [it.candidate_ids for it in items],
            items[0].temperature,
            entropy=entropy,
        )
        return per, ents, _move_dists(items, scores)

    def reasoned_moves(self, items: list[TrainItem]) -> list[torch.Tensor]:
        """:meth:`reasoned`'s log pi over the legal actions alone (the reasoning's tokens not
        scored)."""
        scores = self.host.move_scores(
            [it.prompt_ids for it in items],
            [it.choice_prompt_ids for it in items],
            [it.candidate_ids for it in items],
        )
        return _move_dists(items, scores)

    def think_logp(self, items: list[TrainItem], reasoned: tuple | None = None):
        """Per row: the reasoning tokens' log-probs, then ``log pi(choice | prompt,
        reasoning)``, from ``reasoned`` (:meth:`reasoned`) when computed; the entropy, where
        the reasoning's were computed, is the mean over those positions (vocabulary, then legal
        actions)."""
        per, ents, dists = reasoned or self.reasoned(items, self.cfg.entropy > 0)
        rows, ent = [], []
        for i, (it, x, lp) in enumerate(zip(items, per, dists, strict=True)):
            rows.append(torch.cat([x, lp[it.choice : it.choice + 1]]))
            if ents:
                ent.append(torch.cat([ents[i], -(lp.exp() * lp).sum()[None]]).mean())
        return (*self._padded(items, rows), torch.stack(ent) if ent else None)

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

    # ----- micro-batches
    def chunk_size(self, grad: bool) -> int:
        """Sequences per forward: ``micro_batch`` where a backward follows, else
        ``forward_batch``."""
        learner = self.cfg.learner
        return learner.micro_batch if grad else learner.forward_batch

    def chunks(self, group: list[TrainItem], grad: bool = True) -> list[list[TrainItem]]:
        """Micro-batches of at most :meth:`chunk_size` distinct sequences (:meth:`_rows`).

        Items are ordered by prompt so repeated information states share a micro-batch and
        are computed once, and the prompts of a chunk run their common head once (see
        ``ModelHost.candidate_scores``).
        """
        group = sorted(group, key=lambda it: (it.prompt_ids, it.completion_ids))
        chunks: list[list[TrainItem]] = []
        seen: set = set()
        for it in group:
            keys = self._rows(it)
            if not chunks or len(seen | keys) > self.chunk_size(grad):
                chunks.append([])
                seen = set()
            chunks[-1].append(it)
            seen |= keys
        return chunks

    def _rows(self, item: TrainItem) -> set:
        """The batch rows ``item`` needs: a choice decision's candidates ride in its prompt's
        row as a token tree, one row per distinct prompt, except where the ranks' forwards
        must be collective (a row per candidate, :meth:`choice_scores`); any other item is
        its own sequence."""
        if item.kind != "choice":
            return {id(item)}
        if self.optimizer.collective_forwards:
            return {(tuple(item.prompt_ids), tuple(c)) for c in item.candidate_ids}
        return {tuple(item.prompt_ids)}

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


def _move_dists(items: list[TrainItem], scores: list[torch.Tensor]) -> list[torch.Tensor]:
    """log pi over each decision's legal actions from their scores, at its temperature."""
    return [it.log_pi(s) for it, s in zip(items, scores, strict=True)]
