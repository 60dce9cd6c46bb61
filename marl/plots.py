"""Learning curves of a run as one PNG (matplotlib, no display needed)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import matplotlib

from infra.layout import METRICS

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)


def read_metrics(run: Path) -> list[dict]:
    lines = (run / METRICS).read_text().splitlines()
    return [json.loads(ln) for ln in lines if ln.strip()]


def _series(rows: list[dict], pick) -> dict[str, tuple[list[int], list[float]]]:
    """name -> (steps, values) for every (name, value) that ``pick(row)`` yields."""
    out: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for r in rows:
        for name, v in pick(r):
            if v is not None:
                out[name][0].append(r["step"])
                out[name][1].append(float(v))
    return dict(out)


PANELS = {
    "reward per agent": lambda r: [(k, v["reward"]) for k, v in r.get("agents", {}).items()],
    "win rate per agent": lambda r: [(k, v["win_rate"])
                                     for k, v in r.get("agents", {}).items()],
    "gradient norm per agent": lambda r: [(k, v) for lr in r.get("learner", {}).values()
                                          for k, v in lr["agent_grad_norms"].items()],
    "KL / entropy": lambda r: [(f"{k} {m}", lr[m]) for k, lr in r.get("learner", {}).items()
                               for m in ("kl", "entropy")],
    "evaluation": lambda r: list(r.get("eval", {}).items()),
    "parse-error rate": lambda r: ([("parse errors", r["parse_error_rate"])]
                                   if "parse_error_rate" in r else []),
    "edge probabilities": lambda r: list(r.get("topology", {}).get("edge_probs", {}).items()),
    "team task: score, messages, utility": lambda r: [
        (k, r["topology"][k]) for k in ("score", "messages_per_task", "utility")
        if k in r.get("topology", {})],
}


def plot_run(run: Path, out: Path | None = None) -> Path:
    rows = read_metrics(run)
    panels = {t: _series(rows, f) for t, f in PANELS.items()}
    panels = {t: s for t, s in panels.items() if s}
    cols = 2
    n_rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(n_rows, cols, figsize=(12, 3.6 * n_rows), squeeze=False)
    for ax, (title, series) in zip(axes.flat, panels.items(), strict=False):
        for name, (xs, ys) in sorted(series.items()):
            ax.plot(xs, ys, marker="." if len(xs) < 40 else None, label=name)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(series) <= 8:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"run {run.name}")
    fig.tight_layout()
    out = out or run / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
