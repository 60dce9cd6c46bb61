"""Training output: the ETA honours the time budget, and a resume says where it resumed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from typer.testing import CliRunner

from helpers import tiny_team
from marl.cli import app
from marl.train.progress import EtaColumn


def _eta(column: EtaColumn, seconds_by_rate: float | None) -> str:
    """What the column shows for a task rich estimates to end in ``seconds_by_rate``."""
    return column.render(SimpleNamespace(time_remaining=seconds_by_rate)).plain


def test_the_eta_is_the_budget_when_the_budget_ends_first() -> None:
    # 100 minutes left by the steps' rate, but the budget ends in 5
    eta = _eta(EtaColumn(max_minutes=5), 6000.0)
    assert eta.endswith("(budget)") and eta.startswith("0:04:5"), eta
    assert _eta(EtaColumn(max_minutes=5), None).startswith("0:04:5")  # no rate yet
    # without a budget, or with a later one, the rate decides
    for column in (EtaColumn(), EtaColumn(max_minutes=10_000)):
        assert _eta(column, 6000.0) == "1:40:00"
    assert _eta(EtaColumn(), None) == "-:--:--"


def test_resume_says_from_which_step_and_checkpoint(tmp_path: Path) -> None:
    cfg = tmp_path / "team.yaml"
    cfg.write_text(
        tiny_team(
            "kuhn_poker",
            "  steps: 1\n  groups_per_step: 1\n  group_size: 2\n"
            "  checkpoint_every: 1\n  ray: {enabled: false}\n",
        )
    )
    run = tmp_path / "run"
    first = CliRunner().invoke(app, ["train", str(cfg), "--out", str(run)])
    assert first.exit_code == 0, first.output
    assert "resumed" not in first.output
    again = CliRunner().invoke(
        app,
        ["train", str(cfg), "--out", str(run), "--resume", "--steps", "2", "--max-minutes", "30"],
    )
    assert again.exit_code == 0, again.output
    said = "".join(again.output.split())  # rich wraps long paths
    assert f"resumedfromstep1({run / 'checkpoints' / 'step_000001'})" in said
    assert "done: 2 steps" in again.output
