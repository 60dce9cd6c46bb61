"""Visiting every state: ``train.rollout: states`` for games with an exact tree.

Instead of games, a step asks the policy ``group_size`` times at every information state s of
the game (the seat to move there played by the team's own agent), and values each decision on
the game tree rather than by the returns of sampled games:

    pi_hat(a | s) = (1/G) sum_j pi(a | s, z_j)           the policy the step's decisions show
    Q(s, a)       = E[return of s's player | s, a]        under pi_hat in every seat

(``z_j`` the j-th reasoning of a think policy, nothing for a choice policy, whose G reads are
then the same distribution; a free-text policy's j-th read is its sampled answer's, from
:func:`decision_read`).  Q is exact for pi_hat
(:func:`marl.games.analysis.state_action_values`), so policy targets get the action values
that a batch of games only estimates: the choice-mode Kuhn recipe plays 8,192 games a step to
make that estimate tight, which a think policy, writing a reasoning at each decision, cannot
afford.  The price is generality: a game must have a tree
small enough to walk (Kuhn, Leduc) and the values are those of the current policy in both
seats (self-play).

pi_hat is also a G-sample read of the policy's table, so the step reports its
exploitability for free (``metrics["states"]``).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from marl.agents.rollout import Episode, Turn, move_read
from marl.games.analysis import exploitability, info_states, state_action_values
from marl.infra.seats import ParticipantId
from marl.infra.seeds import derive_seed
from marl.train.workers import EpisodeSpec


def plan_states(
    game: str, seats: list[str], group_size: int, seed: int, step: int
) -> list[EpisodeSpec]:
    """``group_size`` decisions at each information state, the team's agents in every seat;
    the group of a decision is its state's index in :func:`info_states` order."""
    seating = tuple((s, ParticipantId.team(i)) for i, s in enumerate(seats))
    specs: list[EpisodeSpec] = []
    for g in range(len(info_states(game))):
        state_seed = derive_seed(seed, step, g)
        specs += [EpisodeSpec(len(specs) + j, state_seed, g, seating) for j in range(group_size)]
    return specs


def decision_read(turn: Turn, legal: list[int]) -> np.ndarray:
    """What one decision shows of its policy: the distribution a choice was drawn from or a
    free-text answer's read (:func:`~marl.agents.rollout.answer_read`), else the move the
    answer named (:func:`~marl.agents.rollout.move_read`)."""
    if turn.action_probs is not None:
        return np.asarray(turn.action_probs, dtype=float)
    return np.asarray(move_read(legal, turn.action))


def value_states(game: str, episodes: list[Episode], specs: list[EpisodeSpec]) -> dict:
    """Set every decision's ``action_values`` to Q(s, .) under the table its step's decisions
    read (module docstring) and its episode's return to Q(s, a) of the move played; return that
    table's exploitability and reads per state."""
    states = info_states(game)
    group_of = {s.index: s.group for s in specs}
    reads: dict[str, list[np.ndarray]] = defaultdict(list)
    for ep in episodes:
        key = states[group_of[ep.index]][0]
        reads[key].append(decision_read(ep.turns[0], states[group_of[ep.index]][2]))
    means = {key: np.mean(r, axis=0) for key, r in reads.items()}  # a free-text read sums
    table = {  # to 1 only in expectation (answer_read): each row is normalised
        key: dict(zip(legal, means[key] / means[key].sum(), strict=True))
        for key, _, legal in states
    }
    q = state_action_values(game, table)
    for ep in episodes:
        key, _, legal = states[group_of[ep.index]]
        turn = ep.turns[0]
        turn.action_values = [q[key][a] for a in legal]
        ep.returns[turn.agent] = (  # an unplayable answer: a random legal move's value
            q[key][turn.action] if turn.legal else float(np.mean(turn.action_values))
        )
    return {
        "exploitability": exploitability(game, table),
        "reads": min(len(r) for r in reads.values()),
    }
