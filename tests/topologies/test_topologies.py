"""Topologies: builders, validation, unrolling, the learnable topology and its recovery of the
known optimum of the synthetic voting task, persistence, rendering."""

from __future__ import annotations

import networkx as nx
import pytest
import torch

from marl.config.schema import RoleConfig, TeamConfig, TopologyConfig, TopologyLearningConfig
from marl.topologies import (
    SPATIAL,
    TEMPORAL,
    LearnableTopology,
    Topology,
    TopologyError,
    build_topology,
    topology_from_roles,
    topology_kinds,
)
from marl.topologies.render import draw_png, to_mermaid
from marl.topologies.synthetic import DEFAULT_TASK, VotingTask, fit

# solver has two instances: solver_0, solver_1
ROLES = [RoleConfig(name="solver", count=2), RoleConfig(name="critic"), RoleConfig(name="judge")]
S0, S1, C, J = "solver_0", "solver_1", "critic", "judge"
ALL = [S0, S1, C, J]


def build(**topology) -> Topology:
    return topology_from_roles(TopologyConfig(**topology), ROLES)


def edges(t: Topology) -> set[tuple[str, str, str]]:
    return set(t.edges)


def sp(*pairs: tuple[str, str]) -> set[tuple[str, str, str]]:
    return {(u, v, SPATIAL) for u, v in pairs}


def tm(*pairs: tuple[str, str]) -> set[tuple[str, str, str]]:
    return {(u, v, TEMPORAL) for u, v in pairs}


def every_pair(agents: list[str]) -> list[tuple[str, str]]:
    return [(u, v) for u in agents for v in agents]


# ----- builders
def test_registry_has_every_schema_kind():
    assert topology_kinds() == sorted(
        ["chain", "star", "complete", "debate", "layered", "explicit"]
    )


def test_chain():
    one = build(kind="chain")
    assert edges(one) == sp((S0, S1), (S1, C), (C, J))
    assert one.agents == ALL and one.final == J
    two = build(kind="chain", rounds=2)
    assert edges(two) == sp((S0, S1), (S1, C), (C, J)) | tm((J, S0))


def test_star():
    t = build(kind="star", hub="judge", rounds=2)
    assert edges(t) == sp((S0, J), (S1, J), (C, J)) | tm((J, S0), (J, S1), (J, C))
    assert t.final == J
    hub_in_middle = build(kind="star", hub="critic")
    assert edges(hub_in_middle) == sp((S0, C), (S1, C), (J, C))
    assert hub_in_middle.final == C  # the last to speak: the hub


def test_complete():
    t = build(kind="complete", rounds=2)
    assert edges(t) == sp((S0, S1), (S0, C), (S0, J), (S1, C), (S1, J), (C, J)) | tm(
        *every_pair(ALL)
    )
    assert edges(build(kind="complete")) == sp((S0, S1), (S0, C), (S0, J), (S1, C), (S1, J), (C, J))


def test_debate():
    t = build(kind="debate", rounds=3)
    assert edges(t) == tm(*every_pair(ALL))
    assert t.spatial_edges == [] and t.final == J


def test_layered():
    t = build(kind="layered", layers=[["solver"], ["critic"], ["judge"]], rounds=2)
    assert edges(t) == sp((S0, C), (S1, C), (C, J)) | tm((J, S0), (J, S1))
    wide = build(kind="layered", layers=[["solver", "critic"], ["judge"]])
    assert edges(wide) == sp((S0, J), (S1, J), (C, J))


def test_explicit():
    t = build(
        kind="explicit",
        edges=[("solver", "critic"), ("critic", "judge"), ("solver", "judge")],
        rounds=2,
    )
    assert edges(t) == sp((S0, C), (S1, C), (C, J), (S0, J), (S1, J)) | tm((J, S0), (J, S1))


