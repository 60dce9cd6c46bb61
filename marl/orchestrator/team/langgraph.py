"""A team's plan compiled into a LangGraph ``StateGraph`` over ``MessagesState``.

One graph node per ``(agent, round)`` (named by :func:`graph_node_id`), edges following the
unrolled DAG; a node with several predecessors waits for all of them (a barrier edge), so it
runs once, never early.  The task is the last human message; each node appends
``AIMessage(name=agent)`` and reads only its predecessors' messages of this run (found by
``response_metadata["marl_node"]``).  With a vote, a final ``vote`` node repeats the winning
answer.  LangGraph is imported only when a graph is built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from marl.orchestrator.team.errors import TeamError
from marl.orchestrator.team.plan import VOTE_NODE, Plan, majority
from marl.orchestrator.team.prompts import Heard
from marl.topologies import Topology
from marl.topologies.graph import Node, node_name

if TYPE_CHECKING:
    from langgraph.graph.state import CompiledStateGraph

    from marl.orchestrator.team.runtime import Team


def compile_team(
    team: Team,
    checkpointer: Any = None,
    *,
    topology: Topology | None = None,
    name: str | None = None,
) -> CompiledStateGraph:
    """The team's plan of ``topology`` (default: the team's) as a compiled graph."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    if team.defer:  # a hand-over ends the task mid-plan, which a static graph cannot
        raise TeamError(
            f"roles {', '.join(team.defer)} may defer to an expert, which "
            "Team.run and run_batch do; the LangGraph form has no hand-over"
        )

    plan = team.plan(topology)
    builder = StateGraph(MessagesState)
    for node in plan.order:
        builder.add_node(graph_node_id(node), _agent_node(team, plan, node))
    for node in plan.order:
        preds = [graph_node_id(p) for p in plan.preds[node]]
        _join(builder, preds or [START], graph_node_id(node))
    if plan.final is not None:
        builder.add_edge(graph_node_id(plan.final), END)
    else:
        builder.add_node(VOTE_NODE, _vote_node(team, plan))
        _join(builder, [graph_node_id(v) for v in plan.voters], VOTE_NODE)
        builder.add_edge(VOTE_NODE, END)
    return builder.compile(checkpointer=checkpointer, name=name or _graph_name(team.name))


def graph_node_id(node: Node) -> str:
    """``('critic', 1)`` -> ``'critic_r1'``: LangGraph node names use ``[A-Za-z0-9_-]`` only
    (agent names already do), and the ``_r<round>`` suffix keeps the mapping one-to-one."""
    return f"{node[0]}_r{node[1]}"


def message_text(message: Any) -> str:
    """The text of a chat message whose content is a string or a list of parts."""
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)


def _heard(team: str, messages: Sequence[Any]) -> tuple[str, dict[str, Heard]]:
    """The task (last human message) and team ``team``'s messages after it, by node name."""
    from langchain_core.messages import AIMessage, HumanMessage

    start = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=None)
    if start is None:
        raise TeamError(
            "the graph state holds no human message: put the task in "
            "messages, e.g. {'messages': [('user', 'What is 2+3?')]}"
        )
    question = message_text(messages[start])
    heard = {}
    for m in messages[start + 1 :]:
        meta = m.response_metadata if isinstance(m, AIMessage) else {}
        if meta.get("marl_team") == team and "marl_node" in meta:
            agent, _, rnd = meta["marl_node"].rpartition("@")
            heard[meta["marl_node"]] = Heard(agent, int(rnd), message_text(m))
    return question, heard


def _agent_node(team: Team, plan: Plan, node: Node) -> Callable[[dict], dict]:
    agent, key = team.agents[node[0]], node_name(node)

    def run_node(state: dict) -> dict:
        from langchain_core.messages import AIMessage

        question, heard = _heard(team.name, state["messages"])
        missing = [node_name(p) for p in plan.preds[node] if node_name(p) not in heard]
        if missing:
            raise TeamError(
                f"{key} ran before {', '.join(missing)} (no message of theirs in the state)"
            )
        request = team.request(
            plan, node, question, None, [heard[node_name(p)] for p in plan.preds[node]]
        )
        (resp,) = team.act(agent.policy, [request])
        n_in, n_out = len(resp.prompt_ids), len(resp.completion_ids)
        return {
            "messages": [
                AIMessage(
                    content=resp.text,
                    name=agent.name,
                    response_metadata={"marl_team": team.name, "marl_node": key},
                    usage_metadata={
                        "input_tokens": n_in,
                        "output_tokens": n_out,
                        "total_tokens": n_in + n_out,
                    },
                )
            ]
        }

    run_node.__name__ = graph_node_id(node)
    return run_node


def _vote_node(team: Team, plan: Plan) -> Callable[[dict], dict]:
    def vote(state: dict) -> dict:
        from langchain_core.messages import AIMessage

        _question, heard = _heard(team.name, state["messages"])
        votes = {a: heard[node_name((a, r))].text for a, r in plan.voters}
        winner = majority(votes)
        return {
            "messages": [
                AIMessage(
                    content=votes[winner],
                    name=winner,
                    response_metadata={
                        "marl_team": team.name,
                        "marl_node": VOTE_NODE,
                        "votes": votes,
                    },
                )
            ]
        }

    return vote


def _graph_name(team: str) -> str:
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in team) or "team"


def _join(builder: Any, sources: list[str], target: str) -> None:
    """One edge from a single source, else one barrier edge from all of them."""
    builder.add_edge(sources[0] if len(sources) == 1 else sources, target)
