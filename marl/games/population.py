"""A population of table policies played as one mixture, and the least exploitable mixture.

A *mixture* with weights ``w`` draws member ``k`` with probability ``w_k`` before a game and
lets it play the whole game.  In sequence form a member's realisation plan x_k (the product of
its own probabilities along the path to each of its sequences) is what enters the payoff
linearly, so the mixture's plan is sum_k w_k x_k.  Its behaviour at information state I is the
*reach-weighted* average of the members' behaviours (Kuhn's theorem, perfect recall):

    sigma_w(I, a) = sum_k w_k pi_k(I) sigma_k(I, a) / sum_k w_k pi_k(I)

with pi_k(I) member k's own reach of I; a state no member reaches gets the plain w-average.

In a two-player zero-sum game the exploitability of the mixture,

    e(w) = 1/2 [ max_{x'} sum_k w_k u_0(x', y_k) + max_{y'} sum_k w_k u_1(x_k, y') ],

is a maximum of functions linear in w, hence convex: the least exploitable mixture is the
minimiser's strategy in a zero-sum *meta-game* that is itself a small extensive game:
chance seats a responder (seat 0 or 1, probability 1/2 each), the minimiser picks a member
without seeing the seat, the member plays the other seat (its moves are chance moves with the
member's probabilities) and the responder, who sees neither the draw nor the other seat's
member, plays its seat.  ``marl.games.cfr.run_cfr`` (CFR+) solves that game; the minimiser's
average strategy is w.  The answer comes with a certified gap: e(w) is computed exactly, and any
responder strategy r bounds the optimum from below by min_k of the responder's value against
member k, so the loop doubles the CFR+ iterations until e(w) - bound <= ``tol``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from marl.games.analysis import (
    Policy,
    TabularPolicy,
    exploitability,
    game_tree,
    policy_value,
    strategy_vector,
    uniform_policy,
)
from marl.games.cfr import run_cfr
from marl.games.game_tree import build_tree
from marl.games.registry import make

MINIMISER, RESPONDER = 0, 1
MEMBER_KEY = "member"


def _weights(weights: Sequence[float], n: int) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"need {n} non-negative weights with a positive sum, got {weights}")
    return w / w.sum()


def _table(game_name: str, sigma: np.ndarray) -> TabularPolicy:
    tree = game_tree(game_name)
    return {
        key: {int(a): float(sigma[tree.slot_start[i] + j]) for j, a in enumerate(acts)}
        for i, (key, acts) in enumerate(zip(tree.infoset_keys, tree.infoset_actions, strict=True))
    }


def mixture_policy(
    game_name: str, tables: Sequence[Policy], weights: Sequence[float]
) -> TabularPolicy:
    """The behavioural table of the mixture: members' policies weighted by ``w_k pi_k(I)``."""
    tree = game_tree(game_name)
    w = _weights(weights, len(tables))
    nodes = np.flatnonzero(tree.player >= 0)
    num = np.zeros(tree.num_slots)
    den = np.zeros(tree.num_slots)
    plain = np.zeros(tree.num_slots)
    for wk, table in zip(w, tables, strict=True):
        sigma = strategy_vector(game_name, table)
        reach = tree.reach(tree.edge_probs(sigma))
        own = np.zeros(len(tree.infoset_keys))
        own[tree.infoset[nodes]] = reach[nodes, tree.player[nodes]]  # same on all of I
        num += wk * own[tree.slot_infoset] * sigma
        den += wk * own[tree.slot_infoset]
        plain += wk * sigma
    mixed = np.where(den > 0, num / np.where(den > 0, den, 1.0), plain)
    return _table(game_name, mixed)


def mixture_exploitability(
    game_name: str, tables: Sequence[Policy], weights: Sequence[float]
) -> float:
    """Exact exploitability of the mixture (that of its behavioural table)."""
    return exploitability(game_name, mixture_policy(game_name, tables, weights))


