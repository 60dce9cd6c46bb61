"""A learner group: the learner of one base model as ``train.learner.ranks`` Ray actors.

The trainer's runtime holds one :class:`LearnerGroup` per trainable base model and calls it
as it would call one learner: each call goes to every rank (the batch is put in Ray's object
store once and every rank reads it) and the answer is rank 0's, which equals the others'
(same update everywhere: :mod:`marl.train.ranks`).  This is verl's and NeMo-RL's worker
group, with the ranks as data-parallel replicas of one LoRA learner.

How it is built:

1. a Ray placement group of one bundle per rank (``ray.cpus_per_learner`` CPUs,
   ``ray.gpus_per_learner`` GPUs each), packed on few nodes or spread over many
   (``train.learner.placement``); a cluster that cannot hold it is refused in one line
   after ``PLACEMENT_TIMEOUT_S``, not waited on forever;
2. one actor per bundle;
3. rendezvous through Ray: rank 0 opens a TCP store on a port its OS picks on its own node
   and returns ``host:port``; the driver passes that to every rank, which joins the
   ``torch.distributed`` group (gloo on a CPU, NCCL on a GPU) and only then builds its
   learner, so that DeepSpeed finds the group and shards over it.
"""

from __future__ import annotations

from typing import Any

from marl.infra.actors import RayStartError

PLACEMENT_TIMEOUT_S = 120.0


class LearnerGroupError(RayStartError):
    """The cluster cannot hold the learner group; the message says what it asked for (the
    command line prints it in one line, as it does any Ray start error)."""


class LearnerGroup:
    """``ranks`` actors of ``actor_cls`` (a Ray actor class, built as ``(cfg, key)``), joined
    into one process group; see the module docstring."""

    def __init__(
        self,
        actor_cls: Any,
        cfg: dict,
        key: str,
        ranks: int,
        resources: dict[str, float],
        placement: str = "pack",
        timeout_s: float = PLACEMENT_TIMEOUT_S,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray = ray
        bundle = {k: v for k, v in resources.items() if v > 0}
        self.pg = placement_group([bundle] * ranks, strategy=placement.upper())
        if not self.pg.wait(timeout_seconds=timeout_s):
            remove_placement_group(self.pg)
            raise LearnerGroupError(
                f"train.learner.ranks: {ranks} ranks of {bundle} each ({placement}) do not fit "
                f"the Ray cluster ({ray.available_resources()} free)"
            )
        self.actors = [
            actor_cls.options(
                num_cpus=resources.get("CPU", 0),
                num_gpus=resources.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.pg, placement_group_bundle_index=i
                ),
            ).remote(cfg, key)
            for i in range(ranks)
        ]
        address = ray.get(self.actors[0].rendezvous.remote(ranks))
        ray.get([a.join.remote(address, i, ranks) for i, a in enumerate(self.actors)])

    def submit(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every rank; the object refs of their answers."""
        args = tuple(self.ray.put(a) if isinstance(a, list | dict) else a for a in args)
        return [getattr(a, method).remote(*args) for a in self.actors]

    def result(self, refs: list[Any]) -> Any:
        """Rank 0's answer of a :meth:`submit`, once every rank has answered."""
        return self.ray.get(refs)[0]

    def call(self, method: str, *args: Any) -> Any:
        return self.result(self.submit(method, *args))

    def shutdown(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for a in self.actors:
            self.ray.kill(a)
        remove_placement_group(self.pg)
