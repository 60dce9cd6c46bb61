"""Where rollouts and updates run: in this process, or on Ray actors.

Both runtimes are a :class:`Runtime`, the calls the trainer makes: ``play`` (episode specs ->
episodes) or ``launch`` (the same, started now and collected later: asynchronous rollouts,
:mod:`marl.train.asynchrony`), ``update`` (train items per model -> stats), ``publish`` (new
adapter weights, the league pool and their version -> every worker), ``weights``,
``optimizer_states``/``load``, ``exploitability`` and ``shutdown``.  A worker stamps every
episode with the version of the weights it played with.

- :class:`LocalRuntime` builds the team once; the worker and the learners share its model, so
  nothing is copied, and ``launch`` plays at once.
- :class:`RayRuntime` runs ``rollout_workers`` worker actors in one placement group
  (``ray.worker_placement``: pack or spread; :mod:`marl.infra.placement`) and one learner
  group per trainable base model (:class:`~marl.train.group.LearnerGroup`:
  ``train.learner.ranks`` actors in a placement group of their own and one process group),
  with the CPUs/GPUs the config asks for.  Weights travel through the object store:
  ``publish`` puts them (once, every worker reads the same object) and each rollout takes the
  version published when it was launched (a worker loads it before its share, unless it has
  it), so a launch never waits for the workers' current rollouts.  Rollouts run one launch
  after another on a thread of their own.  The workers are an
  :class:`~marl.infra.actors.ActorPool`: a worker that dies (its process, or its node) in a
  rollout or an evaluation is replaced by a new actor in the group's free bundle, given the
  call's weights, and its call is replayed; because seeds come from the specs, the step's
  result is the same.  A pool that keeps losing workers stops with
  :class:`~marl.infra.actors.ActorPoolError`.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

import torch

from marl.agents.builder import Roster, build_roster, host_key
from marl.agents.rollout import Episode
from marl.config import TeamConfig
from marl.infra.actors import ActorPool, start_ray
from marl.infra.placement import in_bundle, release, reserve
from marl.infra.seats import ParticipantId
from marl.train.group import LearnerGroup
from marl.train.league import Weights
from marl.train.learner import Learner, TrainItem, UpdateStats, ratio_correction
from marl.train.optim import make_optimizer
from marl.train.ranks import join_group, open_store
from marl.train.workers import EpisodeSpec, RolloutWorker


@runtime_checkable
class Runtime(Protocol):
    """Where a run's rollouts and updates happen; the trainer sees nothing else of it."""

    def play(self, specs: list[EpisodeSpec], step: int, seed: int) -> list[Episode]:
        """The episodes of ``specs`` (any order); seeds come from the specs and ``seed``."""
        ...

    def launch(self, specs: list[EpisodeSpec], step: int, seed: int) -> Future[list[Episode]]:
        """``play`` started now, with the weights published last; its episodes when done."""
        ...

    def update(
        self, items: dict[str, list[TrainItem]], seed: int, lr: float | None = None
    ) -> dict[str, UpdateStats]:
        """One update per base model key of ``items``."""
        ...

    def publish(
        self, weights: Weights, snapshots: dict[ParticipantId, Weights], version: int
    ) -> None:
        """The trained adapters and the league pool, to everything that plays from now on;
        ``version``: the training step that made them."""
        ...

    def weights(self) -> Weights: ...

    def set_magnet(self, weights: Weights, share: float = 1.0) -> None:
        """The learners' magnets (``train.magnet``) take ``weights`` and ``share``."""
        ...

    def optimizer_states(self) -> dict[str, dict]: ...

    def load(self, weights: Weights, optimizer_states: dict[str, dict]) -> None: ...

    def exploitability(self) -> float:
        """Exact exploitability of the trained role's current policy."""
        ...

    def shutdown(self) -> None: ...


def trainable_hosts(cfg: TeamConfig) -> dict[str, list[str]]:
    """Base-model key -> the trainable roles (adapters) on it: one learner per key."""
    out: dict[str, list[str]] = defaultdict(list)
    for r in cfg.roles:
        if r.trainable:
            out[host_key(cfg, r)].append(r.name)
    return dict(out)


def learner_roster(cfg: TeamConfig) -> Roster:
    """The team as a learner builds it: its model hosts, with the roles that sample on vLLM
    built on transformers instead.  A learner never samples: a vLLM engine per learner rank
    would only hold the memory (on a GPU, most of it) its update needs."""
    roles = [r.replace(backend="hf") if r.backend == "vllm" else r for r in cfg.roles]
    return build_roster(cfg.replace(roles=roles))