@dataclass(frozen=True)
class _MetaState:
    """A node of the meta-game (see the module docstring); ``inner`` is the game's state."""

    inner: object
    members: tuple[TabularPolicy, ...]
    seat: int | None = None  # the responder's seat, once chance has drawn it
    member: int | None = None  # the minimiser's pick

    num_players = 2

    @property
    def is_terminal(self) -> bool:
        return self.member is not None and self.inner.is_terminal

    @property
    def is_chance(self) -> bool:
        if self.seat is None:
            return True
        if self.member is None:
            return False
        return self.inner.is_chance or self.inner.current_player != self.seat

    @property
    def current_player(self) -> int:
        return MINIMISER if self.member is None else RESPONDER

    def legal(self) -> list[int]:
        return list(range(len(self.members))) if self.member is None else self.inner.legal()

    def chance_outcomes(self) -> list[tuple[int, float]]:
        if self.seat is None:
            return [(0, 0.5), (1, 0.5)]
        if self.inner.is_chance:
            return self.inner.chance_outcomes()
        row = self.members[self.member][self.inner.info_key(self.inner.current_player)]
        return [(a, float(row.get(a, 0.0))) for a in self.inner.legal()]

    def apply(self, action: int) -> _MetaState:
        if self.seat is None:
            return _MetaState(self.inner, self.members, seat=action)
        if self.member is None:
            return _MetaState(self.inner, self.members, self.seat, member=action)
        return _MetaState(self.inner.apply(action), self.members, self.seat, self.member)

    def returns(self) -> tuple[float, float]:
        u = float(self.inner.returns()[self.seat])
        return -u, u

    def info_key(self, player: int) -> str:
        if player == MINIMISER:
            return MEMBER_KEY
        return f"{self.seat}|{self.inner.info_key(self.seat)}"


@dataclass(frozen=True)
class MixtureSolution:
    weights: list[float]
    exploitability: float  # exact, of the mixture with ``weights``
    lower_bound: float  # no mixture of these members does better
    iterations: int  # CFR+ iterations of the last solve


def least_exploitable_mixture(
    game_name: str,
    tables: Sequence[Policy],
    tol: float = 1e-4,
    iterations: int = 256,
    max_iterations: int = 8192,
    prune: float = 1e-3,
) -> MixtureSolution:
    """The mixture of ``tables`` with the lowest exact exploitability, to within ``tol``.

    CFR+ on the meta-game, doubling the iterations until the certified gap is at most ``tol``
    (or ``max_iterations`` is reached; the gap is then in the result).  Weights below ``prune``
    are dropped when that costs at most ``tol`` (a served mixture loads fewer members).  The
    answer is never worse than the best single member.
    """
    members = tuple(_table(game_name, strategy_vector(game_name, t)) for t in tables)
    n = len(members)
    if n == 0:
        raise ValueError("an empty population has no mixture")
    singles = [exploitability(game_name, t) for t in members]
    best = int(np.argmin(singles))
    tree = build_tree(_MetaState(make(game_name).root_state(), members))
    member_slots = slice(
        tree.slot_start[tree.key_index[MEMBER_KEY]], tree.slot_start[tree.key_index[MEMBER_KEY] + 1]
    )
    while True:
        sigma = run_cfr(tree, iterations)
        w = sigma[member_slots]
        value = mixture_exploitability(game_name, members, w)
        bound = _lower_bound(game_name, tree, sigma, members)
        if value - bound <= tol or 2 * iterations > max_iterations:
            break
        iterations *= 2
    kept = np.where(w >= prune, w, 0.0)
    if kept.sum() > 0:
        pruned = mixture_exploitability(game_name, members, kept)
        if pruned <= value + tol:
            w, value = kept / kept.sum(), pruned
    if singles[best] <= value:
        w, value = np.eye(n)[best], singles[best]
    return MixtureSolution(
        [float(x) for x in w], float(value), float(min(bound, value)), iterations
    )


def _lower_bound(
    game_name: str, tree, sigma: np.ndarray, members: Sequence[TabularPolicy]
) -> float:
    """min_k of the responder's (average strategy's) value against member k, halved over the
    two seats: a lower bound on every mixture's exploitability."""
    seats: list[dict[str, dict[int, float]]] = [{}, {}]
    for i, (key, acts) in enumerate(zip(tree.infoset_keys, tree.infoset_actions, strict=True)):
        if key == MEMBER_KEY:
            continue
        seat, inner = key.split("|", 1)
        seats[int(seat)][inner] = {
            int(a): float(sigma[tree.slot_start[i] + j]) for j, a in enumerate(acts)
        }

    def responder(seat: int):
        return lambda key, legal: seats[seat].get(key) or uniform_policy(key, legal)

    return min(
        (policy_value(game_name, responder(0), m)[0] + policy_value(game_name, m, responder(1))[1])
        / 2
        for m in members
    )
