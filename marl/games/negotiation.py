"""Negotiation ("deal or no deal", Lewis et al. 2017): split a pool of items with private values.

The pool has ``n_types`` item types with 1..``max_count`` copies each.  Each player privately
values every type with a non-negative integer such that the whole pool is worth ``total_value``
to it; every type is wanted by someone and at least one type by both, so there is both conflict
and room for trade.  Players alternate, player_0 first: ``[propose a b c]`` proposes that the
speaker keeps a, b, c items of each type and the partner gets the rest; ``[Accept]`` takes the
partner's offer on the table; ``[No deal]`` ends the game with nothing for anyone.  After
``max_proposals`` proposals the responder may only accept or refuse, so the game always ends
within ``max_proposals + 1`` moves.

Rewards (general-sum, ``zero_sum = False``): on a deal, the value of the items a player gets
divided by ``total_value`` (so in [0, 1]); 0 for both on no deal.  Counts and values are drawn
from the reset seed.

There is no "optimal" bot (general-sum: no single value to reach).  Bots: ``heuristic`` (accept
above a falling threshold, concede just enough) and ``bayesian``, the strong baseline: it keeps
a posterior over the partner's private values from the partner's proposals and plans its
offers for the best expected value given the modelled chance of acceptance.
"""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np

from marl.games.base import TextGame
from marl.games.bots import register_bot
from marl.games.registry import register

ITEM_NAMES = ("book", "hat", "ball", "pen", "cup")


