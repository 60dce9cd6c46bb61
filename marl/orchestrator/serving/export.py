"""Export a trained team as a self-contained folder that :meth:`Team.load` runs offline.

``export_run(RUN or checkpoint, OUT)`` writes::

    OUT/team.yaml                the resolved config: the learned topology, if any, deployed
                                 as explicit edges (a plain, editable, fixed graph)
    OUT/adapters/<role>/         PEFT folders (adapter_config.json + adapter_model.safetensors)
    OUT/topology.safetensors     the learned edge probabilities (pictures: marl topology show)
    OUT/export.json              provenance: source checkpoint, step, base models, format
    OUT/README.md                a model card with the training figures from metrics.jsonl
                                 (:mod:`marl.orchestrator.serving.card`)

Base weights are not copied: roles name their model (a registry name such as
``smollm2-135m-instruct``, converted once into ``$MARL_HOME``; a Hugging Face id; a path), the
same reference training used.  The folder is written next to OUT and renamed into place
(:func:`marl.infra.atomic.atomic_write`), so a failed export never leaves half a team behind.
Each adapter is loaded into its base model before it is copied, so a damaged one (cut short,
a tensor missing, of another shape or not floating point) is refused by name, not exported.

An export deletes nothing but an earlier export: OUT may not be, hold or sit inside the run or
checkpoint it is made from, and ``overwrite`` replaces only a folder whose ``export.json``
carries :data:`EXPORT_FORMAT`.
"""

from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from marl.config import TeamConfig, TopologyConfig, load_config
from marl.infra.atomic import atomic_write
from marl.infra.layout import METRICS, STATE_FILE, TEAM_FILE, TOPOLOGY_FILE, adapter_folder, resolve
from marl.orchestrator.serving.card import model_card
from marl.topologies import LearnableTopology, Topology, build_topology

EXPORT_FORMAT = "marl-teams/team-export/v1"
MANIFEST = "export.json"  # with EXPORT_FORMAT: the marker of a folder an export may replace


class ExportError(ValueError):
    """A folder that cannot be exported; the message says why."""


def deployed_topology_config(cfg: TeamConfig, topology: Topology) -> TopologyConfig:
    """A fixed graph as a config section: explicit agent-level edges, exact temporal edges,
    the decision agent, and ``prune`` (a learned graph may cut agents off)."""
    vote = cfg.topology.decision == "vote"
    return TopologyConfig(
        kind="explicit",
        rounds=topology.rounds,
        edges=[tuple(e) for e in topology.spatial_edges],
        temporal_edges=[tuple(e) for e in topology.temporal_edges],
        final=None if vote else topology.final,
        decision=cfg.topology.decision,
        prune=True,
    )


def read_metrics(run: Path | None, step: int | None = None) -> list[dict[str, Any]]:
    """The run's metrics lines up to ``step`` (unreadable lines skipped)."""
    if run is None or not (run / METRICS).is_file():
        return []
    out = []
    for line in (run / METRICS).read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and (step is None or row.get("step", 0) <= step):
            out.append(row)
    return out


