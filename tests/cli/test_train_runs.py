"""A run's history is never overwritten by ``marl train``: a resume whose ``latest`` is
missing, dangling or damaged is refused in one line and changes nothing; a folder with a run
in it needs ``--resume``; one trainer at a time holds a run folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import tiny_team
from marl.cli import app
from marl.infra.layout import (
    CHECKPOINTS,
    LATEST,
    METRICS,
    STATE_FILE,
    LayoutError,
    checkpoint_dir,
    resume_point,
    run_lock,
)

TRAIN = "  steps: 1\n  group_size: 2\n  groups_per_step: 1\n  ray: {enabled: false}\n"


def snapshot(run: Path) -> dict[str, bytes]:
    """Every file under ``run`` (but the lock) with its bytes."""
    return {
        str(p.relative_to(run)): p.read_bytes()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.fixture()
def team(tmp_path: Path) -> Path:
    path = tmp_path / "team.yaml"
    path.write_text(tiny_team("kuhn_poker", TRAIN))
    return path


@pytest.fixture()
def history(tmp_path: Path) -> Path:
    """A run with a complete checkpoint 1, an incomplete 2, and its metrics."""
    run = tmp_path / "run"
    for step, complete in ((1, True), (2, False)):
        folder = checkpoint_dir(run, step)
        folder.mkdir(parents=True)
        (folder / "team.yaml").write_text("team")
        if complete:
            (folder / STATE_FILE).write_text("{}")
    (run / METRICS).write_text('{"step": 1}\n{"step": 2}\n')
    return run


def train(*args: str):
    return CliRunner().invoke(app, ["train", *args])


@pytest.mark.parametrize(
    "latest, says",
    [
        ("step_000002", "step_000002, which is missing or incomplete"),  # no state.json
        ("step_000007", "step_000007, which is missing or incomplete"),  # no folder
        (None, "latest is missing"),
        ("dir", "latest is not a pointer file"),
    ],
)
def test_resume_refuses_a_dangling_or_damaged_latest(team, history, latest, says) -> None:
    if latest == "dir":
        (history / LATEST).mkdir()
    elif latest is not None:
        (history / LATEST).write_text(latest)
    before = snapshot(history)
    done = train(str(team), "--out", str(history), "--resume")
    assert done.exit_code == 2, done.output
    assert says in done.output and "nothing was changed" in done.output
    assert "Traceback" not in done.output
    assert snapshot(history) == before


def test_resume_point_continues_a_complete_checkpoint_and_starts_a_new_folder(history) -> None:
    (history / LATEST).write_text("step_000001")
    assert resume_point(history) == history / CHECKPOINTS / "step_000001"
    assert resume_point(history.parent / "fresh") is None


def test_a_folder_holding_a_run_needs_resume(team, history) -> None:
    """No ``latest`` (a run killed before its pointer was written), checkpoints on disk."""
    before = snapshot(history)
    done = train(str(team), "--out", str(history))
    assert done.exit_code == 2 and "already holds a run" in done.output
    assert snapshot(history) == before


def test_one_trainer_per_run_folder(team, tmp_path: Path) -> None:
    run = tmp_path / "busy"
    with run_lock(run):
        done = train(str(team), "--out", str(run))
        assert done.exit_code == 2, done.output
        assert "being written by another process" in done.output
        with pytest.raises(LayoutError, match="another process"), run_lock(run):
            pass
    with run_lock(run):  # released with its holder
        pass


def test_a_damaged_metrics_line_stops_the_resume_and_changes_nothing(team, tmp_path) -> None:
    run = tmp_path / "run"
    done = train(str(team), "--out", str(run), "--steps", "2")
    assert done.exit_code == 0, done.output
    lines = (run / METRICS).read_text().splitlines()
    lines[1] = '{"step": 1, "reward'  # a damaged line in the middle, not a torn last one
    (run / METRICS).write_text("\n".join(lines) + "\n")
    before = snapshot(run)
    done = train(str(team), "--out", str(run), "--resume", "--steps", "3")
    assert done.exit_code == 2, done.output
    assert f"{run / METRICS}:2: not a metrics line" in done.output.replace("\n", "")
    assert "Traceback" not in done.output
    assert snapshot(run) == before