@cache
def value_vectors(counts: tuple[int, ...], total: int) -> np.ndarray:
    """Every non-negative integer value vector worth exactly ``total`` for this pool."""
    ranges = [range(total // c + 1) for c in counts]
    rows = [v for v in itertools.product(*ranges) if np.dot(v, counts) == total]
    vectors = np.array(rows, dtype=int).reshape(-1, len(counts))
    vectors.setflags(write=False)  # cached and shared: nobody may edit it in place
    return vectors


def compatible(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Which rows of ``theirs`` may pair with ``mine``: all types wanted, one wanted by both."""
    wanted = ((mine + theirs) > 0).all(axis=-1)
    shared = ((mine > 0) & (theirs > 0)).any(axis=-1)
    return wanted & shared


def deal_pool(
    rng: np.random.Generator, n_types: int, max_count: int, total: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rejection-sample counts and the two private value vectors, as in the DoND data."""
    while True:
        counts = rng.integers(1, max_count + 1, size=n_types)
        vectors = value_vectors(tuple(int(c) for c in counts), total)
        if len(vectors) == 0:
            continue
        v0, v1 = vectors[rng.integers(len(vectors), size=2)]
        if compatible(v0, v1):
            return counts, v0, v1


def _items(names: tuple[str, ...], items: np.ndarray) -> str:
    return ", ".join(
        f"{n} {name}{'' if n == 1 else 's'}" for name, n in zip(names, items.tolist(), strict=True)
    )


@register("negotiation")
class Negotiation(TextGame):
    """Two players alternate proposals over a shared item pool with private values."""

    metadata = {"name": "negotiation", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ["player_0", "player_1"]
    zero_sum = False

    def __init__(
        self,
        n_types: int = 3,
        max_count: int = 4,
        total_value: int = 10,
        max_proposals: int = 6,
        **kwargs,
    ) -> None:
        if not 1 <= n_types <= len(ITEM_NAMES):
            raise ValueError(f"n_types must be in [1, {len(ITEM_NAMES)}], got {n_types}")
        if max_count < 1 or total_value < 1 or max_proposals < 1:
            raise ValueError("max_count, total_value and max_proposals must be >= 1")
        self.item_names = ITEM_NAMES[:n_types]
        self.max_count, self.total_value, self.max_proposals = max_count, total_value, max_proposals
        # Every split of the largest pool, as what the proposer keeps; a pool masks the rest.
        self.splits = np.array(list(itertools.product(range(max_count + 1), repeat=n_types)))
        self.action_names = [f"propose {' '.join(map(str, k))}" for k in self.splits.tolist()]
        self.ACCEPT, self.NO_DEAL = len(self.splits), len(self.splits) + 1
        self.action_names += ["Accept", "No deal"]
        # pool, own values, the offer to me, [offer pending, proposals used, seat]
        self.obs_shape = (3 * n_types + 3,)
        self.rules = (
            f"Negotiation (2 players, general-sum). Split a pool of items "
            f"({', '.join(n + 's' for n in self.item_names)}). Each player privately values "
            f"the item types; the whole pool is worth "
            f"{total_value} to each. Players alternate. On your turn: "
            f"[propose {' '.join('n' + str(i + 1) for i in range(n_types))}] proposes that YOU "
            f"keep n1 {self.item_names[0]}s, ... and the other player gets the rest; [Accept] "
            f"takes the other player's offer on the table; [No deal] ends the game with nothing "
            f"for anyone. At most {max_proposals} proposals in total; after the last one the "
            f"other player may only accept or refuse. Your reward is the value of the items you "
            f"get divided by {total_value} (0 without a deal)."
        )
        super().__init__(**kwargs)

    def _setup(self, rng: np.random.Generator) -> None:
        counts, v0, v1 = deal_pool(rng, len(self.item_names), self.max_count, self.total_value)
        self.counts = counts
        self.values = dict(zip(self.possible_agents, (v0, v1), strict=True))
        self.feasible = np.flatnonzero((self.splits <= counts).all(axis=1))
        self.offer: int | None = None  # split index proposed by the last mover
        self.proposals = 0
        self.history: list[tuple[str, int]] = []
        self.outcome: dict[str, np.ndarray] | None = None

    # ----- state helpers (also what bots read; each is from one agent's point of view)
    @property
    def proposals_left(self) -> int:
        return self.max_proposals - self.proposals

    def other(self, agent: str) -> str:
        return self.possible_agents[1 - self.possible_agents.index(agent)]

    def offer_to(self, agent: str) -> np.ndarray | None:
        """What ``agent`` would get by accepting the offer on the table (None: no offer)."""
        if self.offer is None or self.history[-1][0] == agent:
            return None
        return self.counts - self.splits[self.offer]

    def worth(self, agent: str, items: np.ndarray) -> float:
        """Normalised value of ``items`` (one row or a matrix of rows) to ``agent``."""
        return items @ self.values[agent] / self.total_value

    def partner_proposals(self, agent: str) -> list[np.ndarray]:
        """Every split the partner proposed, as what the partner would keep."""
        return [self.splits[a] for who, a in self.history if who != agent and a < self.ACCEPT]

    # ----- game hooks
    def legal_text(self, agent: str) -> str:
        if self.proposals_left == 0:
            return super().legal_text(agent)  # only [Accept] / [No deal]: a short list
        names = [f"n{i + 1}" for i in range(len(self.counts))]
        ranges = ", ".join(
            f"{n} from 0 to {c}" for n, c in zip(names, self.counts.tolist(), strict=True)
        )
        others = " ".join(
            self.action_text(a) for a in self.legal_actions(agent) if a >= self.ACCEPT
        )
        return f"[propose {' '.join(names)}] with {ranges} (what you keep); {others}"

    def _legal(self, agent: str) -> list[int]:
        if agent != self.agent_selection:
            return []
        actions = self.feasible.tolist() if self.proposals_left > 0 else []
        if self.offer_to(agent) is not None:
            actions.append(self.ACCEPT)
        return [*actions, self.NO_DEAL]

    def _apply(self, agent: str, action: int) -> None:
        self.history.append((agent, action))
        if action == self.NO_DEAL:
            self._end({})
        elif action == self.ACCEPT:
            proposer = self.other(agent)
            kept = self.splits[self.offer]
            self.outcome = {proposer: kept, agent: self.counts - kept}
            self._end({a: self.worth(a, items) for a, items in self.outcome.items()})
        else:
            self.offer = action
            self.proposals += 1

    def _encode(self, agent: str) -> np.ndarray:
        offer = self.offer_to(agent)
        return np.concatenate(
            [
                self.counts / self.max_count,
                self.values[agent] / self.total_value,
                np.zeros(len(self.counts)) if offer is None else offer / self.max_count,
                [
                    float(offer is not None),
                    self.proposals / self.max_proposals,
                    float(self.possible_agents.index(agent)),
                ],
            ]
        )

    def _describe(self, agent: str) -> str:
        names = self.item_names
        own = ", ".join(
            f"{name} {v}" for name, v in zip(names, self.values[agent].tolist(), strict=True)
        )
        lines = [
            f"You are {agent}. Items in the pool: {_items(names, self.counts)}.",
            f"Your private value per item: {own} (the pool is worth {self.total_value} to "
            f"you; the other player's values are private).",
        ]
        for who, action in self.history:
            if action < self.ACCEPT:
                lines.append(f"{who} proposed to keep {_items(names, self.splits[action])}.")
            else:
                lines.append(f"{who}: {self.action_names[action]}.")
        offer = self.offer_to(agent)
        if self.outcome is not None:
            lines.append(
                "Deal: "
                + "; ".join(f"{a} gets {_items(names, items)}" for a, items in self.outcome.items())
                + f". You get {self.worth(agent, self.outcome[agent]) * self.total_value:g}"
                f" of {self.total_value}."
            )
        elif offer is not None:
            lines.append(
                f"Offer on the table: you would get {_items(names, offer)}, worth "
                f"{self.worth(agent, offer) * self.total_value:g} to you."
            )
        lines.append(f"Proposals left: {self.proposals_left} of {self.max_proposals}.")
        return "\n".join(lines)


def _lowest_sufficient(env: Negotiation, mine: np.ndarray, target: float) -> int:
    """The feasible split worth at least ``target`` to me that concedes the most.

    Ties go to keeping fewer items: what I do not value is what the partner may want.
    """
    ok = mine >= target - 1e-9
    if not ok.any():
        ok = mine == mine.max()
    kept = env.splits[env.feasible].sum(axis=1)
    order = np.lexsort((kept, mine))  # by my value, then by items kept
    return int(env.feasible[next(i for i in order if ok[i])])


@register_bot("negotiation", "heuristic")
class HeuristicBot:
    """Accept any offer worth at least a threshold that falls from ``start`` to ``floor``.

    Otherwise propose the split closest above the threshold (conceding over time); with no
    proposals left, accept anything worth more than nothing.
    """

    def __init__(self, seed: int | None = None, start: float = 0.9, floor: float = 0.5) -> None:
        self.start, self.floor = start, floor

    def act(self, env: Negotiation, agent: str) -> int:
        target = self.start - (self.start - self.floor) * env.proposals / env.max_proposals
        offer = env.offer_to(agent)
        if offer is not None:
            got = env.worth(agent, offer)
            if got >= target - 1e-9 or (env.proposals_left == 0 and got > 0):
                return env.ACCEPT
        if env.proposals_left == 0:
            return env.NO_DEAL
        mine = env.worth(agent, env.splits[env.feasible])
        return _lowest_sufficient(env, mine, target)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@register_bot("negotiation", "bayesian")
class BayesianBot:
    """Opponent-modelling expected-utility bot, the strong baseline for this general-sum game.

    Belief: uniform over the partner value vectors compatible with the pool and my own values
    (exactly the generator's conditional prior), updated by each partner proposal with a
    Boltzmann likelihood ``exp(rationality * partner's value of what it keeps)``.  Acceptance
    model: the partner accepts a share worth ``u`` to it with probability
    ``sigmoid((u - tau) / softness)``, ``tau`` falling from ``partner_start`` to
    ``partner_floor`` and to ~0 when it faces a final ultimatum.  It plans its remaining
    proposals by backward induction under this model (see ``plan``), accepts an offer worth at
    least the planned value, and accepts anything positive when no proposals are left.  Against
    ``heuristic`` it out-earns ``heuristic`` itself in both seats (tested).
    """

    def __init__(
        self,
        seed: int | None = None,
        rationality: float = 8.0,
        partner_start: float = 0.8,
        partner_floor: float = 0.3,
        softness: float = 0.08,
    ) -> None:
        self.rationality, self.softness = rationality, softness
        self.partner_start, self.partner_floor = partner_start, partner_floor

    def belief(self, env: Negotiation, agent: str) -> tuple[np.ndarray, np.ndarray]:
        """Hypotheses for the partner's values and their posterior weights."""
        hyps = value_vectors(tuple(env.counts.tolist()), env.total_value)
        hyps = hyps[compatible(env.values[agent], hyps)]
        keep_value = env.splits[env.feasible] @ hyps.T / env.total_value  # [split, hypothesis]
        beta = self.rationality
        log_norm = np.log(np.exp(beta * keep_value).sum(axis=0))
        logw = np.zeros(len(hyps))
        for kept in env.partner_proposals(agent):
            logw += beta * (kept @ hyps.T / env.total_value) - log_norm
        w = np.exp(logw - logw.max())
        return hyps, w / w.sum()

    def _partner_threshold(self, env: Negotiation, number: int) -> float:
        """The partner's assumed acceptance threshold for proposal ``number`` (1-based)."""
        if number == env.max_proposals:  # the last proposal is an ultimatum
            return 0.5 / env.total_value
        progress = number / env.max_proposals
        return self.partner_start - (self.partner_start - self.partner_floor) * progress

    def plan(self, env: Negotiation, agent: str) -> tuple[int, float]:
        """The split to propose now and its expected value under the model.

        Backward induction over my remaining proposals (every other one): a rejected proposal
        is worth what my next proposal is worth.  Partner counter-offers are not counted on,
        so the value is a lower bound.
        """
        hyps, w = self.belief(env, agent)
        kept = env.splits[env.feasible]
        mine = env.worth(agent, kept)
        partner_value = (env.counts - kept) @ hyps.T / env.total_value
        future, best = 0.0, 0
        for number in reversed(range(env.proposals + 1, env.max_proposals + 1, 2)):
            tau = self._partner_threshold(env, number)
            p_accept = _sigmoid((partner_value - tau) / self.softness) @ w
            value = mine * p_accept + (1.0 - p_accept) * future
            best = int(np.argmax(value))
            future = float(value[best])
        return int(env.feasible[best]), future

    def act(self, env: Negotiation, agent: str) -> int:
        offer = env.offer_to(agent)
        got = env.worth(agent, offer) if offer is not None else -1.0
        if env.proposals_left == 0:
            return env.ACCEPT if got > 0 else env.NO_DEAL
        proposal, value = self.plan(env, agent)
        return env.ACCEPT if got >= value else proposal
