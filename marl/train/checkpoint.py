"""Checkpoints that survive crashes: written to a temp folder, then renamed into place
(:func:`marl.infra.atomic.atomic_write`); where they live is :mod:`marl.infra.layout`'s.

Layout of ``RUN/checkpoints/step_000010/``::

    adapters/<role>/            PEFT adapter folders (adapter_config.json + safetensors)
    optimizer/<model>.safetensors + .json   optimizer tensors + their structure
    league/<snapshot>.safetensors           league pool weights
    state.json                  step, league results, estimator state, counters
    team.yaml                   the resolved config
    topology.safetensors        learned edge logits (learnable topologies; see marl.train.topology)
    topology_optimizer.safetensors + .json   their Adam state
    magnet/<role>.safetensors   the magnet adapters' weights (train.magnet; see marl.train.magnet)

``RUN/latest`` names the newest complete checkpoint; it is replaced atomically after the rename,
so a kill at any moment leaves either the old or the new checkpoint, never half of one.
``RUN/best`` (games with an exact evaluation) names the checkpoint of the lowest
exploitability measured so far, written the same way.
Nothing here pickles: tensors go to safetensors, everything else to JSON/YAML.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from peft import LoraConfig
from safetensors.torch import load_file, save_file

from marl.agents.host.adapters import ADAPTER_WEIGHTS, AdapterMismatch, read_adapter_file
from marl.config import TeamConfig
from marl.infra.atomic import atomic_write
from marl.infra.layout import (
    LATEST,
    LEAGUE,
    STATE_FILE,
    TEAM_FILE,
    adapter_folder,
    checkpoint_dir,
    point,
    snapshot_file,
)
from marl.infra.seats import ParticipantId
from marl.train.league import Weights


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))


def save_adapter_folder(weights: dict[str, torch.Tensor], role, path: Path) -> None:
    """A PEFT adapter folder from weights alone (the driver may not hold the model)."""
    path.mkdir(parents=True, exist_ok=True)
    a = role.adapter
    LoraConfig(
        r=a.r,
        lora_alpha=a.alpha,
        lora_dropout=a.dropout,
        target_modules=a.targets,
        task_type="CAUSAL_LM",
    ).save_pretrained(str(path))
    _save_tensors(weights, path / ADAPTER_WEIGHTS)


def _flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for idx, st in state["state"].items():
        for name, v in st.items():
            if torch.is_tensor(v):
                tensors[f"{idx}.{name}"] = v
            else:
                scalars[f"{idx}.{name}"] = v
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for key, v in [*tensors.items(), *meta["scalars"].items()]:
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = v
    return {"state": state, "param_groups": meta["param_groups"]}


def save_optimizer_state(state: dict, stem: Path, **meta: object) -> None:
    """A torch optimizer ``state_dict`` as ``stem.safetensors`` (tensors) + ``stem.json``."""
    tensors, structure = _flatten_optimizer(state)
    _save_tensors(tensors, stem.with_suffix(".safetensors"))
    stem.with_suffix(".json").write_text(json.dumps({**meta, **structure}))


def load_optimizer_state(stem: Path) -> tuple[dict, dict]:
    """(state_dict, the extra metadata) written by :func:`save_optimizer_state`."""
    meta = json.loads(stem.with_suffix(".json").read_text())
    tensors = load_file(str(stem.with_suffix(".safetensors")))
    structure = {k: meta.pop(k) for k in ("param_groups", "scalars")}
    return _unflatten_optimizer(tensors, structure), meta


@dataclass
class Checkpoint:
    step: int
    path: Path
    weights: Weights
    optimizer_states: dict[str, dict]
    snapshots: dict[ParticipantId, Weights]
    state: dict


def save_checkpoint(
    run: Path,
    step: int,
    cfg: TeamConfig,
    weights: Weights,
    optimizer_states: dict[str, dict],
    snapshots: Mapping[ParticipantId, Weights],
    state: dict,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` and point ``RUN/latest`` at it; ``extra(folder)`` adds
    files (e.g. a learned topology) before the folder is renamed into place, so they are as
    atomic as the rest."""
    final = checkpoint_dir(run, step)
    with atomic_write(final) as tmp:
        for role, sd in weights.items():
            save_adapter_folder(sd, cfg.role(role), adapter_folder(tmp, role))
        (tmp / "optimizer").mkdir()
        for i, (key, opt) in enumerate(optimizer_states.items()):
            save_optimizer_state(opt, tmp / "optimizer" / str(i), model=key)
        (tmp / LEAGUE).mkdir()
        for sid, w in snapshots.items():
            flat = {f"{role}::{k}": v for role, sd in w.items() for k, v in sd.items()}
            _save_tensors(flat, snapshot_file(tmp, str(sid)))
        (tmp / STATE_FILE).write_text(json.dumps({"step": step, **state}, indent=1))
        (tmp / TEAM_FILE).write_text(
            yaml.safe_dump(cfg.model_dump(by_alias=True, mode="json"), sort_keys=False)
        )
        if extra is not None:
            extra(tmp)
    point(run, LATEST, final)
    return final


def load_adapter_weights(path: Path, expected: Weights) -> Weights:
    """Each role's adapter tensors in checkpoint ``path``, checked against ``expected`` (the
    adapters the run trains, role -> name -> tensor; :func:`read_adapter_file`)."""
    weights = {}
    for role, tensors in expected.items():
        file = adapter_folder(path, role) / ADAPTER_WEIGHTS
        if not file.is_file():
            raise AdapterMismatch(f"{file} is missing: the checkpoint has no adapter for {role!r}")
        weights[role] = read_adapter_file(file, tensors)
    return weights


def load_checkpoint(path: Path, expected: Weights) -> Checkpoint:
    """The checkpoint in ``path``; its adapters are checked against ``expected`` (the run's
    adapters, as :meth:`Runtime.weights` gives them), so a damaged one is refused by name."""
    state = json.loads((path / STATE_FILE).read_text())
    weights = load_adapter_weights(path, expected)
    optimizer_states = {}
    for meta_file in sorted((path / "optimizer").glob("*.json")):
        opt, meta = load_optimizer_state(meta_file.with_suffix(""))
        optimizer_states[meta["model"]] = opt
    snapshots: dict[ParticipantId, Weights] = {}
    for sid in state.get("league", {}).get("snapshots", []):
        flat = load_file(str(snapshot_file(path, sid)))
        w: Weights = {}
        for k, v in flat.items():
            role, name = k.split("::", 1)
            w.setdefault(role, {})[name] = v
        snapshots[ParticipantId.parse(sid)] = w
    return Checkpoint(state["step"], path, weights, optimizer_states, snapshots, state)
