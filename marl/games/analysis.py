"""Exact evaluation of tabular policies in small imperfect-information games (Kuhn, Leduc).

A *policy* is either

- a callable ``policy(info_state_key, legal_actions) -> {action: probability}``, or
- a mapping ``{info_state_key: {action: probability}}`` (e.g. what ``cfr.solve`` returns).

Keys are the games' ``information_state(agent)`` strings (``"K:cb"``), actions are indices into
the game's ``action_names``; actions left out get probability 0.  ``info_states(game)`` lists
every key to fill, so an LLM can be queried once per information state to build its table.

NashConv (as in OpenSpiel): NashConv(sigma) = sum_i [ max_{sigma_i'} u_i(sigma_i', sigma_-i)
- u_i(sigma) ]; for two-player zero-sum games exploitability = NashConv / 2, and both are 0
exactly at a Nash equilibrium.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache

import numpy as np

from marl.games.base import TextGame
from marl.games.game_tree import GameTree, build_tree
from marl.games.registry import make, names

ActionProbs = Mapping[int, float]
TabularPolicy = dict[str, dict[int, float]]
Policy = Callable[[str, list[int]], ActionProbs] | Mapping[str, ActionProbs]


@cache
def game_tree(game_name: str) -> GameTree:
    """The game's tree, built once per process from its ``root_state()``."""
    env = make(game_name)
    root = getattr(env, "root_state", None)
    if root is None:
        raise ValueError(f"game {game_name!r} has no exact game tree (no root_state())")
    return build_tree(root())


def tree_games() -> list[str]:
    """The registered games with an exact tree (exploitability), from the registry."""
    return [name for name in names() if hasattr(make(name), "root_state")]


def info_states(game_name: str) -> list[tuple[str, int, list[int]]]:
    """Every information state as ``(key, player index, legal actions)``, in tree order."""
    tree = game_tree(game_name)
    return [
        (key, int(p), list(acts))
        for key, p, acts in zip(
            tree.infoset_keys, tree.infoset_player, tree.infoset_actions, strict=True
        )
    ]


def uniform_policy(key: str, legal: list[int]) -> dict[int, float]:
    """Uniform over the legal actions."""
    return {a: 1.0 / len(legal) for a in legal}


def strategy_vector(
    game_name: str,
    policy: Policy,
    players: tuple[int, ...] | None = None,
    into: np.ndarray | None = None,
) -> np.ndarray:
    """Flat slot vector of ``policy`` at the infosets of ``players`` (default all).

    Raises ``ValueError`` on probabilities for illegal actions, negative probabilities or rows
    that do not sum to 1 (within 1e-6), and ``KeyError`` on a mapping missing a key.
    """
    tree = game_tree(game_name)
    sigma = np.zeros(tree.num_slots) if into is None else into
    query = policy.__getitem__ if isinstance(policy, Mapping) else None
    for info, (key, acts) in enumerate(zip(tree.infoset_keys, tree.infoset_actions, strict=True)):
        if players is not None and tree.infoset_player[info] not in players:
            continue
        row = query(key) if query else policy(key, list(acts))
        probs = {int(a): float(p) for a, p in row.items()}
        if set(probs) - set(acts):
            raise ValueError(
                f"{key!r}: probabilities for illegal actions "
                f"{sorted(set(probs) - set(acts))} (legal: {acts})"
            )
        vals = [probs.get(a, 0.0) for a in acts]
        if min(vals) < 0 or abs(sum(vals) - 1.0) > 1e-6:
            raise ValueError(f"{key!r}: not a distribution over {acts}: {probs}")
        start = tree.slot_start[info]
        sigma[start : start + len(acts)] = np.asarray(vals) / sum(vals)
    return sigma


def to_table(game_name: str, policy: Policy) -> TabularPolicy:
    """Materialise any policy as a ``{key: {action: prob}}`` table (JSON-friendly)."""
    return by_key(game_name, strategy_vector(game_name, policy))


def by_key(game_name: str, slots: np.ndarray) -> dict[str, dict[int, float]]:
    """A flat slot vector as ``{key: {action: value}}``."""
    tree = game_tree(game_name)
    return {
        key: {int(a): float(slots[tree.slot_start[i] + j]) for j, a in enumerate(acts)}
        for i, (key, acts) in enumerate(zip(tree.infoset_keys, tree.infoset_actions, strict=True))
    }


def policy_value(game_name: str, policy_a: Policy, policy_b: Policy) -> tuple[float, float]:
    """Expected payoffs (player_0, player_1) when player_0 plays ``policy_a``, player_1 ``b``."""
    sigma = strategy_vector(game_name, policy_a, players=(0,))
    sigma = strategy_vector(game_name, policy_b, players=(1,), into=sigma)
    tree = game_tree(game_name)
    v = tree.values(tree.edge_probs(sigma))[0]
    return float(v[0]), float(v[1])


def best_response_values(game_name: str, policy: Policy) -> list[float]:
    """For each player i, the value of i's best response to the others playing ``policy``."""
    tree = game_tree(game_name)
    sigma = strategy_vector(game_name, policy)
    return [tree.best_response_value(sigma, p) for p in range(tree.num_players)]


def nash_conv(game_name: str, policy: Policy) -> float:
    """sum_i (best-response value_i - on-policy value_i), every player playing ``policy``."""
    tree = game_tree(game_name)
    sigma = strategy_vector(game_name, policy)
    on_policy = tree.values(tree.edge_probs(sigma))[0]
    return float(
        sum(tree.best_response_value(sigma, p) - on_policy[p] for p in range(tree.num_players))
    )


def state_action_values(game_name: str, policy: Policy) -> dict[str, dict[int, float]]:
    """Q(s, a) at every information state s when every player plays ``policy``: the mean
    return of s's player after playing a there (``GameTree.action_values``), what a batch of
    games estimates by averaging the returns that followed a at s."""
    return by_key(game_name, game_tree(game_name).action_values(strategy_vector(game_name, policy)))


def exploitability(game_name: str, policy: Policy) -> float:
    """NashConv / 2: the average gain of a best responder over the two seats."""
    return nash_conv(game_name, policy) / 2


def info_state_envs(game_name: str) -> dict[str, tuple[TextGame, str]]:
    """For every information state, a fresh env positioned at one history reaching it and
    the agent to move there: what a model must be shown to read off its table policy."""
    root = make(game_name).root_state()
    out: dict[str, tuple[TextGame, str]] = {}
    stack = [root]
    while stack:
        st = stack.pop()
        if st.is_terminal:
            continue
        if st.is_chance:
            stack += [st.apply(a) for a, _ in st.chance_outcomes()]
            continue
        key = st.info_key(st.current_player)
        if key not in out:
            env = make(game_name)
            env.reset(seed=0)
            env.set_tree_state(st)
            out[key] = (env, env.agent_selection)
        stack += [st.apply(a) for a in st.legal()]
    return out