def test_build_topology_from_team_config():
    cfg = TeamConfig.model_validate(
        {
            "schema": "marl-teams/v1",
            "name": "t",
            "game": {"name": "kuhn_poker"},
            "roles": [{"name": "solver", "count": 2}, {"name": "judge"}],
            "topology": {"kind": "star", "hub": "judge"},
        }
    )
    t = build_topology(cfg)
    assert edges(t) == sp((S0, J), (S1, J)) and t.final == J
    assert build_topology(cfg, final="judge").final == J


# ----- validation errors
def test_unknown_role():
    with pytest.raises(
        TopologyError,
        match=r"topology\.edges\[1\]\[1\]: unknown role 'jury'; "
        r"known roles: solver, critic, judge",
    ):
        build(kind="explicit", edges=[("solver", "critic"), ("critic", "jury")])
    with pytest.raises(TopologyError, match=r"topology\.hub: unknown role 'boss'"):
        build(kind="star", hub="boss")
    with pytest.raises(TopologyError, match=r"topology\.layers\[1\]\[0\]: unknown role 'x'"):
        build(kind="layered", layers=[["solver"], ["x"]])


def test_spatial_cycle_is_named():
    roles = [RoleConfig(name=n) for n in "abc"]
    cfg = TopologyConfig(kind="explicit", edges=[("a", "b"), ("b", "c"), ("c", "a")])
    with pytest.raises(
        TopologyError,
        match=r"spatial edges form a cycle: a -> b -> c -> a; "
        r"a round must be a DAG",
    ):
        topology_from_roles(cfg, roles)
    with pytest.raises(TopologyError, match=r"cycle: x -> x"):
        Topology(["x"], [("x", "x", SPATIAL)])
    # the same pairs are fine as temporal edges: no acyclicity across rounds
    Topology(["a", "b"], [("a", "b", SPATIAL), ("b", "a", TEMPORAL)], rounds=2)


def test_unreachable_final_node_is_named():
    with pytest.raises(
        TopologyError,
        match=r"solver_0@0, solver_1@0 never reach the decision "
        r"node judge@0: add edges",
    ):
        build(kind="explicit", edges=[("critic", "judge")])
    with pytest.raises(TopologyError, match=r"judge@0 never reach the decision node critic@0"):
        topology_from_roles(TopologyConfig(kind="chain"), ROLES, final="critic")
    # spatial-only edges over two rounds: round 0 never reaches round 1
    with pytest.raises(
        TopologyError,
        match=r"a@0, b@0 never reach the decision node b@1: .*"
        r"temporal edges",
    ):
        Topology(["a", "b"], [("a", "b", SPATIAL)], rounds=2)
    # strict=False prunes instead: the agent simply does not run
    t = Topology(["a", "b", "c"], [("a", "c", SPATIAL)], strict=False)
    assert t.pruned_agents == ["b"] and t.order() == [("a", 0), ("c", 0)]


def test_other_errors():
    with pytest.raises(TopologyError, match=r"a debate needs rounds >= 2"):
        build(kind="debate")
    with pytest.raises(
        TopologyError,
        match=r"role 'solver' has 2 agents .* a star needs a hub "
        r"role with count 1",
    ):
        build(kind="star", hub="solver")
    with pytest.raises(TopologyError, match=r"roles in no layer: judge"):
        build(kind="layered", layers=[["solver"], ["critic"]])
    with pytest.raises(TopologyError, match=r"unknown agent 'zed'; known agents: a, b"):
        Topology(["a", "b"], [("a", "zed", SPATIAL)])
    with pytest.raises(TopologyError, match=r"unknown kind 'lateral'"):
        Topology(["a", "b"], [("a", "b", "lateral")])
    with pytest.raises(TopologyError, match=r"final agent 'q' is not in the topology"):
        Topology(["a", "b"], [("a", "b", SPATIAL)], final="q")
    with pytest.raises(
        TopologyError,
        match=r"final: role 'solver' has 2 agents; name one of "
        r"solver_0, solver_1",
    ):
        topology_from_roles(TopologyConfig(kind="chain"), ROLES, final="solver")


