"""Advantage estimators for multi-agent GRPO (docs/algorithms.md#advantage-estimators).

Every estimator maps per-sample rewards to per-sample advantages.  A *group* is the set of
rollouts that started from the same state (the G games of one deal seed, or every decision
taken in one identical information state); an *agent key* says whose reward distribution a
sample belongs to (a role, or a seat in self-play).

    global      A = (r - mean_g) / (std_g + eps)                 pooled over every agent
    agent_wise  A = (r - mean_{g,k}) / (std_{g,k} + eps)         per group and agent (Dr. MAS)
    rae         A = r - b[game, role];  b <- 0.95 b + 0.05 r     EMA baseline (SPIRAL)
    turn_level  G_t = r_t + gamma G_{t+1} per player, then A = (G - mean_k) / (std_k + eps)
                                                                 per player (MARS)

The normalised estimators take a ``scale`` (``train.advantage_scale``, :data:`SCALES`): what
divides the centred rewards.  ``std`` (GRPO) rescales every cell to unit variance, so cells
whose payoffs differ in size weigh alike; ``none`` (Dr. GRPO) keeps the rewards' units, so the
game trained on is the game played, which a magnet's regularised equilibrium needs.

Groups (or group x agent cells) whose rewards are all equal carry no signal; they get a zero
advantage and are reported in ``Advantages.degenerate`` so the trainer can count them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

EPS = 1e-6


@dataclass
class Samples:
    """Column view of the decisions of one training batch (index-aligned lists)."""

    rewards: Sequence[float]  # return credited to the decision's agent
    groups: Sequence[Hashable]  # same-start-state group id
    agents: Sequence[Hashable]  # agent key (role or seat)
    games: Sequence[str] = ()  # game name, for RAE
    roles: Sequence[str] = ()  # role name, for RAE
    episodes: Sequence[Hashable] = ()  # episode id, for turn-level credit
    turn_rewards: Sequence[float] = ()  # reward that arrived right after this turn
    publics: Sequence[Hashable] = ()  # public state of the decision (None: nothing hidden)
    choices: Sequence[int | None] = ()  # index of the action taken among the legal ones
    probs: Sequence[Sequence[float] | None] = ()  # the distribution it was drawn from


@dataclass
class Advantages:
    values: np.ndarray
    degenerate: int = 0  # zero-variance cells (no gradient)
    cells: int = 0  # cells considered


#: What divides a cell's centred rewards: its std (GRPO), or nothing (Dr. GRPO: reward units).
SCALES: dict[str, Callable[[np.ndarray], float]] = {
    "std": lambda v: float(v.std()) + EPS,
    "none": lambda v: 1.0,
}


def _normalise(x: np.ndarray, keys: Sequence[Hashable], scale: str = "std") -> Advantages:
    """(x - mean_key) / SCALES[scale] within each key; zero-variance keys give zero."""
    divide = SCALES[scale]
    out = np.zeros_like(x, dtype=np.float64)
    cells: dict[Hashable, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        cells[k].append(i)
    degenerate = 0
    for idx in cells.values():
        v = x[idx]
        if len(idx) < 2 or np.ptp(v) == 0:
            degenerate += 1
            continue
        out[idx] = (v - v.mean()) / divide(v)
    return Advantages(out, degenerate, len(cells))


def global_advantages(s: Samples, scale: str = "std") -> Advantages:
    """Vanilla GRPO: one baseline per group, every agent pooled."""
    return _normalise(np.asarray(s.rewards, float), list(s.groups), scale)


def agent_wise_advantages(s: Samples, scale: str = "std") -> Advantages:
    """Dr. MAS: statistics per (group, agent), so each agent is compared with itself."""
    return _normalise(
        np.asarray(s.rewards, float), list(zip(s.groups, s.agents, strict=True)), scale
    )


class RoleBaseline:
    """SPIRAL's role-conditioned advantage: an EMA baseline per (game, role).

    The advantage uses the baseline *before* this batch's update, then the baseline moves
    towards the batch mean of each key.  State is a plain dict, saved with checkpoints.
    """

    def __init__(self, decay: float = 0.95) -> None:
        self.decay = decay
        self.baseline: dict[str, float] = {}

    def __call__(self, s: Samples) -> Advantages:
        r = np.asarray(s.rewards, float)
        keys = [f"{g}/{role}" for g, role in zip(s.games, s.roles, strict=True)]
        adv = np.array([ri - self.baseline.get(k, 0.0) for ri, k in zip(r, keys, strict=True)])
        for k in set(keys):
            mean = float(r[[i for i, kk in enumerate(keys) if kk == k]].mean())
            b = self.baseline.get(k)
            self.baseline[k] = mean if b is None else self.decay * b + (1 - self.decay) * mean
        return Advantages(adv, 0, len(set(keys)))


def discounted_returns(s: Samples, gamma: float) -> np.ndarray:
    """G_t = r_t + gamma * G_{t+1} over each (episode, agent)'s own turns, in batch order."""
    r = np.asarray(s.turn_rewards, float)
    g = np.zeros_like(r)
    tails: dict[tuple, float] = {}
    for i in range(len(r) - 1, -1, -1):  # walk backwards so G_{t+1} is known
        key = (s.episodes[i], s.agents[i])
        tails[key] = r[i] + gamma * tails.get(key, 0.0)
        g[i] = tails[key]
    return g


