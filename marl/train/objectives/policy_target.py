"""Policy targets: magnetic mirror descent's step in closed form, then fitted by the model.

The ``policy_target`` objective of the learner (``train.policy_target.eta > 0``, choice
decoding; batches of think decisions go to :mod:`.think_target`, which reuses the pieces here:
the action values, the closed form, :func:`fit`, :func:`accumulate` and the Gauss-Newton
solver, :func:`adapter_gauss_newton` and :func:`difference_jacobian`).

For an information state s with legal actions a, the current policy pi, the magnet rho and
action values Q(s, a) estimated from the batch (the mean return in reward units after playing
a at s; an action not played there gets the state's mean, i.e. no advantage), MMD's step with
the negative-entropy mirror map (Sokota et al., ICLR 2023) has a closed form:

    log pi_target(a) = [ log pi(a) + alpha eta log rho(a) + eta Q(s, a) ] / (1 + alpha eta)
                       - log Z

The model is then fitted to the table of targets, by optimiser steps that keep the best
weights seen (:func:`fit`) or by damped Gauss-Newton steps (:func:`gauss_newton_fit`), on

    L = mean_s KL(pi_target_s || pi_theta_s)

a supervised loss whose only minimum is the target table, whatever the parametrisation.  A
policy-gradient step puts its fixed point in the same place, but where the model's features
tie the information states together (an LLM's "bet" barely depends on its card) the optimiser
spends the step on what the states share; fitting a target to convergence moves the
state-specific part as far as the target asks (docs/algorithms.md#policy-targets).

The Jacobians Gauss-Newton needs come from one backward pass per action index: the states are
scored without shared work, so each batch row's activations belong to one state
(:class:`RowGrads`).

A free-text role's move is the answer it writes, read by the game.  Its policy at s sums
over the answers that name each move; the fit takes the one answer that names move a and
nothing else, y_a (the move's text, then the end of the answer, :func:`as_answers`), so

    pi(a | s) = p(y_a | s) / M(s),    M(s) = sum_a p(y_a | s)

is the policy among those answers and M(s) the probability that the answer is one of them,
which every other answer (reasoning first, an illegal move, no move) lowers.  The loss adds
the negative log of it,

    L = mean_s [ KL(pi_target_s || pi_theta_s) - log M_theta(s) ],

so the fit moves the moves towards their targets and the mass onto the playable answers,
where sampled answers and this pi agree; Gauss-Newton gets one more row per state, log M
towards 0.  The sampling temperature must be 1 (then p(y_a | s) is what sampling draws).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

from marl.train.learner import Learner, TrainItem, UpdateStats
from marl.train.loss import exact_kl
from marl.train.objectives import OBJECTIVES, register_objective

#: A linearisation: Jacobian rows ([K, P]) and their residuals (targets minus values, [K]).
Linearised = tuple[torch.Tensor, torch.Tensor]


def action_values(
    keys: Sequence[Hashable],
    choices: Sequence[int],
    rewards: Sequence[float],
    n_actions: Sequence[int],
    branched: Sequence[Sequence[float] | None] = (),
) -> dict[Hashable, list[float]]:
    """Q(s, a) per information state: the mean return of the decisions that played a at s;
    an action not played there gets the state's mean return.  A state with ``branched``
    values (every action's mean return from copies of the game, ``train.branch``) takes
    their mean over its decisions instead."""
    sums: dict[Hashable, list[float]] = {}
    counts: dict[Hashable, list[int]] = {}
    total: dict[Hashable, list[float]] = defaultdict(lambda: [0.0, 0])
    vines: dict[Hashable, list[Sequence[float]]] = defaultdict(list)
    for key, a, r, n, v in zip(
        keys, choices, rewards, n_actions, branched or [None] * len(keys), strict=True
    ):
        sums.setdefault(key, [0.0] * n)[a] += r
        counts.setdefault(key, [0] * n)[a] += 1
        total[key][0] += r
        total[key][1] += 1
        if v is not None:
            vines[key].append(v)
    values = {}
    for key, s in sums.items():
        mean = total[key][0] / total[key][1]
        values[key] = (
            [sum(col) / len(vines[key]) for col in zip(*vines[key], strict=True)]
            if key in vines
            else [s[a] / c if c else mean for a, c in enumerate(counts[key])]
        )
    return values


def mmd_target(
    logp: torch.Tensor,
    magnet_logp: torch.Tensor,
    q: torch.Tensor,
    eta: float | torch.Tensor,
    alpha: float,
) -> torch.Tensor:
    """log pi_target over the last axis (rows: information states; -inf pads stay -inf);
    ``eta`` is one step size or one per row ([states, 1])."""
    z = (logp + alpha * eta * magnet_logp + eta * q) / (1 + alpha * eta)
    return torch.log_softmax(z, -1)


def magnet_read(magnet_logp: torch.Tensor, share: float) -> torch.Tensor:
    """log rho over the last axis: ``share`` of the magnet adapter's distribution, the rest
    uniform (``log rho = share log p_M + const``; ``train.magnet.start: uniform``, share 0 at
    first); -inf pads stay -inf."""
    if share == 1:
        return magnet_logp
    return torch.log_softmax(
        torch.where(torch.isfinite(magnet_logp), share * magnet_logp, magnet_logp), -1
    )


def target_kl(logp: torch.Tensor, target_logp: torch.Tensor) -> torch.Tensor:
    """KL(pi_target || pi_theta) per row, the fitting loss (gradient through ``logp``)."""
    p = target_logp.exp()
    return (p * (target_logp - logp)).nan_to_num(0.0).sum(-1)


@dataclass
class Fit:
    first: float  # the loss before the fit: how far the targets are
    best: float  # the lowest loss reached: the weights kept
    lr: float | None = None  # the step size an optimiser's fit ended with


def fit(
    loss: Callable[[bool], float],
    step: Callable[[float], None],
    save: Callable[[], Any],
    restore: Callable[[Any], None],
    lr: float,
    steps: int,
) -> Fit:
    """``steps`` optimiser steps on a loss, ending on the best weights seen.

    ``loss(grad)`` evaluates the loss at the current weights (accumulating its gradient when
    ``grad``); ``step(lr)`` applies one step.  A step that does not lower the loss halves the
    step size: Adam's steps are about ``lr`` in size however close the target is, so a fixed
    ``lr`` that moves a far target overshoots a near one.
    """
    first = best = loss(True)
    kept = save()
    last = first
    for i in range(steps):
        step(lr)
        last = loss(i < steps - 1)
        if last < best:
            best, kept = last, save()
        else:
            lr /= 2
    if not last <= best:  # the last step made things worse (or not finite): undo it
        restore(kept)
    return Fit(first, best, lr)


def gauss_newton(jacobian: torch.Tensor, residual: torch.Tensor, ridge: float) -> torch.Tensor:
    """The least-norm parameter step that moves K function values by ``residual``, to first
    order:

        delta = J^T (J J^T + lambda I)^-1 r,    lambda = ridge * trace(J J^T) / K

    J is [K, P]: the gradients of each state's logit differences.  Where the model's features
    tie the states together (one direction moves every card's "bet"), J J^T is
    ill-conditioned and a gradient step follows its largest eigenvector; this step moves each
    state by what its target asks."""
    wide = jacobian.double()  # J J^T sums over every parameter (SmolLM2's LoRA: ~2M): in
    # float32 its rounding (~1e-4 of the largest entry) exceeds the ridge on the directions
    # that tell the states apart, so it is formed and solved in float64
    gram = wide @ wide.T
    lam = ridge * float(gram.diagonal().mean()) + 1e-12
    eye = torch.eye(len(gram), dtype=gram.dtype, device=gram.device)
    c = torch.linalg.solve(gram + lam * eye, residual.to(gram))
    return jacobian.T @ c.to(jacobian.dtype)


def jacobian(values: torch.Tensor, params: list[torch.nn.Parameter]) -> torch.Tensor:
    """[K, P]: the gradient of each of the K ``values`` over the flattened ``params``, one
    backward pass per value."""
    rows = []
    for v in values:
        g = torch.autograd.grad(v, params, retain_graph=True, allow_unused=True)
        rows.append(
            torch.cat(
                [
                    torch.zeros(p.numel(), device=p.device) if x is None else x.float().flatten()
                    for p, x in zip(params, g, strict=True)
                ]
            )
        )
    return torch.stack(rows)


class RowGrads:
    """Per-unit gradients of ``nn.Linear`` weights from one backward pass.

    Where each batch row of a forward serves one unit (an information state) and the units
    share no computation, the gradient of ``sum_k f_k`` splits into the units' own
    gradients: for a linear layer ``y = x W^T`` the weight gradient is ``sum_t g_t x_t^T``
    over the positions t of a row, and a row's positions belong to one unit.  So one
    backward gives the K rows of a Jacobian that :func:`jacobian` needs K passes for.

    ``owner(rows)`` is told before each forward which unit each batch row serves; use as a
    context manager around the forwards, then call :meth:`take` after each backward.
    """

    def __init__(
        self, model: torch.nn.Module, params: list[torch.nn.Parameter], units: int
    ) -> None:
        by_weight = {id(m.weight): m for m in model.modules() if isinstance(m, torch.nn.Linear)}
        missing = [p for p in params if id(p) not in by_weight]
        if missing:
            raise ValueError(f"{len(missing)} parameters are not nn.Linear weights")
        self.modules = [by_weight[id(p)] for p in params]
        self.acc = [torch.zeros(units, *p.shape, device=p.device) for p in params]
        self._owner: torch.Tensor | None = None
        self._hooks: list = []

    def owner(self, rows: torch.Tensor) -> None:
        self._owner = rows

    def _forward(self, i: int, inputs: tuple, out: torch.Tensor) -> None:
        if not out.requires_grad:
            return
        x, owner = inputs[0].detach(), self._owner
        assert owner is not None and len(owner) == len(x), "owner() not told of this forward"

        def add(g: torch.Tensor) -> None:
            per_row = torch.einsum("bto,bti->boi", g.float(), x.float())
            self.acc[i].index_add_(0, owner.to(per_row.device), per_row.to(self.acc[i]))

        out.register_hook(add)

    def __enter__(self) -> RowGrads:
        self._hooks = [
            m.register_forward_hook(lambda _, inp, out, i=i: self._forward(i, inp, out))
            for i, m in enumerate(self.modules)
        ]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()

    def take(self) -> torch.Tensor:
        """[units, P]: the gradients gathered since the last call, flat in ``params``' order."""
        out = torch.cat([a.flatten(1) for a in self.acc], 1)
        for a in self.acc:
            a.zero_()
        return out


@torch.no_grad()
def shift(params: list[torch.nn.Parameter], delta: torch.Tensor) -> None:
    """params += delta, ``delta`` flat in their order."""
    i = 0
    for p in params:
        p.add_(delta[i : i + p.numel()].view_as(p).to(p.dtype))
        i += p.numel()


def gauss_newton_fit(
    linearise: Callable[[], Linearised],
    params: list[torch.nn.Parameter],
    loss: Callable[[], float],
    ridge: float,
    steps: int,
    first: float,
    lengths: int = 6,
    search: Literal["all", "descent"] = "all",
) -> Fit:
    """``steps`` damped Gauss-Newton steps (:func:`gauss_newton`) on ``linearise()``'s
    Jacobian and residual (targets minus values), from ``first = loss()`` at the start
    (which the caller has already); each keeps its direction and takes the length
    :func:`line_search` finds; a step that lowers nothing ends the fit."""
    best = first
    for _ in range(steps):
        jac, residual = linearise()
        delta = gauss_newton(jac, residual, ridge)
        length, value = line_search(params, delta, loss, lengths, search, best)
        if not value < best:
            break
        best = value
        shift(params, delta * length)
    return Fit(first, best)


def line_search(
    params: list[torch.nn.Parameter],
    delta: torch.Tensor,
    loss: Callable[[], float],
    lengths: int,
    search: Literal["all", "descent"],
    start: float,
) -> tuple[float, float]:
    """The length, as a multiple of the step ``delta``, with the lowest ``loss()`` of those
    tried, and that loss (the weights left where they were).

    ``all`` tries 1, 1/2, ..., 2^-(lengths - 1): along a step far beyond where the model is
    linear the loss is not unimodal (SmolLM2's first step: 0.068 -> 0.19, 0.065, 0.11, 0.048
    at 1, 1/2, 1/4, 1/8).  A larger damping would shorten the step too, but would turn it
    towards the gradient, i.e. towards what the states share (card-blind play).  ``descent``
    tries 2 first, then the same lengths in turn, and stops at the first loss above the one
    before it once one is below ``start``: where the step is well scaled (a think-target fit
    after its first steps: the loss falls all the way to the full step) that is 2-3 losses
    instead of all of them; a step that is too long still walks down until a length lowers
    the loss, but a lower loss further down, past a rise, goes unseen."""
    factors = [2.0] * (search == "descent") + [2.0**-i for i in range(lengths)]
    tried: list[tuple[float, float]] = []
    for factor in factors:
        shift(params, delta * factor)
        value = loss()
        shift(params, -delta * factor)
        rose = bool(tried) and value > tried[-1][1]
        if search == "descent" and rose and min(v for _, v in tried) < start:
            break
        tried.append((factor, value))
    return min(tried, key=lambda t: t[1])


def adapter_gauss_newton(
    learner: Learner,
    b: TargetBatch,
    rows: Callable[[list[tuple], list[torch.nn.Parameter]], Iterable[Linearised]],
    loss: Callable[[], float],
    first: float,
) -> Fit:
    """Per adapter, ``fit_steps`` steps of :func:`gauss_newton_fit` on its states' Jacobian
    and residuals (``rows(keys, params)``'s parts, stacked; computed with the adapter
    active), from the ``loss()`` ``first`` at the start."""
    cfg, best = learner.cfg.policy_target, first
    for adapter, group in sorted(b.by_adapter.items()):
        params = learner.adapter_params[adapter]

        def linearise(
            adapter: str = adapter, group: list[tuple] = group, params: list = params
        ) -> Linearised:
            with learner.host.use(adapter):
                parts = list(rows(group, params))
            return torch.cat([j for j, _ in parts]), torch.cat([r for _, r in parts])

        best = gauss_newton_fit(
            linearise, params, loss, cfg.ridge, cfg.fit_steps, best, cfg.lengths, cfg.search
        ).best
    return Fit(first, best)


def state_key(it: TrainItem) -> tuple:
    """What identifies a choice decision's information state on its adapter."""
    return (it.adapter, tuple(it.prompt_ids), tuple(map(tuple, it.candidate_ids)), it.temperature)


@dataclass
class TargetBatch:
    """One update's information states and what the fit gathers about them."""

    states: dict[tuple, TrainItem]  # a decision per state
    members: dict[tuple, list[TrainItem]]  # every decision per state
    q: dict[Hashable, list[float]]  # action values per state
    by_adapter: dict[str, list[tuple]]
    rho: dict[tuple, torch.Tensor] = field(default_factory=dict)  # the magnet's log-probs
    targets: dict[tuple, torch.Tensor] = field(default_factory=dict)
    kl_magnet: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    agent_norms: dict[str, float] = field(default_factory=dict)
    grad_norm: float = 0.0
    free: bool = False  # free text: the candidates are whole answers, and -log M is fitted

    def target(self, key: tuple, logp: torch.Tensor, eta: float, alpha: float) -> torch.Tensor:
        """The state's target, made from the policy ``logp`` at its first scoring (the fit's
        start), so that scoring is also the fit's first forward."""
        if key not in self.targets:
            lp = logp.detach().float()
            r = self.rho[key].float() if key in self.rho else torch.zeros_like(lp)
            q = torch.tensor(self.q[key], device=lp.device)
            self.targets[key] = mmd_target(lp, r, q, eta, alpha)
            if alpha > 0:
                self.kl_magnet.append(float(exact_kl(lp, r)))
            self.entropy.append(float(-(lp.exp() * lp).sum()))
        return self.targets[key]


def target_batch(items: list[TrainItem]) -> TargetBatch:
    """The batch's distinct information states, their action values, grouped by adapter."""
    keys = [state_key(it) for it in items]
    members: dict[tuple, list[TrainItem]] = defaultdict(list)
    for key, it in zip(keys, items, strict=True):
        members[key].append(it)
    q = action_values(
        keys,
        [it.choice for it in items],
        [it.advantage for it in items],
        [len(it.candidate_ids) for it in items],
        [it.action_values for it in items],
    )
    by_adapter: dict[str, list[tuple]] = defaultdict(list)
    for key in members:
        by_adapter[key[0]].append(key)
    states = {key: group[0] for key, group in members.items()}
    return TargetBatch(states, dict(members), q, by_adapter)


def adam_fit(
    learner: Learner, loss: Callable[[bool], float], b: TargetBatch, steps: int | None = None
) -> Fit:
    """:func:`fit` with the learner's optimizer from ``train.lr``, ``steps`` steps (default
    ``fit_steps``); the last step's gradient norm goes to ``b``."""

    def step(lr: float) -> None:
        learner.optimizer.set_lr(lr)
        b.grad_norm = learner.optimizer.step()  # applies nothing when it is not finite

    steps = learner.cfg.policy_target.fit_steps if steps is None else steps
    return fit(loss, step, learner.weights, learner.load, learner.lr, steps)


def target_stats(
    b: TargetBatch, first: float, best: float, decisions: int, clip_frac: float = 0.0
) -> UpdateStats:
    """What a target update reports: ``first`` the KL before the fit (the step's size),
    ``best`` after it (the fit's residual); skipped when the fit ended on no finite loss."""
    n = len(b.states)
    return UpdateStats(
        first,
        b.grad_norm,
        b.agent_norms,
        clip_frac,
        0.0,
        sum(b.entropy) / n,
        decisions,
        skipped=not math.isfinite(best),
        kl_magnet=sum(b.kl_magnet) / n if b.kl_magnet else 0.0,
        fit_residual=best,
    )


def accumulate(
    learner: Learner,
    b: TargetBatch,
    grad: bool,
    chunks: Callable[[list[tuple]], Iterable[Any]],
    part: Callable[[Any], torch.Tensor],
) -> float:
    """A fit's loss at the current weights: the sum of ``part(chunk)`` (a scalar, computed in
    the learner's precision with the chunk's adapter active) over the micro-batches
    ``chunks(keys)`` of each adapter's states, its gradient accumulated when ``grad`` and each
    adapter's gradient norm recorded in ``b``; inf when not finite."""
    learner.optimizer.zero_grad()
    total, finite = 0.0, True
    with learner.training(grad):
        for adapter, group in sorted(b.by_adapter.items()):
            with (
                learner.host.use(adapter),
                torch.set_grad_enabled(grad),
                learner.grad_tap() as tap,
            ):
                for chunk in chunks(group):
                    with learner.compute():
                        loss = part(chunk)
                    finite = finite and bool(torch.isfinite(loss))
                    if grad and finite:
                        learner.optimizer.backward(loss)
                    total += float(loss.detach())
            if grad:
                b.agent_norms[adapter] = math.sqrt(tap.squared_norm())
    return total if finite else math.inf


@register_objective("policy_target")
class PolicyTarget:
    """Targets for the batch's information states, then ``fit_steps`` steps on their mean
    KL(target || pi): the optimizer's (:func:`fit`: the best weights kept) or Gauss-Newton
    steps (:func:`gauss_newton_fit`); ``loss`` is the KL before the fit (the step's size),
    ``fit_residual`` after.  A batch of think decisions goes to the ``think_target``
    objective (:mod:`.think_target`)."""

    def __init__(self, learner: Learner) -> None:
        self.learner, self.cfg = learner, learner.cfg.policy_target
        self.think = OBJECTIVES["think_target"](learner)

    def update(self, items: list[TrainItem]) -> UpdateStats:
        kinds = {it.kind for it in items}
        if kinds == {"think"}:
            return self.think.update(items)
        free = kinds == {"free"}
        if free:
            items = [as_answers(it) for it in items]
        elif kinds - {"choice"}:
            raise ValueError(
                "policy targets take one learner's decisions in choice, think or free "
                f"decoding, got {sorted(kinds)}"
            )
        learner = self.learner
        b = target_batch(items)
        b.free = free
        if learner.cfg.magnet.alpha > 0:
            with torch.no_grad(), learner.compute():
                for group in b.by_adapter.values():
                    dists = learner.magnet_logp([b.states[k] for k in group])
                    rho = [magnet_read(r, learner.magnet_share) for r in dists]
                    b.rho.update(zip(group, rho, strict=True))
        if self.cfg.solver == "gauss_newton":
            result = self._gauss_newton(b, self._loss(b, False))
        else:
            result = adam_fit(learner, lambda grad: self._loss(b, grad), b)
        return target_stats(b, result.first, result.best, len(items))

    def _loss(self, b: TargetBatch, grad: bool) -> float:
        """The mean KL(target || pi) over the states, free text's -log M added (see
        :func:`accumulate`)."""
        n = len(b.states)

        def part(chunk: list[TrainItem]) -> torch.Tensor:
            scores = self.learner.choice_scores(chunk)
            dists = self.learner.choice_dists(chunk, scores)
            kls = [
                target_kl(lp.float(), self._target(b, it, lp))
                - (torch.logsumexp(s.float(), 0) if b.free else 0.0)
                for it, lp, s in zip(chunk, dists, scores, strict=True)
            ]
            return torch.stack(kls).sum() / n

        return accumulate(
            self.learner,
            b,
            grad,
            lambda keys: self.learner.chunks([b.states[k] for k in keys], grad),
            part,
        )

    def _target(self, b: TargetBatch, it: TrainItem, logp: torch.Tensor) -> torch.Tensor:
        return b.target(state_key(it), logp, self.cfg.eta, self.learner.cfg.magnet.alpha)

    def _gauss_newton(self, b: TargetBatch, first: float) -> Fit:
        """Gauss-Newton steps of the states' logit differences (``log pi(a) - log pi(a_0)``)
        towards the targets' (:func:`adapter_gauss_newton`), from the KL ``first``."""

        def rows(group: list[tuple], params: list[torch.nn.Parameter]) -> Iterable[Linearised]:
            for chunk in self.learner.chunks([b.states[k] for k in group]):
                yield state_jacobian(self.learner, chunk, params, b.targets, b.free)

        return adapter_gauss_newton(self.learner, b, rows, lambda: self._loss(b, False), first)


def state_jacobian(
    learner: Learner,
    chunk: list[TrainItem],
    params: list[torch.nn.Parameter],
    targets: dict[tuple, torch.Tensor],
    free: bool = False,
) -> Linearised:
    """The logit differences of ``chunk``'s states (distinct), on ``learner``'s host: their
    Jacobian over ``params`` ([rows, P], a row per (state, action > 0)) and their residuals to
    the targets; ``free``: then a row per state of log M (the answers' total log-probability)
    with the residual -log M.  The states are scored without shared work, so one backward
    pass per action index gives every state's row (:class:`RowGrads`)."""
    with (
        RowGrads(learner.host.model, params, len(chunk)) as rows,
        learner.compute(),
    ):
        scores = learner.host.separate_scores(
            [it.prompt_ids for it in chunk], [it.candidate_ids for it in chunk], rows.owner
        )
    mass: Linearised | None = None
    if free:
        log_m = torch.stack([torch.logsumexp(s.float(), 0) for s in scores])
        torch.autograd.grad(log_m.sum(), params, retain_graph=True, allow_unused=True)
        mass = rows.take(), -log_m.detach()
    dists = [it.log_pi(s.float()) for it, s in zip(chunk, scores, strict=True)]
    jac, residual = difference_jacobian(
        dists, [targets[state_key(it)] for it in chunk], params, rows
    )
    if mass is None:
        return jac, residual
    return torch.cat([jac, mass[0]]), torch.cat([residual, mass[1]])


def as_answers(it: TrainItem) -> TrainItem:
    """A free-text decision as the fit reads it: its legal moves' own answers as the
    candidates, scored after its prompt (module docstring)."""
    if it.answer_ids is None:
        raise ValueError("a free-text decision without its moves' answers (answer_ids)")
    return replace(it, candidate_ids=it.answer_ids, completion_ids=[])


def difference_jacobian(
    dists: list[torch.Tensor],
    targets: list[torch.Tensor],
    params: list[torch.nn.Parameter],
    rows: RowGrads,
    moved: list[torch.Tensor] | None = None,
) -> Linearised:
    """Unit k's logit differences ``dists[k][a] - dists[k][0]``, a >= 1 (``dists``: log pi
    over each unit's actions, in the graph of forwards that ``rows`` watched with unit k's
    activations its own): their Jacobian over ``params`` ([rows, P], a row per (unit, a),
    units in order) from one backward pass per action index, and their residuals to the
    ``targets``' (log-probs, in the same order).  With ``moved`` the Jacobian is that of
    ``moved``'s differences instead (a surrogate the residuals are still ``dists``')."""
    width = max(len(d) for d in dists)
    per_action = []
    for a in range(1, width):
        total = sum(d[a] - d[0] for d in (moved or dists) if len(d) > a)
        torch.autograd.grad(total, params, retain_graph=a < width - 1, allow_unused=True)
        per_action.append(rows.take())
    jac = [per_action[a - 1][k] for k, d in enumerate(dists) for a in range(1, len(d))]
    residual = [
        (t[1:] - t[0]) - (d[1:] - d[0]).detach() for d, t in zip(dists, targets, strict=True)
    ]
    return torch.stack(jac), torch.cat(residual)
