"""The runtime protocol the trainer is typed with, and the actor pool behind the Ray runtime
and Ray tournaments: a killed actor is replaced and its chunk replayed, up to a bound."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest
import ray

from doubler import Doubler
from helpers import tiny_team
from marl.config import load_config_text
from marl.infra import budget
from marl.infra.actors import ActorPool, ActorPoolError, start_ray
from marl.train.runtime import (
    LearnerProcess,
    LocalRuntime,
    RayRuntime,
    Runtime,
    learner_roster,
)
from marl.train.trainer import Trainer, TrainingError

PROTOCOL = [
    "play",
    "launch",
    "update",
    "publish",
    "weights",
    "optimizer_states",
    "load",
    "exploitability",
    "shutdown",
]


def kuhn(ray_section: str = "{enabled: false}") -> str:
    return tiny_team(
        "kuhn_poker", f"  steps: 1\n  group_size: 2\n  groups_per_step: 2\n  ray: {ray_section}\n"
    )


@pytest.mark.parametrize("cls", [LocalRuntime, RayRuntime])
def test_both_runtimes_offer_the_protocol_with_its_signatures(cls: type) -> None:
    for name in PROTOCOL:
        want = inspect.signature(getattr(Runtime, name))
        assert inspect.signature(getattr(cls, name)) == want, (cls.__name__, name)


def test_a_local_runtime_is_a_runtime() -> None:
    runtime = LocalRuntime(load_config_text(kuhn()))
    assert isinstance(runtime, Runtime)


def test_a_learner_of_a_vllm_role_starts_no_engine() -> None:
    """The learner only needs the role's model host; its correction still knows the role
    samples on vLLM."""
    text = kuhn().replace("model: tiny-random", "model: tiny-random-vllm\n    backend: vllm")
    cfg = load_config_text(text)
    assert list(learner_roster(cfg).hosts) == ["tiny-random-vllm"]  # no "vllm:..." engine
    lp = LearnerProcess(cfg.model_dump(by_alias=True), "tiny-random-vllm")
    assert lp.learner.correction == "recompute"


class _Lost:
    """A runtime whose rollout actors keep dying."""

    def play(self, specs, step, seed):
        raise ActorPoolError("actors keep dying: 3 lost")

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def test_the_trainer_stops_with_a_training_error_when_actors_keep_dying(tmp_path: Path) -> None:
    trainer = Trainer(load_config_text(kuhn()), tmp_path / "run", runtime=_Lost())
    with pytest.raises(TrainingError, match=r"^step 1: rollout actors keep dying: 3 lost$"):
        trainer.train_step()


@pytest.fixture(scope="module")
def local_ray():
    """Ray whose workers can import :class:`Doubler` from the tests folder."""
    path = os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    start_ray()  # already running: a no-op
    yield
    ray.shutdown()


def pool_of(size: int) -> ActorPool:
    cls = ray.remote(num_cpus=0.1)(Doubler)
    return ActorPool(cls.remote, size)


@pytest.mark.slow
def test_a_pool_runs_a_queue_of_chunks_in_order(local_ray) -> None:
    pool = pool_of(2)
    seen: list[list[int]] = []
    try:
        out = pool.map("work", [[1], [2, 3], [], [4]], "", False, on_result=seen.append)
    finally:
        pool.shutdown()
    assert out == [[2], [4, 6], [], [8]]
    assert sorted(seen) == sorted(out) and pool.replaced == 0


@pytest.mark.slow
def test_actors_get_the_callers_budget_and_report_in_one_line(local_ray) -> None:
    pool = pool_of(1)
    try:
        assert pool.map("deadline", [[1]]) == [None]
        with budget.budget(2.0):
            assert pool.map("deadline", [[1]]) == [budget.deadline()]
        with pytest.raises(budget.ReportedError) as raised:
            pool.map("work", [[-2]], "", False)
    finally:
        pool.shutdown()
    assert type(raised.value) is budget.ReportedError  # itself, not Ray's RayTaskError dump
    assert str(raised.value) == "game x: step raised ValueError: -2"


@pytest.mark.slow
def test_a_killed_actor_is_replaced_and_its_chunk_replayed(local_ray, tmp_path: Path) -> None:
    poison = tmp_path / "poison"
    poison.touch()
    pool = pool_of(2)
    try:
        pids = ray.get([a.pid.remote() for a in pool.actors])
        prepared: list = []  # the actor each chunk went to, told first
        out = pool.map("work", [[1, -1], [5]], str(poison), True, prepare=prepared.append)
        assert out == [[2, -2], [10]]
        assert pool.replaced == 1 and not poison.exists()
        assert len(prepared) == 3  # each chunk, and the replay of the lost one
        assert ray.get(pool.actors[0].pid.remote()) not in pids  # a fresh actor in its slot
        assert ray.get(pool.actors[1].pid.remote()) == pids[1]
    finally:
        pool.shutdown()


@pytest.mark.slow
def test_one_survives_its_actors_death_and_prepares_the_replacement(
    local_ray, tmp_path: Path
) -> None:
    poison = tmp_path / "poison"
    poison.touch()
    pool = pool_of(2)
    try:
        prepared: list = []
        assert pool.one("work", [-1, 4], str(poison), True, prepare=prepared.append) == [-2, 8]
        assert pool.replaced == 1 and not poison.exists()
        assert len(prepared) == 2  # the first actor, then its replacement
    finally:
        pool.shutdown()


@pytest.mark.slow
def test_a_pool_gives_up_after_twice_its_size(local_ray, tmp_path: Path) -> None:
    poison = tmp_path / "poison"
    poison.touch()
    pool = pool_of(1)
    try:
        with pytest.raises(
            ActorPoolError,
            match=r"actors keep dying: 3 lost while running "
            r"'work' on 1 chunks \(2 replacements allowed\)",
        ):
            pool.map("work", [[-1]], str(poison), False)
        assert pool.replaced == 2
    finally:
        pool.shutdown()