class LearnerProcess:
    """A learner plus the team built around it: what one learner rank holds."""

    def __init__(self, cfg: dict, key: str, roster: Roster | None = None) -> None:
        team = TeamConfig.model_validate(cfg)
        tc = team.train
        assert tc is not None
        roster = roster or learner_roster(team)
        roles = trainable_hosts(team)[key]
        self.learner = Learner(
            tc,
            roster.hosts[key],
            roles,
            optimizer=make_optimizer(tc.learner.backend, tc.learner.zero_stage, tc.precision),
            correction=ratio_correction(team, roles),
        )

    def update(self, items: list[TrainItem], seed: int, lr: float | None = None) -> UpdateStats:
        torch.manual_seed(seed)
        return self.learner.update(items, lr)

    def weights(self) -> Weights:
        return self.learner.weights()

    def set_magnet(self, weights: Weights, share: float = 1.0) -> None:
        self.learner.set_magnet(weights, share)

    def optimizer_state(self) -> dict:
        return self.learner.optimizer_state()

    def load(self, weights: Weights, optimizer_state: dict | None) -> None:
        self.learner.load(weights, optimizer_state)


class LocalRuntime:
    def __init__(self, cfg: TeamConfig) -> None:
        data = cfg.model_dump(by_alias=True)
        self.roster = build_roster(cfg)
        self.worker = RolloutWorker(data, self.roster)
        # ZeRO-3 partitions every parameter of the model its engine wraps and gathers them in
        # hooks on the modules it saw, while the worker adds and drops league adapters on its
        # model: the learners then get a model of their own, and the worker gets the weights
        lc = cfg.train.learner if cfg.train else None
        self.shared = not (lc and lc.backend == "deepspeed" and lc.zero_stage == 3)
        roster = self.roster if self.shared else learner_roster(cfg)
        self.learners = {k: LearnerProcess(data, k, roster) for k in trainable_hosts(cfg)}

    def play(self, specs: list[EpisodeSpec], step: int, seed: int) -> list[Episode]:
        return self.worker.play(specs, step, seed)

    def launch(self, specs: list[EpisodeSpec], step: int, seed: int) -> Future[list[Episode]]:
        done: Future[list[Episode]] = Future()
        try:
            done.set_result(self.play(specs, step, seed))
        except Exception as exc:  # the caller meets it where it collects the episodes
            done.set_exception(exc)
        return done

    def update(
        self, items: dict[str, list[TrainItem]], seed: int, lr: float | None = None
    ) -> dict[str, UpdateStats]:
        return {k: self.learners[k].update(v, seed, lr) for k, v in items.items()}

    def publish(
        self, weights: Weights, snapshots: dict[ParticipantId, Weights], version: int
    ) -> None:
        if not self.shared:  # otherwise the worker's model is the learners'
            self.worker.set_weights(weights)
        self.worker.sync_snapshots(snapshots)
        self.worker.version = version

    def exploitability(self) -> float:
        return self.worker.exploitability()

    def weights(self) -> Weights:
        return {a: w for lp in self.learners.values() for a, w in lp.weights().items()}

    def set_magnet(self, weights: Weights, share: float = 1.0) -> None:
        for lp in self.learners.values():
            lp.set_magnet(weights, share)

    def optimizer_states(self) -> dict[str, dict]:
        return {k: lp.optimizer_state() for k, lp in self.learners.items()}

    def load(self, weights: Weights, optimizer_states: dict[str, dict]) -> None:
        for k, lp in self.learners.items():
            lp.load(weights, optimizer_states.get(k))

    def shutdown(self) -> None:
        pass


def _use_all_cores() -> None:
    """Rollouts and updates alternate, so each actor may use every core while it runs."""
    torch.set_num_threads(max(1, os.cpu_count() or 1))


def _place(roster: Roster) -> None:
    """Put the actor's models on the GPU Ray assigned to it, if there is a real one."""
    import ray

    if ray.get_runtime_context().get_accelerator_ids().get("GPU") and torch.cuda.is_available():
        roster.to("cuda")


class _Placed:
    """Lets the driver (and tests) see where Ray put an actor."""

    def placement(self) -> dict:
        import ray

        ctx = ray.get_runtime_context()
        return {
            "node": ctx.get_node_id(),
            "gpus": ctx.get_accelerator_ids().get("GPU", []),
            "pid": os.getpid(),
        }


class _WorkerActor(RolloutWorker, _Placed):
    def __init__(self, cfg: dict) -> None:
        _use_all_cores()
        super().__init__(cfg)
        _place(self.roster)

    def sync(self, version: int, refs: list) -> None:
        """Play with the published ``version`` from now on: its weights and league pool (object
        refs, fetched only when this worker has another version)."""
        import ray

        if version != self.version:
            weights, snapshots = ray.get(refs)
            self.set_weights(weights)
            self.sync_snapshots(snapshots)
            self.version = version


class LearnerRank(LearnerProcess, _Placed):
    """One rank of a :class:`~marl.train.group.LearnerGroup`: its learner is built once the
    rank has joined its group (:meth:`join`), where DeepSpeed will find it."""

    def __init__(self, cfg: dict, key: str) -> None:
        _use_all_cores()
        self.cfg, self.key, self.store, self.rank = cfg, key, None, 0

    def rendezvous(self, world: int) -> str:
        """Rank 0: the address the ranks meet at (a free port on this node)."""
        self.store, address = open_store(world)
        return address

    def join(self, address: str, rank: int, world: int) -> None:
        roster = learner_roster(TeamConfig.model_validate(self.cfg))
        _place(roster)
        gpu = roster.hosts[self.key].device.type == "cuda"
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0")
        join_group(address, rank, world, "nccl" if gpu else "gloo", self.store)
        self.rank = rank
        super().__init__(self.cfg, self.key, roster)

    # every rank takes part (a ZeRO gather is collective); only rank 0's copy is sent back,
    # the group's answer, so one copy crosses the network, not one per rank
    def weights(self) -> Weights:
        weights = super().weights()
        return weights if self.rank == 0 else {}

    def optimizer_state(self) -> dict:
        state = super().optimizer_state()
        return state if self.rank == 0 else {}


