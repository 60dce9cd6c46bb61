"""Exact game trees of small imperfect-information games, flattened into numpy arrays.

Any state object with the :class:`TreeState` interface (``marl.games.poker.PokerState`` is one) is
enumerated once, breadth first, into arrays.  Breadth-first order puts the nodes of one depth
in a contiguous block and the children of each node next to each other, so every pass below is
a handful of vectorised numpy operations per depth instead of a Python recursion per node:

- ``reach(probs)``: pi_j(h) for every player j and chance (last column), forward by depth;
- ``values(probs)``: v_j(h) = sum_z pi(h -> z) u_j(z), backward by depth;
- ``best_response_value(sigma, i)``: max over pure strategies of i of i's expected payoff;
- ``action_values(sigma)``: Q(I, a), the mover's expected payoff after a at I, for every slot.

A behaviour strategy is one flat vector ``sigma`` indexed by *slots* (one slot per
(information state, legal action) pair; the slots of an information state are contiguous).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
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

    def action_values(self, sigma: np.ndarray) -> np.ndarray:
        """[S]: Q(I, a) for every slot, the expected payoff of I's player after playing a at
        I when everyone plays ``sigma``:

            Q(I, a) = sum_{h in I} pi_{-i}(h) v_i(h a) / sum_{h in I} pi_{-i}(h)

        the mean return after (I, a) over the histories play reaches I by (the player's own
        reach is the same at every h in I, so it cancels).  A slot no history reaches with
        positive weight gets 0."""
        probs = self.edge_probs(sigma)
        reach, v = self.reach(probs), self.values(probs)
        num, den = np.zeros(self.num_slots), np.zeros(self.num_slots)
        edges = np.flatnonzero(self.edge_slot >= 0)
        movers = self.player[self.parent[edges]]
        for p in range(self.num_players):
            mine = edges[movers == p]
            cf = self.counterfactual_reach(reach, p)[self.parent[mine]]
            slots = self.edge_slot[mine]
            num += np.bincount(slots, cf * v[mine, p], minlength=self.num_slots)
            den += np.bincount(slots, cf, minlength=self.num_slots)
        return np.divide(num, den, out=np.zeros_like(num), where=den > 0)

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


@dataclass
class _Enumeration:
    """The per-node and per-infoset lists that the breadth-first enumeration grows."""

    n_players: int
    parent: list[int] = field(default_factory=lambda: [-1])
    player: list[int] = field(default_factory=list)
    infoset: list[int] = field(default_factory=list)
    edge_action: list[int] = field(default_factory=lambda: [-1])
    edge_col: list[int] = field(default_factory=lambda: [0])
    chance_prob: list[float] = field(default_factory=lambda: [1.0])
    depth: list[int] = field(default_factory=lambda: [0])
    utility: list[Sequence[float]] = field(default_factory=list)
    children: list[dict[int, int]] = field(default_factory=list)
    keys: dict[str, int] = field(default_factory=dict)
    key_list: list[str] = field(default_factory=list)
    infoset_player: list[int] = field(default_factory=list)
    infoset_actions: list[list[int]] = field(default_factory=list)
    infoset_depth: list[int] = field(default_factory=list)

    def visit(self, state: TreeState, node: int) -> tuple[list[tuple[int, float]], int]:
        """Record ``node``'s mover, payoffs and infoset; return its (action, probability)
        edges and the reach column they multiply."""
        if state.is_terminal:
            self.player.append(TERMINAL)
            self.utility.append(tuple(state.returns()))
            self.infoset.append(-1)
            return [], -1
        self.utility.append((0.0,) * self.n_players)
        if state.is_chance:
            self.player.append(CHANCE)
            self.infoset.append(-1)
            return state.chance_outcomes(), self.n_players
        p = state.current_player
        self.player.append(p)
        legal = state.legal()
        self.infoset.append(self._infoset(state.info_key(p), p, legal, self.depth[node]))
        return [(a, 1.0) for a in legal], p

    def _infoset(self, key: str, player: int, legal: list[int], depth: int) -> int:
        """Index of the information state ``key``, new ones appended; every node of one
        infoset must share its legal moves and its depth."""
        if key not in self.keys:
            self.keys[key] = len(self.key_list)
            self.key_list.append(key)
            self.infoset_player.append(player)
            self.infoset_actions.append(legal)
            self.infoset_depth.append(depth)
        info = self.keys[key]
        if self.infoset_actions[info] != legal or self.infoset_depth[info] != depth:
            raise ValueError(f"info state {key!r} has inconsistent moves or depths")
        return info


def _enumerate(root: TreeState) -> _Enumeration:
    """Every history, breadth first: the children of a node get consecutive indices."""
    e = _Enumeration(root.num_players)
    frontier: list[TreeState] = [root]
    i = 0
    while i < len(frontier):  # the frontier list doubles as the BFS queue
        state = frontier[i]
        moves, col = e.visit(state, i)
        kids: dict[int, int] = {}
        for action, prob in moves:
            kids[action] = len(frontier)
            frontier.append(state.apply(action))
            e.parent.append(i)
            e.edge_action.append(action)
            e.edge_col.append(col)
            e.chance_prob.append(prob)
            e.depth.append(e.depth[i] + 1)
        e.children.append(kids)
        i += 1
    return e


def _edge_slots(e: _Enumeration, slot_start: np.ndarray) -> np.ndarray:
    """[N] the slot of the player action leading to each node, -1 below chance and the root."""
    edge_slot = np.full(len(e.parent), -1, dtype=np.int64)
    for node in range(1, len(e.parent)):
        owner = e.infoset[e.parent[node]]
        if owner >= 0:
            acts = e.infoset_actions[owner]
            edge_slot[node] = slot_start[owner] + acts.index(int(e.edge_action[node]))
    return edge_slot


def build_tree(root: TreeState) -> GameTree:
    """Enumerate every history breadth first and index information states by key."""
    e = _enumerate(root)
    slot_start = np.cumsum([0] + [len(a) for a in e.infoset_actions])
    slot_infoset = np.repeat(np.arange(len(e.key_list)), np.diff(slot_start)).astype(np.int64)
    slot_action = np.array([a for acts in e.infoset_actions for a in acts], dtype=np.int64)
    parent_arr = np.array(e.parent, dtype=np.int64)
    player_arr = np.array(e.player, dtype=np.int64)
    infoset_arr = np.array(e.infoset, dtype=np.int64)
    depth_arr = np.array(e.depth)
    levels = [
        _level(
            d,
            depth_arr,
            parent_arr,
            player_arr,
            infoset_arr,
            e.infoset_depth,
            e.infoset_player,
            slot_start,
            e.n_players,
        )
        for d in range(int(depth_arr.max()))
    ]
    return GameTree(
        num_players=e.n_players,
        parent=parent_arr,
        player=player_arr,
        infoset=infoset_arr,
        edge_action=np.array(e.edge_action, dtype=np.int64),
        edge_slot=_edge_slots(e, slot_start),
        edge_col=np.array(e.edge_col, dtype=np.int64),
        chance_prob=np.array(e.chance_prob),
        utility=np.array(e.utility, dtype=np.float64),
        children=e.children,
        levels=levels,
        infoset_keys=e.key_list,
        infoset_player=np.array(e.infoset_player, dtype=np.int64),
        infoset_actions=e.infoset_actions,
        slot_start=slot_start.astype(np.int64),
        slot_infoset=slot_infoset,
        slot_action=slot_action,
        key_index=e.keys,
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
