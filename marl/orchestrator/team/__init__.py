"""Teams of agents answering tasks along a communication topology.

- :mod:`~marl.orchestrator.team.plan`: a topology unrolled into ``(agent, round)`` nodes, run in
  topological generations, and the decision (final node or majority vote);
- :mod:`~marl.orchestrator.team.prompts`: what a node reads and how it is prompted;
- :mod:`~marl.orchestrator.team.views`: a task's question and private views, given to agents;
- :mod:`~marl.orchestrator.team.runtime`: :class:`Team`, which runs plans in batches;
- :mod:`~marl.orchestrator.team.results`: each node's message and the team's answer to a task
  (final node, vote or expert) with what it cost;
- :mod:`~marl.orchestrator.team.langgraph`: the same plan as a LangGraph ``StateGraph``.
"""

from marl.orchestrator.team.errors import TeamError
from marl.orchestrator.team.langgraph import graph_node_id, message_text
from marl.orchestrator.team.plan import Plan, answer_key, majority
from marl.orchestrator.team.prompts import Heard, NodeContext, PromptFn, default_prompt
from marl.orchestrator.team.results import EXPERT_NODE, NodeMessage, TeamResult
from marl.orchestrator.team.runtime import Team
from marl.orchestrator.team.views import TaskView, assign_views

__all__ = [
    "EXPERT_NODE",
    "Heard",
    "NodeContext",
    "NodeMessage",
    "Plan",
    "PromptFn",
    "TaskView",
    "Team",
    "TeamError",
    "TeamResult",
    "answer_key",
    "assign_views",
    "default_prompt",
    "graph_node_id",
    "majority",
    "message_text",
]
