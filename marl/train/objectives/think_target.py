"""Policy targets for think-then-act roles: the reasoning as a latent of the move.

The ``think_target`` objective, which ``policy_target`` hands batches of think decisions
(``train.policy_target.eta > 0``, ``decoding.mode: think``).

A think role writes a reasoning z, then chooses a move after it, so its policy over the moves
at an information state s (the prompt without the reasoning) integrates the reasoning out:

    pi(a | s) = E_{z ~ pi(z | s)} pi(a | s, z)  ~  (1/m) sum_j pi(a | s, z_j)

over the m reasonings z_j sampled at s in the batch.  MMD's target for s is made from that
mixture exactly as for a choice role (:mod:`.policy_target`: the same action values Q(s, a)
from the batch, the same closed form), with the magnet's move distribution after the same
reasonings as rho(a | s) (the magnet's own reasonings are not sampled, and importance weights
over a whole reasoning would be as noisy as it is long).  The loss is

    L = mean_s KL(pi_target_s || (1/m_s) sum_j pi_theta(. | s, z_j))
        + w * sum_{j, t} -min(r_jt A_j, clip(r_jt, 1 - eps_low, 1 + eps_high) A_j) / T
    A_j  = Q(s, a_j) - V(s),    V(s) = (1/m_s) sum_i Q(s, a_i)
    r_jt = pi_theta(z_jt | s, z_j<t) / pi_old(z_jt | s, z_j<t)

(w: ``train.policy_target.reasoning_weight``; T: the batch's reasoning tokens; a move taken
after reasoning j is a_j; with w = 0 the reasoning's tokens are not scored at all).  The first
term fits the moves: only the mixture has to match the target, not each pi(. | s, z_j), so
reasonings may specialise (one that names a strong card can bet while another checks) and the
move after a reasoning is free to depend on what it says; a per-(s, z) KL would pull every
reasoning's move to the same table and leave the reasoning nothing to decide.  The second
trains the reasoning tokens by the decision's advantage (GRPO's clipped surrogate against the
sampling-time log-probs, so the ``fit_steps`` steps on it are bounded as PPO's epochs are); the
move's own token is left to the first term.  With ``train.entropy`` the reasoning tokens'
entropy bonus is added as in GRPO.

The solver (``train.policy_target.solver``) fits it in one of two ways:

- ``adam``: ``fit_steps`` optimizer steps on L, keeping the best weights seen
  (:func:`.policy_target.fit`).
- ``gauss_newton``: ``fit_steps`` damped Gauss-Newton steps
  (:func:`.policy_target.gauss_newton_fit`, its line search on the KL term alone) on the
  mixture's logit differences

      f_s(a) = log pibar(a | s) - log pibar(a_0 | s),  a >= 1,
      pibar(. | s) = (1/m_s) sum_j softmax(scores(. | s, z_j) / tau)

  (tau: the sampling temperature) towards the target's; then, with w > 0, one optimizer step
  on the whole L (the better weights kept), so the reasoning still learns from the advantage
  while the KL holds the moves near their targets.  The step's Jacobian is not f's own but
  that of the mean over the state's reasonings of the move's logit differences after each,

      g_s(a) = (1/m_s) sum_j [log pi(a | s, z_j) - log pi(a_0 | s, z_j)]

  which moves the move after every reasoning alike.  f's own Jacobian weighs each reasoning
  by how undecided the move after it is (p(a | s, z_j) p(a_0 | s, z_j) / pibar), so its
  least-norm step moves the move after those few reasonings, which fresh reasonings do not
  share: on SmolLM2 the KL before each fit stayed at 0.05-0.08 and the read exploitability
  flat at 0.33 over 7 steps.  The line search still measures f's KL.  The Jacobian takes
  one backward pass per action index (:class:`.policy_target.RowGrads`): each state's
  distinct contexts (prompt, reasoning, separator) are scored once, its prompt run once for
  them and no work shared with other states, every batch row of them counting as the
  state's; a reasoning sampled twice weighs twice in pibar and in g.

``train.policy_target.think_fit`` says whose moves are fitted: ``mixture`` (above), ``each``
(the move after every reasoning to its state's target, the mean of those KLs) or ``pooled``:
the states with the same legal moves are all scored after the same reasonings, drawn from the
ones those states wrote (:func:`pool_reasonings`), and their mixtures fitted.  Reasonings that
follow their own state's prompt let a least-norm step tell the states apart by the words
sampled there rather than by the card; behind a shared set of reasonings only the prompt
differs.  The loss and the fit's residual are then those of the pooled mixtures.

A state's decisions are scored in one micro-batch (its mixture needs every reasoning in one
graph), so a state with more than ``train.learner.micro_batch`` decisions (``forward_batch``
in the evaluations without gradients) takes one alone.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from marl.agents.host import ModelHost
from marl.agents.host.generation import think_contexts
from marl.train.learner import Learner, TrainItem, UpdateStats, magnet_adapter
from marl.train.loss import LossParts, grpo_loss
from marl.train.objectives import register_objective
from marl.train.objectives.policy_target import (
    Linearised,
    RowGrads,
    TargetBatch,
    accumulate,
    adam_fit,
    adapter_gauss_newton,
    difference_jacobian,
    magnet_read,
    state_key,
    target_batch,
    target_kl,
    target_stats,
)

State = list[TrainItem]  # the decisions of one information state, one per sampled reasoning


def mixture(dists: list[torch.Tensor]) -> torch.Tensor:
    """log (1/m) sum_j pi_j over the last axis, from m log-distributions over one action set."""
    return torch.logsumexp(torch.stack([d.float() for d in dists]), 0) - math.log(len(dists))


def mixtures(states: list[State], dists: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each state's mixture (:func:`mixture`), ``dists`` holding its decisions' in order."""
    out, i = [], 0
    for s in states:
        out.append(mixture(dists[i : i + len(s)]))
        i += len(s)
    return out


