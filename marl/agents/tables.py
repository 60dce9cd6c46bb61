"""Exact evaluation of an agent or bot: its table policy and exploitability, or its outcome
probabilities against a fixed bot.

For games with an exact tree (Kuhn, Leduc) the player is shown every information state once
and its action distribution there is read off: a model in one batched scoring pass (the
``choice`` distribution over the legal actions' texts, the same one a choice-mode policy
samples from in play), a bot through its ``action_probs``.  The game layer then evaluates
the table exactly (NashConv against best responders).

A policy that reasons before it chooses (think decoding) has no exact table here: its
distribution at a state is the mean over reasonings of the choice distribution after each.
:func:`agent_report` samples K reasonings per state, evaluates the table of their means, and
gives a percentile bootstrap interval (the K samples of every state resampled with
replacement, independently per state).  A free-text policy's table is read the same way from
K sampled answers per state, each the move the game parses from it (an unplayable answer: a
uniformly random legal move), with the share of unplayable answers beside it.

In perfect-information games (tic-tac-toe, Nim, small Connect Four) :func:`outcome_report`
reads the player's distribution at every position it can reach against a bot with fixed
action probabilities, and gives the exact probabilities of winning, drawing and losing from
each seat: what a run's games estimate with sampling noise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from marl.agents import Agent
from marl.agents.rollout import move_read, read_action
from marl.games import TextGame, make
from marl.games.analysis import exploitability, info_state_envs
from marl.games.perfect_info import GameSpec, decision_positions, outcome_probabilities

Positions = list[tuple[TextGame, str]]
Table = dict[str, dict[int, float]]


@dataclass
class ExploitabilityReport:
    """``interval`` (sampled tables only): the bootstrap interval at ``level``, from
    ``samples`` reads per information state (answers, for free text)."""

    game: str
    exploitability: float
    table: Table
    interval: tuple[float, float] | None = None
    samples: int = 1
    level: float = 0.95
    unplayable: float | None = None  # free text: the share of answers no move could be read from


#: Model backends whose policies report their choice distribution (vLLM and remote
#: endpoints return samples only), so an exact evaluation can read their tables.
TABLE_BACKENDS = frozenset({"hf"})


def agent_probs(agent: Agent, batch: int = 32) -> Callable[[Positions], list[dict]]:
    """Read a model agent's choice distribution, ``batch`` states per forward pass; a bot
    participant's through its ``action_probs``."""
    if agent.role == "bot":
        return bot_probs(agent.policy.bot)
    probabilities = getattr(agent.policy, "probabilities", None)
    if probabilities is None:
        raise TypeError(
            f"agent {agent.name!r} cannot report action probabilities "
            "(needs a model policy such as the hf backend)"
        )

    def read(positions: Positions) -> list[dict]:
        out = []
        for i in range(0, len(positions), batch):
            requests = [agent.request(env, who) for env, who in positions[i : i + batch]]
            out += [
                dict(zip(r.legal, p, strict=True))
                for r, p in zip(requests, probabilities(requests), strict=True)
            ]
        return out

    return read


def bot_probs(bot) -> Callable[[Positions], list[dict]]:
    if not hasattr(bot, "action_probs"):
        raise TypeError(f"bot {type(bot).__name__} has no fixed action probabilities")
    return lambda positions: [dict(bot.action_probs(env, who)) for env, who in positions]


def table_policy(read: Callable[[Positions], list[dict]], game: str) -> Table:
    """``{info state: {action: probability}}`` for every information state of ``game``."""
    positioned = info_state_envs(game)
    return dict(zip(positioned, read(list(positioned.values())), strict=True))


def exploitability_report(
    read: Callable[[Positions], list[dict]], game: str
) -> ExploitabilityReport:
    table = table_policy(read, game)
    return ExploitabilityReport(game, exploitability(game, table), table)


def _mean(dists: list[dict]) -> dict[int, float]:
    return {a: float(np.mean([d[a] for d in dists])) for a in dists[0]}