class RayRuntime:
    def __init__(self, cfg: TeamConfig, address: str | None = None) -> None:
        import ray

        self.ray = ray
        rc = cfg.train.ray
        start_ray(address or rc.address)
        self.data = cfg.model_dump(by_alias=True)
        lc = cfg.train.learner
        resources = {"CPU": rc.cpus_per_learner, "GPU": rc.gpus_per_learner}
        self.learners = {
            k: LearnerGroup(
                ray.remote(LearnerRank), self.data, k, lc.ranks, resources, lc.placement
            )
            for k in trainable_hosts(cfg)
        }
        n = rc.rollout_workers
        bundle = {"CPU": rc.cpus_per_worker, "GPU": rc.gpus_per_worker}
        what = f"train.ray.rollout_workers: {n} workers"
        self.worker_pg = reserve(bundle, n, rc.worker_placement, what)
        self._worker_cls = ray.remote(_WorkerActor).options(
            num_cpus=rc.cpus_per_worker,
            num_gpus=rc.gpus_per_worker,
            scheduling_strategy=in_bundle(self.worker_pg),
        )
        self.published: tuple[int, list] | None = None  # version, [weights, snapshots] refs
        self.pool = ActorPool(lambda: self._worker_cls.remote(self.data), n)
        self.rollouts = ThreadPoolExecutor(1, thread_name_prefix="rollouts")

    @staticmethod
    def _sync(published: tuple[int, list] | None) -> Callable[[Any], None] | None:
        """What queues ``published`` on a worker before its work (an actor runs one caller's
        calls in order); nothing before the first publish: every worker starts with the
        learners' initial weights."""
        if published is None:
            return None
        version, refs = published
        return lambda worker: worker.sync.remote(version, refs)

    @property
    def workers(self) -> list[Any]:
        return self.pool.actors

    @property
    def replaced(self) -> int:
        """Workers replaced after dying, over the runtime's life."""
        return self.pool.replaced

    def play(self, specs: list[EpisodeSpec], step: int, seed: int) -> list[Episode]:
        return self.launch(specs, step, seed).result()

    def launch(self, specs: list[EpisodeSpec], step: int, seed: int) -> Future[list[Episode]]:
        n = len(self.workers)
        chunks = [specs[i * len(specs) // n : (i + 1) * len(specs) // n] for i in range(n)]
        sync = self._sync(self.published)  # the weights of now, whenever the thread gets to it
        return self.rollouts.submit(
            lambda: [
                ep for eps in self.pool.map("play", chunks, step, seed, prepare=sync) for ep in eps
            ]
        )

    def update(
        self, items: dict[str, list[TrainItem]], seed: int, lr: float | None = None
    ) -> dict[str, UpdateStats]:
        refs = {k: self.learners[k].submit("update", v, seed, lr) for k, v in items.items()}
        return {k: self.learners[k].result(r) for k, r in refs.items()}

    def publish(
        self, weights: Weights, snapshots: dict[ParticipantId, Weights], version: int
    ) -> None:
        self.published = (version, [self.ray.put(weights), self.ray.put(snapshots)])

    def exploitability(self) -> float:
        return self.pool.one("exploitability", prepare=self._sync(self.published))

    def weights(self) -> Weights:
        return self._gather("weights")

    def set_magnet(self, weights: Weights, share: float = 1.0) -> None:
        ref = self.ray.put(weights)
        self._gather("set_magnet", ref, share)

    def optimizer_states(self) -> dict[str, dict]:
        refs = {k: g.submit("optimizer_state") for k, g in self.learners.items()}
        return {k: self.learners[k].result(r) for k, r in refs.items()}

    def load(self, weights: Weights, optimizer_states: dict[str, dict]) -> None:
        ref = self.ray.put(weights)
        refs = [g.submit("load", ref, optimizer_states.get(k)) for k, g in self.learners.items()]
        self.ray.get([r for rs in refs for r in rs])

    def _gather(self, method: str, *args: Any) -> Weights:
        """``method`` on every group at once; their rank-0 answers merged."""
        refs = [g.submit(method, *args) for g in self.learners.values()]
        out: Weights = {}
        for g, r in zip(self.learners.values(), refs, strict=True):
            out.update(g.result(r) or {})
        return out

    def shutdown(self) -> None:
        self.rollouts.shutdown(cancel_futures=True)
        self.pool.shutdown()
        release(self.worker_pg)
        for g in self.learners.values():
            g.shutdown()
