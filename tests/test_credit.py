"""The plan/execute benchmark task and the credit report (``marl eval team``): a 2-step tiny
team run, then every ablation evaluated on the same held-out tasks."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from helpers import team_train
from typer.testing import CliRunner

from cli import app
from games.plan_execute import SPLITS, generate, split_of
from games.tasks import make_task, task_names, task_takes
from orchestrator.credit import (
    Trained,
    ablations,
    build_variant,
    held_out_tasks,
    wilson,
    without_edge,
)

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


def test_train_and_eval_instances_are_disjoint() -> None:
    for difficulty in (0, 1):
        seen = {s: {(t.template, t.numbers) for t in (generate(i, difficulty, split=s)
                                                      for i in range(300))}
                for s in SPLITS}
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
    r = CliRunner().invoke(app, ["train", str(folder / "team.yaml"), "--out",
                                 str(folder / "run")])
    assert r.exit_code == 0, r.output
    return folder / "run"


def test_ablations_name_every_variant(run: Path) -> None:
    trained = Trained.load(run)
    names = [(v.name, v.kind) for v in ablations(trained)]
    assert names == [("trained", "trained"), ("untrained", "untrained"),
                     ("swap planner<->executor", "swap"), ("untrained planner", "revert"),
                     ("untrained executor", "revert"), ("drop planner->executor", "drop")]
    variants = {v.name: v for v in ablations(trained)}
    assert variants["untrained"].adapters == {}
    assert set(variants["untrained planner"].adapters) == {"executor"}
    assert variants["drop planner->executor"].topology.edges == []
    assert without_edge(trained.topology, trained.topology.edges[0]).pruned_agents == [
        "planner"]


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
    assert all(not v.any() for k, v in fresh.adapter_weights("planner").items()
               if "lora_B" in k)  # LoRA starts at the identity: the untrained role


def test_eval_team_writes_table_csv_json_and_plot(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "credit"
    r = CliRunner().invoke(app, ["eval", "team", str(run), "--tasks", "3", "--seed", "7",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    for name in ("trained", "untrained", "swap planner<->executor", "untrained planner",
                 "untrained executor", "drop planner->executor", "95% CI"):
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