# ----- unrolling
def test_unroll_chain_two_rounds():
    t = build(kind="chain", rounds=2)
    dag = t.unroll()
    assert nx.is_directed_acyclic_graph(dag)
    assert set(dag.nodes) == {(a, r) for a in ALL for r in (0, 1)}
    for (_u, ru), (_v, rv), kind in dag.edges(data="kind"):
        assert (rv - ru, kind) in {(0, SPATIAL), (1, TEMPORAL)}
    assert dag.number_of_edges() == 3 * 2 + 1 == t.num_messages()
    assert t.order() == [(a, r) for r in (0, 1) for a in ALL]
    assert t.final_node == (J, 1)
    assert t.predecessors(S0, 1) == [(J, 0)]
    assert t.predecessors(S0, 0) == []
    assert t.predecessors(C, 1) == [(S1, 1)]


def test_unroll_order_is_topological_and_complete_graph_reads_everyone():
    t = build(kind="complete", rounds=3)
    order = t.order()
    rank = {n: i for i, n in enumerate(order)}
    assert all(rank[u] < rank[v] for u, v in t.unroll().edges)
    assert t.predecessors(C, 2) == [(S0, 1), (S1, 1), (C, 1), (J, 1), (S0, 2), (S1, 2)]


def test_debate_prunes_answers_after_the_decision():
    t = build(kind="debate", rounds=3)
    full, live = t.unroll(prune=False), t.unroll()
    assert full.number_of_nodes() == 12
    # in the last round only the decision node runs: the others would speak after it
    assert set(live.nodes) == {(a, r) for a in ALL for r in (0, 1)} | {(J, 2)}
    assert t.predecessors(J, 2) == [(a, 1) for a in ALL]
    assert t.num_messages() == 16 + 4


def test_yaml_edges_roundtrip(tmp_path):
    t = build(kind="star", hub="judge", rounds=2)
    assert t.to_yaml_edges()[:3] == [[S0, J], [S1, J], [C, J]]
    assert [J, S0, TEMPORAL] in t.to_yaml_edges()
    assert Topology.from_edges(t.to_yaml_edges(), agents=t.agents, rounds=2) == t
    t.save_yaml(tmp_path / "star.yaml")
    assert Topology.load_yaml(tmp_path / "star.yaml") == t


# ----- the synthetic task and its closed-form optimum
def test_voting_task_optimum_is_known_and_clear():
    lt = LearnableTopology(DEFAULT_TASK.agents)
    best, utility, runner_up = DEFAULT_TASK.optimum(lt.candidates)
    assert best == [("a", "e", SPATIAL), ("b", "e", SPATIAL)]
    assert utility == pytest.approx(0.852)  # accuracy 0.912 - 2 messages * 0.03
    assert utility - runner_up == pytest.approx(0.03)
    alone = DEFAULT_TASK.expected_utility(torch.zeros(1, 10, dtype=torch.bool), lt.candidates)
    assert alone.item() == pytest.approx(0.8)  # the decider on its own
    # non-trivial: c's message and the relay a -> b -> e exist but cost more than they add
    masks = torch.zeros(3, 10, dtype=torch.bool)
    idx = {e[:2]: i for i, e in enumerate(lt.candidates)}
    masks[:, [idx["a", "e"], idx["b", "e"]]] = True
    masks[1, idx["c", "e"]] = True
    masks[2, idx["a", "b"]] = True
    u = DEFAULT_TASK.expected_utility(masks, lt.candidates)
    assert u[0] > u[1] and u[0] > u[2]


def test_voting_task_runs_a_topology_like_an_orchestrator():
    """Playing node by node along Topology.order()/predecessors() matches the vectorised
    rules on every outcome, for random graphs."""
    task = DEFAULT_TASK
    lt = LearnableTopology(task.agents)
    outcomes = torch.tensor([[(k >> i) & 1 for i in range(5)] for k in range(32)]).bool()
    masks = lt.sample_masks(12, torch.Generator().manual_seed(0))
    for mask in masks:
        topo = lt.topology_of(mask)
        vectorised = task.decide(mask.expand(32, -1), outcomes, lt.candidates)
        for row, expected in zip(outcomes, vectorised.tolist(), strict=True):
            assert task.run(topo, dict(zip(task.agents, row.tolist(), strict=True))) == expected


