"""The team runtime: a team answers a task by talking along its topology.

A :class:`Team` is a team config made runnable: one policy per role (the same ones training
uses), its agents, and a communication :class:`~topologies.Topology`.  ``team.run(task)``
unrolls the topology's rounds into the DAG of ``(agent, round)`` nodes and runs it in
topological *generations*: every node of a generation only depends on earlier generations, so
all nodes of one generation that share a policy go out as **one** ``policy.act`` batch (and
``run_batch`` merges the same generation of many tasks into that batch too).

Each node sees the task (plus its agent's private view, for a :class:`games.tasks.Task`) and
only the messages on its incoming edges, never the whole conversation: that is the point of a
topology (and what keeps prompts short).  The team's answer comes from a *decision node*: the
topology's final node (an aggregator or judge), or, with ``topology.decision: vote``, a
majority vote over every agent's last-round answer.

``team.to_langgraph()`` compiles the very same DAG into a LangGraph ``StateGraph`` over
``MessagesState``: one graph node per ``(agent, round)``, joins as barriers, so the team can be
embedded, streamed and checkpointed like any LangGraph app.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import networkx as nx

from agents.agent import Agent
from agents.builder import (
    ROLE_BUILDERS,
    BuildContext,
    adapter_dir,
    host_key,
    system_prompt_for,
)
from agents.hf import HFPolicy, ModelHost
from agents.policy import Policy, Request, Response
from configs import TeamConfig, load_config
from games.tasks import Task, final_integer
from topologies import LearnableTopology, Topology, TopologyError, build_topology
from topologies.graph import Node, node_name

if TYPE_CHECKING:
    from langgraph.graph.state import CompiledStateGraph

#: Backends the team runtime can run: language models answering free text.
TEXT_BACKENDS = ("hf", "vllm", "openai")
#: The learned topology file a checkpoint or exported team may hold.
TOPOLOGY_FILE = "topology.safetensors"
#: LangGraph node name of the majority vote (agent nodes always end in ``_r<round>``).
VOTE_NODE = "vote"


class TeamError(ValueError):
    """A team that cannot be built or run as asked; the message says what to change."""


# ----- what a node sees and says
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
    decides: bool = False   # this node's answer is the team's answer
    votes: bool = False     # this node's answer is one vote of the team's majority


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
        parts.append("Messages you received:\n" + "\n".join(
            f"- {h.agent} (round {h.round + 1}): {h.text.strip()}" for h in ctx.received))
    if ctx.decides:
        parts.append("Your answer is the team's final answer: combine what you received with "
                     "what you know, work it out, then end with the answer.")
    elif ctx.votes:
        parts.append("Your answer is your vote for the team's answer: end with the answer.")
    elif ctx.view:  # others may need what only this agent knows: a small model must be told
        parts.append("Tell your teammates your private information"
                     + (" and what you received" if ctx.received else "")
                     + ", in one short sentence.")
    elif ctx.received:
        parts.append("Give your answer briefly, using or correcting these messages.")
    else:
        parts.append("Give your answer briefly.")
    messages = [{"role": "system", "content": agent.system_prompt}] if agent.system_prompt else []
    messages.append({"role": "user", "content": "\n\n".join(parts)})
    return messages


@dataclass
class Turn:
    """What one node said; ``response`` keeps token ids and log-probs for a trainer."""

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
        return {"agent": self.agent, "role": self.role, "round": self.round, "text": self.text,
                "reads": self.reads, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens}


@dataclass
class TeamResult:
    """A team's answer to one task, how it got there, and what it cost.

    ``messages`` counts the edges used (messages read along the unrolled DAG), ``tokens`` the
    prompt plus completion tokens of every turn: the costs a learnable topology trades against
    ``score`` (``task.score(answer)`` for a :class:`~games.tasks.Task`, else ``None``).
    """

    answer: str
    transcript: list[Turn]
    messages: int
    tokens: int
    score: float | None = None
    decided_by: str = ""
    votes: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"answer": self.answer, "messages": self.messages, "tokens": self.tokens,
                "score": self.score, "decided_by": self.decided_by, "votes": self.votes,
                "transcript": [t.to_dict() for t in self.transcript]}


# ----- decision by vote
def answer_key(text: str) -> str:
    """What a vote compares: the integer the text commits to, else its normalised words."""
    number = final_integer(text)
    if number is not None:
        return f"int:{number}"
    return " ".join(text.lower().split()).strip(" .!")


def majority(answers: Mapping[str, str]) -> str:
    """The agent whose answer wins the vote (ties: the first in ``answers``' order).

    Empty answers only win when every answer is empty."""
    if not answers:
        raise TeamError("a vote needs at least one answer")
    keys = {a: answer_key(t) for a, t in answers.items()}
    counts = Counter(k for k in keys.values() if k) or Counter(keys.values())
    best = max(counts.values())
    return next(a for a, k in keys.items() if counts.get(k) == best)


# ----- the executable form of a topology
@dataclass(frozen=True)
class Plan:
    """A topology unrolled for execution: the DAG, its generations, and the decision.

    ``decision == "final"``: the pruned DAG (nodes that reach the final node), ended by it.
    ``decision == "vote"``: every agent's last-round node votes; the DAG is what reaches them.
    """

    topology: Topology
    decision: str
    dag: nx.DiGraph
    generations: tuple[tuple[Node, ...], ...]
    preds: Mapping[Node, tuple[Node, ...]]
    final: Node | None
    voters: tuple[Node, ...]

    @classmethod
    def of(cls, topology: Topology, decision: str = "final") -> Plan:
        index = {a: i for i, a in enumerate(topology.agents)}

        def key(n: Node) -> tuple[int, int]:
            return n[1], index[n[0]]

        if decision == "final":
            dag, final, voters = topology.unroll(), topology.final_node, ()
        elif decision == "vote":
            full = topology.unroll(prune=False)
            voters = tuple((a, topology.rounds - 1) for a in topology.agents)
            live = set(voters).union(*(nx.ancestors(full, v) for v in voters))
            dag, final = full.subgraph(live).copy(), None
        else:
            raise TeamError(f"unknown decision {decision!r}; use 'final' or 'vote'")
        generations = tuple(tuple(sorted(g, key=key)) for g in nx.topological_generations(dag))
        preds = {n: tuple(sorted(dag.predecessors(n), key=key)) for n in dag}
        return cls(topology, decision, dag, generations, preds, final, voters)

    @property
    def order(self) -> list[Node]:
        """Execution order: generation by generation."""
        return [n for g in self.generations for n in g]

    @property
    def agents(self) -> list[str]:
        """Agents that speak at least once, in the topology's agent order."""
        running = {a for a, _r in self.dag}
        return [a for a in self.topology.agents if a in running]

    @property
    def messages(self) -> int:
        return self.dag.number_of_edges()


# ----- tasks
@dataclass(frozen=True)
class TaskView:
    """A task as the runtime needs it: the shared question, per-agent private views."""

    question: str
    views: Mapping[str, str]
    task: Task | None = None


def assign_views(views: Mapping[str, str], agents: Sequence[str]) -> dict[str, str]:
    """Private views -> team agents: by name where they match, then in order.

    A task names its own agents (``agent_0``, ``sender``); a team has its own names
    (``solver``, ``critic``).  Matching names win, the other views go to the other agents in
    the team's order.  A view with no agent left would silently lose information: error.
    """
    out = {a: views[a] for a in agents if a in views}
    rest = [v for k, v in views.items() if k not in out]
    free = [a for a in agents if a not in out]
    if len(rest) > len(free):
        raise TeamError(f"the task has {len(views)} private views ({', '.join(views)}) but the "
                        f"team runs only {len(agents)} agents ({', '.join(agents)}); use a "
                        "task with fewer agents or a bigger team")
    out.update(zip(free, rest, strict=False))
    return out


def as_task_view(task: str | Task | TaskView) -> TaskView:
    if isinstance(task, TaskView):
        return task
    if isinstance(task, str):
        return TaskView(task, {})
    if isinstance(task, Task):
        return TaskView(task.question, dict(task.private_views), task)
    raise TypeError(f"a task is a str or a games.tasks.Task, got {type(task).__name__}")


@dataclass
class _Job:
    index: int
    view: TaskView
    plan: Plan
    views: dict[str, str]
    turns: dict[Node, Turn] = field(default_factory=dict)


# ----- the team
class Team:
    """A runnable team: agents (policies), a topology, a decision rule.

    Build it with :meth:`from_config`, :meth:`from_yaml` or :meth:`load` (an exported team,
    a run or a checkpoint folder).  ``learnable`` is the team's :class:`LearnableTopology`
    when its config says ``topology.learnable`` (trained, when loaded from a folder holding
    ``topology.safetensors``): a trainer samples a graph per episode from it and passes it to
    :meth:`run_batch` (``topologies=``).  Model calls are serialised by a lock, so one team
    may serve several threads (LangGraph supersteps, HTTP requests).
    """

    def __init__(self, cfg: TeamConfig, agents: Sequence[Agent], topology: Topology, *,
                 learnable: LearnableTopology | None = None,
                 hosts: Mapping[str, ModelHost] | None = None,
                 prompt: PromptFn = default_prompt) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.agents: dict[str, Agent] = {a.name: a for a in agents}
        if set(topology.agents) != set(self.agents):
            raise TopologyError(f"the topology's agents ({', '.join(topology.agents)}) are not "
                                f"the team's ({', '.join(self.agents)})")
        self.topology = topology
        self.learnable = learnable
        self.hosts = dict(hosts or {})
        self.prompt = prompt
        self.decision = cfg.topology.decision
        self._plans: OrderedDict[int, Plan] = OrderedDict()
        self._lock = threading.RLock()

    # ----- construction
    @classmethod
    def from_config(cls, cfg: TeamConfig, *, seed: int = 0,
                    adapters: Mapping[str, str | Path] | None = None,
                    policies: Mapping[str, Policy] | None = None,
                    hosts: dict[str, ModelHost] | None = None,
                    topology: Topology | None = None,
                    learnable: LearnableTopology | None = None,
                    prompt: PromptFn = default_prompt) -> Team:
        """Build the roles' policies and the topology.

        ``adapters`` maps roles to trained PEFT folders (else adapters start untrained);
        ``policies`` replaces roles' policies (any object with ``act``; no model is loaded for
        them); ``hosts`` shares base models with other teams; ``topology`` overrides the
        configured one; ``learnable`` is a trained learnable topology, whose deployed graph is
        then used.  Roles run in free decoding: a team answers in text, it has no action list.
        """
        policies = dict(policies or {})
        adapters = dict(adapters or {})
        unknown = sorted((set(policies) | set(adapters)) - {r.name for r in cfg.roles})
        if unknown:
            raise TeamError(f"unknown roles {', '.join(unknown)}; the team's roles: "
                            f"{', '.join(r.name for r in cfg.roles)}")
        hosts = {} if hosts is None else hosts
        agents: list[Agent] = []
        for k, role in enumerate(cfg.roles):
            policy = policies.get(role.name)
            shared = hosts.get(host_key(cfg, role))
            if policy is None and role.adapter is not None and shared is not None and (
                    role.name in getattr(shared, "adapters", ())):
                raise TeamError(f"role {role.name!r}: the shared model host already holds an "
                                "adapter of that name (another team's role); give this team "
                                "its own hosts")
            if policy is None:
                if role.backend not in TEXT_BACKENDS:
                    raise TeamError(f"role {role.name!r} uses backend {role.backend!r}: the "
                                    "team runtime runs language models "
                                    f"({', '.join(TEXT_BACKENDS)}); use one of them or pass "
                                    "policies={role: policy}")
                free = role.model_copy(update={"decoding": role.decoding.model_copy(
                    update={"mode": "free"})})
                policy = ROLE_BUILDERS[role.backend](free, BuildContext(cfg, hosts,
                                                                        seed + 1000 * k))
                if role.name in adapters:
                    load_role_adapter(policy, role.name, adapters[role.name])
            for i, name in enumerate(role.instance_names()):
                agents.append(Agent(name=name, role=role.name, policy=policy, mode="free",
                                    system_prompt=system_prompt_for(role, cfg.name,
                                                                    cfg.game.name, name, i)))
        if topology is None:
            if learnable is not None:
                topology = learnable.deploy()
            else:
                topology = build_topology(cfg)
                if cfg.topology.learnable:
                    learnable = LearnableTopology.from_team(cfg, final=cfg.topology.final)
        return cls(cfg, agents, topology, learnable=learnable, hosts=hosts, prompt=prompt)

    @classmethod
    def from_yaml(cls, path: str | Path, **kwargs: Any) -> Team:
        """:meth:`from_config` on a team file (raises :class:`configs.ConfigError`)."""
        return cls.from_config(load_config(path), **kwargs)

    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> Team:
        """A trained team from an exported folder, a checkpoint or a run (its latest
        checkpoint): ``team.yaml``, ``adapters/<role>/`` for every trainable role, and the
        learned topology if the config is learnable and ``topology.safetensors`` is there.
        Needs no network: the base model comes from the registry's cache (or memory)."""
        from orchestrator.participants import checkpoint_folder

        folder = checkpoint_folder(Path(path))
        team_file = folder / "team.yaml"
        if not team_file.is_file():
            raise FileNotFoundError(f"{folder} has no team.yaml (expected an exported team, a "
                                    "run or a checkpoint folder)")
        cfg = load_config(team_file)
        policies = kwargs.get("policies") or {}
        adapters = {r.name: adapter_dir(folder, r.name) for r in cfg.roles
                    if r.adapter is not None and r.name not in policies}
        learned = folder / TOPOLOGY_FILE
        if cfg.topology.learnable and learned.is_file() and "topology" not in kwargs:
            kwargs.setdefault("learnable", LearnableTopology.load(learned))
        return cls.from_config(cfg, adapters=adapters, **kwargs)

    # ----- planning
    def plan(self, topology: Topology | None = None) -> Plan:
        """The executable plan of ``topology`` (default: the team's) under the team's decision
        rule; cached for the last few topologies (a trainer samples one per episode)."""
        topology = self.topology if topology is None else topology
        with self._lock:
            plan = self._plans.get(id(topology))
            if plan is None or plan.topology is not topology:
                if set(topology.agents) != set(self.agents):
                    raise TopologyError(f"the topology's agents ({', '.join(topology.agents)}) "
                                        f"are not the team's ({', '.join(self.agents)})")
                plan = Plan.of(topology, self.decision)
                self._plans[id(topology)] = plan
                while len(self._plans) > 64:
                    self._plans.popitem(last=False)
            return plan

    def _context(self, plan: Plan, node: Node, view: TaskView, views: Mapping[str, str],
                 received: Sequence[Heard]) -> NodeContext:
        return NodeContext(question=view.question, view=views.get(node[0]), round=node[1],
                           rounds=plan.topology.rounds, received=tuple(received),
                           decides=node == plan.final, votes=node in plan.voters)

    # ----- running
    def run(self, task: str | Task, *, topology: Topology | None = None,
            on_turn: Callable[[Turn], None] | None = None) -> TeamResult:
        """Answer one task (a question, or a Task whose private views go to the agents)."""
        hook = None if on_turn is None else (lambda _i, turn: on_turn(turn))
        return self.run_batch([task], topologies=topology, on_turn=hook)[0]

    def run_batch(self, tasks: Sequence[str | Task],
                  *, topologies: Topology | Sequence[Topology] | None = None,
                  on_turn: Callable[[int, Turn], None] | None = None) -> list[TeamResult]:
        """Answer many tasks at once: generation ``k`` of every task's plan goes out as one
        ``act`` call per policy.  ``topologies``: one for all tasks, or one per task (e.g.
        sampled from :attr:`learnable`); ``on_turn(task_index, turn)`` sees each turn."""
        if isinstance(topologies, Topology) or topologies is None:
            topologies = [self.topology if topologies is None else topologies] * len(tasks)
        if len(topologies) != len(tasks):
            raise TeamError(f"{len(topologies)} topologies for {len(tasks)} tasks")
        if not tasks:
            return []
        with self._lock:
            jobs = []
            for i, (task, topo) in enumerate(zip(tasks, topologies, strict=True)):
                view, plan = as_task_view(task), self.plan(topo)
                # over every agent in role order, whatever the graph: an agent a sampled graph
                # cuts off keeps its view (lost to the team), the others keep theirs
                jobs.append(_Job(i, view, plan, assign_views(view.views, list(self.agents))))
            for k in range(max(len(j.plan.generations) for j in jobs)):
                groups: dict[int, tuple[Policy, list[tuple[_Job, Node]]]] = {}
                for job in jobs:
                    for node in job.plan.generations[k] if k < len(job.plan.generations) else ():
                        policy = self.agents[node[0]].policy
                        groups.setdefault(id(policy), (policy, []))[1].append((job, node))
                for policy, items in groups.values():
                    self._act(policy, items, on_turn)
        return [self._result(job) for job in jobs]

    def _act(self, policy: Policy, items: list[tuple[_Job, Node]],
             on_turn: Callable[[int, Turn], None] | None) -> None:
        requests = []
        for job, node in items:
            received = [Heard(p[0], p[1], job.turns[p].text) for p in job.plan.preds[node]]
            ctx = self._context(job.plan, node, job.view, job.views, received)
            requests.append(Request(self.prompt(self.agents[node[0]], ctx), [], [],
                                    agent=node_name(node)))
        responses = policy.act(requests)
        if len(responses) != len(requests):
            raise TeamError(f"a policy answered {len(responses)} of {len(requests)} requests")
        for (job, node), resp in zip(items, responses, strict=True):
            agent = self.agents[node[0]]
            turn = Turn(agent.name, agent.role, node[1], resp.text,
                        [node_name(p) for p in job.plan.preds[node]],
                        len(resp.prompt_ids), len(resp.completion_ids), resp)
            job.turns[node] = turn
            if on_turn is not None:
                on_turn(job.index, turn)

    def _result(self, job: _Job) -> TeamResult:
        plan = job.plan
        transcript = [job.turns[n] for n in plan.order]
        votes = None
        if plan.final is not None:
            decider = plan.final
        else:
            votes = {a: job.turns[(a, r)].text for a, r in plan.voters}
            decider = (majority(votes), plan.topology.rounds - 1)
        answer = job.turns[decider].text
        task = job.view.task
        return TeamResult(answer=answer, transcript=transcript, messages=plan.messages,
                          tokens=sum(t.prompt_tokens + t.completion_tokens for t in transcript),
                          score=None if task is None else float(task.score(answer)),
                          decided_by=VOTE_NODE if votes is not None else node_name(decider),
                          votes=votes)

    # ----- LangGraph
    def to_langgraph(self, checkpointer: Any = None, *, topology: Topology | None = None,
                     name: str | None = None) -> CompiledStateGraph:
        """The team as a compiled LangGraph ``StateGraph`` over ``MessagesState``.

        One node per ``(agent, round)`` (named by :func:`graph_node_id`), edges following the
        unrolled DAG; a node with several predecessors waits for all of them (a barrier edge),
        so it runs once, never early.  The task is the last human message; each node appends
        ``AIMessage(name=agent)`` and reads only its predecessors' messages of this run (found
        by ``response_metadata["marl_node"]``).  With a vote, a final ``vote`` node repeats
        the winning answer.  Embed it as a node of your graph, stream it, checkpoint it.
        """
        from langgraph.graph import END, START, MessagesState, StateGraph

        plan = self.plan(topology)
        builder = StateGraph(MessagesState)
        for node in plan.order:
            builder.add_node(graph_node_id(node), self._graph_node(plan, node))
        for node in plan.order:
            preds = [graph_node_id(p) for p in plan.preds[node]]
            _join(builder, preds or [START], graph_node_id(node))
        if plan.final is not None:
            builder.add_edge(graph_node_id(plan.final), END)
        else:
            builder.add_node(VOTE_NODE, self._vote_node(plan))
            _join(builder, [graph_node_id(v) for v in plan.voters], VOTE_NODE)
            builder.add_edge(VOTE_NODE, END)
        return builder.compile(checkpointer=checkpointer, name=name or _graph_name(self.name))

    def _heard(self, messages: Sequence[Any]) -> tuple[str, dict[str, Heard]]:
        """The task (last human message) and this team's messages after it, by node name."""
        from langchain_core.messages import AIMessage, HumanMessage

        start = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)),
                    default=None)
        if start is None:
            raise TeamError("the graph state holds no human message: put the task in "
                            "messages, e.g. {'messages': [('user', 'What is 2+3?')]}")
        question = message_text(messages[start])
        heard = {}
        for m in messages[start + 1:]:
            meta = m.response_metadata if isinstance(m, AIMessage) else {}
            if meta.get("marl_team") == self.name and "marl_node" in meta:
                agent, _, rnd = meta["marl_node"].rpartition("@")
                heard[meta["marl_node"]] = Heard(agent, int(rnd), message_text(m))
        return question, heard

    def _graph_node(self, plan: Plan, node: Node) -> Callable[[dict], dict]:
        agent, key = self.agents[node[0]], node_name(node)

        def run_node(state: dict) -> dict:
            from langchain_core.messages import AIMessage

            question, heard = self._heard(state["messages"])
            missing = [node_name(p) for p in plan.preds[node] if node_name(p) not in heard]
            if missing:
                raise TeamError(f"{key} ran before {', '.join(missing)} (no message of theirs "
                                "in the state)")
            ctx = self._context(plan, node, TaskView(question, {}), {},
                                [heard[node_name(p)] for p in plan.preds[node]])
            request = Request(self.prompt(agent, ctx), [], [], agent=key)
            with self._lock:
                (resp,) = agent.policy.act([request])
            n_in, n_out = len(resp.prompt_ids), len(resp.completion_ids)
            return {"messages": [AIMessage(
                content=resp.text, name=agent.name,
                response_metadata={"marl_team": self.name, "marl_node": key},
                usage_metadata={"input_tokens": n_in, "output_tokens": n_out,
                                "total_tokens": n_in + n_out})]}

        run_node.__name__ = graph_node_id(node)
        return run_node

    def _vote_node(self, plan: Plan) -> Callable[[dict], dict]:
        def vote(state: dict) -> dict:
            from langchain_core.messages import AIMessage

            _question, heard = self._heard(state["messages"])
            votes = {a: heard[node_name((a, r))].text for a, r in plan.voters}
            winner = majority(votes)
            return {"messages": [AIMessage(
                content=votes[winner], name=winner,
                response_metadata={"marl_team": self.name, "marl_node": VOTE_NODE,
                                   "votes": votes})]}

        return vote

    def __repr__(self) -> str:
        return (f"Team({self.name!r}, agents={list(self.agents)}, decision={self.decision!r}, "
                f"topology={self.topology!r})")