def state_chunks(states: list[State], size: int) -> list[list[State]]:
    """The states packed into micro-batches of at most ``size`` decisions, a state never split:
    one with more decisions than ``size`` takes a micro-batch alone."""
    chunks: list[list[State]] = []
    count = 0
    for s in states:
        if not chunks or count + len(s) > size:
            chunks.append([])
            count = 0
        chunks[-1].append(s)
        count += len(s)
    return chunks


def pool_key(it: TrainItem) -> tuple:
    """The states whose reasonings :func:`pool_reasonings` pools: one adapter, temperature
    and set of legal moves (in Kuhn poker, the cards a seat may hold at one point of play)."""
    return (it.adapter, tuple(map(tuple, it.candidate_ids)), it.temperature)


def pool_reasonings(b: TargetBatch, rng: random.Random, host: ModelHost) -> None:
    """``think_fit: pooled``: every state of a pool (:func:`pool_key`) scored after the same
    reasonings, drawn without replacement from all those the pool's states wrote, as many as
    the state has decisions (its mixture keeps its size).  A state's decision j becomes its
    prompt followed by drawn reasoning j; since the states of a pool then differ only in their
    prompts, only what the prompts tell apart (the card) can move their moves apart."""
    pools: dict[tuple, list[TrainItem]] = defaultdict(list)
    for group in b.members.values():
        pools[pool_key(group[0])].extend(group)
    drawn = {k: rng.sample(pool, len(pool)) for k, pool in pools.items()}
    for key, group in b.members.items():
        shared = drawn[pool_key(group[0])][: len(group)]
        contexts = think_contexts(
            host, [it.prompt_ids for it in group], [z.completion_ids for z in shared]
        )
        b.members[key] = [
            replace(
                it,
                completion_ids=z.completion_ids,
                old_logprobs=z.old_logprobs,
                choice_prompt_ids=c,
            )
            for it, z, c in zip(group, shared, contexts, strict=True)
        ]


def reasoning_advantages(b: TargetBatch) -> None:
    """Every decision's advantage made Q(s, a) - V(s) from the batch's action values, V(s) the
    mean of Q(s, a) over the state's decisions: the advantage of the reasoning that led to a."""
    for key, group in b.members.items():
        q = b.q[key]
        v = sum(q[it.choice] for it in group) / len(group)
        b.members[key] = [replace(it, advantage=q[it.choice] - v) for it in group]


@dataclass
class Reasoning:
    """A micro-batch's reasoning term: its loss parts (averaged over its reasoning tokens) and
    how many tokens it averaged."""

    parts: LossParts
    mask_tokens: float


@dataclass
class Evaluation:
    """One evaluation of the loss: its total, the moves' mean KL to the targets, the reasoning
    term (before its weight) and the fraction of reasoning tokens the clip cut (both 0 with a
    reasoning weight of 0: the reasoning's tokens are then not scored)."""

    total: float
    kl: float = 0.0
    reasoning: float = 0.0
    clip_frac: float = 0.0


