"""``scripts/gpu_check.py`` on a CPU: one line and exit 0 without CUDA; the quick mode runs
the learner-group comparison (two gloo ranks) and two Kuhn steps on the tiny model; a part
that fails is a row with its one-line reason, and the next part still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO

pytestmark = pytest.mark.slow


def gpu_check(*args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "scripts.gpu_check", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_cuda_it_says_so_in_one_line_and_exits_0() -> None:
    out = gpu_check()
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("\n") == 1 and out.stdout.startswith("no CUDA device is present")
    assert "--device cpu --quick" in out.stdout


def test_the_quick_cpu_mode_compares_two_ranks_and_times_kuhn_steps() -> None:
    out = gpu_check("--device", "cpu", "--quick", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["part"]: r for r in json.loads(out.stdout)}
    assert list(rows) == ["vllm", "ranks", "zero2", "zero3", "kuhn"]
    assert {n for n, r in rows.items() if r["status"] == "skipped"} == {"vllm", "zero2", "zero3"}
    assert rows["ranks"]["status"] == "ok" and "2 gloo rank(s)" in rows["ranks"]["figure"]
    assert rows["kuhn"]["status"] == "ok" and rows["kuhn"]["figure"].startswith("2 steps:")
    assert "update" in rows["kuhn"]["figure"]


def test_a_failing_part_is_a_row_with_its_reason_and_the_next_part_runs() -> None:
    out = gpu_check("--device", "cpu", "--quick", "--only", "kuhn,ranks", "--model", "no-such")
    assert out.returncode == 1
    table = out.stdout.strip().splitlines()
    assert table[0].startswith("gpu_check on CPU")
    rows = [ln.split(" | ") for ln in table if ln.startswith("| kuhn") or ln.startswith("| ranks")]
    assert [r[0] for r in rows] == ["| kuhn", "| ranks"]
    assert all(r[2] == "failed" and "no-such" in r[3] for r in rows)
