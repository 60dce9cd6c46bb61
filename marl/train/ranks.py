"""A learner's place in its group of ranks: which items it learns from, and the sums it shares.

The learner of one base model may be ``train.learner.ranks`` processes (a learner group,
:mod:`marl.train.group`) forming one ``torch.distributed`` group.  Every rank receives the
whole batch and takes its share of each agent's items (:meth:`Ranks.share`); the loss keeps
the 1-rank normalisation, each micro-batch weighted by its tokens over the *whole* batch's
tokens ``n_total``, so the gradients of the ranks add up to the 1-rank gradient:

    g = sum_i (tokens_i / n_total) grad L_i = sum_r sum_{i in share_r} (tokens_i / n_total) grad L_i

The optimizer backend sums them across the group before clipping and stepping (torch:
an all-reduce of the LoRA gradients; DeepSpeed: its own averaging reduction of the loss
scaled by the world size), so the update equals the 1-rank update.

Every rank runs the same sequence of micro-batches: per agent, as many as the rank with the
most, padded with zero-weight copies of the agent's first item (:meth:`Ranks.schedule`).
ZeRO-2 reduces gradients inside each backward, so the ranks' backwards have to pair up; the
check for a non-finite loss is taken together after each micro-batch, so all ranks skip.
ZeRO-3 needs the ranks' *forwards* to pair up too: the learner then scores each micro-batch
with one forward (no shared heads), and the config refuses think roles there.

A process with no group (or a group of one) is rank 0 of 1 and communicates nothing.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from marl.train.learner import TrainItem


def open_store(world: int) -> tuple[dist.TCPStore, str]:
    """Rank 0's rendezvous: a TCP store on a port the OS picks (port 0: free, no race) on this
    node's address, and that ``host:port`` for the other ranks."""
    import ray

    host = ray.util.get_node_ip_address() if ray.is_initialized() else socket.gethostname()
    store = dist.TCPStore(host, 0, world, is_master=True, wait_for_workers=False)
    return store, f"{host}:{store.port}"


def join_group(
    address: str,
    rank: int,
    world: int,
    backend: str,
    store: dist.TCPStore | None = None,
    timeout: timedelta = timedelta(minutes=30),
) -> None:
    """Join the group whose rank 0 opened ``address`` (rank 0 passes its ``store``)."""
    if store is None:
        host, port = address.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), world, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


@dataclass(frozen=True)
class Ranks:
    """This process's rank in the default process group (0 of 1 without one)."""

    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> Ranks:
        if not dist.is_initialized():
            return cls()
        return cls(dist.get_rank(), dist.get_world_size())

    # ----- the share of each rank
    def share(self, group: list[TrainItem], rank: int | None = None) -> list[TrainItem]:
        """Rank ``rank``'s part of ``group`` (default: this rank's): the items sorted as
        micro-batches sort them (repeated states stay together), cut into ``world`` runs of
        about equal tokens; an item goes to the run holding the middle of its tokens."""
        if self.world == 1:
            return group
        rank = self.rank if rank is None else rank
        ordered = sorted(group, key=lambda it: (it.prompt_ids, it.completion_ids))
        total = sum(it.tokens for it in ordered)
        out, start = [], 0
        for it in ordered:
            if min(int((start + it.tokens / 2) * self.world / total), self.world - 1) == rank:
                out.append(it)
            start += it.tokens
        return out

    def schedule(
        self, group: list[TrainItem], chunks: Callable[[list[TrainItem]], list[list[TrainItem]]]
    ) -> list[tuple[list[TrainItem], bool]]:
        """This rank's micro-batches of ``group``, each with whether it counts: as many as the
        busiest rank has, the missing ones a zero-weight copy of the group's first item."""
        mine = chunks(self.share(group))
        if self.world == 1:
            return [(c, True) for c in mine]
        most = max(len(chunks(self.share(group, r))) for r in range(self.world))
        pad = [min(group, key=lambda it: (it.prompt_ids, it.completion_ids))]
        return [(c, True) for c in mine] + [(pad, False)] * (most - len(mine))

    # ----- sums over the group
    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some rank."""
        if self.world == 1:
            return flag
        t = torch.tensor([float(flag)], device=_device())
        dist.all_reduce(t)
        return bool(t.item() > 0)

    def sum(self, values: list[float]) -> list[float]:
        """``values`` summed over the ranks (float64)."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=_device())
        dist.all_reduce(t)
        return t.tolist()

    def max(self, value: float) -> float:
        """The largest ``value`` over the ranks."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def sum_tensors(self, tensors: list[torch.Tensor]) -> None:
        """Sum ``tensors`` over the ranks, in place (one flat all-reduce)."""
        if self.world == 1 or not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat)
        for t, part in zip(tensors, flat.split([t.numel() for t in tensors]), strict=True):
            t.copy_(part.view_as(t))


def _device() -> torch.device:
    """Where the group's tensors live: the GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