def graph_node_id(node: Node) -> str:
    """``('critic', 1)`` -> ``'critic_r1'``: LangGraph node names use ``[A-Za-z0-9_-]`` only
    (agent names already do), and the ``_r<round>`` suffix keeps the mapping one-to-one."""
    return f"{node[0]}_r{node[1]}"


def _graph_name(team: str) -> str:
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in team) or "team"


def _join(builder: Any, sources: list[str], target: str) -> None:
    """One edge from a single source, else one barrier edge from all of them."""
    builder.add_edge(sources[0] if len(sources) == 1 else sources, target)


def message_text(message: Any) -> str:
    """The text of a chat message whose content is a string or a list of parts."""
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)


# ----- adapters
def load_role_adapter(policy: Policy, role: str, folder: str | Path) -> None:
    """Put a trained PEFT folder's weights into the role's (freshly built) adapter.

    The role's adapter settings (from team.yaml) must match the folder's: a mismatch would
    otherwise load a different network silently.  Reads JSON and safetensors only.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    if not isinstance(policy, HFPolicy) or policy.adapter is None:
        raise TeamError(f"role {role!r}: trained adapters load into hf roles with an adapter "
                        "section")
    conf_file, weights_file = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not conf_file.is_file() or not weights_file.is_file():
        raise FileNotFoundError(f"{folder} is not a PEFT adapter folder (needs "
                                "adapter_config.json and adapter_model.safetensors)")
    saved = json.loads(conf_file.read_text())
    host = policy.host
    current = host.model.peft_config[policy.adapter]
    for key in ("r", "lora_alpha"):
        if saved.get(key) != getattr(current, key):
            raise TeamError(f"role {role!r}: {folder} has {key}={saved.get(key)} but the "
                            f"config says {getattr(current, key)}")
    weights = load_file(str(weights_file))
    expected = set(host.adapter_weights(policy.adapter))
    if set(weights) != expected:
        diff = sorted(set(weights) ^ expected)
        raise TeamError(f"role {role!r}: {folder} holds other tensors than the configured "
                        f"adapter (e.g. {diff[:2]}); check adapter.targets in team.yaml")
    host.set_adapter_weights(policy.adapter, weights)


__all__ = [
    "Heard", "NodeContext", "Plan", "PromptFn", "TaskView", "Team", "TeamError",
    "TeamResult", "Turn", "answer_key", "assign_views", "default_prompt", "graph_node_id",
    "load_role_adapter", "majority", "message_text",
]
