"""What one ``(agent, round)`` node reads, and how it is rendered into chat messages.

A node sees the task (plus its agent's private view) and only the messages on its incoming
edges, never the whole conversation: that is the point of a topology (and what keeps prompts
short).  A prompt function turns that :class:`NodeContext` into the agent's messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from marl.agents.agent import Agent


@dataclass(frozen=True)
class Heard:
    """One incoming message: who said it, in which round (0-based), and what."""

    agent: str
    round: int
    text: str


@dataclass(frozen=True)
class NodeContext:
    """Everything one ``(agent, round)`` node may read; a prompt function renders it."""

    question: str
    view: str | None
    round: int
    rounds: int
    received: tuple[Heard, ...]
    decides: bool = False  # this node's answer is the team's answer
    votes: bool = False  # this node's answer is one vote of the team's majority


#: Renders a node's chat messages: ``prompt(agent, ctx) -> [{"role": ..., "content": ...}]``.
PromptFn = Callable[[Agent, NodeContext], list[dict[str, str]]]


def default_prompt(agent: Agent, ctx: NodeContext) -> list[dict[str, str]]:
    """System prompt, then one user turn: task, private view, round, received messages, and
    what is asked of this node.  Received messages are labelled with sender and round, so an
    agent can tell a critique from its own earlier answer."""
    parts = [ctx.question.strip()]
    if ctx.view:
        parts.append("Private information (only you know this):\n" + ctx.view.strip())
    if ctx.rounds > 1:
        parts.append(f"This is round {ctx.round + 1} of {ctx.rounds}.")
    if ctx.received:
        parts.append(
            "Messages you received:\n"
            + "\n".join(
                f"- {h.agent} (round {h.round + 1}): {h.text.strip()}" for h in ctx.received
            )
        )
    if ctx.decides:
        parts.append(
            "Your answer is the team's final answer: combine what you received with "
            "what you know, work it out, then end with the answer."
        )
    elif ctx.votes:
        parts.append("Your answer is your vote for the team's answer: end with the answer.")
    elif ctx.view:  # others may need what only this agent knows: a small model must be told
        parts.append(
            "Tell your teammates your private information"
            + (" and what you received" if ctx.received else "")
            + ", in one short sentence."
        )
    elif ctx.received:
        parts.append("Give your answer briefly, using or correcting these messages.")
    else:
        parts.append("Give your answer briefly.")
    messages = [{"role": "system", "content": agent.system_prompt}] if agent.system_prompt else []
    messages.append({"role": "user", "content": "\n\n".join(parts)})
    return messages
