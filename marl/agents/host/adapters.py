"""LoRA adapters on the host's base model: add, load (checked), save, weights in and out,
activation per block, and the public view the learner trains through.

Every saved adapter is read through :func:`read_adapter_file`, against the tensors of the
adapter it goes into: a damaged file (cut short, a tensor missing, another shape, integer
tensors) is one :class:`AdapterMismatch` naming the file and the tensor, never a traceback
from deep in safetensors or PEFT, nor a network loaded half or cast in silence.

Roles name their adapter; the host switches adapters per batch (PEFT ``set_adapter``), so the
base weights exist once.  A block without an adapter runs the base with every adapter
disabled (also the frozen reference a KL term compares against).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


class AdapterMismatch(ValueError):
    """A saved adapter that cannot be read or does not fit the adapter it goes into; the
    message names the file (and the tensor)."""


def read_adapter_file(file: Path, expected: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of a saved adapter, checked against ``expected`` (the adapter they go
    into, name -> tensor): a readable safetensors file with the same tensor names, each of the
    same shape and of a floating-point dtype, every value finite (training never saves
    anything else)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        weights = load_file(str(file))
    except (SafetensorError, OSError) as exc:
        raise AdapterMismatch(f"{file}: not a readable safetensors file ({exc})") from None
    for names, why in (
        (sorted(set(expected) - set(weights)), "is missing"),
        (sorted(set(weights) - set(expected)), "is no parameter of this adapter"),
    ):
        if names:
            more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
            raise AdapterMismatch(
                f"{file}: tensor {names[0]} {why}{more}; the file is damaged or was "
                "written for other adapter.targets"
            )
    for name, want in expected.items():
        got = weights[name]
        if not got.is_floating_point():
            raise AdapterMismatch(f"{file}: tensor {name} is {got.dtype}, not floating point")
        if got.shape != want.shape:
            raise AdapterMismatch(
                f"{file}: tensor {name} has shape {list(got.shape)} but the model's "
                f"adapter has {list(want.shape)}; check adapter.r and the base model"
            )
        if not torch.isfinite(got).all():
            raise AdapterMismatch(f"{file}: tensor {name} holds NaN or infinite values")
    return weights


def read_adapter_config(path: Path) -> LoraConfig:
    """The LoRA settings of the PEFT folder ``path`` (JSON only)."""
    try:
        return LoraConfig.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as exc:
        raise AdapterMismatch(
            f"{path / ADAPTER_CONFIG}: not a readable LoRA config ({exc})"
        ) from None


def _owner(param_name: str, adapters: list[str]) -> str | None:
    """The adapter a parameter belongs to (None: the base; "?": an adapter not listed)."""
    if "lora_" not in param_name:
        return None
    return next((a for a in adapters if f".{a}." in f"{param_name}."), "?")


class Adapters:
    """Named LoRA adapters on one base model (a :class:`ModelHost` part)."""

    model: torch.nn.Module
    adapters: list[str]
    _active: str | None
    _disabled: bool
    _memo: dict[str | None, dict[tuple, float]]
    _owners: dict[str | None, list[torch.Tensor]] | None

    def add_adapter(
        self,
        name: str,
        r: int = 8,
        alpha: int = 16,
        dropout: float = 0.0,
        targets: Sequence[str] = ("q_proj", "v_proj"),
        seed: int = 0,
    ) -> None:
        """Attach a fresh LoRA adapter (B = 0, so it starts equal to the base model).

        A is drawn under ``seed`` (not the global RNG), so a run is reproducible.  Targets
        that name no module of the model are a :class:`~marl.agents.models.ModelError`.
        """
        from marl.agents.models import ModelError

        cfg = LoraConfig(
            r=r,
            lora_alpha=alpha,
            lora_dropout=dropout,
            target_modules=list(targets),
            task_type="CAUSAL_LM",
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            try:
                if isinstance(self.model, PeftModel):
                    self.model.add_adapter(name, cfg)
                else:
                    self.model = get_peft_model(self.model, cfg, adapter_name=name).eval()
                    self._active = name
            except ValueError as exc:
                raise ModelError(
                    f"role {name!r}: adapter.targets {list(targets)} match no "
                    f"module of the model ({exc})"
                ) from None
        self.adapters.append(name)
        self._forget(name)

    def save_adapter(self, name: str, path: str | Path) -> None:
        """Write one adapter as a PEFT folder (adapter_config.json + safetensors weights)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(path), selected_adapters=[name], safe_serialization=True)
        nested = path / name  # PEFT nests non-default adapters in a sub-folder
        if nested.is_dir():
            for f in nested.iterdir():
                f.replace(path / f.name)
            nested.rmdir()

    def load_adapter(self, name: str, path: str | Path, trainable: bool = False) -> None:
        """Load a saved PEFT folder as adapter ``name``, reading JSON and safetensors only,
        every tensor checked (:func:`read_adapter_file`).

        A ``name`` the host already holds (a role's adapter, built from its config) takes the
        folder's weights, and the two must agree: a different rank, alpha or set of tensors
        would otherwise load a different network silently (:class:`AdapterMismatch`).  A new
        ``name`` is attached with the folder's own settings (and removed again if its weights
        do not fit).
        """
        path = Path(path)
        if not (path / ADAPTER_CONFIG).is_file() or not (path / ADAPTER_WEIGHTS).is_file():
            raise FileNotFoundError(
                f"{path} is not a PEFT adapter folder (needs {ADAPTER_CONFIG} and "
                f"{ADAPTER_WEIGHTS})"
            )
        if name in self.adapters:
            self._fill_adapter(name, path)
            return
        config = read_adapter_config(path)
        config.inference_mode = not trainable
        if isinstance(self.model, PeftModel):
            self.model.add_adapter(name, config)
        else:
            self.model = get_peft_model(self.model, config, adapter_name=name).eval()
            self._active = name
        self.adapters.append(name)
        self._forget(name)
        try:
            self._fill_adapter(name, path)
        except AdapterMismatch:
            self.delete_adapter(name)
            if self._active == name:
                self._active = None
            raise

    def _fill_adapter(self, name: str, path: Path) -> None:
        """The weights of the PEFT folder ``path`` into the existing adapter ``name``."""
        saved = read_adapter_config(path)
        current = self.adapter_config(name)
        for key in ("r", "lora_alpha"):
            if getattr(saved, key) != getattr(current, key):
                raise AdapterMismatch(
                    f"{path / ADAPTER_CONFIG} has {key}={getattr(saved, key)} but the config "
                    f"says {getattr(current, key)}"
                )
        weights = read_adapter_file(path / ADAPTER_WEIGHTS, self.adapter_weights(name))
        self.set_adapter_weights(name, weights)

    @contextlib.contextmanager
    def use(self, adapter: str | None) -> Iterator[None]:
        """Run the block with ``adapter`` active, or with every adapter disabled for ``None``;
        the adapter active before comes back afterwards (PEFT's ``set_adapter`` also makes the
        active adapter the only trainable one, so a nested block must hand it back). Blocks
        nest either way: an adapter's block inside the base model's switches the layers on."""
        if not isinstance(self.model, PeftModel):
            if adapter is not None:
                raise KeyError(f"no adapter {adapter!r}: this model has none")
            yield
        elif adapter is None:
            previous, self._active = self._active, None
            disabled, self._disabled = self._disabled, True
            try:
                with self.model.disable_adapter():
                    yield
            finally:
                self._active, self._disabled = previous, disabled
                if previous is not None:  # a nested block may have activated another
                    self._set_adapter(previous)
        else:
            if adapter not in self.adapters:
                raise KeyError(f"no adapter {adapter!r}; known: {self.adapters}")
            previous, disabled = self._active, self._disabled
            if disabled:  # inside use(None): switch the layers back on for this block
                self.model.base_model.enable_adapter_layers()
                self._disabled = False
            self._set_adapter(adapter)
            self._active = adapter
            try:
                yield
            finally:
                if previous is not None and previous != adapter:
                    self._set_adapter(previous)
                if disabled:
                    self.model.base_model.disable_adapter_layers()
                    self._disabled = True
                if previous is not None or disabled:  # else the adapter stays set, and active
                    self._active = previous

    def _set_adapter(self, adapter: str) -> None:
        """PEFT's ``set_adapter`` walks every module (~25 ms) and a rollout step asks for the
        same adapter hundreds of times: call it only when PEFT has another one active."""
        if getattr(self.model, "active_adapter", None) != adapter:
            self.model.set_adapter(adapter)

    def _forget(self, adapter: str) -> None:
        """An adapter was added or removed: its remembered scores and the owner map go."""
        self._memo.pop(adapter, None)
        self._owners = None

    def weights_version(self, adapter: str | None) -> tuple[int, ...]:
        """Changes whenever a parameter that ``adapter``'s scores depend on (its own and the
        base's) is written in place (optimizer steps, loading): torch bumps a tensor's version
        counter on every in-place operation."""
        if self._owners is None:
            self._owners = defaultdict(list)
            for name, p in self.model.named_parameters():
                self._owners[_owner(name, self.adapters)].append(p)
        base, own = self._owners[None], self._owners.get(adapter, []) if adapter else []
        return (len(base), sum(p._version for p in base), len(own), sum(p._version for p in own))

    def adapter_weights(self, name: str) -> dict[str, torch.Tensor]:
        """The adapter's tensors (CPU copies), keyed without the adapter name: what learners
        send to rollout workers and checkpoints store."""
        from peft import get_peft_model_state_dict

        sd = get_peft_model_state_dict(self.model, adapter_name=name)
        return {k: v.detach().cpu().clone() for k, v in sd.items()}

    def set_adapter_weights(self, name: str, weights: dict[str, torch.Tensor]) -> None:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.model, weights, adapter_name=name)
        bad = [k for k in result.unexpected_keys if "lora_" in k]
        if bad:
            raise KeyError(f"adapter weights do not fit adapter {name!r}: {bad[:3]}")

    def delete_adapter(self, name: str) -> None:
        self.model.delete_adapter(name)
        self.adapters.remove(name)
        self._forget(name)

    def adapter_parameters(self, *names: str) -> list[torch.nn.Parameter]:
        """The LoRA parameters of the named adapters, in the model's order: what a learner
        trains."""
        return [p for n, p in self.model.named_parameters() if _owner(n, self.adapters) in names]

    def base_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The base model's named parameters, every adapter's left out."""
        return [
            (n, p) for n, p in self.model.named_parameters() if _owner(n, self.adapters) is None
        ]

    def adapter_config(self, name: str) -> LoraConfig:
        """The LoRA settings adapter ``name`` was made with (rank, alpha, dropout, targets)."""
        return self.model.peft_config[name]
