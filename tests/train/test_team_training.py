"""Team-task training: role policies (GRPO) and edge logits (REINFORCE) in the same step, the
topology alone with frozen policies, checkpoints that restore the logits, export of the
learned graph.  Real components on the tiny random model; the task is a registered test task
whose score varies with the sampled text, so both updates get a signal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from helpers import REPO, register_parity_task
from marl.cli import app
from marl.config import ConfigError, TeamConfig, load_config, load_config_text
from marl.orchestrator.team import Team
from marl.train.topology import LearnedGraph
from marl.train.trainer import Trainer, TrainingError

register_parity_task("text_parity", first="agent_0", answerer="agent_0", view="You go first.")


def team_yaml(
    train: str,
    adapter: str = "adapter: {r: 4, alpha: 8}",
    learning: str = "{lr: 0.5, cost_weight: 0.1}",
) -> str:
    return f"""\
schema: marl-teams/v1
name: joint
roles:
  - name: solver
    count: 2
    model: tiny-random
    {adapter}
    decoding: {{mode: free, temperature: 1.0, max_new_tokens: 4}}
  - name: judge
    model: tiny-random
    decoding: {{mode: free, temperature: 1.0, max_new_tokens: 4}}
topology: {{kind: complete, learnable: true, final: judge, learning: {learning}}}
game: {{name: text_parity}}
train:
  group_size: 4
  groups_per_step: 2
  lr: 0.05
  checkpoint_every: 1
  ray: {{enabled: false}}
{train}"""


def adapter_weights(tr: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in tr.runtime.weights()["solver"].items()}


def logits(tr: Trainer) -> torch.Tensor:
    assert isinstance(tr.graph, LearnedGraph)
    return tr.graph.lt.theta.detach().clone()


def changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


def test_one_joint_step_updates_adapters_and_edge_logits(tmp_path: Path) -> None:
    tr = Trainer(load_config_text(team_yaml("  steps: 1\n")), tmp_path / "run")
    w0, theta0 = adapter_weights(tr), logits(tr)
    res = tr.train_step()
    assert changed(w0, adapter_weights(tr))
    assert not torch.equal(theta0, logits(tr))
    m = res.metrics
    assert m["learner"]["tiny-random"]["grad_norm"] > 0
    topo = m["topology"]
    assert set(topo["edge_probs"]) == {"solver_0->solver_1", "solver_0->judge", "solver_1->judge"}
    assert 0 <= topo["messages_per_task"] <= 3 and topo["tokens_per_task"] > 0
    assert topo["utility"] == pytest.approx(topo["score"] - 0.1 * topo["messages_per_task"])
    # every speaking turn of a trainable role is a GRPO sample
    turns = [t for ep in res.episodes for t in ep.turns]
    assert m["decisions"] == sum(t.role == "solver" for t in turns) > 0
    masks = {ep.edge_mask for ep in res.episodes}
    assert len(masks) > 1  # one sampled graph per episode


def test_frozen_policies_leave_adapters_unchanged(tmp_path: Path) -> None:
    tr = Trainer(load_config_text(team_yaml("  steps: 2\n  policies: frozen\n")), tmp_path / "run")
    w0, theta0 = adapter_weights(tr), logits(tr)
    hist = tr.fit()
    assert not changed(w0, adapter_weights(tr))
    assert not torch.equal(theta0, logits(tr))
    assert all(h["learner"] == {} and h["decisions"] == 0 for h in hist)


def test_resume_restores_logits_and_their_optimizer(tmp_path: Path) -> None:
    cfg = load_config_text(team_yaml("  steps: 3\n"))
    first = Trainer(
        cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 2})}),
        tmp_path / "run",
    )
    first.fit()
    ck = tmp_path / "run" / "checkpoints" / "step_000002"
    assert (ck / "topology.safetensors").is_file()
    assert (ck / "topology_optimizer.json").is_file()
    resumed = Trainer(cfg, tmp_path / "run", resume=True)
    assert resumed.step == 2
    assert torch.equal(logits(resumed), logits(first))
    a, b = first.graph.lt.optimizer.state_dict(), resumed.graph.lt.optimizer.state_dict()
    assert all(torch.equal(a["state"][0][k], b["state"][0][k]) for k in a["state"][0])
    assert resumed.graph.lt.steps == first.graph.lt.steps == 2
    # the same third step either way: the run continues as if never stopped
    first.tc = cfg.train
    r1, r2 = first.train_step(), resumed.train_step()
    assert torch.allclose(logits(first), logits(resumed))
    assert r1.metrics["topology"]["edge_probs"] == pytest.approx(
        r2.metrics["topology"]["edge_probs"]
    )


def test_topology_only_team_trains_checkpoints_and_exports(tmp_path: Path) -> None:
    """No adapter anywhere: only the edges learn; `marl train` then `marl export` gives a
    team whose YAML holds the deployed edges."""
    text = team_yaml("  steps: 2\n", adapter="", learning="{lr: 2.0, cost_weight: 0.5}")
    (tmp_path / "team.yaml").write_text(text)
    run, out = tmp_path / "run", tmp_path / "exported"
    r = CliRunner().invoke(app, ["train", str(tmp_path / "team.yaml"), "--out", str(run)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert all("edge_probs" in row["topology"] for row in rows)
    r = CliRunner().invoke(app, ["plot", str(run)])
    assert r.exit_code == 0 and (run / "curves.png").is_file()
    resumed = Trainer(load_config_text(text), run, resume=True)  # no adapters folder
    assert resumed.step == 2 and resumed.runtime.weights() == {}
    r = CliRunner().invoke(app, ["export", str(run), "--out", str(out)])
    assert r.exit_code == 0, r.output
    cfg = load_config(out / "team.yaml")
    assert cfg.topology.kind == "explicit" and not cfg.topology.learnable
    probs = resumed.graph.lt.edge_probabilities()
    assert {(s, d) for s, d in cfg.topology.edges or []} == {
        (s, d) for (s, d, _k), p in probs.items() if p > 0.5
    }
    Team.load(out).run("Say a few words.")


def test_a_fixed_graph_team_trains_its_policies(tmp_path: Path) -> None:
    text = (
        team_yaml("  steps: 1\n  rollout: team\n")
        .replace("learnable: true, ", "")
        .replace(", learning: {lr: 0.5, cost_weight: 0.1}", "")
    )
    tr = Trainer(load_config_text(text), tmp_path / "run")
    w0 = adapter_weights(tr)
    res = tr.train_step()
    assert changed(w0, adapter_weights(tr))
    assert res.metrics["topology"]["messages_per_task"] == 3  # the complete graph, every time
    assert "edge_probs" not in res.metrics["topology"]
    assert not (tr.checkpoint() / "topology.safetensors").exists()


def test_team_runs_check_their_config(tmp_path: Path) -> None:
    base = team_yaml("  steps: 1\n")
    with pytest.raises(TrainingError, match="needs a cooperative task"):
        Trainer(
            load_config_text(base.replace("{name: text_parity}", "{name: kuhn_poker}")),
            tmp_path / "run",
        )
    frozen = (
        base.replace("learnable: true, ", "").replace(", learning: {lr: 0.5, cost_weight: 0.1}", "")
        + "  rollout: team\n  policies: frozen\n"
    )
    with pytest.raises(TrainingError, match="nothing to train"):
        Trainer(load_config_text(frozen), tmp_path / "frozen")
    cases = [
        (base.replace("mode: free", "mode: choice", 1), "free text"),
        (base + "  league: {opponents: league}\n", "no opponents"),
    ]
    for text, message in cases:  # the file's own rules: validate reports them, none loads
        with pytest.raises(ConfigError, match=message):
            load_config_text(text)
    with pytest.raises(Exception, match="only allowed when learnable is true"):
        load_config_text(base.replace("learnable: true, ", ""))


def test_learning_section_reaches_the_learnable_topology() -> None:
    cfg: TeamConfig = load_config_text(
        team_yaml(
            "  steps: 1\n",
            learning=(
                "{lr: 0.25, tau: 2.0, cost: tokens, cost_weight: 0.01, baseline: mean, "
                "init_logit: 1.5}"
            ),
        )
    )
    lt = LearnedGraph(cfg, seed=0).lt
    c = lt.config
    assert (c.lr, c.tau, c.cost, c.cost_weight, c.baseline, c.init_logit, c.temporal) == (
        0.25,
        2.0,
        "tokens",
        0.01,
        "mean",
        1.5,
        False,
    )
    assert torch.allclose(lt.theta, torch.full_like(lt.theta, 1.5))


def test_the_learnable_example_team_trains_a_step(tmp_path: Path) -> None:
    """configs/learnable_team.yaml as shipped (on the tiny model, short answers)."""
    cfg = load_config(Path(__file__).parents[2] / "configs" / "learnable_team.yaml")
    cfg = cfg.model_copy(
        update={
            "roles": [
                r.model_copy(
                    update={
                        "model": "tiny-random",
                        "decoding": r.decoding.model_copy(update={"max_new_tokens": 4}),
                    }
                )
                for r in cfg.roles
            ],
            "train": cfg.train.model_copy(
                update={
                    "steps": 1,
                    "group_size": 2,
                    "groups_per_step": 1,
                    "ray": cfg.train.ray.model_copy(update={"enabled": False}),
                }
            ),
        }
    )
    res = Trainer(cfg, tmp_path / "run").train_step()
    assert len(res.metrics["topology"]["edge_probs"]) == 6
    assert {t.role for ep in res.episodes for t in ep.turns} <= {"solver", "critic", "judge"}


def test_topology_experiment_runs_on_the_tiny_model(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.experiments.topology",
            "--model",
            "tiny-random",
            "--updates",
            "1",
            "--tasks-per-update",
            "1",
            "--graphs-per-task",
            "2",
            "--eval-tasks",
            "2",
            "--max-new-tokens",
            "3",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((tmp_path / "results.json").read_text())
    assert set(report["results"]) == {"complete", "chain", "learned", "direct"}
    assert report["results"]["complete"]["messages_ratio"] == 1.0
    assert "goal (learned accuracy" in r.stdout
    assert (tmp_path / "run" / "latest").is_file()  # a run folder marl export reads
