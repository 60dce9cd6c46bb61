"""The team runtime: message routing along the unrolled DAG, batching per generation and
policy, decisions (final node, majority vote), LangGraph (compile, invoke, stream,
checkpointer, embedded in a user's graph), export and loading in a fresh offline process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest
import torch
import yaml
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import MemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from typer.testing import CliRunner

from helpers import tiny
from marl.agents.policy import Request, Response
from marl.cli import app
from marl.config import TeamConfig, load_config, load_config_text
from marl.games.tasks import make_task
from marl.orchestrator.serving.export import ExportError, export_run
from marl.orchestrator.team import (
    Plan,
    Team,
    TeamError,
    assign_views,
    graph_node_id,
    majority,
)
from marl.topologies import LearnableTopology, Topology, build_topology
from marl.topologies.graph import node_name
from marl.train.checkpoint import save_checkpoint

REPO = Path(__file__).parents[3]
TEAM_FILES = ["debate_team", "solver_critic_judge", "star_planner", "learnable_team"]
MARKER = re.compile(r"MSG\[([\w@-]+)#(\d+)\]")


def example(name: str) -> TeamConfig:
    return load_config(REPO / "configs" / f"{name}.yaml")


class Echo:
    """A text policy that answers ``MSG[<node>#<n>] <answer>`` and records every batch.

    The marker names the speaking node and a global counter, so a test can read off any
    prompt exactly which messages reached it (and from which run).
    """

    def __init__(self, answers: dict[str, str] | None = None) -> None:
        self.calls: list[list[Request]] = []
        self.answers = answers or {}
        self.n = 0

    def act(self, requests: list[Request]) -> list[Response]:
        self.calls.append(list(requests))
        out = []
        for r in requests:
            self.n += 1
            out.append(
                Response(text=f"MSG[{r.agent}#{self.n}] {self.answers.get(r.agent, 'no idea')}")
            )
        return out


def echo_team(cfg: TeamConfig, shared: Echo | None = None, **answers: str) -> Team:
    policies = {
        r.name: shared or Echo(answers={k.replace("__", "@"): v for k, v in answers.items()})
        for r in cfg.roles
    }
    return Team.from_config(cfg, policies=policies)


def prompt_of(request: Request) -> str:
    return request.messages[-1]["content"]


def heard(request: Request) -> set[str]:
    return {m[0] for m in MARKER.findall(prompt_of(request))}


def expected_preds(topology: Topology, decision: str) -> dict[str, set[str]]:
    """Predecessors from the Topology API alone (not the runtime's Plan)."""
    if decision == "final":
        dag = topology.unroll()
    else:
        full = topology.unroll(prune=False)
        last = [(a, topology.rounds - 1) for a in topology.agents]
        keep = set(last).union(*(nx.ancestors(full, n) for n in last))
        dag = full.subgraph(keep)
    return {node_name(n): {node_name(p) for p in dag.predecessors(n)} for n in dag}


# ----- routing
@pytest.mark.parametrize("name", TEAM_FILES)
def test_each_agent_reads_only_its_predecessors(name: str) -> None:
    cfg = example(name)
    shared = Echo()
    team = echo_team(cfg, shared)
    result = team.run("What is 2 + 3?")
    requests = {r.agent: r for call in shared.calls for r in call}
    want = expected_preds(team.topology, cfg.topology.decision)
    assert set(requests) == set(want)
    for node, preds in want.items():
        assert heard(requests[node]) == preds, node
        assert "What is 2 + 3?" in prompt_of(requests[node])
    assert result.messages == sum(len(p) for p in want.values())
    assert [t.node for t in result.transcript] == [n for n in requests]
    assert {t.node: set(t.reads) for t in result.transcript} == want


def test_chain_judge_sees_the_critique_not_the_solution() -> None:
    team = echo_team(example("solver_critic_judge"))
    shared = Echo()
    team = echo_team(example("solver_critic_judge"), shared)
    result = team.run("What is 6 * 7?")
    judge = next(r for call in shared.calls for r in call if r.agent == "judge@0")
    assert heard(judge) == {"critic@0"}
    assert "solver@0" not in prompt_of(judge)
    assert result.decided_by == "judge@0" and result.answer.startswith("MSG[judge@0#")
    assert result.messages == 2
    system = judge.messages[0]
    assert system["role"] == "system" and "judge of team solver-critic-judge" in system["content"]


def test_private_views_reach_only_their_agent() -> None:
    cfg = example("solver_critic_judge")
    task = make_task("split_arithmetic", seed=3, n_agents=3)
    shared = Echo(answers={"judge@0": f"\\boxed{{{task.answer}}}"})
    team = echo_team(cfg, shared)
    result = team.run(task)
    requests = {r.agent: prompt_of(r) for call in shared.calls for r in call}
    views = list(task.private_views.values())
    for i, node in enumerate(["solver@0", "critic@0", "judge@0"]):
        assert task.question in requests[node]
        assert views[i] in requests[node]
        assert all(v not in requests[node] for j, v in enumerate(views) if j != i)
    assert result.score == 1.0
    wrong = echo_team(cfg, Echo(answers={"judge@0": f"\\boxed{{{task.answer + 1}}}"}))
    assert wrong.run(task).score == 0.0


def test_views_by_name_then_in_order() -> None:
    assert assign_views({"b": "B", "x": "X", "y": "Y"}, ["a", "b", "c"]) == {
        "b": "B",
        "a": "X",
        "c": "Y",
    }
    with pytest.raises(TeamError, match="4 private views .* only 3 agents"):
        assign_views({k: k for k in "wxyz"}, ["a", "b", "c"])


# ----- batching
def test_one_act_call_per_generation_and_policy() -> None:
    debate = example("debate_team")  # one role, 3 agents, 2 rounds, vote
    shared = Echo()
    team = echo_team(debate, shared)
    team.run("q")
    assert [len(c) for c in shared.calls] == [3, 3]
    shared.calls.clear()
    team.run_batch(["q1", "q2", "q3", "q4"])
    assert [len(c) for c in shared.calls] == [12, 12]

    star = example("star_planner")  # planner and worker: two policies
    policies = {"planner": Echo(), "worker": Echo()}
    team = Team.from_config(star, policies=policies)
    team.run_batch(["q1", "q2"])
    assert [len(c) for c in policies["worker"].calls] == [4, 4]  # rounds 1 and 2
    assert [len(c) for c in policies["planner"].calls] == [2, 2]
    assert [r.agent for r in policies["worker"].calls[0]] == ["worker_0@0", "worker_1@0"] * 2


def test_run_batch_mixes_topologies_generation_by_generation() -> None:
    cfg = example("learnable_team")
    shared = Echo()
    team = echo_team(cfg, shared)
    assert team.learnable is not None
    sparse = team.learnable.topology_of(
        torch.tensor(
            [
                e in {("solver_0", "judge", "spatial"), ("solver_1", "judge", "spatial")}
                for e in team.learnable.candidates
            ]
        )
    )
    results = team.run_batch(["a", "b"], topologies=[team.topology, sparse])
    dense_plan, sparse_plan = team.plan(), team.plan(sparse)
    assert len(shared.calls) == max(len(dense_plan.generations), len(sparse_plan.generations))
    assert [len(c) for c in shared.calls] == [
        sum(len(p.generations[k]) for p in (dense_plan, sparse_plan) if k < len(p.generations))
        for k in range(len(shared.calls))
    ]
    assert results[1].messages == 2 and {t.agent for t in results[1].transcript} == {
        "solver_0",
        "solver_1",
        "judge",
    }
    assert results[0].messages == 6


# ----- decisions
def test_majority_vote() -> None:
    assert majority({"a": "it is \\boxed{5}", "b": "7", "c": "surely 5."}) == "a"
    assert majority({"a": "7", "b": "5", "c": "5"}) == "b"
    assert majority({"a": "7", "b": "5"}) == "a"  # tie: first in order
    assert majority({"a": "", "b": "", "c": "Paris"}) == "c"  # empty answers are not votes
    assert majority({"a": "Paris.", "b": "paris", "c": "Rome"}) == "a"


def test_debate_decides_by_vote() -> None:
    cfg = example("debate_team")
    task = make_task("split_arithmetic", seed=5, n_agents=3)
    good, bad = f"\\boxed{{{task.answer}}}", f"\\boxed{{{task.answer + 2}}}"
    team = echo_team(cfg, debater_0__1=bad, debater_1__1=good, debater_2__1=good)
    result = team.run(task)
    assert result.decided_by == "vote" and result.score == 1.0
    assert set(result.votes) == {"debater_0", "debater_1", "debater_2"}
    assert result.answer == result.votes["debater_1"]


def test_topology_config_extensions() -> None:
    base = """schema: marl-teams/v1
name: t
roles:
  - {name: solver, count: 2}
  - {name: judge}
game: {name: split_arithmetic}
"""
    cfg = load_config_text(
        base + "topology: {kind: explicit, rounds: 2, edges: "
        "[[solver_1, judge]], temporal_edges: [[solver_0, solver_1], "
        "[judge, judge]], prune: true, final: judge}\n"
    )
    t = build_topology(cfg)
    assert set(t.edges) == {
        ("solver_1", "judge", "spatial"),
        ("solver_0", "solver_1", "temporal"),
        ("judge", "judge", "temporal"),
    }
    plan = Plan.of(t)
    assert node_name(plan.final) == "judge@1" and ("solver_0", 0) in plan.dag
    with pytest.raises(Exception, match="final: only allowed when decision is 'final'"):
        load_config_text(
            base + "topology: {kind: debate, rounds: 2, decision: vote, final: judge}\n"
        )


# ----- real model runs
@pytest.mark.parametrize("name", TEAM_FILES)
def test_every_team_file_runs_on_the_tiny_model(name: str) -> None:
    cfg = tiny(example(name))
    team = Team.from_config(cfg)
    task = make_task("split_arithmetic", seed=1, n_agents=cfg.game.kwargs["n_agents"])
    result = team.run(task)
    plan = team.plan()
    assert [t.node for t in result.transcript] == [node_name(n) for n in plan.order]
    assert result.score in (0.0, 1.0) and isinstance(result.answer, str)
    assert (
        result.tokens
        == sum(
            len(t.response.prompt_ids) + len(t.response.completion_ids) for t in result.transcript
        )
        > 0
    )
    assert all(0 < t.completion_tokens <= 6 for t in result.transcript)
    assert result.messages == plan.messages
    batch = team.run_batch([task, "What is 2 + 3?"])
    assert batch[0].answer == result.answer  # greedy: batching does not change answers
    assert batch[1].score is None
    json.dumps(result.to_dict())


def test_teams_share_a_base_model_but_not_adapter_names() -> None:
    hosts: dict = {}
    chain = Team.from_config(tiny(example("solver_critic_judge")), hosts=hosts)
    star = Team.from_config(tiny(example("star_planner")), hosts=hosts)
    assert star.agents["planner"].policy.host is chain.agents["solver"].policy.host
    with pytest.raises(TeamError, match="'solver': the shared model host already holds"):
        Team.from_config(tiny(example("learnable_team")), hosts=hosts)


# ----- LangGraph
def test_langgraph_nodes_edges_and_invoke() -> None:
    cfg = example("learnable_team")  # complete graph: judge joins three generations
    shared = Echo()
    team = echo_team(cfg, shared)
    graph = team.to_langgraph()
    plan = team.plan()
    drawn = graph.get_graph()
    names = set(drawn.nodes) - {"__start__", "__end__"}
    assert names == {graph_node_id(n) for n in plan.order}
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", n) for n in names)
    edges = {(e.source, e.target) for e in drawn.edges}
    for node in plan.order:
        for p in plan.preds[node]:
            assert (graph_node_id(p), graph_node_id(node)) in edges
    out = graph.invoke({"messages": [HumanMessage("What is 2 + 3?")]})
    said = out["messages"][1:]
    assert [m.name for m in said] == [a for a, _r in plan.order]
    assert all(isinstance(m, AIMessage) for m in said)
    requests = {r.agent: r for call in shared.calls for r in call}
    want = expected_preds(team.topology, "final")
    assert {k: heard(v) for k, v in requests.items()} == want
    assert said[-1].response_metadata["marl_node"] == "judge@0"


def test_langgraph_stream_runs_each_node_once_after_its_predecessors() -> None:
    cfg = example("star_planner")
    team = echo_team(cfg)
    graph = team.to_langgraph()
    steps = [
        next(iter(u))
        for u in graph.stream({"messages": [("user", "Plan 2 + 3.")]}, stream_mode="updates")
    ]
    order = [graph_node_id(n) for n in team.plan().order]
    assert sorted(steps) == sorted(order)  # every node exactly once
    rank = {s: i for i, s in enumerate(steps)}
    for node in team.plan().order:
        for p in team.plan().preds[node]:
            assert rank[graph_node_id(p)] < rank[graph_node_id(node)]


def test_langgraph_vote_node_and_checkpointer() -> None:
    cfg = example("debate_team")
    shared = Echo(answers={"debater_0@1": "5", "debater_1@1": "6", "debater_2@1": "5"})
    team = echo_team(cfg, shared)
    graph = team.to_langgraph(checkpointer=MemorySaver())
    config = {"configurable": {"thread_id": "t1"}}
    first = graph.invoke({"messages": [("user", "first question")]}, config)
    assert first["messages"][-1].response_metadata["marl_node"] == "vote"
    assert first["messages"][-1].content.endswith(" 5")
    n_first = len(first["messages"])
    start = shared.n
    second = graph.invoke({"messages": [("user", "second question")]}, config)
    assert len(second["messages"]) == 2 * n_first  # the thread kept the first exchange
    late = [r for call in shared.calls for r in call][6:]
    assert len(late) == 6
    for r in late:  # the second run only hears messages of the second run
        assert all(int(n) > start for _node, n in MARKER.findall(prompt_of(r)))
        assert "second question" in prompt_of(r) and "first question" not in prompt_of(r)
    state = graph.get_state(config)
    assert state.values["messages"][-1].response_metadata["marl_node"] == "vote"


# ----- export, load offline, embed
@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder as the trainer writes it, plus the learned topology it would save."""
    run = tmp_path_factory.mktemp("run")
    cfg = tiny(example("learnable_team"))
    team = Team.from_config(cfg)
    weights = {}
    for role in ("solver", "critic"):
        policy = team.agents[role if role == "critic" else "solver_0"].policy
        w = policy.host.adapter_weights(policy.adapter)
        g = torch.Generator().manual_seed(len(role))
        weights[role] = {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in w.items()}
    for step in (1, 2):
        ck = save_checkpoint(run, step, cfg, weights, {}, {}, {"league": {}})
    lt = LearnableTopology.from_team(cfg, final="judge")
    keep = {
        ("solver_0", "critic", "spatial"),
        ("solver_1", "critic", "spatial"),
        ("critic", "judge", "spatial"),
    }
    with torch.no_grad():
        lt.theta.copy_(torch.tensor([3.0 if e in keep else -3.0 for e in lt.candidates]))
    lt.steps = 7
    lt.save(ck / "topology.safetensors")
    rows = [
        {"step": 1, "agents": {"team@agent_0": {"reward": 0.25, "win_rate": 0.25}}},
        {
            "step": 2,
            "agents": {"team@agent_0": {"reward": 0.5, "win_rate": 0.5}},
            "eval": {"exploitability": 0.125},
        },
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


@pytest.fixture(scope="module")
def exported(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "team"
    result = CliRunner().invoke(app, ["export", str(trained_run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_export_writes_a_self_contained_team(exported: Path, trained_run: Path) -> None:
    cfg = load_config(exported / "team.yaml")
    t = cfg.topology
    assert (t.kind, t.learnable, t.prune, t.final) == ("explicit", False, True, "judge")
    assert sorted(map(tuple, t.edges)) == sorted(
        [("solver_0", "critic"), ("solver_1", "critic"), ("critic", "judge")]
    )
    for role in ("solver", "critic"):
        assert (exported / "adapters" / role / "adapter_model.safetensors").is_file()
    assert not (exported / "adapters" / "judge").exists()
    assert [r.model for r in cfg.roles] == ["tiny-random"] * 3
    manifest = json.loads((exported / "export.json").read_text())
    assert manifest["step"] == 2 and manifest["topology"] == "learned"
    assert manifest["messages_per_task"] == 3
    card = (exported / "README.md").read_text()
    assert "- steps: 2" in card and "0.125" in card and "| team@agent_0 | 0.500 | 0.500 |" in card
    assert "```mermaid" in card and "3 of 6 candidate edges kept" in card
    again = CliRunner().invoke(app, ["export", str(trained_run), "--out", str(exported)])
    assert again.exit_code == 2 and "not empty" in again.output


def test_export_of_a_checkpoint_keeps_the_configured_topology(tmp_path: Path) -> None:
    cfg = tiny(example("solver_critic_judge"))
    team = Team.from_config(cfg)
    weights = {r: team.agents[r].policy.host.adapter_weights(r) for r in ("solver", "critic")}
    ck = save_checkpoint(tmp_path / "run", 3, cfg, weights, {}, {}, {"league": {}})
    out = export_run(ck, tmp_path / "out")
    exported = load_config(out / "team.yaml")
    assert exported.topology == cfg.topology and exported.roles == cfg.roles
    assert not (out / "topology.safetensors").exists()
    assert "No metrics.jsonl" in (out / "README.md").read_text()
    assert json.loads((out / "export.json").read_text())["topology"] == "configured"
    loaded = Team.load(out)
    assert loaded.topology == team.topology
    assert loaded.run("What is 1 + 2?").answer == team.run("What is 1 + 2?").answer
    with pytest.raises(ExportError, match="no team.yaml"):
        export_run(tmp_path, tmp_path / "other")


def test_topology_show_draws_learned_probabilities(exported: Path, tmp_path: Path) -> None:
    png = tmp_path / "t.png"
    result = CliRunner().invoke(app, ["topology", "show", str(exported), "--png", str(png)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("flowchart LR") and "p=0.95" in result.stdout
    assert "stroke-width" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plain = CliRunner().invoke(
        app, ["topology", "show", str(REPO / "configs" / "solver_critic_judge.yaml")]
    )
    assert plain.exit_code == 0 and "p=" not in plain.stdout and "-->" in plain.stdout


def test_exported_team_loads_offline_in_a_fresh_process(exported: Path) -> None:
    question = "What is 4 + 4?"
    script = f"""
import json, os
os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
from marl.orchestrator.team import Team
team = Team.load({str(exported)!r})
res = team.run({question!r})
w = {{r: float(sum(v.abs().sum() for v in team.agents[a].policy.host.adapter_weights(r).values()))
     for r, a in (("solver", "solver_0"), ("critic", "critic"))}}
print(json.dumps({{"answer": res.answer, "nodes": [t.node for t in res.transcript], "w": w}}))
"""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    here = Team.load(exported)
    mine = here.run(question)
    assert got["answer"] == mine.answer
    assert (
        got["nodes"]
        == [t.node for t in mine.transcript]
        == ["solver_0@0", "solver_1@0", "critic@0", "judge@0"]
    )
    from safetensors.torch import load_file

    for role, total in got["w"].items():
        saved = load_file(str(exported / "adapters" / role / "adapter_model.safetensors"))
        assert total == pytest.approx(float(sum(v.abs().sum() for v in saved.values())))


def test_user_langgraph_app_embeds_the_exported_team(exported: Path) -> None:
    team = Team.load(exported)

    def intake(state: MessagesState) -> dict:
        question = state["messages"][-1].content
        return {"messages": [HumanMessage(f"Answer briefly: {question}")]}

    def report(state: MessagesState) -> dict:
        last = state["messages"][-1]
        return {"messages": [AIMessage(f"The team ({last.name}) says: {last.content}", name="app")]}

    app_graph = StateGraph(MessagesState)
    app_graph.add_node("intake", intake)
    app_graph.add_node("team", team.to_langgraph())
    app_graph.add_node("report", report)
    app_graph.add_edge(START, "intake")
    app_graph.add_edge("intake", "team")
    app_graph.add_edge("team", "report")
    app_graph.add_edge("report", END)
    compiled = app_graph.compile(checkpointer=MemorySaver())
    out = compiled.invoke(
        {"messages": [("user", "What is 1 + 1?")]}, {"configurable": {"thread_id": "u"}}
    )
    names = [m.name for m in out["messages"] if isinstance(m, AIMessage)]
    assert names == ["solver_0", "solver_1", "critic", "judge", "app"]
    direct = team.run("Answer briefly: What is 1 + 1?")
    assert out["messages"][-1].content == f"The team (judge) says: {direct.answer}"
    updates = [
        next(iter(u))
        for u in compiled.stream(
            {"messages": [("user", "And 2 + 2?")]},
            {"configurable": {"thread_id": "u"}},
            stream_mode="updates",
        )
    ]
    assert updates == ["intake", "team", "report"]


def test_load_rejects_a_mismatched_adapter(exported: Path, tmp_path: Path) -> None:
    broken = tmp_path / "team"
    shutil.copytree(exported, broken)
    data = yaml.safe_load((broken / "team.yaml").read_text())
    data["roles"][0]["adapter"]["r"] = 4
    (broken / "team.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(TeamError, match="r=8 but the config says 4"):
        Team.load(broken)