RECOVERY_UPDATES = 300
RECOVERY_BATCH = 64


def test_learning_recovers_the_optimal_edge_set():
    """REINFORCE (leave-one-out baseline, Adam lr 0.1, 64 sampled graphs of one 0/1 episode
    each per update) recovers the optimal edge set {a -> e, b -> e} of DEFAULT_TASK out of the
    2^10 candidate graphs, deployed at p > 0.5, in at least 9 of 10 seeds within 300 updates.
    Measured: 100 of 100 seeds (0..99), every one stable from update 230 on, median ~60."""
    best, _, _ = DEFAULT_TASK.optimum(LearnableTopology(DEFAULT_TASK.agents).candidates)
    recovered = 0
    for seed in range(10):
        lt = LearnableTopology(DEFAULT_TASK.agents, config=TopologyLearningConfig(lr=0.1))
        history = fit(
            DEFAULT_TASK, lt, RECOVERY_UPDATES, RECOVERY_BATCH, torch.Generator().manual_seed(seed)
        )
        recovered += sorted(lt.deploy().edges) == sorted(best)
        assert history[-1]["utility"] > history[0]["utility"]
    assert recovered >= 9


# ----- the learnable topology's mechanics
def test_reinforce_step_by_hand():
    """One candidate, theta = 0 (p = 1/2), samples a = 1 (R = 1) and a = 0 (R = 0), batch-mean
    baseline: A = +-1/2, loss = -(1/2)(1/2 log p - 1/2 log(1 - p)) = 0, d loss / d theta =
    -(1/2)(1/2 (1 - p) + 1/2 p) = -1/4 < 0, so Adam's first step raises theta by lr."""
    lt = LearnableTopology(["a", "b"], config=TopologyLearningConfig(lr=0.1, baseline="mean"))
    stats = lt.update_batch(torch.tensor([[True], [False]]), torch.tensor([1.0, 0.0]))
    assert stats["loss"] == pytest.approx(0.0, abs=1e-7)
    assert lt.theta.item() == pytest.approx(0.1, rel=1e-4)
    lt2 = LearnableTopology(["a", "b"], config=TopologyLearningConfig(lr=0.1, baseline="mean"))
    lt2.log_prob(torch.tensor([[True], [False]])).mul(
        torch.tensor([0.5, -0.5])
    ).mean().neg().backward()
    assert lt2.theta.grad.item() == pytest.approx(-0.25)


def test_baselines():
    from marl.topologies.learnable import _BASELINES

    r = torch.tensor([1.0, 2.0, 6.0])
    assert _BASELINES["mean"](r).tolist() == [3.0, 3.0, 3.0]
    assert _BASELINES["loo"](r).tolist() == [4.0, 3.5, 1.5]
    assert _BASELINES["none"](r).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="baseline\n  Input should be 'none', 'mean' or 'loo'"):
        TopologyLearningConfig(baseline="median")


def test_update_is_the_reinforce_step_on_the_sampled_graphs():
    """The vectorised update takes the same step as REINFORCE written per episode on the
    log-probabilities of the graphs the masks give; those log-probabilities are
    differentiable."""
    gen = torch.Generator().manual_seed(3)
    a, b = (
        LearnableTopology(list("wxyz"), config=TopologyLearningConfig(lr=0.05)) for _ in range(2)
    )
    masks = a.sample_masks(6, gen)
    utilities = torch.linspace(0.0, 1.0, 6)
    a.update_batch(masks, utilities)
    graphs = [b.topology_of(m) for m in masks]
    assert [sorted(g.edges) for g in graphs] == [
        sorted(e for e, on in zip(b.candidates, m.tolist(), strict=True) if on) for m in masks
    ]
    logp = torch.stack([b.log_prob(m) for m in masks])
    assert logp.requires_grad
    b.optimizer.zero_grad()
    (-(utilities - (utilities.sum() - utilities) / 5) * logp).mean().backward()  # loo
    b.optimizer.step()
    assert torch.allclose(a.theta, b.theta)


