"""Learning curves of a run as one PNG (matplotlib, no display needed)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import matplotlib

from marl.infra.atomic import atomic_write
from marl.infra.jsonl import complete_lines
from marl.infra.layout import METRICS

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)


def read_metrics(run: Path) -> list[dict]:
    """The run's complete metrics lines (a line torn by a kill is left out)."""
    lines, _torn = complete_lines(run / METRICS)
    return [json.loads(ln) for ln in lines if ln.strip()]


Series = dict[str, tuple[list[int], list[float]]]


def _number(v) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _series(rows: list[dict], pick) -> Series:
    """name -> (steps, values) for every (name, value) that ``pick(row)`` yields; a row or
    value that is missing or not a number is skipped (a line may lack any field)."""
    out: Series = defaultdict(lambda: ([], []))
    for r in rows:
        if _number(r.get("step")) is None:
            continue
        for name, v in pick(r):
            if _number(v) is not None:
                out[name][0].append(r["step"])
                out[name][1].append(float(v))
    return dict(out)


def _dicts(value) -> dict:
    return value if isinstance(value, dict) else {}


def _per_agent(field: str):
    return lambda r: [(k, _dicts(v).get(field)) for k, v in _dicts(r.get("agents")).items()]


PANELS = {
    "reward per agent": _per_agent("reward"),
    "win rate per agent": _per_agent("win_rate"),
    "gradient norm per agent": lambda r: [
        (k, v)
        for lr in _dicts(r.get("learner")).values()
        for k, v in _dicts(_dicts(lr).get("agent_grad_norms")).items()
    ],
    "KL / entropy": lambda r: [
        (f"{k} {m}", _dicts(lr).get(m))
        for k, lr in _dicts(r.get("learner")).items()
        for m in ("kl", "entropy")
    ],
    "evaluation": lambda r: [
        *_dicts(r.get("eval")).items(),
        (
            "exploitability, read from the step's decisions",
            _dicts(r.get("states")).get("exploitability"),
        ),
    ],
    "policy targets: KL to the targets": lambda r: [
        (f"{k} {label}", _dicts(lr).get(m))
        for k, lr in _dicts(r.get("learner")).items()
        if "fit_residual" in _dicts(lr)
        for m, label in (("loss", "before the fit"), ("fit_residual", "after"))
    ],
    "unplayable answers": lambda r: [
        ("parse errors", r.get("parse_error_rate")),
        ("illegal moves", r.get("illegal_move_rate")),
    ],
    "edge probabilities": lambda r: list(
        _dicts(_dicts(r.get("topology")).get("edge_probs")).items()
    ),
    "team task: score, messages, utility": lambda r: [
        (k, _dicts(r.get("topology")).get(k)) for k in ("score", "messages_per_task", "utility")
    ],
}

SNAPSHOT = "snap:"  # league snapshot opponents are named snap:<step>@<seat>


def _band_key(name: str) -> str | None:
    """The band a series joins: league snapshots, one band per seat; None for the rest."""
    if not name.startswith(SNAPSHOT):
        return None
    _, at, seat = name.partition("@")
    return f"league snapshots{'@' + seat if at else ''}"


def _draw(ax, series: Series) -> None:
    """One line per series, except league snapshots: one mean line per seat with a min-max
    band over the snapshots met at each step (dozens of snapshot lines are unreadable)."""
    bands: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    counts: dict[str, int] = defaultdict(int)
    for name, (xs, ys) in sorted(series.items()):
        key = _band_key(name)
        if key is None:
            ax.plot(xs, ys, marker="." if len(xs) < 40 else None, label=name)
            continue
        counts[key] += 1
        for x, y in zip(xs, ys, strict=True):
            bands[key][x].append(y)
    for key, by_step in sorted(bands.items()):
        steps = sorted(by_step)
        lo, hi = [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps]
        mean = [sum(by_step[s]) / len(by_step[s]) for s in steps]
        (line,) = ax.plot(
            steps, mean, linestyle="--", label=f"{key} (mean of {counts[key]}; band: min-max)"
        )
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2)


def plot_run(run: Path, out: Path | None = None) -> Path:
    rows = read_metrics(run)
    panels = {t: _series(rows, f) for t, f in PANELS.items()}
    panels = {t: s for t, s in panels.items() if s}
    cols = 2
    n_rows = max(1, (len(panels) + cols - 1) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(12, 3.6 * n_rows), squeeze=False)
    for ax, (title, series) in zip(axes.flat, panels.items(), strict=False):
        _draw(ax, series)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(ax.get_legend_handles_labels()[0]) <= 8:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"run {run.name}")
    fig.tight_layout()
    out = out or run / "curves.png"
    try:
        if out.exists() and not out.is_file():  # a device or pipe: written, never replaced
            fig.savefig(out, dpi=110, format="png")
        else:
            with atomic_write(out, folder=False) as tmp:
                fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return out
