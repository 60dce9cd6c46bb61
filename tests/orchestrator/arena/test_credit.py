"""The plan/execute benchmark task and the credit report (``marl eval team``): a 2-step tiny
team run, then every ablation evaluated on the same held-out tasks."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from helpers import REPO, Saying, team_train
from marl.agents.builder import RosterError, build_roster
from marl.cli import app
from marl.config import load_config_text
from marl.games.plan_execute import SPLITS, generate, plan_value, split_of
from marl.games.tasks import make_task, task_names, task_takes
from marl.orchestrator.arena.credit import (
    Trained,
    ablations,
    build_variant,
    held_out_tasks,
    wilson,
    without_edge,
)
from marl.orchestrator.team.runtime import trained_parts
from marl.train.workers import EpisodeSpec, TeamPlayer

TEAM = """\
schema: marl-teams/v1
name: tiny-coop
roles:
  - name: planner
    model: tiny-random
    adapter: {r: 4, alpha: 8}
    decoding: {mode: free, temperature: 1.0, max_new_tokens: 4}
  - name: executor
    model: tiny-random
    adapter: {r: 4, alpha: 8}
    decoding: {mode: free, temperature: 1.0, max_new_tokens: 4}
topology: {kind: chain, final: executor}
game: {name: plan_execute, kwargs: {difficulty: 1}}
""" + team_train(checkpoint_every=1)


# ----- the task
def test_task_is_deterministic_and_scored_exactly() -> None:
    assert "plan_execute" in task_names() and task_takes("plan_execute", "split")
    for difficulty in (0, 1, 2):
        for seed in range(30):
            t = generate(seed, difficulty)
            assert t == generate(seed, difficulty)
            assert t.answer >= 0 and len(t.numbers) == len(t.template.ops) + 1
            assert set(t.private_views) == {"planner"} and t.answerer == "executor"
            assert t.problem in t.private_views["planner"]
            assert t.problem not in t.question  # the executor never reads the story
            assert all(str(x) in t.problem for x in t.numbers)
            assert t.score(f"so {t.plan} = \\boxed{{{t.answer}}}") == 1.0
            assert t.score(f"\\boxed{{{t.answer + 1}}}") == 0.0
            assert t.score("no number") == 0.0
    t = make_task("plan_execute", 3, 1)
    (op1, op2) = t.template.ops
    assert t.plan == f"{t.numbers[0]} {op1} {t.numbers[1]} {op2} {t.numbers[2]}"


def test_role_scores_grade_each_role_on_its_own_job() -> None:
    t = make_task("plan_execute", 3, 1)
    right, wrong = f"PLAN: {t.plan}", f"PLAN: {t.plan} + 1"
    assert plan_value(right) == t.answer and plan_value(wrong) == t.answer + 1
    assert plan_value("plan: 3x4 - 2, done") == 10 and plan_value("3 * 4") is None
    boxed = "\\boxed{{{}}}".format
    assert t.role_scores({"planner": right, "executor": boxed(t.answer)}) == {
        "planner": 1.0,
        "executor": 1.0,
    }
    # a wrong plan carried out faithfully: the executor did its job, the planner did not
    assert t.role_scores({"planner": wrong, "executor": boxed(t.answer + 1)}) == {
        "planner": 0.0,
        "executor": 1.0,
    }
    assert t.role_scores({"planner": right, "executor": boxed(-1)}) == {
        "planner": 1.0,
        "executor": 0.0,
    }
    # no plan to follow: the executor is graded on the answer itself
    assert t.role_scores({"planner": "no idea", "executor": boxed(t.answer)}) == {
        "planner": 0.0,
        "executor": 1.0,
    }


def test_a_team_episode_returns_each_role_its_own_score() -> None:
    cfg = load_config_text(TEAM)
    task = make_task("plan_execute", 5, **cfg.game.kwargs)
    scripted = {
        "planner": Saying(f"PLAN: {task.plan} + 1"),
        "executor": Saying(f"\\boxed{{{task.answer + 1}}}"),
    }
    player = TeamPlayer(cfg, build_roster(cfg, policies=scripted))
    (ep,) = player.play([EpisodeSpec(0, 5, 0, ())])
    assert ep.score == 0.0 and ep.team_return() == 0.0  # the team reward: the task's score
    assert ep.returns == {"planner": 0.0, "executor": 1.0}
    assert {t.agent: t.reward for t in ep.turns} == ep.returns  # turn-level credit too


def test_train_and_eval_instances_are_disjoint() -> None:
    for difficulty in (0, 1):
        seen = {
            s: {
                (t.template, t.numbers)
                for t in (generate(i, difficulty, split=s) for i in range(300))
            }
            for s in SPLITS
        }
        assert seen["train"] and seen["eval"] and not seen["train"] & seen["eval"]
        assert all(split_of(*key) == s for s, keys in seen.items() for key in keys)
    with pytest.raises(ValueError, match="split"):
        generate(0, split="test")
    tasks = held_out_tasks("plan_execute", {"difficulty": 1}, 5, seed=10)
    assert [t.seed for t in tasks] == list(range(10, 15))
    assert {t.split for t in tasks} == {"eval"} and {t.difficulty for t in tasks} == {1}


def test_wilson_interval() -> None:
    lo, hi = wilson(30, 60)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(0.245, abs=0.01)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0


# ----- the report on a trained tiny team
@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("coop")
    (folder / "team.yaml").write_text(TEAM)
    r = CliRunner().invoke(app, ["train", str(folder / "team.yaml"), "--out", str(folder / "run")])
    assert r.exit_code == 0, r.output
    return folder / "run"


def test_ablations_name_every_variant(run: Path) -> None:
    trained = Trained.load(run)
    names = [(v.name, v.kind) for v in ablations(trained)]
    assert names == [
        ("trained", "trained"),
        ("untrained", "untrained"),
        ("swap planner<->executor", "swap"),
        ("untrained planner", "revert"),
        ("untrained executor", "revert"),
        ("drop planner->executor", "drop"),
    ]
    variants = {v.name: v for v in ablations(trained)}
    assert variants["untrained"].adapters == {}
    assert set(variants["untrained planner"].adapters) == {"executor"}
    assert variants["drop planner->executor"].topology.edges == []
    assert without_edge(trained.topology, trained.topology.edges[0]).pruned_agents == ["planner"]


def test_swapping_two_roles_swaps_their_weights(run: Path) -> None:
    trained = Trained.load(run)
    variants = {v.name: v for v in ablations(trained)}
    host = "tiny-random"
    base = build_variant(trained.cfg, variants["trained"]).hosts[host]
    swapped = build_variant(trained.cfg, variants["swap planner<->executor"]).hosts[host]
    fresh = build_variant(trained.cfg, variants["untrained planner"]).hosts[host]

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    planner, executor = base.adapter_weights("planner"), base.adapter_weights("executor")
    assert not same(planner, executor)  # trained apart, else a swap would prove nothing
    assert same(swapped.adapter_weights("planner"), executor)
    assert same(swapped.adapter_weights("executor"), planner)
    assert same(fresh.adapter_weights("executor"), executor)
    assert all(
        not v.any() for k, v in fresh.adapter_weights("planner").items() if "lora_B" in k
    )  # LoRA starts at the identity: the untrained role


def test_adapter_init_warm_starts_a_role_from_a_saved_adapter(tmp_path: Path) -> None:
    source = build_roster(load_config_text(TEAM)).hosts["tiny-random"]
    torch.manual_seed(0)
    saved = {k: torch.randn_like(v) for k, v in source.adapter_weights("planner").items()}
    source.set_adapter_weights("planner", saved)
    source.save_adapter("planner", tmp_path / "planner")
    text = TEAM.replace(
        "adapter: {r: 4, alpha: 8}",
        f"adapter: {{r: 4, alpha: 8, init: '{tmp_path / 'planner'}'}}",
        1,
    )
    host = build_roster(load_config_text(text)).hosts["tiny-random"]
    warm = host.adapter_weights("planner")
    assert warm.keys() == saved.keys() and all(torch.equal(warm[k], saved[k]) for k in warm)
    assert all(
        not v.any() for k, v in host.adapter_weights("executor").items() if "lora_B" in k
    )  # no init: untrained
    for init, words in ((tmp_path / "planner", "r=4 but"), (tmp_path / "none", "not a PEFT")):
        bad = TEAM.replace(
            "adapter: {r: 4, alpha: 8}", f"adapter: {{r: 8, alpha: 8, init: '{init}'}}", 1
        )
        with pytest.raises(RosterError, match=f"role 'planner': adapter.init: .*{words}"):
            build_roster(load_config_text(bad))


def test_eval_team_writes_table_csv_json_and_plot(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "credit"
    r = CliRunner().invoke(
        app, ["eval", "team", str(run), "--tasks", "3", "--seed", "7", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    for name in (
        "trained",
        "untrained",
        "swap planner<->executor",
        "untrained planner",
        "untrained executor",
        "drop planner->executor",
        "95% CI",
    ):
        assert name in r.output
    report = json.loads((out / "credit.json").read_text())
    rows = report["rows"]
    assert [row["variant"] for row in rows][:2] == ["trained", "untrained"] and len(rows) == 6
    assert report["task_kwargs"] == {"difficulty": 1, "split": "eval"}
    for row in rows:
        assert row["n"] == 3 and 0 <= row["ci_low"] <= row["accuracy"] <= row["ci_high"] <= 1
        assert row["delta"] == pytest.approx(row["accuracy"] - rows[0]["accuracy"])
    by_name = {row["variant"]: row for row in rows}
    assert by_name["trained"]["messages_per_task"] == 1
    assert by_name["drop planner->executor"]["messages_per_task"] == 0
    assert by_name["drop planner->executor"]["edges"] == 0
    with (out / "credit.csv").open() as f:
        assert [row["variant"] for row in csv.DictReader(f)] == [row["variant"] for row in rows]
    assert (out / "credit.png").stat().st_size > 0
    # default folder: RUN/credit
    r = CliRunner().invoke(app, ["eval", "team", str(run / "latest"), "--tasks", "1"])
    assert r.exit_code == 0, r.output
    assert (run / "credit" / "credit.json").is_file()


def test_eval_team_refuses_a_folder_without_a_team(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["eval", "team", str(tmp_path)])
    assert r.exit_code == 2 and "team.yaml" in r.output


def test_marl_run_on_a_run_writes_transcripts_in_it(run: Path) -> None:
    r = CliRunner().invoke(app, ["run", str(run), "--game", "plan_execute", "--episodes", "2"])
    assert r.exit_code == 0, r.output
    (folder,) = (run / "transcripts").iterdir()
    assert folder.name.startswith("run-") and (folder / "transcripts.jsonl").is_file()
    assert "accuracy " in r.output


# ----- the experiments' team modes
def experiment(name: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m scripts.experiments.NAME ARGS`` from the repository root."""
    r = subprocess.run(
        [sys.executable, "-m", f"scripts.experiments.{name}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def test_drmas_experiment_trains_a_team_recipe_with_reward_scales(tmp_path: Path) -> None:
    (tmp_path / "team.yaml").write_text(TEAM)
    r = experiment(
        "drmas",
        "--team",
        str(tmp_path / "team.yaml"),
        "--steps",
        "1",
        "--seeds",
        "0",
        "--eval-tasks",
        "2",
        "--scale",
        "planner=0.1",
        "--reward",
        "individual",
        "--out",
        str(tmp_path / "runs"),
    )
    assert "accuracy" in r.stdout and "agent_wise / global" in r.stdout
    for estimator in ("global", "agent_wise"):
        cfg = trained_parts(tmp_path / "runs" / f"{estimator}-s0")[0]
        assert cfg.train.advantage == estimator and cfg.train.reward == "individual"
        assert cfg.train.reward_scales == {"planner": 0.1}


def test_topology_experiment_trains_a_recipe_team_with_a_helper(run: Path, tmp_path: Path) -> None:
    (tmp_path / "team.yaml").write_text(TEAM)
    experiment(
        "topology",
        "--team",
        str(tmp_path / "team.yaml"),
        "--init",
        str(run),
        "--train-policies",
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
        str(tmp_path / "out"),
    )
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report["results"]["direct"]["edges"] == ["planner->executor"]
    assert report["results"]["chain"]["edges"] == ["planner->helper", "helper->executor"]
    cfg = trained_parts(tmp_path / "out" / "run")[0]
    assert [r.name for r in cfg.roles] == ["planner", "helper", "executor"]
    assert cfg.train.policies == "train" and cfg.role("planner").adapter.init is not None