def turn_level_advantages(s: Samples, gamma: float = 1.0, scale: str = "std") -> Advantages:
    """MARS: per-turn discounted returns, normalised per player across the batch."""
    return _normalise(discounted_returns(s, gamma), list(s.agents), scale)


def remove_common_mode(adv: np.ndarray, s: Samples, fraction: float) -> np.ndarray:
    """Project out the part of the advantages that moves every private state alike.

    In a public state P (poker: the betting, not the card) a model that reads its card weakly
    has nearly the same logit gradient for every card, so its update along action k is

        G_k = sum_{i in P} A_i * (1[a_i = k] - pi_i(k))      (the score of a softmax choice)

    whatever the cards: "bet more with every card", which drives the policy card-blind (the
    same play with every card).  With S the matrix of those scores (one row per decision of
    one agent in P):

        A' = A - c * S @ lstsq(S, A)        so that  S^T A' = 0  when c = 1,

    leaving only the card-dependent signal; c < 1 keeps some of the common one.  Subtracting
    each action's mean advantage instead would not do: the score factors (1 - pi) differ
    between cards, and the common push it leaves collapses the policy.  Decisions without a
    public state or a choice distribution (free text) keep their advantages.  The math and
    its price: docs/algorithms.md#common-mode-projection.
    """
    if fraction == 0 or not s.publics:
        return adv
    out = adv.astype(np.float64, copy=True)
    cells: dict[Hashable, list[int]] = defaultdict(list)
    for i, (pub, agent, probs) in enumerate(zip(s.publics, s.agents, s.probs, strict=True)):
        if pub is not None and probs is not None:
            cells[(pub, agent, len(probs))].append(i)
    for idx in cells.values():
        scores = np.array(
            [[float(k == s.choices[i]) - p for k, p in enumerate(s.probs[i])] for i in idx]
        )
        lam = np.linalg.lstsq(scores, adv[idx], rcond=None)[0]
        out[idx] -= fraction * scores @ lam
    return out


ESTIMATORS: dict[str, Callable[..., Callable[[Samples], Advantages]]] = {
    "global": lambda scale="std", **_: partial(global_advantages, scale=scale),
    "agent_wise": lambda scale="std", **_: partial(agent_wise_advantages, scale=scale),
    "rae": lambda decay=0.95, **_: RoleBaseline(decay),
    "turn_level": lambda gamma=1.0, scale="std", **_: partial(
        turn_level_advantages, gamma=gamma, scale=scale
    ),
}


def make_estimator(name: str, **kwargs) -> Callable[[Samples], Advantages]:
    try:
        return ESTIMATORS[name](**kwargs)
    except KeyError:
        raise KeyError(
            f"unknown advantage estimator {name!r}; known: {', '.join(sorted(ESTIMATORS))}"
        ) from None
