"""Exact evaluation of an agent or bot: its table policy and exploitability.

For games with an exact tree (Kuhn, Leduc) the player is shown every information state once
and its action distribution there is read off: a model in one batched scoring pass (the
``choice`` distribution over the legal actions' texts, the same one a choice-mode policy
samples from in play), a bot through its ``action_probs``.  The game layer then evaluates
the table exactly (NashConv against best responders).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agents import Agent
from games import TextGame
from games.analysis import exploitability, info_state_envs

Positions = list[tuple[TextGame, str]]
Table = dict[str, dict[int, float]]


@dataclass
class ExploitabilityReport:
    game: str
    exploitability: float
    table: Table


def agent_probs(agent: Agent, batch: int = 32) -> Callable[[Positions], list[dict]]:
    """Read a model agent's choice distribution, ``batch`` states per forward pass."""
    probabilities = getattr(agent.policy, "probabilities", None)
    if probabilities is None:
        raise TypeError(f"agent {agent.name!r} cannot report action probabilities "
                        "(needs a model policy such as the hf backend)")

    def read(positions: Positions) -> list[dict]:
        out = []
        for i in range(0, len(positions), batch):
            requests = [agent.request(env, who) for env, who in positions[i:i + batch]]
            out += [dict(zip(r.legal, p, strict=True))
                    for r, p in zip(requests, probabilities(requests), strict=True)]
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


def exploitability_report(read: Callable[[Positions], list[dict]],
                          game: str) -> ExploitabilityReport:
    table = table_policy(read, game)
    return ExploitabilityReport(game, exploitability(game, table), table)
