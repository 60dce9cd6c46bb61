"""Exact values of policies in small perfect-information games (tic-tac-toe, Nim, small Connect
Four): how much does a policy keep against an opponent who knows it and best-responds?

Generic over :class:`~marl.games.base.TextGame`: the search steps ``clone()`` copies of the real
environment (so it can never disagree with the rules) and memoises on the game's
``state_key()``, which makes tic-tac-toe's 5,478 positions a fraction of a second.  Transitions
must be deterministic after ``reset(seed=0)`` (no chance moves): the games this module is for.
Poker-style imperfect-information games are ``marl.games.analysis``' business.

A *policy* is ``policy(env, agent) -> {action: probability}`` over legal actions, e.g. a bot's
``action_probs``; it must depend on the position only (the memo shares positions).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping

import numpy as np

from marl.games.base import TextGame
from marl.games.registry import make

Policy = Callable[[TextGame, str], Mapping[int, float]]
GameSpec = str | Callable[[], TextGame]


def best_response_value(game: GameSpec, policy: Policy, seat: str | int) -> float:
    """Expected return of ``seat`` playing ``policy`` from the start when the other players
    answer with the moves that minimise it: for two-player zero-sum games that is their best
    response, and the result is the policy's guaranteed value (game value minus exploitability).
    """
    env, agent = _start(game, seat)
    return _Search(agent, policy).value(env)


def minimax_value(game: GameSpec, seat: str | int) -> float:
    """The game's value for ``seat`` when every player plays perfectly (``seat`` maximises)."""
    env, agent = _start(game, seat)
    return _Search(agent, None).value(env)


def _start(game: GameSpec, seat: str | int) -> tuple[TextGame, str]:
    env = make(game) if isinstance(game, str) else game()
    if not getattr(env, "perfect_information", False):
        raise ValueError(
            f"{type(env).__name__} is not a perfect-information game: a min over "
            f"the opponent's moves would let it see hidden information"
        )
    env.reset(seed=0)
    agent = env.possible_agents[seat] if isinstance(seat, int) else seat
    if agent not in env.possible_agents:
        raise ValueError(f"unknown seat {seat!r}; seats: {env.possible_agents}")
    return env, agent


def _checked(probs: Mapping[int, float], env: TextGame, agent: str) -> dict[int, float]:
    """The policy's distribution, refusing illegal actions and probabilities not summing to 1."""
    legal = env.legal_actions(agent)
    illegal = [a for a, p in probs.items() if p > 0 and a not in legal]
    if illegal:
        raise ValueError(
            f"policy puts probability on illegal actions {illegal} at {env.state_key()!r}"
        )
    if not math.isclose(sum(probs.values()), 1.0, abs_tol=1e-6):
        raise ValueError(
            f"policy probabilities sum to {sum(probs.values())} at {env.state_key()!r}"
        )
    return {a: p for a, p in probs.items() if p > 0}


class _Search:
    """Expectimax over ``agent``'s policy (max if none), min over everyone else's moves."""

    def __init__(self, agent: str, policy: Policy | None) -> None:
        self.agent = agent
        self.policy = policy
        self.memo: dict[Hashable, float] = {}

    def value(self, env: TextGame) -> float:
        """Return still to come for ``agent`` from ``env``'s position."""
        live = _live(env)
        if not live:
            return 0.0
        key = env.state_key()
        if key is not None and key in self.memo:
            return self.memo[key]
        mover = env.agent_selection
        if mover not in live:  # a finished player's dead step comes first
            result = self._after(env, None)
        elif mover != self.agent:
            result = min(self._after(env, a) for a in env.legal_actions(mover))
        elif self.policy is None:
            result = max(self._after(env, a) for a in env.legal_actions(mover))
        else:
            result = sum(p * self._after(env, a) for a, p in self._probs(env).items())
        if key is not None:
            self.memo[key] = result
        return result

    def _probs(self, env: TextGame) -> dict[int, float]:
        return _checked(self.policy(env, self.agent), env, self.agent)  # type: ignore[misc]

    def _after(self, env: TextGame, action: int | None) -> float:
        child = env.clone()
        child.step(action)
        return child.rewards.get(self.agent, 0.0) + self.value(child)


def _live(env: TextGame) -> list[str]:
    return [a for a in env.agents if not (env.terminations[a] or env.truncations[a])]


def _key(env: TextGame) -> Hashable:
    key = env.state_key()
    if key is None:
        raise ValueError(
            f"{type(env).__name__} has no state_key(): positions cannot be told "
            f"apart for an exact evaluation"
        )
    return key


def _moves(
    env: TextGame, agent: str, policy: Policy | None, opponent: Policy
) -> dict[int | None, float]:
    """The moves from ``env`` with their probabilities: ``agent``'s from ``policy`` (every
    legal move, weight 0, when it is None), everyone else's from ``opponent``, and a finished
    player's dead step (None)."""
    mover = env.agent_selection
    if mover not in _live(env):
        return {None: 1.0}
    if mover == agent and policy is None:
        return dict.fromkeys(env.legal_actions(mover), 0.0)
    return _checked((policy if mover == agent else opponent)(env, mover), env, mover)


def decision_positions(
    game: GameSpec, seat: str | int, opponent: Policy
) -> list[tuple[TextGame, str]]:
    """Every position where ``seat`` is to move that play can reach when ``seat`` may make
    any legal move and everyone else plays ``opponent``'s support, one env per position: what
    a model must be shown to read off its policy for :func:`outcome_probabilities`."""
    env, agent = _start(game, seat)
    seen: set[Hashable] = set()
    out, stack = [], [env]
    while stack:
        node = stack.pop()
        key = _key(node)
        if key in seen or not _live(node):
            continue
        seen.add(key)
        if node.agent_selection == agent and agent in _live(node):
            out.append((node, agent))
        for action in _moves(node, agent, None, opponent):
            child = node.clone()
            child.step(action)
            stack.append(child)
    return out


def outcome_probabilities(
    game: GameSpec, policy: Policy, seat: str | int, opponent: Policy
) -> dict[str, float]:
    """Exact probabilities that ``seat`` playing ``policy`` ends with a positive, zero or
    negative return (``win``, ``draw``, ``loss``) when everyone else plays ``opponent``, a
    fixed policy such as the random bot's ``action_probs``: the expectation over the whole
    tree, so a policy's rate against a bot carries no sampling noise."""
    env, agent = _start(game, seat)
    memo: dict[tuple, tuple[float, ...]] = {}

    def dist(node: TextGame, banked: float) -> tuple[float, ...]:
        if not _live(node):
            return (float(banked > 0), float(banked == 0), float(banked < 0))
        key = (_key(node), banked)
        if key not in memo:
            total = np.zeros(3)
            for action, p in _moves(node, agent, policy, opponent).items():
                child = node.clone()
                child.step(action)
                total += p * np.array(dist(child, banked + child.rewards.get(agent, 0.0)))
            memo[key] = tuple(total)
        return memo[key]

    win, draw, loss = dist(env, 0.0)
    return {"win": float(win), "draw": float(draw), "loss": float(loss)}
