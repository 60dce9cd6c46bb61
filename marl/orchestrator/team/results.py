"""What a team says and what it answers: each node's message, one task's run in progress,
and the result the plan's decision makes of it (the final node, a majority vote, or the expert
a role deferred to)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from marl.agents.policy import Response
from marl.orchestrator.team.plan import VOTE_NODE, Plan, majority
from marl.orchestrator.team.views import TaskView
from marl.topologies.graph import Node, node_name

#: ``TeamResult.decided_by`` (and the expert message's agent) when an expert answered.
EXPERT_NODE = "expert"


@dataclass
class NodeMessage:
    """What one ``(agent, round)`` node said; ``response`` keeps token ids and log-probs for
    a trainer."""

    agent: str
    role: str
    round: int
    text: str
    reads: list[str]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    response: Response | None = field(default=None, repr=False, compare=False)

    @property
    def node(self) -> str:
        return node_name((self.agent, self.round))

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "role": self.role,
            "round": self.round,
            "text": self.text,
            "reads": self.reads,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }


@dataclass
class TeamResult:
    """A team's answer to one task, how it got there, and what it cost.

    ``messages`` counts the edges used (messages read along the unrolled DAG), ``tokens`` the
    prompt plus completion tokens of every node (hosted ones as their server counts them) and
    of the expert: the costs a learnable topology trades against ``score``
    (``task.score(answer)`` for a :class:`~marl.games.tasks.Task`, else ``None``).  A deferred task
    (``deferrals`` > 0) was answered by ``expert``; ``reward`` charges its ``deferral_cost``.
    ``role_scores`` are the task's per-agent scores, for tasks that define them
    (``task.role_scores(last message of each agent)``) and were not handed over.
    """

    answer: str
    transcript: list[NodeMessage]
    messages: int
    tokens: int
    score: float | None = None
    decided_by: str = ""
    votes: dict[str, str] | None = None
    deferrals: int = 0
    deferral_cost: float = 0.0
    expert: NodeMessage | None = None
    role_scores: dict[str, float] | None = None

    @property
    def reward(self) -> float:
        """The team reward: the score less what the deferrals cost."""
        return float(self.score or 0.0) - self.deferral_cost

    def to_dict(self) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "messages": self.messages,
            "tokens": self.tokens,
            "score": self.score,
            "decided_by": self.decided_by,
            "votes": self.votes,
            "deferrals": self.deferrals,
            "deferral_cost": self.deferral_cost,
            "role_scores": self.role_scores,
            "expert": None if self.expert is None else self.expert.to_dict(),
            "transcript": [t.to_dict() for t in self.transcript],
        }


@dataclass
class TaskRun:
    """One task of a batch being run: its plan, its agents' views, what its nodes said."""

    index: int
    view: TaskView
    plan: Plan
    views: dict[str, str]
    said: dict[Node, NodeMessage] = field(default_factory=dict)
    deferrals: int = 0
    deferral_cost: float = 0.0
    expert: NodeMessage | None = None  # set once the task is handed over: no node speaks after


def node_message(
    agent: str, role: str, node: Node, response: Response, reads: Sequence[Node]
) -> NodeMessage:
    """What ``node`` said in ``response``, having read the nodes ``reads``."""
    prompt_tokens, completion_tokens = response.token_counts()
    return NodeMessage(
        agent=agent,
        role=role,
        round=node[1],
        text=response.text,
        reads=[node_name(p) for p in reads],
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        response=response,
    )


def task_result(run: TaskRun) -> TeamResult:
    """The team's answer to ``run``: the expert's, the final node's or the vote's, with
    what it cost."""
    plan = run.plan
    transcript = [run.said[n] for n in plan.order if n in run.said]
    votes = None
    if run.expert is not None:
        answer, decided_by = run.expert.text, EXPERT_NODE
    elif plan.final is not None:
        answer, decided_by = run.said[plan.final].text, node_name(plan.final)
    else:
        votes = {a: run.said[(a, r)].text for a, r in plan.voters}
        decider = (majority(votes), plan.topology.rounds - 1)
        answer, decided_by = run.said[decider].text, VOTE_NODE
    task = run.view.task
    spoken = transcript + ([run.expert] if run.expert is not None else [])
    # the edges read: all of the plan's unless the task was handed over early
    messages = sum(len(plan.preds[n]) for n in run.said)
    role_scores = None
    if hasattr(task, "role_scores") and run.expert is None:
        role_scores = dict(task.role_scores({t.agent: t.text for t in transcript}))
    return TeamResult(
        answer=answer,
        transcript=transcript,
        messages=messages,
        tokens=sum(t.prompt_tokens + t.completion_tokens for t in spoken),
        score=None if task is None else float(task.score(answer)),
        decided_by=decided_by,
        votes=votes,
        deferrals=run.deferrals,
        deferral_cost=run.deferral_cost,
        expert=run.expert,
        role_scores=role_scores,
    )