def test_sampled_graphs_are_acyclic_and_temporal_candidates():
    lt = LearnableTopology(
        list("abc"), rounds=2, config=TopologyLearningConfig(temporal=True, init_logit=3.0)
    )
    assert len(lt.candidates) == 3 + 9
    topo = lt.topology_of(lt.sample_masks(1, torch.Generator().manual_seed(0))[0])
    assert nx.is_directed_acyclic_graph(topo.unroll(prune=False))
    with pytest.raises(TopologyError, match="temporal candidates need rounds >= 2"):
        LearnableTopology(list("abc"), config=TopologyLearningConfig(temporal=True))


def test_pruning_threshold_fraction_and_schedule():
    lt = LearnableTopology(list("abcd"))  # 6 candidates
    with torch.no_grad():
        lt.theta.copy_(torch.tensor([3.0, -3.0, 0.5, -0.5, 1.0, -4.0]))
    dropped = lt.prune(threshold=0.1)
    assert dropped == [lt.candidates[1], lt.candidates[5]]
    dropped = lt.prune(fraction=0.5)  # 4 remain: drop the 2 least likely
    assert dropped == [lt.candidates[2], lt.candidates[3]]
    assert lt.active.tolist() == [True, False, False, False, True, False]
    assert set(lt.edge_probabilities()) == {lt.candidates[0], lt.candidates[4]}
    assert not lt.sample_masks(100)[:, ~lt.active].any()  # permanently off
    sched = LearnableTopology(
        list("abcd"), config=TopologyLearningConfig(prune_every=2, prune_fraction=0.5)
    )
    masks, utilities = sched.sample_masks(4), torch.rand(4)
    assert sched.update_batch(masks, utilities)["pruned"] == []
    stats = sched.update_batch(masks, utilities)
    assert len(stats["pruned"]) == 3 and stats["active"] == 3


def test_deploy_threshold_and_top_k():
    lt = LearnableTopology(list("abc"))  # a->b, a->c, b->c
    with torch.no_grad():
        lt.theta.copy_(torch.tensor([2.0, 0.1, -1.0]))
    assert lt.deploy().spatial_edges == [("a", "b"), ("a", "c")]
    assert lt.deploy(threshold=0.6).spatial_edges == [("a", "b")]
    assert lt.deploy(top_k=1).spatial_edges == [("a", "b")]
    assert sorted(lt.deploy(top_k=3).spatial_edges) == [("a", "b"), ("a", "c"), ("b", "c")]
    cut = lt.deploy(threshold=0.9)  # nothing reaches c: a and b are pruned, not rejected
    assert cut.edges == [] and cut.pruned_agents == ["a", "b"]
    with pytest.raises(TopologyError, match="never reach"):
        lt.deploy(threshold=0.9, strict=True)


def test_save_load_roundtrip(tmp_path):
    from safetensors import safe_open

    lt = LearnableTopology(
        list("abc"),
        rounds=2,
        config=TopologyLearningConfig(temporal=True, tau=0.5, cost_weight=0.1),
    )
    fit_like = torch.Generator().manual_seed(1)
    lt.update_batch(lt.sample_masks(8, fit_like), torch.rand(8, generator=fit_like))
    lt.prune(fraction=0.25)
    lt.save(tmp_path / "topo.safetensors")
    with safe_open(str(tmp_path / "topo.safetensors"), framework="pt") as f:
        assert '["a", "b", "spatial"]' in f.metadata()["candidates"]
    back = LearnableTopology.load(tmp_path / "topo.safetensors")
    assert back.candidates == lt.candidates and back.config == lt.config
    assert torch.equal(back.theta, lt.theta) and torch.equal(back.active, lt.active)
    assert back.steps == 1 and back.deploy() == lt.deploy()
    lt.deploy().save_yaml(tmp_path / "deployed.yaml")
    assert Topology.load_yaml(tmp_path / "deployed.yaml") == lt.deploy()
    other = LearnableTopology(list("abc"), rounds=2, config=lt.config)
    other.load_state_dict(
        {
            "theta": lt.theta.detach(),
            "active": lt.active,
            "optimizer": lt.optimizer.state_dict(),
            "steps": lt.steps,
        }
    )
    assert torch.equal(other.theta, lt.theta) and other.steps == 1


