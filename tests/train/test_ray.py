"""The Ray runtime on real local Ray clusters: a killed worker is replaced mid-rollout,
actors spread over two simulated nodes, and GPU placement from declared resources."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from helpers import tiny_team
from marl.config import load_config_text
from marl.train.runtime import RayRuntime
from marl.train.trainer import Trainer

pytestmark = pytest.mark.slow


def team(ray_section: str, groups: int = 4) -> str:
    return tiny_team(
        "kuhn_poker",
        f"""\
  steps: 1
  group_size: 8
  groups_per_step: {groups}
  concurrency: 8
  ray: {ray_section}
""",
    )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def kill_when_busy(pid: int, busy: float = 0.1) -> None:
    """SIGKILL the actor once it has spent ``busy`` CPU seconds: inside the rollout call, so
    the kill never races the call's end."""
    start = cpu_seconds(pid)
    while cpu_seconds(pid) - start < busy:
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)


def summary(episodes) -> list:
    return [(e.index, e.returns, [t.action for t in e.turns]) for e in episodes]


@pytest.fixture()
def local_ray():
    ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_killed_worker_is_replaced_and_the_step_completes(local_ray, tmp_path: Path) -> None:
    cfg = load_config_text(team("{rollout_workers: 1}", groups=16))
    runtime = RayRuntime(cfg)
    trainer = Trainer(cfg, tmp_path / "run", runtime=runtime)
    specs = trainer.plan(1)
    reference = summary(runtime.play(specs, 1, 0))
    pid = ray.get(runtime.workers[0].placement.remote())["pid"]
    runtime.publish(runtime.weights(), {}, 1)  # reloaded weights: nothing remembered, full work
    timer = threading.Thread(target=kill_when_busy, args=(pid,))
    timer.start()
    episodes = runtime.play(specs, 1, 0)
    timer.join()
    assert runtime.replaced == 1
    assert ray.get(runtime.workers[0].placement.remote())["pid"] != pid
    assert summary(episodes) == reference  # seeds come from the specs: same games
    result = trainer.train_step()  # and training goes on with the new worker
    assert result.metrics["episodes"] == len(specs)


def test_gpu_placement_from_declared_resources(local_ray) -> None:
    """One learner per GPU; two rollout workers share the other one (0.5 each)."""
    cfg = load_config_text(
        team(
            "{rollout_workers: 2, cpus_per_worker: 1, gpus_per_worker: 0.5,"
            " cpus_per_learner: 1, gpus_per_learner: 1}"
        )
    )
    runtime = RayRuntime(cfg)
    learner = ray.get(next(iter(runtime.learners.values())).actors[0].placement.remote())
    workers = ray.get([w.placement.remote() for w in runtime.workers])
    assert len(learner["gpus"]) == 1
    assert workers[0]["gpus"] == workers[1]["gpus"] and len(workers[0]["gpus"]) == 1
    assert workers[0]["gpus"] != learner["gpus"]


def test_actors_spread_over_two_nodes(tmp_path: Path) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        cluster.wait_for_nodes()
        cfg = load_config_text(team("{rollout_workers: 2, cpus_per_worker: 2}"))
        runtime = RayRuntime(cfg)
        nodes = {p["node"] for p in ray.get([w.placement.remote() for w in runtime.workers])}
        assert len(nodes) == 2  # 2 CPUs each: one worker per node
        trainer = Trainer(cfg, tmp_path / "run", runtime=runtime)
        specs = trainer.plan(1)
        assert len(runtime.play(specs, 1, 0)) == len(specs)
        runtime.publish(runtime.weights(), {}, 1)
        # the workers of both nodes play with the version published
        assert {ep.policy_version for ep in runtime.play(specs, 2, 0)} == {1}
    finally:
        ray.shutdown()
        cluster.shutdown()