@register_objective("think_target")
class ThinkTarget:
    """MMD's targets for the moves of think decisions, fitted through the mixture over the
    sampled reasonings, with a policy-gradient term on the reasoning tokens (module
    docstring); ``loss`` is the KL before the fit, ``fit_residual`` at the weights kept,
    ``clip_frac`` the reasoning tokens'."""

    def __init__(self, learner: Learner) -> None:
        self.learner, self.cfg = learner, learner.cfg.policy_target
        self.rng = random.Random(learner.cfg.seed)  # think_fit: pooled draws

    def update(self, items: list[TrainItem]) -> UpdateStats:
        if any(it.kind != "think" for it in items):
            raise ValueError("think targets need think decoding")
        b = self.batch(items)
        seen: list[Evaluation] = []

        def evaluate(grad: bool) -> Evaluation:
            seen.append(self.evaluate(b, grad))
            return seen[-1]

        if self.cfg.solver == "gauss_newton":
            kept = self._gauss_newton(b, evaluate)
        else:
            kept = self._adam(b, evaluate)
        return target_stats(b, seen[0].kl, kept.kl, len(items), kept.clip_frac)

    def _adam(
        self, b: TargetBatch, evaluate: Callable[[bool], Evaluation], steps: int | None = None
    ) -> Evaluation:
        """``steps`` optimizer steps (default ``fit_steps``) on the whole loss, ending on the
        best weights seen (:func:`.policy_target.adam_fit`): the evaluation there, its KL inf
        where no loss was finite."""
        seen: list[Evaluation] = []

        def loss(grad: bool) -> float:
            seen.append(evaluate(grad))
            return seen[-1].total

        best = adam_fit(self.learner, loss, b, steps).best
        kept = next((e for e in seen if e.total == best), seen[0])
        return kept if math.isfinite(best) else replace(kept, kl=math.inf)

    def _gauss_newton(self, b: TargetBatch, evaluate: Callable[[bool], Evaluation]) -> Evaluation:
        """Gauss-Newton steps of the mixtures' logit differences towards the targets' (the
        line search on the moves' KL), then, with a reasoning weight, one optimizer step on
        the whole loss (module docstring): the evaluation at the weights kept."""
        seen = [evaluate(False)]  # also makes the targets
        if not math.isfinite(seen[0].total):
            return replace(seen[0], kl=math.inf)

        def kl() -> float:
            seen.append(evaluate(False))
            return seen[-1].kl if math.isfinite(seen[-1].total) else math.inf

        def rows(group: list[tuple], params: list[torch.nn.Parameter]) -> Iterator[Linearised]:
            for chunk in self._chunks(b, group, grad=True):
                yield think_jacobian(
                    self.learner, chunk, params, b.targets, self.cfg.think_fit == "each"
                )

        best = adapter_gauss_newton(self.learner, b, rows, kl, seen[0].kl).best
        if self.cfg.reasoning_weight > 0:
            return self._adam(b, evaluate, steps=1)
        return next(e for e in reversed(seen) if e.kl == best)

    def batch(self, items: list[TrainItem]) -> TargetBatch:
        """The batch's states with their action values, reasoning advantages and (with a
        magnet) the magnet's mixtures."""
        b = target_batch(items)
        reasoning_advantages(b)
        if self.cfg.think_fit == "pooled":
            pool_reasonings(b, self.rng, self.learner.host)
        if self.learner.cfg.magnet.alpha > 0:
            with torch.no_grad(), self.learner.compute():
                for adapter, group in b.by_adapter.items():
                    with self.learner.host.use(magnet_adapter(adapter)):
                        for chunk in self._chunks(b, group, grad=False):
                            dists = self.learner.reasoned_moves(_items(chunk))
                            keys = [state_key(s[0]) for s in chunk]
                            share = self.learner.magnet_share
                            rho = [magnet_read(m, share) for m in mixtures(chunk, dists)]
                            b.rho.update(zip(keys, rho, strict=True))
        return b

    def _chunks(self, b: TargetBatch, keys: list[tuple], grad: bool) -> list[list[State]]:
        return state_chunks([b.members[k] for k in keys], self.learner.chunk_size(grad))

    def evaluate(self, b: TargetBatch, grad: bool) -> Evaluation:
        """The loss at the current weights (its gradient accumulated when ``grad``; see
        :func:`.policy_target.accumulate`); a total of inf when not finite."""
        n = len(b.members)
        tokens = max(1, sum(len(it.completion_ids) for s in b.members.values() for it in s))
        out = Evaluation(0.0)

        def part(chunk: list[State]) -> torch.Tensor:
            if not self.cfg.reasoning_weight:  # the reasoning is no part of the loss
                kl = self._moves_kl(b, chunk, self.learner.reasoned_moves(_items(chunk)))
                out.kl += float(kl.detach()) / n
                return kl / n
            kl, reasoning = self._chunk_loss(b, chunk)
            share = reasoning.mask_tokens / tokens
            out.kl += float(kl.detach()) / n
            out.reasoning += float(reasoning.parts.loss.detach()) * share
            out.clip_frac += reasoning.parts.clip_frac * share
            return kl / n + self.cfg.reasoning_weight * share * reasoning.parts.loss

        out.total = accumulate(
            self.learner, b, grad, lambda keys: self._chunks(b, keys, grad), part
        )
        return out

    def _chunk_loss(self, b: TargetBatch, chunk: list[State]) -> tuple[torch.Tensor, Reasoning]:
        """The summed KL of the chunk's states' mixtures to their targets, and the clipped
        surrogate of its reasoning tokens (averaged over them)."""
        learner, items = self.learner, _items(chunk)
        reasoned = learner.reasoned(items, learner.cfg.entropy > 0)
        kl = self._moves_kl(b, chunk, reasoned[2])
        logp, old, mask, _ = learner.think_logp(items, (reasoned[0], [], reasoned[2]))
        for row, it in enumerate(items):  # the move: fitted by the KL, not reinforced
            mask[row, len(it.completion_ids)] = 0
        ent = None
        if reasoned[1]:
            ent = torch.stack([e.mean() if len(e) else e.new_zeros(()) for e in reasoned[1]])
        adv = torch.tensor([it.advantage for it in items], device=logp.device)
        cfg = learner.cfg
        parts = grpo_loss(
            logp, old, adv, mask, cfg.clip_low, cfg.clip_high, entropy=ent, entropy_coef=cfg.entropy
        )
        return kl, Reasoning(parts, float(mask.sum()))

    def _moves_kl(
        self, b: TargetBatch, chunk: list[State], dists: list[torch.Tensor]
    ) -> torch.Tensor:
        """The summed KL of the chunk's states' mixtures (``think_fit: each``: of the move
        after each reasoning) to their targets, ``dists`` the decisions' log pi in order."""
        kls, at = [], 0
        for s, mix in zip(chunk, mixtures(chunk, dists), strict=True):
            target = b.target(state_key(s[0]), mix, self.cfg.eta, self.learner.cfg.magnet.alpha)
            fitted = dists[at : at + len(s)] if self.cfg.think_fit == "each" else [mix]
            kls.append(sum(target_kl(d, target) for d in fitted) / len(fitted))
            at += len(s)
        return torch.stack(kls).sum()


