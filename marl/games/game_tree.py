"""Exact game trees of small imperfect-information games, flattened into numpy arrays.

Any state object with the :class:`TreeState` interface (``marl.games.poker.PokerState`` is one) is
enumerated once, breadth first, into arrays.  Breadth-first order puts the nodes of one depth
in a contiguous block and the children of each node next to each other, so every pass below is
a handful of vectorised numpy operations per depth instead of a Python recursion per node:

- ``reach(probs)``: pi_j(h) for every player j and chance (last column), forward by depth;
- ``values(probs)``: v_j(h) = sum_z pi(h -> z) u_j(z), backward by depth;
- ``best_response_value(sigma, i)``: max over pure strategies of i of i's expected payoff.

A behaviour strategy is one flat vector ``sigma`` indexed by *slots* (one slot per
(information state, legal action) pair; the slots of an information state are contiguous).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

CHANCE, TERMINAL = -1, -2


class TreeState(Protocol):
    """The pure game-state interface the enumerator needs."""

    num_players: int

    @property
    def is_terminal(self) -> bool: ...

    @property
    def is_chance(self) -> bool: ...

    @property
    def current_player(self) -> int: ...

    def legal(self) -> list[int]: ...

    def chance_outcomes(self) -> list[tuple[int, float]]: ...

    def apply(self, action: int) -> TreeState: ...

    def returns(self) -> Sequence[float]: ...

    def info_key(self, player: int) -> str: ...


@dataclass(frozen=True)
class _Level:
    """The edges from the nodes of one depth to their children at the next depth."""

    children: slice  # child nodes, grouped by parent in parent order
    parents: np.ndarray  # the nodes of this depth that have children
    starts: np.ndarray  # offset of each parent's first child within ``children``
    player_edges: tuple[np.ndarray, ...]  # per player: children reached by that player's action
    infoset_slots: tuple[np.ndarray, ...]  # per player: slots of its infosets at this depth
    infoset_starts: tuple[np.ndarray, ...]  # offsets of each infoset within infoset_slots


@dataclass(frozen=True)
class GameTree:
    """Arrays over nodes (N), edges (one per non-root node) and slots (S)."""

    num_players: int
    parent: np.ndarray  # [N] parent node, -1 at the root
    player: np.ndarray  # [N] player to move, CHANCE or TERMINAL
    infoset: np.ndarray  # [N] infoset index of player nodes, else -1
    edge_action: np.ndarray  # [N] action or chance outcome leading here (-1 at the root)
    edge_slot: np.ndarray  # [N] slot of the player action leading here, else -1
    edge_col: np.ndarray  # [N] reach column multiplied by the edge (player, or chance = P)
    chance_prob: np.ndarray  # [N] probability of the chance edge leading here, else 1
    utility: np.ndarray  # [N, P] payoffs at terminals, 0 elsewhere
    children: list[dict[int, int]]  # action/outcome -> child node, to walk the tree
    levels: list[_Level]
    infoset_keys: list[str]
    infoset_player: np.ndarray  # [I]
    infoset_actions: list[list[int]]  # legal actions, in slot order
    slot_start: np.ndarray  # [I + 1] first slot of each infoset
    slot_infoset: np.ndarray  # [S]
    slot_action: np.ndarray  # [S]
    key_index: dict[str, int]

    @property
    def num_slots(self) -> int:
        return len(self.slot_infoset)

    # ----- strategy vectors
    def uniform(self) -> np.ndarray:
        counts = np.diff(self.slot_start)
        return 1.0 / counts[self.slot_infoset]

    def normalize(self, weights: np.ndarray) -> np.ndarray:
        """Per-infoset normalisation of non-negative slot weights; uniform where they sum to 0."""
        sums = np.add.reduceat(weights, self.slot_start[:-1])[self.slot_infoset]
        safe = np.where(sums > 0, sums, 1.0)
        return np.where(sums > 0, weights / safe, self.uniform())

    def edge_probs(self, sigma: np.ndarray) -> np.ndarray:
        """Probability of every edge: sigma at player nodes, chance probabilities elsewhere."""
        probs = self.chance_prob.copy()
        mine = self.edge_slot >= 0
        probs[mine] = sigma[self.edge_slot[mine]]
        return probs

    # ----- passes
    def reach(self, probs: np.ndarray) -> np.ndarray:
        """[N, P + 1]: each player's and chance's contribution to the reach probability."""
        r = np.ones((len(self.parent), self.num_players + 1))
        for lv in self.levels:
            idx = np.arange(lv.children.start, lv.children.stop)
            r[idx] = r[self.parent[idx]]
            r[idx, self.edge_col[idx]] *= probs[idx]
        return r

    def values(self, probs: np.ndarray) -> np.ndarray:
        """[N, P]: expected payoff below every node when play follows ``probs``."""
        v = self.utility.copy()
        for lv in reversed(self.levels):
            weighted = probs[lv.children, None] * v[lv.children]
            v[lv.parents] = np.add.reduceat(weighted, lv.starts, axis=0)
        return v

    def counterfactual_reach(self, reach: np.ndarray, player: int) -> np.ndarray:
        """pi_{-i}(h): the product of chance's and every other player's reach."""
        return np.prod(np.delete(reach, player, axis=1), axis=1)

    def best_response_value(self, sigma: np.ndarray, player: int) -> float:
        """Value of ``player``'s best response to the others playing ``sigma``.

        Backward by depth.  At an infoset I of ``player`` the response picks
        argmax_a sum_{h in I} pi_{-i}(h) v_i(h a), which needs every node of I at one depth
        (checked when the tree is built) and the values of deeper nodes already final.
        """
        probs = self.edge_probs(sigma)
        cf = self.counterfactual_reach(self.reach(probs), player)
        v = self.utility[:, player].copy()
        q = np.zeros(self.num_slots)
        for lv in reversed(self.levels):
            edges = lv.player_edges[player]
            if len(edges):
                slots = self.edge_slot[edges]
                q[slots] = np.bincount(
                    slots, cf[self.parent[edges]] * v[edges], minlength=self.num_slots
                )[slots]
                own, starts = lv.infoset_slots[player], lv.infoset_starts[player]
                sizes = np.diff(np.append(starts, len(own)))
                best = q[own] == np.repeat(np.maximum.reduceat(q[own], starts), sizes)
                best = best.astype(np.float64)
                choice = np.zeros(self.num_slots)
                # ties: mixing over equally good actions keeps the same value
                choice[own] = best / np.repeat(np.add.reduceat(best, starts), sizes)
                probs[edges] = choice[slots]
            weighted = probs[lv.children] * v[lv.children]
            v[lv.parents] = np.add.reduceat(weighted, lv.starts)
        return float(v[0])


def build_tree(root: TreeState) -> GameTree:
    """Enumerate every history breadth first and index information states by key."""
    parent, player, infoset, edge_action, edge_col, chance_prob = [-1], [], [], [-1], [0], [1.0]
    utility: list[Sequence[float]] = []
    children: list[dict[int, int]] = []
    keys: dict[str, int] = {}
    key_list: list[str] = []
    infoset_player: list[int] = []
    infoset_actions: list[list[int]] = []
    infoset_depth: list[int] = []
    depth = [0]
    n_players = root.num_players
    frontier: list[TreeState] = [root]
    i = 0
    while i < len(frontier):  # the frontier list doubles as the BFS queue
        state = frontier[i]
        kids: dict[int, int] = {}
        info = -1
        if state.is_terminal:
            player.append(TERMINAL)
            utility.append(tuple(state.returns()))
            moves: list[tuple[int, float]] = []
            col = -1
        elif state.is_chance:
            player.append(CHANCE)
            utility.append((0.0,) * n_players)
            moves, col = state.chance_outcomes(), n_players
        else:
            p = state.current_player
            player.append(p)
            utility.append((0.0,) * n_players)
            legal = state.legal()
            key = state.info_key(p)
            if key not in keys:
                keys[key] = len(key_list)
                key_list.append(key)
                infoset_player.append(p)
                infoset_actions.append(legal)
                infoset_depth.append(depth[i])
            info = keys[key]
            if infoset_actions[info] != legal or infoset_depth[info] != depth[i]:
                raise ValueError(f"info state {key!r} has inconsistent moves or depths")
            moves, col = [(a, 1.0) for a in legal], p
        infoset.append(info)
        for action, prob in moves:
            kids[action] = len(frontier)
            frontier.append(state.apply(action))
            parent.append(i)
            edge_action.append(action)
            edge_col.append(col)
            chance_prob.append(prob)
            depth.append(depth[i] + 1)
        children.append(kids)
        i += 1

    slot_start = np.cumsum([0] + [len(a) for a in infoset_actions])
    slot_infoset = np.repeat(np.arange(len(key_list)), np.diff(slot_start)).astype(np.int64)
    slot_action = np.array([a for acts in infoset_actions for a in acts], dtype=np.int64)
    parent_arr = np.array(parent, dtype=np.int64)
    player_arr = np.array(player, dtype=np.int64)
    infoset_arr = np.array(infoset, dtype=np.int64)
    edge_action_arr = np.array(edge_action, dtype=np.int64)
    edge_slot = np.full(len(parent), -1, dtype=np.int64)
    for node in range(1, len(parent)):
        owner = infoset_arr[parent_arr[node]]
        if owner >= 0:
            acts = infoset_actions[owner]
            edge_slot[node] = slot_start[owner] + acts.index(int(edge_action_arr[node]))
    depth_arr = np.array(depth)
    levels = [
        _level(
            d,
            depth_arr,
            parent_arr,
            player_arr,
            infoset_arr,
            infoset_depth,
            infoset_player,
            slot_start,
            n_players,
        )
        for d in range(int(depth_arr.max()))
    ]
    return GameTree(
        num_players=n_players,
        parent=parent_arr,
        player=player_arr,
        infoset=infoset_arr,
        edge_action=edge_action_arr,
        edge_slot=edge_slot,
        edge_col=np.array(edge_col, dtype=np.int64),
        chance_prob=np.array(chance_prob),
        utility=np.array(utility, dtype=np.float64),
        children=children,
        levels=levels,
        infoset_keys=key_list,
        infoset_player=np.array(infoset_player, dtype=np.int64),
        infoset_actions=infoset_actions,
        slot_start=slot_start.astype(np.int64),
        slot_infoset=slot_infoset,
        slot_action=slot_action,
        key_index=keys,
    )


def _level(
    d: int,
    depth: np.ndarray,
    parent: np.ndarray,
    player: np.ndarray,
    infoset: np.ndarray,
    infoset_depth: list[int],
    infoset_player: list[int],
    slot_start: np.ndarray,
    n_players: int,
) -> _Level:
    kids = np.flatnonzero(depth == d + 1)
    children = slice(int(kids[0]), int(kids[-1]) + 1)
    parents, starts = np.unique(parent[kids], return_index=True)
    player_edges, infoset_slots, infoset_starts = [], [], []
    for p in range(n_players):
        player_edges.append(kids[player[parent[kids]] == p])
        own = [
            i
            for i, (dd, pp) in enumerate(zip(infoset_depth, infoset_player, strict=True))
            if dd == d and pp == p
        ]
        slots = [np.arange(slot_start[i], slot_start[i + 1]) for i in own]
        infoset_slots.append(np.concatenate(slots) if slots else np.zeros(0, dtype=np.int64))
        infoset_starts.append(np.cumsum([0] + [len(s) for s in slots[:-1]]).astype(np.int64))
    return _Level(
        children,
        parents,
        starts.astype(np.int64),
        tuple(player_edges),
        tuple(infoset_slots),
        tuple(infoset_starts),
    )
