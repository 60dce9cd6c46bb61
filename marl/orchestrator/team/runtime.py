"""The team runtime: a team answers a task by talking along its topology.

A :class:`Team` is a team config made runnable: one policy per role (the same ones training
uses, built by :func:`marl.agents.builder.build_roster`), its agents, and a communication
:class:`~marl.topologies.Topology`.  ``team.run(task)`` runs the topology's :class:`Plan`
generation by generation: all nodes of one generation that share a policy go out as **one**
``policy.act`` batch (and ``run_batch`` merges the same generation of many tasks into that
batch too).  The team's answer comes from the plan's decision: the topology's final node (an
aggregator or judge), or, with ``topology.decision: vote``, a majority vote over every agent's
last-round answer.

A role with ``defer`` may hand the task to its expert instead: when its answer contains the
defer token, the expert answers from that role's request, the task stops there, and the
expert's answer is the team's (its reward: the score less ``cost`` per deferral).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marl.agents.agent import Agent
from marl.agents.builder import RosterError, adapter_dir, build_roster
from marl.agents.experts import Expert, make_expert
from marl.agents.host import ModelHost
from marl.agents.policy import Policy, Request, Response
from marl.config import TeamConfig, load_config
from marl.config.schema import DeferConfig
from marl.games.tasks import Task
from marl.infra.layout import TEAM_FILE, TOPOLOGY_FILE, checkpoint_folder
from marl.orchestrator.team.errors import TeamError
from marl.orchestrator.team.langgraph import compile_team
from marl.orchestrator.team.plan import Plan
from marl.orchestrator.team.prompts import Heard, NodeContext, PromptFn, default_prompt
from marl.orchestrator.team.results import (
    EXPERT_NODE,
    NodeMessage,
    TaskRun,
    TeamResult,
    node_message,
    task_result,
)
from marl.orchestrator.team.views import as_task_view, assign_views
from marl.topologies import LearnableTopology, Topology, TopologyError, build_topology
from marl.topologies.graph import Node, node_name

if TYPE_CHECKING:
    from langgraph.graph.state import CompiledStateGraph


def trained_parts(path: str | Path) -> tuple[TeamConfig, dict[str, Path], LearnableTopology | None]:
    """What a trained team is made of, from an exported folder, a checkpoint or a run (its
    latest checkpoint): its config, each trainable role's adapter folder, and its learned
    topology when the config is learnable and ``topology.safetensors`` is there."""
    folder = checkpoint_folder(Path(path))
    team_file = folder / TEAM_FILE
    if not team_file.is_file():
        raise FileNotFoundError(
            f"{folder} has no team.yaml (expected an exported team, a run or a checkpoint folder)"
        )
    cfg = load_config(team_file)
    adapters = {r.name: adapter_dir(folder, r.name) for r in cfg.roles if r.adapter is not None}
    learned = folder / TOPOLOGY_FILE
    topology = (
        LearnableTopology.load(learned) if cfg.topology.learnable and learned.is_file() else None
    )
    return cfg, adapters, topology


class Team:
    """A runnable team: agents (policies), a topology, a decision rule.

    Build it with :meth:`from_config`, :meth:`from_yaml` or :meth:`load` (an exported team,
    a run or a checkpoint folder).  ``learnable`` is the team's :class:`LearnableTopology`
    when its config says ``topology.learnable`` (trained, when loaded from a folder holding
    ``topology.safetensors``): a trainer samples a graph per episode from it and passes it to
    :meth:`run_batch` (``topologies=``).  Model calls are serialised by a lock, so one team
    may serve several threads (LangGraph supersteps, HTTP requests).
    """

    def __init__(
        self,
        cfg: TeamConfig,
        agents: Sequence[Agent],
        topology: Topology,
        *,
        learnable: LearnableTopology | None = None,
        hosts: Mapping[str, ModelHost] | None = None,
        prompt: PromptFn = default_prompt,
        experts: Mapping[str, Expert] | None = None,
    ) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.agents: dict[str, Agent] = {a.name: a for a in agents}
        if set(topology.agents) != set(self.agents):
            raise TopologyError(
                f"the topology's agents ({', '.join(topology.agents)}) are not "
                f"the team's ({', '.join(self.agents)})"
            )
        self.topology = topology
        self.learnable = learnable
        self.hosts = dict(hosts or {})
        self.prompt = prompt
        self.decision = cfg.topology.decision
        experts = dict(experts or {})
        #: role -> (its defer settings, its expert), for the roles that may defer
        self.defer: dict[str, tuple[DeferConfig, Expert]] = {
            r.name: (r.defer, experts.pop(r.name, None) or make_expert(r.defer))
            for r in cfg.roles
            if r.defer is not None
        }
        if experts:
            raise TeamError(
                f"experts for {', '.join(experts)}, which defer to none; the roles "
                f"with a defer section: {', '.join(self.defer) or 'none'}"
            )
        self._plans: OrderedDict[int, Plan] = OrderedDict()
        self._lock = threading.RLock()

    # ----- construction
    @classmethod
    def from_config(
        cls,
        cfg: TeamConfig,
        *,
        seed: int = 0,
        adapters: Mapping[str, str | Path] | None = None,
        policies: Mapping[str, Policy] | None = None,
        hosts: dict[str, ModelHost] | None = None,
        topology: Topology | None = None,
        learnable: LearnableTopology | None = None,
        prompt: PromptFn = default_prompt,
        experts: Mapping[str, Expert] | None = None,
    ) -> Team:
        """Build the roles' policies and the topology.

        ``adapters`` maps roles to trained PEFT folders (else adapters start untrained);
        ``policies`` replaces roles' policies (any object with ``act``; no model is loaded for
        them); ``hosts`` shares base models with other teams; ``topology`` overrides the
        configured one; ``learnable`` is a trained learnable topology, whose deployed graph is
        then used; ``experts`` replaces deferring roles' experts (else built from ``defer``).
        Roles run in free decoding: a team answers in text, it has no action list.
        """
        try:
            roster = build_roster(
                cfg, seed, hosts, policies=policies, adapters=adapters, free_text=True
            )
        except RosterError as exc:
            raise TeamError(str(exc)) from exc
        if topology is None:
            if learnable is not None:
                topology = learnable.deploy()
            else:
                topology = build_topology(cfg)
                if cfg.topology.learnable:
                    learnable = LearnableTopology.from_team(cfg, final=cfg.topology.final)
        return cls(
            cfg,
            roster.agents,
            topology,
            learnable=learnable,
            hosts=roster.hosts,
            prompt=prompt,
            experts=experts,
        )

    @classmethod
    def from_yaml(cls, path: str | Path, **kwargs: Any) -> Team:
        """:meth:`from_config` on a team file (raises :class:`marl.config.ConfigError`)."""
        return cls.from_config(load_config(path), **kwargs)

    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> Team:
        """A trained team from an exported folder, a checkpoint or a run (its latest
        checkpoint): ``team.yaml``, ``adapters/<role>/`` for every trainable role, and the
        learned topology if the config is learnable and ``topology.safetensors`` is there.
        Needs no network: the base model comes from the registry's cache (or memory)."""
        cfg, adapters, learned = trained_parts(path)
        for role in kwargs.get("policies") or {}:
            adapters.pop(role, None)
        if learned is not None and "topology" not in kwargs:
            kwargs.setdefault("learnable", learned)
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
                    raise TopologyError(
                        f"the topology's agents ({', '.join(topology.agents)}) "
                        f"are not the team's ({', '.join(self.agents)})"
                    )
                plan = Plan.of(topology, self.decision)
                self._plans[id(topology)] = plan
                while len(self._plans) > 64:
                    self._plans.popitem(last=False)
            return plan

    # ----- one node
    def request(
        self, plan: Plan, node: Node, question: str, view: str | None, received: Sequence[Heard]
    ) -> Request:
        """The policy request of ``node``: its agent's prompt over what the node may read."""
        ctx = NodeContext(
            question=question,
            view=view,
            round=node[1],
            rounds=plan.topology.rounds,
            received=tuple(received),
            decides=node == plan.final,
            votes=node in plan.voters,
        )
        return Request(self.prompt(self.agents[node[0]], ctx), [], [], agent=node_name(node))

    def act(self, policy: Policy, requests: list[Request]) -> list[Response]:
        """One model call, serialised with every other call of this team."""
        with self._lock:
            responses = policy.act(requests)
        if len(responses) != len(requests):
            raise TeamError(f"a policy answered {len(responses)} of {len(requests)} requests")
        return responses

    # ----- running
    def run(
        self,
        task: str | Task,
        *,
        topology: Topology | None = None,
        on_turn: Callable[[NodeMessage], None] | None = None,
    ) -> TeamResult:
        """Answer one task (a question, or a Task whose private views go to the agents)."""
        hook = None if on_turn is None else (lambda _i, message: on_turn(message))
        return self.run_batch([task], topologies=topology, on_turn=hook)[0]

    def run_batch(
        self,
        tasks: Sequence[str | Task],
        *,
        topologies: Topology | Sequence[Topology] | None = None,
        on_turn: Callable[[int, NodeMessage], None] | None = None,
    ) -> list[TeamResult]:
        """Answer many tasks at once: generation ``k`` of every task's plan goes out as one
        ``act`` call per policy.  ``topologies``: one for all tasks, or one per task (e.g.
        sampled from :attr:`learnable`); ``on_turn(task_index, message)`` sees each node's
        message as it is said."""
        if isinstance(topologies, Topology) or topologies is None:
            topologies = [self.topology if topologies is None else topologies] * len(tasks)
        if len(topologies) != len(tasks):
            raise TeamError(f"{len(topologies)} topologies for {len(tasks)} tasks")
        if not tasks:
            return []
        with self._lock:
            runs = []
            for i, (task, topo) in enumerate(zip(tasks, topologies, strict=True)):
                view, plan = as_task_view(task), self.plan(topo)
                # over every agent in role order, whatever the graph: an agent a sampled graph
                # cuts off keeps its view (lost to the team), the others keep theirs
                runs.append(TaskRun(i, view, plan, assign_views(view.views, list(self.agents))))
            for k in range(max(len(r.plan.generations) for r in runs)):
                groups: dict[int, tuple[Policy, list[tuple[TaskRun, Node]]]] = {}
                for run in runs:
                    if run.expert is not None or k >= len(run.plan.generations):
                        continue
                    for node in run.plan.generations[k]:
                        policy = self.agents[node[0]].policy
                        groups.setdefault(id(policy), (policy, []))[1].append((run, node))
                for policy, items in groups.values():
                    self._speak(policy, items, on_turn)
        return [task_result(run) for run in runs]

    def _speak(
        self,
        policy: Policy,
        items: list[tuple[TaskRun, Node]],
        on_turn: Callable[[int, NodeMessage], None] | None,
    ) -> None:
        """One batch: the nodes ``items`` (of one generation, one policy) say their message."""
        requests = []
        for run, node in items:
            received = [Heard(p[0], p[1], run.said[p].text) for p in run.plan.preds[node]]
            requests.append(
                self.request(run.plan, node, run.view.question, run.views.get(node[0]), received)
            )
        handed: dict[int, tuple[TaskRun, Node, Request]] = {}
        for (run, node), request, resp in zip(
            items, requests, self.act(policy, requests), strict=True
        ):
            agent = self.agents[node[0]]
            message = node_message(agent.name, agent.role, node, resp, run.plan.preds[node])
            run.said[node] = message
            if on_turn is not None:
                on_turn(run.index, message)
            defer = self.defer.get(agent.role)
            if defer is not None and defer[0].token in resp.text:
                run.deferrals += 1
                run.deferral_cost += defer[0].cost
                handed.setdefault(run.index, (run, node, request))
        self._hand_over(list(handed.values()), on_turn)

    def _hand_over(
        self,
        handed: list[tuple[TaskRun, Node, Request]],
        on_turn: Callable[[int, NodeMessage], None] | None,
    ) -> None:
        """The experts answer the deferred tasks (one batch per expert), each from the request
        of the first node that deferred it."""
        groups: dict[int, tuple[Expert, list[tuple[TaskRun, Node, Request]]]] = {}
        for item in handed:
            expert = self.defer[self.agents[item[1][0]].role][1]
            groups.setdefault(id(expert), (expert, []))[1].append(item)
        for expert, items in groups.values():
            with self._lock:
                responses = expert.answer(
                    [r for _, _, r in items], [run.view.task for run, _, _ in items]
                )
            for (run, node, _request), resp in zip(items, responses, strict=True):
                run.expert = node_message(
                    EXPERT_NODE, EXPERT_NODE, node, resp, run.plan.preds[node]
                )
                if on_turn is not None:
                    on_turn(run.index, run.expert)

    # ----- LangGraph
    def to_langgraph(
        self, checkpointer: Any = None, *, topology: Topology | None = None, name: str | None = None
    ) -> CompiledStateGraph:
        """The team as a compiled LangGraph ``StateGraph`` over ``MessagesState`` (see
        :mod:`marl.orchestrator.team.langgraph`): embed it as a node of your graph, stream it,
        checkpoint it."""
        return compile_team(self, checkpointer, topology=topology, name=name)

    def __repr__(self) -> str:
        return (
            f"Team({self.name!r}, agents={list(self.agents)}, decision={self.decision!r}, "
            f"topology={self.topology!r})"
        )
