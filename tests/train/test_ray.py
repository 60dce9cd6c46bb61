"""The Ray runtime on real local Ray clusters: a killed worker is replaced mid-rollout, GPU
placement from declared resources, and a simulated two-node cluster: learner ranks and workers
placed as the config says, and a node lost mid-run without losing a step."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import ray
import torch.distributed as dist
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


FAST_NODE_DEATH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
CLUSTER_RUN = """\
  steps: 4
  group_size: 2
  groups_per_step: 2
  learner: {ranks: 2}
  ray: {rollout_workers: 2, cpus_per_worker: 0.5, worker_placement: spread,
        cpus_per_learner: 0.5, gpus_per_learner: 1}
"""


def steps_logged(metrics: Path) -> int:
    text = metrics.read_text() if metrics.exists() else ""
    return sum('"learner"' in ln for ln in text.splitlines())


def remove_after_first_step(cluster: Cluster, node, metrics: Path, removed: list[int]) -> None:
    """Remove ``node`` once the run has logged a training step (within a minute); note how
    many steps it had logged."""
    deadline = time.monotonic() + 60
    while steps_logged(metrics) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    removed.append(steps_logged(metrics))
    cluster.remove_node(node)


def test_a_two_node_cluster_places_as_configured_and_a_lost_node_loses_no_step(
    tmp_path: Path,
) -> None:
    """The head declares two GPUs it does not have; the other node one CPU.  The learner's
    ranks pack on the GPU node and still run gloo on the CPU; the workers spread over both
    nodes.  The worker node is removed after the first step: its worker is restarted on the
    head and the run logs every step."""
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "num_gpus": 2, "_system_config": FAST_NODE_DEATH},
    )
    node = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    trainer = None
    try:
        cluster.wait_for_nodes()
        head = cluster.head_node.node_id
        trainer = Trainer(load_config_text(tiny_team("kuhn_poker", CLUSTER_RUN)), tmp_path / "run")
        ranks = next(iter(trainer.runtime.learners.values())).actors
        learners = ray.get([r.placement.remote() for r in ranks])
        assert {p["node"] for p in learners} == {head}  # packed where the GPUs are
        assert sorted(len(p["gpus"]) for p in learners) == [1, 1]
        assert learners[0]["gpus"] != learners[1]["gpus"]
        backends = ray.get([r.__ray_call__.remote(lambda r: dist.get_backend()) for r in ranks])
        devices = ray.get(
            [r.__ray_call__.remote(lambda r: r.learner.host.device.type) for r in ranks]
        )
        assert backends == ["gloo", "gloo"] and devices == ["cpu", "cpu"]  # no CUDA here
        workers = ray.get([w.placement.remote() for w in trainer.runtime.workers])
        assert {p["node"] for p in workers} == {head, node.node_id}  # spread

        metrics, removed = tmp_path / "run" / "metrics.jsonl", []
        killer = threading.Thread(
            target=remove_after_first_step, args=(cluster, node, metrics, removed), daemon=True
        )
        killer.start()
        trainer.fit()
        killer.join()
        rows = [json.loads(ln) for ln in metrics.read_text().splitlines()]
        assert 1 <= removed[0] < 4  # mid-run
        assert [r["step"] for r in rows if "learner" in r] == [1, 2, 3, 4]
        assert trainer.runtime.replaced == 1
        workers = ray.get([w.placement.remote() for w in trainer.runtime.workers])
        assert {p["node"] for p in workers} == {head}
    finally:
        if trainer is not None:
            trainer.runtime.shutdown()
        ray.shutdown()
        cluster.shutdown()