def _items(chunk: list[State]) -> list[TrainItem]:
    return [it for s in chunk for it in s]


def think_jacobian(
    learner: Learner,
    chunk: list[State],
    params: list[torch.nn.Parameter],
    targets: dict[tuple, torch.Tensor],
    each: bool = False,
) -> Linearised:
    """On ``learner``'s active adapter, the Jacobian over ``params`` of the mean move's logit
    differences g_s of ``chunk``'s states ([rows, P], a row per (state, a >= 1)) and the
    residuals of the mixtures' f_s to the ``targets``' (module docstring;
    :func:`.policy_target.difference_jacobian`).  Each state's distinct contexts are scored
    once, apart from every other, and all their batch rows count as the state's; a context
    several decisions share weighs as many times in the mixture.  ``each``: a row per
    (distinct context, a >= 1) instead, the move after that reasoning towards its state's
    target (every context run in full, on its own)."""
    scored: list[TrainItem] = []  # a decision per distinct context
    unit: list[int] = []  # its state's index in the chunk
    picks: list[list[int]] = []  # per state, per decision: its context's index in ``scored``
    for k, s in enumerate(chunk):
        index: dict[tuple, int] = {}
        for it in s:
            if tuple(it.choice_prompt_ids) not in index:
                index[tuple(it.choice_prompt_ids)] = len(scored)
                scored.append(it)
                unit.append(k)
        picks.append([index[tuple(it.choice_prompt_ids)] for it in s])
    state_of = torch.arange(len(scored)) if each else torch.tensor(unit)
    units = len(scored) if each else len(chunk)
    with RowGrads(learner.host.model, params, units) as rows, learner.compute():
        scores = learner.host.separate_scores(
            [it.choice_prompt_ids for it in scored],
            [it.candidate_ids for it in scored],
            lambda owner: rows.owner(state_of[owner]),
            None if each else unit,  # a state's contexts share its prompt: run once, theirs alone
        )
    dists = [it.log_pi(x.float()) for it, x in zip(scored, scores, strict=True)]
    if each:
        own = [targets[state_key(chunk[k][0])] for k in unit]
        return difference_jacobian(dists, own, params, rows)
    mixes = [mixture([dists[i] for i in p]) for p in picks]
    means = [torch.stack([dists[i] for i in p]).mean(0) for p in picks]
    wanted = [targets[state_key(s[0])] for s in chunk]
    return difference_jacobian(mixes, wanted, params, rows, moved=means)
