"""How a learner turns accumulated gradients into an update: plain torch AdamW, or DeepSpeed.

The learner's algorithm (per-agent loss accumulation, per-agent gradient norms, skipping
non-finite steps) is written once in :mod:`marl.train.learner` and its objectives; it talks to
its optimizer only through the :class:`Optimizer` calls below, so the torch and DeepSpeed
backends cannot drift apart.  Both optimise only the trainable LoRA parameters with AdamW (no
weight decay) and clip the global gradient norm to ``max_grad_norm``; both save their state in
torch AdamW's per-parameter format, so a checkpoint written by one backend resumes under the other.

DeepSpeed on one process, or on a learner group
-----------------------------------------------
A learner of one rank owns its base model alone (world size 1), so ZeRO shards nothing; what
the backend brings there is DeepSpeed's engine (bf16/fp16 mixed precision with fp32 master
weights on a GPU when ``train.precision`` asks for it, its clipping and overflow handling).
With ``train.learner.ranks > 1`` the ranks' group exists before the engine is built
(:mod:`marl.train.group`) and ZeRO-1/2 partition the AdamW state (and ZeRO-2 the gradients)
over it; each rank's loss is scaled by the world size so that DeepSpeed's averaging reduction
gives the sum the learner's normalisation needs (:mod:`marl.train.ranks`).
To run it in an ordinary process:

- a process group is started if there is none: gloo on CPU (NCCL on a GPU), world size 1, on a
  TCP store bound to port 0 of the loopback address, so the OS picks a free port (no race);
- ``DS_ACCELERATOR=cpu`` when the model is on the CPU, so DeepSpeed does not guess;
- nothing is JIT-compiled.  DeepSpeed's CPU accelerator builds a shared-memory all-reduce kernel
  when its communication backend starts (about a minute on two cores); the learner's
  collectives are plain torch.distributed ones (that kernel serves DeepSpeed's inference
  path), so the op is marked incompatible and never built, on one rank or several.  The
  optimizer is torch's AdamW given to DeepSpeed as a client optimizer, not DeepSpeed's
  CPU-Adam/FusedAdam ops, which would need compiling too.  Any op that still gets built is
  cached under ``$MARL_HOME/torch_extensions`` (``TORCH_EXTENSIONS_DIR``), so only the first
  start pays for it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator
from typing import Protocol

import torch

from marl.agents.precision import resolve
from marl.train.ranks import Ranks

Params = list[torch.nn.Parameter]


class Optimizer(Protocol):
    """What the learner needs from an optimizer backend."""

    #: every forward is a collective of the ranks (ZeRO-3 gathers the parameters in it), so
    #: the ranks must make the same number of forwards, whatever their shares hold
    collective_forwards: bool

    @property
    def loss_scale(self) -> float:
        """The factor that ``backward`` multiplies the loss by (fp16 loss scaling), so that
        gradient read-outs can be divided by it; 1.0 without scaling."""
        ...

    def zero_grad(self) -> None:
        """Start accumulating a new step's gradient."""

    def backward(self, loss: torch.Tensor) -> None:
        """Add the gradient of ``loss`` (already weighted by its share of the batch)."""

    def step(self) -> float:
        """Clip and apply the accumulated gradient; return its global norm before clipping.
        A non-finite norm means nothing was applied and the gradient was dropped."""

    def discard(self) -> None:
        """Drop the gradient accumulated since ``zero_grad`` without changing the weights."""

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next ``step`` (schedules are the trainer's)."""

    def state_dict(self) -> dict:
        """AdamW state in torch's per-parameter format (``state``/``param_groups``)."""

    def load_state_dict(self, state: dict) -> None: ...

    def full_params(self, write: bool = False) -> contextlib.AbstractContextManager[None]:
        """A block in which the parameters hold their full values (ZeRO-3 partitions them);
        with ``write``, values written into them become the optimizer's master weights."""


OptimizerFactory = Callable[..., Optimizer]


class TorchAdamW:
    """``torch.optim.AdamW`` on the parameters themselves.  In a learner group every rank
    holds the whole adapters and the same AdamW state; ``step`` sums the ranks' gradients
    (one all-reduce) before clipping, so every rank applies the same update."""

    loss_scale = 1.0
    collective_forwards = False

    def __init__(
        self, model: torch.nn.Module, params: Params, lr: float, max_grad_norm: float
    ) -> None:
        self.params, self.max_grad_norm = params, max_grad_norm
        self.ranks = Ranks.current()
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

    def zero_grad(self) -> None:
        # zeros, not None: AdamW skips parameters without a gradient, and every adapter
        # parameter should age its moments on every step whichever agents were in the batch
        for p in self.params:
            p.grad = torch.zeros_like(p)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        self.ranks.sum_tensors([p.grad for p in self.params])
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm))
        if not math.isfinite(norm):
            self.discard()
            return norm
        self.optimizer.step()
        return norm

    def discard(self) -> None:
        self.optimizer.zero_grad(set_to_none=False)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)

    def full_params(self, write: bool = False) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


