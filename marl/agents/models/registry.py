"""Named model specs and the one entry point, :func:`load_model`, that turns a reference into
``(model, tokenizer)``.

A reference is a registry name, a local directory (or ``.gguf`` file), or a Hugging Face id.
Registry models that need conversion are built once and cached under ``$MARL_HOME/models``.
"""

from __future__ import annotations

import difflib
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marl.agents.models.cache import atomic_model_dir, is_complete, model_cache_dir

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    ModelAndTokenizer = tuple[PreTrainedModel, PreTrainedTokenizerBase]

DEFAULT_MODEL = "smollm2-135m-instruct"


class ModelError(Exception):
    """A model reference could not be resolved or loaded; the message is meant for users."""


class UnknownModelError(ModelError):
    """Neither a registry name, an existing local path, nor a Hugging Face id."""


class ModelNotInstalledError(ModelError):
    """The package that ships a registry model's weights is not installed."""


class ModelVerificationError(ModelError):
    """A freshly converted model failed its sanity check, so it was not cached."""


@dataclass(frozen=True)
class ModelSpec:
    """How to obtain one named model.

    ``build`` returns an in-memory ``(model, tokenizer)``. With ``cache=True`` its output is
    saved once (safetensors + tokenizer files) and later loads read the cache; ``verify`` runs
    on the reloaded cache candidate before it is published. ``check_available`` raises
    :class:`ModelNotInstalledError` when the weights' source is missing, without building.
    """

    name: str
    description: str
    source: str
    build: Callable[[], ModelAndTokenizer]
    cache: bool = True
    verify: Callable[[PreTrainedModel, PreTrainedTokenizerBase], None] | None = None
    check_available: Callable[[], None] | None = None

    def cache_dir(self) -> Path:
        """Where the cached copy lives (meaningful only with ``cache=True``)."""
        return model_cache_dir(self.name)

    def is_cached(self) -> bool:
        """True when a complete cached copy exists."""
        return self.cache and is_complete(self.cache_dir())

    def needs_build(self) -> bool:
        """True when loading would run the (possibly slow) build first."""
        return self.cache and not self.is_cached()


MODEL_REGISTRY: dict[str, ModelSpec] = {}


def register_model(spec: ModelSpec, *, overwrite: bool = False) -> ModelSpec:
    """Add ``spec`` to the registry; refuses silent replacement of an existing name."""
    if spec.name in MODEL_REGISTRY and not overwrite:
        raise ValueError(f"model {spec.name!r} is already registered")
    MODEL_REGISTRY[spec.name] = spec
    return spec


def list_models() -> list[ModelSpec]:
    """Registered specs, in registration order."""
    return list(MODEL_REGISTRY.values())


def get_model_spec(name: str) -> ModelSpec:
    """The spec registered as ``name``, or an :class:`UnknownModelError` with suggestions."""
    try:
        return MODEL_REGISTRY[name]
    except KeyError:
        close = [n for n in MODEL_REGISTRY if n.startswith(name)] or difflib.get_close_matches(
            name, MODEL_REGISTRY, n=1
        )
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownModelError(
            f"unknown model {name!r}{hint} (registry: {', '.join(MODEL_REGISTRY)}; "
            "Hugging Face ids look like 'org/name')"
        ) from None


def _resolve_dtype(dtype: torch.dtype | str) -> torch.dtype | str:
    import torch

    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return resolved


def _load_dir(path: str | Path, dtype: torch.dtype | str, **kwargs: Any) -> ModelAndTokenizer:
    """Load a saved (or GGUF, via ``gguf_file``) model directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    model.eval()
    return model, tokenizer


def save_model_dir(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    """Write weights as safetensors plus tokenizer files (and chat template) into ``path``."""
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def ensure_cached(spec: ModelSpec) -> Path:
    """Build ``spec`` into its cache directory unless already there; returns the directory."""
    final = spec.cache_dir()
    if is_complete(final):
        return final
    if spec.check_available is not None:
        spec.check_available()

    def write(tmp: Path) -> None:
        model, tokenizer = spec.build()
        save_model_dir(model, tokenizer, tmp)
        del model
        if spec.verify is not None:
            spec.verify(*_load_dir(tmp, "auto", local_files_only=True))

    import transformers

    manifest = {
        "source": spec.source,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    return atomic_model_dir(final, write, manifest)


_PATHLIKE = re.compile(r"^(\.{1,2}|~)?[/\\]|^\.{1,2}$|[/\\].*[/\\]|\\")
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def load_model(ref: str = DEFAULT_MODEL, dtype: torch.dtype | str = "float32") -> ModelAndTokenizer:
    """Load ``ref`` as ``(model, tokenizer)`` in eval mode.

    ``ref`` is tried as: registry name, then an existing local directory or ``.gguf`` file,
    then a Hugging Face id ``org/name`` (hub or local HF cache). Anything else raises
    :class:`UnknownModelError`. ``dtype`` is a torch dtype, its name, or ``"auto"``.
    """
    torch_dtype = _resolve_dtype(dtype)
    if ref in MODEL_REGISTRY:
        return _load_registered(MODEL_REGISTRY[ref], torch_dtype)
    local = _load_local(ref, torch_dtype)
    if local is not None:
        return local
    return _load_hub(ref, torch_dtype)


def _load_registered(spec: ModelSpec, torch_dtype: torch.dtype | str) -> ModelAndTokenizer:
    """A registry entry: from its cached folder, or built in memory (the tiny random model)."""
    if spec.cache:
        return _load_dir(ensure_cached(spec), torch_dtype, local_files_only=True)
    model, tokenizer = spec.build()
    if torch_dtype != "auto":
        model = model.to(torch_dtype)
    return model.eval(), tokenizer


def _load_local(ref: str, torch_dtype: torch.dtype | str) -> ModelAndTokenizer | None:
    """A saved model directory or a ``.gguf`` file at ``ref``; None when there is neither."""
    path = Path(ref).expanduser()
    local: dict[str, Any] | None = None
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{ref!r} has no config.json, so it is not a saved model directory")
        local = {"path": path}
    elif path.is_file() and path.suffix == ".gguf":
        local = {"path": path.parent, "gguf_file": path.name}
    if local is None:
        return None
    try:
        return _load_dir(dtype=torch_dtype, local_files_only=True, **local)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{ref!r} is not a loadable model: {_first_line(exc)}") from exc


def _load_hub(ref: str, torch_dtype: torch.dtype | str) -> ModelAndTokenizer:
    """A Hugging Face id: the local HF cache first, then the hub."""
    path = Path(ref).expanduser()
    if _PATHLIKE.search(ref) or path.suffix == ".gguf":
        raise UnknownModelError(f"no model at local path {ref!r} (not a directory or .gguf file)")
    if not _HF_ID.match(ref):
        get_model_spec(ref)  # raises with suggestions
    try:
        # The local HF cache first: no network round trips (or retries) for cached models.
        return _load_dir(ref, torch_dtype, local_files_only=True)
    except OSError:
        pass
    try:
        return _load_dir(ref, torch_dtype)
    except OSError as exc:
        raise ModelError(f"could not load Hugging Face model {ref!r}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
