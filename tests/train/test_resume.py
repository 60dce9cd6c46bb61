"""Checkpoints survive SIGKILL: a killed and resumed run equals an uninterrupted one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import metrics_rows, tiny_team

KUHN = """\
  steps: 4
  group_size: 4
  groups_per_step: 2
  lr: 0.02
  checkpoint_every: 1
  eval_every: 0  # off: a run cut short evaluates its last step, a whole one does not
  ray: {enabled: false}
  league: {opponents: league, snapshot_every: 1, anchors: [random]}
"""


def _train(cfg: Path, run: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "marl", "train", str(cfg), "--out", str(run), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "120"},
    )


@pytest.mark.slow
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    cfg = tmp_path / "team.yaml"
    cfg.write_text(tiny_team("kuhn_poker", KUHN, count=2))
    full = _train(cfg, tmp_path / "full")
    killed = _train(cfg, tmp_path / "killed")
    ckpts = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 240
    while not (ckpts / "step_000002").is_dir() and time.time() < deadline:
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert (ckpts / "step_000002").is_dir()
    assert not (ckpts / "step_000004").exists()
    resumed = _train(cfg, tmp_path / "killed", "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()[-2000:]
    assert full.wait(timeout=300) == 0, full.stderr.read().decode()[-2000:]
    assert [r["step"] for r in metrics_rows(tmp_path / "killed")] == [1, 2, 3, 4]
    assert metrics_rows(tmp_path / "killed") == metrics_rows(tmp_path / "full")
