"""Compute precision of the transformers path: fp32, or bf16/fp16 autocast around forwards.

Autocast runs the matrix products in half precision (bf16 on CPUs with AMX and on GPUs, fp16 on
GPUs only) and keeps precision-sensitive ops (softmax, norms, losses) in fp32.  A frozen base
that only half-precision forwards use is stored in that dtype (:func:`weights_dtype`); LoRA
weights, their gradients and the optimizer state stay fp32 whatever the compute precision.

``auto`` is bf16 where the machine multiplies bf16 in hardware (a CUDA GPU that supports it, a
CPU with AMX or AVX512-BF16) and fp32 elsewhere: on a CPU without those units bf16 is emulated
and several times slower than fp32, so :func:`resolve` also warns when bf16 is asked for there.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterable

import torch

#: ``decoding.precision`` / ``train.precision`` -> the autocast dtype (None: plain fp32).
PRECISIONS: dict[str, torch.dtype | None] = {
    "fp32": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


@functools.cache
def native_bf16() -> bool:
    """Whether this machine computes bf16 matrix products in hardware."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


@functools.cache
def resolve(precision: str) -> str:
    """The precision that runs here: ``auto`` made concrete; emulated bf16 warned about once."""
    if precision == "auto":
        return "bf16" if native_bf16() else "fp32"
    if precision not in PRECISIONS:
        known = ", ".join([*PRECISIONS, "auto"])
        raise ValueError(f"unknown precision {precision!r}; known: {known}")
    if precision == "bf16" and not native_bf16():
        warnings.warn(
            "precision bf16 on a CPU without bf16 matrix units (AMX, AVX512-BF16) is "
            "emulated and several times slower than fp32; use precision auto or fp32",
            stacklevel=2,
        )
    return precision


def autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """A block whose forward passes on ``device`` compute in ``precision``.

    fp16 is refused off a GPU: CPU fp16 kernels are slow and fp16 without loss scaling
    underflows; bf16 has fp32's exponent range and needs neither.
    """
    dtype = PRECISIONS[resolve(precision)]
    device = torch.device(device)
    if dtype is None:
        return contextlib.nullcontext()
    if dtype is torch.float16 and device.type != "cuda":
        raise ValueError(
            f"precision fp16 needs a GPU but the model is on {device.type}; use bf16 (or fp32)"
        )
    return torch.autocast(device.type, dtype=dtype)


def compute_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype that matrix products run in here: autocast's where it is on, else fp32."""
    kind = torch.device(device).type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else torch.float32


def weights_dtype(precisions: Iterable[str]) -> torch.dtype:
    """The dtype to store a frozen base in, given the precision of every forward run on it.

    Half precision when they all compute in the same half dtype, else fp32.  Autocast caches
    its casts only for weights that require grad, so fp32 frozen weights are cast again at
    every forward: at decoding batch sizes that costs more than the half-precision matrix units
    save.  Stored in bf16 the base is cast never and holds half the memory.  (PEFT keeps the
    adapters it adds in fp32 over a half-precision base.)
    """
    dtypes = {PRECISIONS[resolve(p)] for p in precisions}
    half = dtypes.pop() if len(dtypes) == 1 else None
    return half if half is not None else torch.float32