def sampled_report(
    read: Callable[[Positions], list[dict]],
    game: str,
    samples: int,
    resamples: int = 200,
    level: float = 0.95,
    seed: int = 0,
) -> ExploitabilityReport:
    """Exploitability of the mean of ``samples`` reads per information state (``read``
    returns a sampled distribution per position), with a percentile bootstrap interval over
    ``resamples`` resamplings of each state's reads."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    positioned = info_state_envs(game)
    positions = list(positioned.values())
    n = len(positions)
    flat = read(positions * samples)  # one pass over all the draws: full batches
    draws = [[flat[j * n + i] for j in range(samples)] for i in range(n)]
    return draws_report(dict(zip(positioned, draws, strict=True)), game, resamples, level, seed)


def draws_report(
    draws: dict[str, list[dict]],
    game: str,
    resamples: int = 200,
    level: float = 0.95,
    seed: int = 0,
) -> ExploitabilityReport:
    """Exploitability of the table of means of ``draws`` (``samples`` sampled distributions
    per information state), with the percentile bootstrap interval of :func:`sampled_report`."""
    keys, rows = list(draws), list(draws.values())
    samples = len(rows[0])
    table = {k: _mean(list(d)) for k, d in zip(keys, rows, strict=True)}
    rng = np.random.default_rng(seed)
    boot = [
        exploitability(
            game,
            {
                k: _mean([d[j] for j in rng.integers(0, samples, samples)])
                for k, d in zip(keys, rows, strict=True)
            },
        )
        for _ in range(resamples)
    ]
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return ExploitabilityReport(
        game, exploitability(game, table), table, (float(lo), float(hi)), samples, level
    )


def answers_report(agent: Agent, game: str, samples: int, batch: int = 32) -> ExploitabilityReport:
    """A free-text agent's exploitability from ``samples`` sampled answers per information
    state, each read as the move the game parses from it (:func:`move_read`), with the
    bootstrap interval of :func:`sampled_report` and the share of unplayable answers."""
    unplayable: list[bool] = []

    def read(positions: Positions) -> list[dict]:
        out = []
        for i in range(0, len(positions), batch):
            requests = [agent.request(env, who) for env, who in positions[i : i + batch]]
            for req, resp in zip(requests, agent.policy.act(requests), strict=True):
                action, error = read_action(req.env, req.agent, req.legal, resp)
                unplayable.append(error is not None)
                out.append(dict(zip(req.legal, move_read(req.legal, action), strict=True)))
        return out

    report = sampled_report(read, game, samples)
    report.unplayable = float(np.mean(unplayable))
    return report


def agent_report(
    agent: Agent, game: str, samples: int = 1, batch: int = 32
) -> ExploitabilityReport:
    """A model agent's exploitability: exact from its choice distribution, or, for a policy
    whose table is sampled (``sampled_table``: think decoding), from ``samples`` reasonings
    per information state with their bootstrap interval; a free-text agent's from its
    sampled answers (:func:`answers_report`)."""
    if agent.mode == "free" and agent.role != "bot":
        return answers_report(agent, game, samples, batch)
    read = agent_probs(agent, batch)
    if getattr(agent.policy, "sampled_table", False):
        return sampled_report(read, game, samples)
    return exploitability_report(read, game)


@dataclass
class OutcomeReport:
    """Per seat: ``{"win", "draw", "loss"}`` probabilities and how many positions were read."""

    seats: dict[str, dict[str, float]]
    positions: dict[str, int]


def outcome_report(
    read: Callable[[Positions], list[dict]],
    game: GameSpec,
    opponent: Callable[[TextGame, str], dict[int, float]],
) -> OutcomeReport:
    """Exact outcome probabilities of the player ``read`` reads, from every seat of ``game``
    (a name, or a factory of configured envs) against ``opponent`` (a bot's
    ``action_probs``)."""
    seats, counts = {}, {}
    for seat in (make(game) if isinstance(game, str) else game()).possible_agents:
        positions = decision_positions(game, seat, opponent)
        table = {env.state_key(): d for (env, _), d in zip(positions, read(positions), strict=True)}
        seats[seat] = outcome_probabilities(
            game, lambda env, _who, t=table: t[env.state_key()], seat, opponent
        )
        counts[seat] = len(positions)
    return OutcomeReport(seats, counts)