def test_a_file_saved_with_the_earlier_settings_layout_loads(tmp_path):
    """Files written before the settings were the schema's model (its fields in another
    order) load with the same settings, logits, mask and step count."""
    import json

    from safetensors.torch import save_file

    candidates = [["a", "b", "spatial"], ["a", "c", "spatial"], ["b", "c", "spatial"]]
    config = {
        "lr": 0.2,
        "tau": 0.5,
        "cost_weight": 0.1,
        "cost": "tokens",
        "baseline": "mean",
        "init_logit": 0.0,
        "temporal": False,
        "prune_every": 3,
        "prune_fraction": 0.25,
        "prune_threshold": 0.05,
    }
    meta = {
        "format": "marl-teams/learnable-topology/v1",
        "agents": json.dumps(list("abc")),
        "rounds": "1",
        "final": "c",
        "candidates": json.dumps(candidates),
        "config": json.dumps(config),
        "steps": "7",
    }
    logits, active = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([True, False, True])
    save_file({"logits": logits, "active": active}, str(tmp_path / "t.safetensors"), metadata=meta)
    back = LearnableTopology.load(tmp_path / "t.safetensors")
    assert back.config == TopologyLearningConfig(**config) and back.steps == 7
    assert torch.equal(back.theta.detach(), logits) and torch.equal(back.active, active)
    back.save(tmp_path / "again.safetensors")
    assert LearnableTopology.load(tmp_path / "again.safetensors").config == back.config


def test_learnable_from_team():
    cfg = TeamConfig.model_validate(
        {
            "schema": "marl-teams/v1",
            "name": "t",
            "game": {"name": "kuhn_poker"},
            "roles": [{"name": "solver", "count": 2}, {"name": "judge"}],
            "topology": {"kind": "debate", "rounds": 2, "learnable": True},
        }
    )
    lt = LearnableTopology.from_team(cfg)
    assert lt.agents == [S0, S1, J] and lt.final == J and lt.rounds == 2
    assert len(lt.candidates) == 3 + 9  # spatial i<j, then every temporal pair
    assert LearnableTopology.from_team(cfg, final="solver_0").agents == [S1, J, S0]


# ----- rendering
def test_mermaid_of_a_topology():
    t = build(kind="chain", rounds=2)
    assert to_mermaid(t) == (
        "flowchart LR\n"
        '    n0["solver_0"]\n    n1["solver_1"]\n    n2["critic"]\n    n3["judge"]\n'
        "    n0 --> n1\n    n1 --> n2\n    n2 --> n3\n"
        '    n3 -.->|"t-1"| n0\n'
        "    classDef decision stroke-width:3px\n    class n3 decision\n"
    )


def test_mermaid_and_png_of_a_learnable_topology(tmp_path):
    lt = LearnableTopology(list("abc"))
    with torch.no_grad():
        lt.theta.copy_(torch.tensor([2.0, 0.0, -2.0]))
    text = to_mermaid(lt)
    assert '    n0 -->|"p=0.88"| n1\n' in text and '    n1 -->|"p=0.12"| n2\n' in text
    assert "    linkStyle 0 stroke-width:4.0px\n" in text  # 0.5 + 4 * 0.88
    assert "    linkStyle 2 stroke-width:1.0px\n" in text
    for obj, name in ((lt, "learned.png"), (build(kind="star", hub="judge", rounds=2), "star.png")):
        path = draw_png(obj, tmp_path / name, title=name)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_voting_task_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"reliabilities must lie in \(0.5, 1\)"):
        VotingTask(("a", "b"), (0.4, 0.9), 0.1)
    with pytest.raises(TopologyError, match="must be spatial and follow the agent order"):
        DEFAULT_TASK.optimum([("e", "a", SPATIAL)])