# ----- DeepSpeed


def deepspeed_config(
    zero_stage: int, max_grad_norm: float, device: torch.device, precision: str = "fp32"
) -> dict:
    """The DeepSpeed config of one learner.

    Batch sizes are 1 and accumulation is unmanaged: the learner decides how many micro-batches
    a step has (they vary with the batch), calls ``backward`` for each and ``step`` once; with
    ``managed_gradient_accumulation`` off, DeepSpeed neither rescales the losses nor reduces
    before ``step``.  DeepSpeed's half-precision modes (the model in bf16/fp16, fp32 master
    weights and AdamW state) only on a GPU: on a CPU the weights stay fp32, as with the torch
    backend, and a bf16 ``precision`` is the learner's autocast alone.
    """
    if zero_stage not in (1, 2, 3):
        raise ValueError(
            f"zero_stage must be 1, 2 or 3, not {zero_stage} (no ZeRO: use the torch backend)"
        )
    cuda, precision = device.type == "cuda", resolve(precision)
    if precision == "fp16" and not cuda:
        raise ValueError(
            f"precision fp16 needs a GPU but the learner is on {device.type}; use bf16 (or fp32)"
        )
    if precision == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        raise ValueError("precision bf16: this GPU has no bf16; use fp16 (or fp32)")
    bf16, fp16 = cuda and precision == "bf16", cuda and precision == "fp16"
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": max_grad_norm,
        "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True,  # torch's AdamW as the client optimizer
        "bf16": {"enabled": bf16, "check_grad_overflow": True},
        "fp16": {"enabled": fp16},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def start_deepspeed(device: torch.device):
    """Import DeepSpeed for a model on ``device`` and make sure a process group exists (see
    the module docstring); returns the ``deepspeed`` module."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from marl.agents.models.cache import marl_home

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(marl_home() / "torch_extensions"))
    try:
        import deepspeed
    except ImportError as exc:
        raise ImportError(
            "train.learner.backend is deepspeed but DeepSpeed is not installed: "
            "pip install 'marl-teams[deepspeed]'"
        ) from exc
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.engine import DeepSpeedEngine

    if not hasattr(DeepSpeedEngine, "managed_gradient_accumulation"):
        raise ImportError(
            f"DeepSpeed {deepspeed.__version__} is too old for the learner, which "
            "needs unmanaged gradient accumulation: pip install 'deepspeed>=0.19.8'"
        )

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)  # its INFO lines drown progress
    accel = get_accelerator()
    if torch.device(accel.device_name()).type != device.type:
        raise RuntimeError(
            f"DeepSpeed runs on {accel.device_name()} in this process but the "
            f"learner's model is on {device}; set DS_ACCELERATOR to match"
        )
    if not dist.is_initialized():
        for key in ("RANK", "LOCAL_RANK"):
            os.environ.setdefault(key, "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)  # port 0: a free port
        backend = "gloo" if device.type == "cpu" else accel.communication_backend_name()
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    # the learner's collectives are torch.distributed's (gloo on a CPU): skip building
    # DeepSpeed's shared-memory all-reduce kernel, which only its inference path uses
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed


class DeepSpeedAdamW:
    """A DeepSpeed engine (ZeRO stage 1, 2 or 3) over the trainable parameters of ``model``,
    with torch's AdamW as its client optimizer.

    ZeRO-1/2 keep fp32 master copies (and the moments) in flat partitions and write the result
    back into the parameters after each step; ZeRO-3 also partitions every parameter of
    ``model`` and gathers it around each module's forward.  ``extra`` is merged into the config
    (e.g. ZeRO-3's ``stage3_param_persistence_threshold``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        params: Params,
        lr: float,
        max_grad_norm: float,
        zero_stage: int = 1,
        extra: dict | None = None,
        precision: str = "fp32",
    ) -> None:
        self.params, self.stage = params, zero_stage
        self.collective_forwards = zero_stage == 3
        device = params[0].device
        self.ds = start_deepspeed(device)
        self.world = Ranks.current().world
        config = deepspeed_config(zero_stage, max_grad_norm, device, precision)
        for key, value in (extra or {}).items():
            config[key] = (
                {**config[key], **value}
                if isinstance(value, dict) and isinstance(config.get(key), dict)
                else value
            )
        self.client = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        self.defaults = dict(self.client.defaults)
        self.engine, self.zero, _, _ = self.ds.initialize(
            model=model,
            optimizer=self.client,
            model_parameters=params,
            config=config,
            dist_init_required=False,
        )
        self._create_state()

    def _create_state(self) -> None:
        """Make the AdamW state exist now, as zeros at step 0.

        ZeRO creates it lazily at the first step, but a resumed run loads a saved state before
        that.  A step on an all-zero gradient creates it without moving anything (AdamW's update
        is m / (sqrt(v) + eps) = 0 and there is no weight decay); its step count is reset.
        """
        self.zero_grad()
        if not math.isfinite(self.step()):
            raise RuntimeError("DeepSpeed skipped the state-creating step")
        for st in self.client.state.values():
            st["step"].zero_()

    @property
    def loss_scale(self) -> float:
        """DeepSpeed averages the ranks' gradients; each rank's loss is the 1-rank loss's
        share (see :mod:`marl.train.ranks`), so it is scaled by the world size to make the
        average their sum."""
        return self.world * (float(self.zero.loss_scale) if self.engine.fp16_enabled() else 1.0)

    def zero_grad(self) -> None:
        """Every parameter starts the step with a zero gradient, as in ``TorchAdamW``.

        A plain ``engine.zero_grad`` is not enough: ZeRO-3 resets a parameter's accumulated
        gradient only when the step's first backward reaches it, and a learner's backward
        reaches one adapter at a time, so the other adapters would add to the previous step's
        gradient.  A backward of zero through every parameter resets them all.
        """
        self.engine.zero_grad()
        self._backward_through_all(0.0)

    def _backward_through_all(self, factor: float) -> None:
        """Backward of ``factor`` times the sum of every parameter: a gradient of ``factor``
        that reaches them all, also the adapters that PEFT has made not require grad."""
        with self.full_params(), self._grad_params():
            self.backward(torch.stack([p.float().sum() for p in self.params]).sum() * factor)

    def backward(self, loss: torch.Tensor) -> None:
        """The learner runs the model's forward itself (through ``ModelHost``), not through
        ``engine.forward``.  What ``engine.forward`` does that matters here is to tell ZeRO that
        a new micro-batch begins, without which ZeRO-3 overwrites the gradient accumulated so far
        instead of adding to it; that is done right after each backward, which is the same point
        in the sequence."""
        with self._grad_params():  # ZeRO-3 zeroes the gradient of params not requiring grad
            self.engine.backward(loss * self.world, scale_wrt_gas=False)
        self.zero.clear_backward_seen_flag()

    def step(self) -> float:
        """DeepSpeed computes the norm, skips the update on overflow (inf/NaN) and clears the
        gradient either way."""
        with self._grad_params():
            self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float("nan") if norm is None else float(norm)

    def set_lr(self, lr: float) -> None:
        """ZeRO steps the client optimizer over its flat partitions, whose groups keep the
        client's ``lr`` entries."""
        for group in self.client.param_groups:
            group["lr"] = lr

    def discard(self) -> None:
        """DeepSpeed has no call that drops a half-accumulated gradient (ZeRO-2/3 have already
        moved it into their partitions); its overflow path does exactly that, so this feeds it
        a non-finite gradient and lets ``step`` skip."""
        self._backward_through_all(float("nan"))
        if math.isfinite(self.step()):
            raise RuntimeError("DeepSpeed applied a non-finite gradient")

    # ----- state
    @contextlib.contextmanager
    def _grad_params(self) -> Iterator[None]:
        """ZeRO-3 reads optimizer state only of parameters that require grad; PEFT switches
        that off on every adapter but the active one."""
        flags = [p.requires_grad for p in self.params]
        for p in self.params:
            p.requires_grad_(True)
        try:
            yield
        finally:
            for p, f in zip(self.params, flags, strict=True):
                p.requires_grad_(f)

    def _shape(self, p: torch.nn.Parameter) -> torch.Size:
        return p.ds_shape if hasattr(p, "ds_shape") else p.shape

    def state_dict(self) -> dict:
        from deepspeed.utils import safe_get_full_optimizer_state

        step = next(iter(self.client.state.values()))["step"]
        state = {}
        with self._grad_params():
            for i, p in enumerate(self.params):
                st = {"step": step.detach().clone().cpu()}
                for key in ("exp_avg", "exp_avg_sq"):
                    v = safe_get_full_optimizer_state(p, key)
                    st[key] = v.detach().float().cpu().reshape(self._shape(p)).clone()
                state[i] = st
        return {
            "state": state,
            "param_groups": [{**self.defaults, "params": list(range(len(self.params)))}],
        }

    def load_state_dict(self, state: dict) -> None:
        from deepspeed.utils import safe_set_full_optimizer_state

        saved = {int(k): v for k, v in state["state"].items()}
        if not saved:
            return
        if sorted(saved) != list(range(len(self.params))):
            raise ValueError(
                f"optimizer state for {len(saved)} parameters, this learner has {len(self.params)}"
            )
        with self._grad_params():
            for i, p in enumerate(self.params):
                for key in ("exp_avg", "exp_avg_sq"):
                    safe_set_full_optimizer_state(p, saved[i][key].to(p.device).float(), key)
        step = float(saved[0]["step"])
        for st in self.client.state.values():
            st["step"].fill_(step)

    @contextlib.contextmanager
    def full_params(self, write: bool = False) -> Iterator[None]:
        from deepspeed.utils import safe_set_full_fp32_param

        gather = (
            self.ds.zero.GatheredParameters(self.params, modifier_rank=0 if write else None)
            if self.stage == 3
            else contextlib.nullcontext()
        )
        with gather:
            yield
            if write:
                with self._grad_params():
                    for p in self.params:
                        safe_set_full_fp32_param(p, p.detach().float())


def make_optimizer(
    backend: str = "torch", zero_stage: int = 1, precision: str = "fp32"
) -> OptimizerFactory:
    """The factory of ``train.learner.backend``: called as ``(model, params, lr,
    max_grad_norm)``.  Torch's AdamW steps the fp32 parameters whatever ``precision``."""
    if backend == "torch":
        return TorchAdamW
    if backend == "deepspeed":
        return lambda model, params, lr, max_grad_norm: DeepSpeedAdamW(
            model, params, lr, max_grad_norm, zero_stage=zero_stage, precision=precision
        )
    raise ValueError(f"unknown learner backend {backend!r}; known: torch, deepspeed")
