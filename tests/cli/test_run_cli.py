"""``marl run``: a team on a free prompt and on cooperative tasks, transcripts written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from marl.cli import app

TEAM = """\
schema: marl-teams/v1
name: tiny-coop
roles:
  - name: planner
    model: tiny-random
    adapter: {r: 4, alpha: 8}
    decoding: {mode: free, temperature: 0.0, max_new_tokens: 4}
  - name: executor
    model: tiny-random
    decoding: {mode: free, temperature: 0.0, max_new_tokens: 4}
topology: {kind: chain, final: executor}
game: {name: plan_execute, kwargs: {difficulty: 1}}
"""


@pytest.fixture
def team(tmp_path: Path) -> Path:
    path = tmp_path / "team.yaml"
    path.write_text(TEAM)
    return path


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "transcripts.jsonl").read_text().splitlines()]


def test_run_on_a_task_prints_transcripts_scores_and_accuracy(team: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = CliRunner().invoke(
        app,
        [
            "run",
            str(team),
            "--game",
            "plan_execute",
            "--episodes",
            "3",
            "--seed",
            "5",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert r.output.count("[planner@0]") == 3 and r.output.count("[executor@0]") == 3
    assert "reads planner@0" in r.output and r.output.count("score: ") == 3
    assert "accuracy " in r.output and "95% CI [" in r.output
    got = rows(out)
    assert [g["seed"] for g in got] == [5, 6, 7]
    assert all(g["score"] in (0.0, 1.0) and g["decided_by"] == "executor@0" for g in got)
    assert all("The story: " in g["private_views"]["planner"] for g in got)
    assert [t["agent"] for t in got[0]["transcript"]] == ["planner", "executor"]


def test_run_on_a_prompt_has_no_score(
    team: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["run", str(team), "--task", "What is 2 + 3?"])
    assert r.exit_code == 0, r.output
    assert "[planner@0]" in r.output and "answer (executor@0)" in r.output
    assert "score:" not in r.output and "accuracy" not in r.output
    (folder,) = (tmp_path / "runs").iterdir()  # the default: runs/run-<time>
    assert folder.name.startswith("run-")
    (row,) = rows(folder)
    assert row["task"] == "What is 2 + 3?" and row["score"] is None


def test_run_needs_exactly_one_of_task_and_game(team: Path) -> None:
    for args in ([], ["--task", "hi", "--game", "plan_execute"]):
        r = CliRunner().invoke(app, ["run", str(team), *args])
        assert r.exit_code == 2 and "exactly one" in r.output
    r = CliRunner().invoke(app, ["run", str(team), "--game", "kuhn_poker"])
    assert r.exit_code == 2 and "unknown cooperative task" in r.output
