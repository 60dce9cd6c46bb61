"""A learner group: the learner of one base model as ``train.learner.ranks`` Ray actors.

The trainer's runtime holds one :class:`LearnerGroup` per trainable base model and calls it
as it would call one learner: each call goes to every rank (the batch is put in Ray's object
store once and every rank reads it) and the answer is rank 0's, which equals the others'
(same update everywhere: :mod:`marl.train.ranks`; the other ranks send back no weights or
optimizer state, so one copy crosses the network).  This is verl's and NeMo-RL's worker
group, with the ranks as data-parallel replicas of one LoRA learner.

How it is built:

1. a Ray placement group of one bundle per rank (``ray.cpus_per_learner`` CPUs,
   ``ray.gpus_per_learner`` GPUs each), packed on few nodes or spread over many
   (``train.learner.placement``; :mod:`marl.infra.placement`); a cluster that cannot hold it
   is refused in one line, not waited on forever;
2. one actor per bundle;
3. rendezvous through Ray: rank 0 opens a TCP store on a port its OS picks on its own node
   and returns ``host:port``; the driver passes that to every rank, which joins the
   ``torch.distributed`` group (gloo on a CPU, NCCL on a GPU) and only then builds its
   learner, so that DeepSpeed finds the group and shards over it.  The backend follows the
   device the rank's model is on: a GPU Ray assigned is used only where torch sees CUDA, so a
   node that declares GPUs without having them gets gloo on its CPU.
"""

from __future__ import annotations

from typing import Any

from marl.infra.placement import PLACEMENT_TIMEOUT_S, in_bundle, release, reserve


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

        self.ray = ray
        what = f"train.learner.ranks: {ranks} ranks"
        self.pg = reserve(resources, ranks, placement, what, timeout_s)
        self.actors = [
            actor_cls.options(
                num_cpus=resources.get("CPU", 0),
                num_gpus=resources.get("GPU", 0),
                scheduling_strategy=in_bundle(self.pg, i),
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
        for a in self.actors:
            self.ray.kill(a)
        release(self.pg)
