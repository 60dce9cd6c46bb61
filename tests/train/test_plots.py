"""`marl plot`: league snapshots as one labelled band, lines missing fields, atomic PNGs."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from typer.testing import CliRunner

from marl.cli import app
from marl.train import plots


def _row(step: int, snapshots: int) -> dict:
    agents = {
        "player_0@player_0": {"reward": 0.1 * step, "win_rate": 0.5, "games": 4},
        "bot:random@player_1": {"reward": -0.2, "win_rate": 0.4, "games": 2},
    }
    for k in range(1, snapshots + 1):
        agents[f"snap:{k}@player_1"] = {
            "reward": 0.01 * k - step,
            "win_rate": 0.1 * (k % 10),
            "games": 2,
        }
    return {
        "step": step,
        "agents": agents,
        "parse_error_rate": 0.0,
        "learner": {"m": {"kl": 0.0, "entropy": 1.0, "agent_grad_norms": {"p": 1.0}}},
    }


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list:
    """The figures plot_run draws, kept open for inspection."""
    figures: list = []
    close = plt.close
    monkeypatch.setattr(plots.plt, "close", figures.append)
    yield figures
    for fig in figures:
        close(fig)


def test_ten_snapshot_opponents_draw_one_labelled_band(tmp_path: Path, captured: list) -> None:
    rows = [_row(s, snapshots=10) for s in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plots.plot_run(tmp_path)
    [fig] = captured
    for title in ("reward per agent", "win rate per agent"):
        ax = next(a for a in fig.axes if a.get_title() == title)
        handles, labels = ax.get_legend_handles_labels()
        assert len(handles) == 3, labels  # the learner, the bot, one band of ten snapshots
        assert len(ax.get_lines()) == 3
        band = next(lb for lb in labels if lb.startswith("league snapshots@player_1"))
        assert "mean of 10" in band and "min-max" in band
        assert ax.get_legend() is not None
        assert ax.collections  # the shaded band
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temps


def test_lines_missing_fields_are_skipped_not_fatal(tmp_path: Path) -> None:
    rows = [
        _row(1, snapshots=2),
        {"step": 2, "agents": {"player_0@player_0": {"reward": 1.0}}},
        {"step": 3, "learner": {"m": {"kl": 0.1}}},
        {"eval": {"exploitability": 0.2}},
        {"step": 4, "agents": {"x@y": None}, "parse_error_rate": "n/a"},
        _row(5, 2),
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["plot", str(tmp_path), "--out", str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "c.png").stat().st_size > 0


def test_a_policy_target_run_plots_its_reads_and_its_fits(tmp_path: Path, captured: list) -> None:
    """Policy-target rows: the table read from each step's decisions beside the evaluations,
    and the KL to the targets before and after each fit; a GRPO run draws no fit panel."""
    rows = [
        {
            "step": s,
            "states": {"exploitability": 0.3 - 0.02 * s, "reads": 4},
            "learner": {"m": {"kl": 0.0, "entropy": 0.4, "loss": 0.05, "fit_residual": 0.01}},
            **({"eval": {"exploitability": 0.31 - 0.02 * s}} if s % 2 else {}),
        }
        for s in range(1, 6)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plots.plot_run(tmp_path)
    [fig] = captured
    ev = next(a for a in fig.axes if a.get_title() == "evaluation")
    labels = ev.get_legend_handles_labels()[1]
    assert labels == ["exploitability", "exploitability, read from the step's decisions"]
    read = ev.get_lines()[1]
    assert list(read.get_xdata()) == [1, 2, 3, 4, 5]
    assert read.get_ydata()[-1] == pytest.approx(0.2)
    fit = next(a for a in fig.axes if a.get_title() == "policy targets: KL to the targets")
    assert fit.get_legend_handles_labels()[1] == ["m after", "m before the fit"]
    grpo = tmp_path / "grpo"
    grpo.mkdir()
    (grpo / "metrics.jsonl").write_text(json.dumps(_row(1, snapshots=0)) + "\n")
    plots.plot_run(grpo)
    titles = [a.get_title() for a in captured[1].axes]
    assert "KL / entropy" in titles and "policy targets: KL to the targets" not in titles
