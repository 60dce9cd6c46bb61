"""Tiny Hanabi: the two-player common-payoff matrix game from the Bayesian Action Decoder paper.

Chance deals each player a private card (1 or 2, uniform).  Player 0 sees its card and picks
A/B/C; player 1 sees player 0's action and its own card and picks A/B/C.  Both receive
``payoff[card0, card1, action0, action1]`` (the default table is OpenSpiel's ``tiny_hanabi``
default, whose optimum expected payoff is 10; the obvious "safe" convention only gets 8).  It is
the smallest game where the team must learn to signal through actions.

``reset(options={"cards": (c0, c1)})`` fixes the chance outcome (card indices 0/1), so exact
analysis can enumerate chance instead of sampling it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import cache

import numpy as np

from marl.games.bots import register_bot
from marl.games.registry import register
from marl.games.tasks import CooperativeGame

N_CARDS = 2
N_ACTIONS = 3
CARD_NAMES = ("1", "2")
ACTION_NAMES = ("A", "B", "C")

# OpenSpiel tiny_hanabi default payoff string, in its order (card0, card1, action0, action1).
DEFAULT_PAYOFF: tuple[int, ...] = (
    10,
    0,
    0,
    4,
    8,
    4,
    10,
    0,
    0,  # cards 1, 1
    0,
    0,
    10,
    4,
    8,
    4,
    0,
    0,
    10,  # cards 1, 2
    0,
    0,
    10,
    4,
    8,
    4,
    0,
    0,
    0,  # cards 2, 1
    10,
    0,
    0,
    4,
    8,
    4,
    10,
    0,
    0,  # cards 2, 2
)
SHAPE = (N_CARDS, N_CARDS, N_ACTIONS, N_ACTIONS)

# A joint deterministic policy: player 0's action per card, player 1's per (card, action0).
JointPolicy = tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]


def payoff_table(payoff: Sequence[float] | None = None) -> np.ndarray:
    table = np.asarray(DEFAULT_PAYOFF if payoff is None else payoff, dtype=float)
    if table.size != np.prod(SHAPE):
        raise ValueError(f"payoff needs {np.prod(SHAPE)} entries, got {table.size}")
    return table.reshape(SHAPE)


def expected_payoff(table: np.ndarray, policy: JointPolicy) -> float:
    """Exact team value of a joint deterministic policy, chance enumerated."""
    p0, p1 = policy
    return float(
        np.mean(
            [
                table[c0, c1, p0[c0], p1[c1][p0[c0]]]
                for c0 in range(N_CARDS)
                for c1 in range(N_CARDS)
            ]
        )
    )


def _best_reply(table: np.ndarray, p0: tuple[int, ...], c1: int, a0: int) -> int:
    """player_1's best action at (card1, action0): payoff summed over the cards that play a0."""
    cards = [c0 for c0 in range(N_CARDS) if p0[c0] == a0]
    return int(np.argmax(table[cards, c1, a0].sum(axis=0)))


@cache
def _optimal(payoff: tuple[float, ...]) -> tuple[JointPolicy, float]:
    table = payoff_table(payoff)
    best: tuple[JointPolicy, float] | None = None
    for p0 in itertools.product(range(N_ACTIONS), repeat=N_CARDS):
        p1 = tuple(
            tuple(_best_reply(table, p0, c1, a0) for a0 in range(N_ACTIONS))
            for c1 in range(N_CARDS)
        )
        value = expected_payoff(table, (p0, p1))
        if best is None or value > best[1]:
            best = ((p0, p1), value)
    assert best is not None
    return best


def optimal_policy(payoff: Sequence[float] | None = None) -> tuple[JointPolicy, float]:
    """The best joint deterministic policy and its value, by exhaustive search.

    A common-payoff game always has a deterministic optimum, and for a fixed player-0 policy
    player 1's best response is a per-information-state argmax, so searching the 3^2 player-0
    policies is exact.
    """
    return _optimal(tuple(float(x) for x in payoff_table(payoff).ravel()))


def _format_table(table: np.ndarray) -> str:
    lines = ["Payoff (rows: player_0's action, columns: player_1's action):"]
    for c0, c1 in itertools.product(range(N_CARDS), repeat=2):
        rows = "; ".join(
            f"{ACTION_NAMES[a0]}: "
            + " ".join(f"{table[c0, c1, a0, a1]:g}" for a1 in range(N_ACTIONS))
            for a0 in range(N_ACTIONS)
        )
        lines.append(f"  cards ({CARD_NAMES[c0]}, {CARD_NAMES[c1]}) -> {rows}")
    return "\n".join(lines)


