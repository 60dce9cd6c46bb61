"""Policy targets: magnetic mirror descent's step in closed form, then fitted by the model.

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
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


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
    linearise: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    params: list[torch.nn.Parameter],
    loss: Callable[[], float],
    ridge: float,
    steps: int,
    first: float,
    lengths: int = 6,
) -> Fit:
    """``steps`` damped Gauss-Newton steps (:func:`gauss_newton`) on ``linearise()``'s
    Jacobian and residual (targets minus values), from ``first = loss()`` at the start
    (which the caller has already).

    Each step keeps its direction and takes the length, of 1, 1/2, ..., 2^-(lengths - 1)
    times the full step, with the lowest ``loss()``; a step that lowers nothing ends the
    fit.  All lengths are tried: along a step far beyond where the model is linear the loss
    is not unimodal (SmolLM2's first step: 0.068 -> 0.19, 0.065, 0.11, 0.048 at 1, 1/2,
    1/4, 1/8).  A larger damping would shorten the step too, but would turn it towards the
    gradient, i.e. towards what the states share (card-blind play)."""
    best = first
    for _ in range(steps):
        jac, residual = linearise()
        delta = gauss_newton(jac, residual, ridge)
        losses = []
        for i in range(lengths):
            shift(params, delta / 2**i)
            losses.append(loss())
            shift(params, -delta / 2**i)
        i = min(range(lengths), key=losses.__getitem__)
        if not losses[i] < best:
            break
        best = losses[i]
        shift(params, delta / 2**i)
    return Fit(first, best)