def training_summary(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps, the last step's per-agent reward and win rate, first/last exploitability."""
    if not metrics:
        return {}
    last = metrics[-1]
    summary: dict[str, Any] = {
        "steps": last.get("step", len(metrics)),
        "rewards": {
            k: {"reward": v.get("reward"), "win_rate": v.get("win_rate")}
            for k, v in (last.get("agents") or {}).items()
        },
    }
    expl = [
        (m.get("step"), m["eval"]["exploitability"])
        for m in metrics
        if isinstance(m.get("eval"), dict) and "exploitability" in m["eval"]
    ]
    if expl:
        summary["exploitability"] = {
            "first": {"step": expl[0][0], "value": expl[0][1]},
            "last": {"step": expl[-1][0], "value": expl[-1][1]},
        }
    return summary


def export_run(
    source: str | Path, out: str | Path, *, overwrite: bool = False, threshold: float = 0.5
) -> Path:
    """Write the team of a run (its latest checkpoint, or the one its ``best``/``latest``
    pointer names) or a checkpoint to ``out``.

    A learnable topology saved with the checkpoint (``topology.safetensors``) is deployed
    (edges with p > ``threshold``) and written into team.yaml as explicit edges; otherwise the
    configured topology is kept.  Returns ``out``.
    """
    folder, run = resolve(source)
    team_file = folder / TEAM_FILE
    if not team_file.is_file():
        raise ExportError(
            f"{source}: no team.yaml in {folder} (expected a run folder with "
            "`latest`, or a checkpoint folder)"
        )
    out = Path(out)
    check_output(out, [folder] + ([run] if run is not None else []), overwrite)
    cfg = load_config(team_file)
    step = _json(folder / STATE_FILE).get("step")
    learned_file = folder / TOPOLOGY_FILE
    learned = LearnableTopology.load(learned_file) if learned_file.is_file() else None
    resolved = cfg
    if learned is not None:
        deployed = learned.deploy(threshold=threshold)
        resolved = cfg.model_copy(update={"topology": deployed_topology_config(cfg, deployed)})
    topology = build_topology(resolved)
    check_adapters(cfg, folder)
    with atomic_write(out) as tmp:
        (tmp / TEAM_FILE).write_text(_team_yaml(resolved, source=folder, step=step))
        copy_adapters(cfg, folder, tmp)
        if learned is not None:
            shutil.copy2(learned_file, tmp / TOPOLOGY_FILE)
        manifest = {
            "format": EXPORT_FORMAT,
            "team": cfg.name,
            "source": str(folder.resolve()),
            "step": step,
            "models": {r.name: r.model for r in cfg.roles},
            "adapters": {r.name: f"adapters/{r.name}" for r in cfg.roles if r.adapter},
            "topology": "learned" if learned is not None else "configured",
            "messages_per_task": topology.num_messages(),
            "exported": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "training": training_summary(read_metrics(run, step)),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        (tmp / "README.md").write_text(model_card(resolved, topology, manifest, learned, threshold))
        load_config(tmp / TEAM_FILE)  # what we wrote must load
    return out


def check_adapters(cfg: TeamConfig, folder: Path) -> None:
    """Every trainable role of ``cfg`` has its trained adapter in ``folder``, and it loads
    into the role's base model (each tensor's name, shape and dtype checked)."""
    from marl.agents.builder import RosterError, load_trained_adapters
    from marl.agents.models import ModelError

    missing = [
        r.name
        for r in cfg.roles
        if r.adapter is not None
        and not (adapter_folder(folder, r.name) / "adapter_config.json").is_file()
    ]
    if missing:
        raise ExportError(
            f"{folder} has no trained adapter for roles {', '.join(missing)} "
            "(adapters/<role>/adapter_config.json)"
        )
    trained = {r.name: adapter_folder(folder, r.name) for r in cfg.roles if r.adapter is not None}
    try:
        load_trained_adapters(cfg, trained)
    except (RosterError, ModelError) as exc:
        raise ExportError(f"nothing was exported: {exc}") from None


def copy_adapters(cfg: TeamConfig, folder: Path, out: Path) -> None:
    """The PEFT folders of ``cfg``'s trainable roles, from checkpoint ``folder`` to ``out``."""
    for role in cfg.roles:
        if role.adapter is not None:
            src, dst = adapter_folder(folder, role.name), adapter_folder(out, role.name)
            dst.mkdir(parents=True)
            for name in ("adapter_config.json", "adapter_model.safetensors"):
                shutil.copy2(src / name, dst / name)


def is_export(folder: Path) -> bool:
    """Whether ``folder`` was written by :func:`export_run` (its manifest names the format)."""
    return _json(folder / MANIFEST).get("format") == EXPORT_FORMAT


def check_output(out: Path, sources: list[Path], overwrite: bool) -> None:
    """Refuse an ``out`` whose writing would delete or nest in what is exported, and a
    non-empty one unless ``overwrite`` and it is an earlier export."""
    target = out.resolve()
    for source in (s.resolve() for s in sources):
        where = (
            "is"
            if target == source
            else "contains"
            if target in source.parents
            else "is inside"
            if source in target.parents
            else None
        )
        if where is not None:
            raise ExportError(
                f"--out {out} {where} the exported folder {source}; choose a folder outside it"
            )
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ExportError(f"--out {out} is not a plain folder")
    if not out.exists() or not any(out.iterdir()):
        return
    if not overwrite:
        raise ExportError(f"{out} exists and is not empty (pass overwrite / --force)")
    if not is_export(out):
        raise ExportError(
            f"{out} is not an earlier export (no {MANIFEST} of {EXPORT_FORMAT}): "
            "--force replaces only an export; choose another --out"
        )


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _team_yaml(cfg: TeamConfig, source: Path, step: int | None) -> str:
    data = cfg.model_dump(by_alias=True, mode="json", exclude_none=True)
    head = (
        f"# Exported by marl-teams from {source.name}"
        + (f" (step {step})" if step is not None else "")
        + ".\n# Load with Team.load(<this folder>) or serve with `marl serve <this folder>`."
        "\n"
    )
    return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