@register("tiny_hanabi")
class TinyHanabi(CooperativeGame):
    """Two-player cooperative signalling game with a shared payoff."""

    metadata = {"name": "tiny_hanabi", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ["player_0", "player_1"]
    action_names = list(ACTION_NAMES)
    # OpenSpiel's information-state tensor: own card, player_0's action, player_1's action.
    obs_shape = (N_CARDS + 2 * N_ACTIONS,)

    def __init__(self, payoff: Sequence[float] | None = None, **kwargs) -> None:
        self.payoff = payoff_table(payoff)
        self.rules = (
            "Tiny Hanabi (cooperative, 2 players). Each player privately holds card 1 or 2 "
            "(uniformly random). player_0 sees its own card and plays A, B or C; player_1 sees "
            "its own card and player_0's action, then plays A, B or C. Both players receive the "
            "same payoff:\n" + _format_table(self.payoff)
        )
        super().__init__(**kwargs)

    def _setup(self, rng: np.random.Generator) -> None:
        cards = self.reset_options.get("cards")
        if cards is None:
            cards = rng.integers(0, N_CARDS, size=2)
        self.cards = tuple(int(c) for c in cards)
        if len(self.cards) != 2 or not all(0 <= c < N_CARDS for c in self.cards):
            raise ValueError(f"cards must be two indices in [0, {N_CARDS}), got {cards!r}")
        self.moves: list[int] = []

    def _legal(self, agent: str) -> list[int]:
        return list(range(N_ACTIONS))

    def _apply(self, agent: str, action: int) -> None:
        self.moves.append(action)
        if len(self.moves) == 2:
            self.team_payoff = float(self.payoff[self.cards + tuple(self.moves)])
            self._end_team(self.team_payoff)

    def _encode(self, agent: str) -> np.ndarray:
        obs = np.zeros(self.obs_shape, dtype=np.float32)
        obs[self.cards[self.possible_agents.index(agent)]] = 1.0
        for i, move in enumerate(self.moves):
            obs[N_CARDS + i * N_ACTIONS + move] = 1.0
        return obs

    def _describe(self, agent: str) -> str:
        seat = self.possible_agents.index(agent)
        parts = [f"You are {agent}. Your card is {CARD_NAMES[self.cards[seat]]}."]
        if self.moves:
            parts.append(f"player_0 played {ACTION_NAMES[self.moves[0]]}.")
        if len(self.moves) == 2:
            parts.append(
                f"player_1 played {ACTION_NAMES[self.moves[1]]}. The cards were "
                f"({CARD_NAMES[self.cards[0]]}, {CARD_NAMES[self.cards[1]]}); "
                f"team payoff {self.team_payoff:g}."
            )
        return " ".join(parts)

    # ----- what a player may condition on, for bots and analysis
    def info_state(self, agent: str) -> tuple[int, ...]:
        """(own card,) for player_0; (own card, player_0's action) for player_1."""
        seat = self.possible_agents.index(agent)
        return (self.cards[seat],) + tuple(self.moves[:seat])


class _TablePolicyBot:
    """Plays a joint deterministic policy from each player's own information state."""

    def __init__(self, policy: JointPolicy) -> None:
        self.policy = policy

    def act(self, env: TinyHanabi, agent: str) -> int:
        state = env.info_state(agent)
        if agent == env.possible_agents[0]:
            return self.policy[0][state[0]]
        return self.policy[1][state[0]][state[1]]

    def action_probs(self, env: TinyHanabi, agent: str) -> dict[int, float]:
        return {self.act(env, agent): 1.0}


@register_bot("tiny_hanabi", "optimal")
class OptimalBot(_TablePolicyBot):
    """The exhaustively verified optimal joint policy (value 10 on the default table)."""

    def __init__(self, seed: int | None = None, payoff: Sequence[float] | None = None) -> None:
        super().__init__(optimal_policy(payoff)[0])


def greedy_policy(payoff: Sequence[float] | None = None) -> JointPolicy:
    """Each player maximises expected payoff treating the partner's card as uniform noise.

    player_1 ignores what player_0's action says about player_0's card; player_0 anticipates
    that.  This is the natural no-convention baseline and lands on the "safe" local optimum.
    """
    table = payoff_table(payoff)
    prior = table.mean(axis=0)  # [card1, action0, action1]: player_0's card averaged out
    p1 = tuple(
        tuple(int(np.argmax(prior[c1, a0])) for a0 in range(N_ACTIONS)) for c1 in range(N_CARDS)
    )
    p0 = tuple(
        int(
            np.argmax(
                [
                    np.mean([table[c0, c1, a0, p1[c1][a0]] for c1 in range(N_CARDS)])
                    for a0 in range(N_ACTIONS)
                ]
            )
        )
        for c0 in range(N_CARDS)
    )
    return p0, p1


@register_bot("tiny_hanabi", "heuristic")
class HeuristicBot(_TablePolicyBot):
    """The greedy, convention-free policy (value 8 on the default table)."""

    def __init__(self, seed: int | None = None, payoff: Sequence[float] | None = None) -> None:
        super().__init__(greedy_policy(payoff))
