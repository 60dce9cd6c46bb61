"""A tournament's report: CSV tables, two PNG charts and one HTML page that shows them.

``OUT/ratings.csv`` (name, rating, ci_low, ci_high, games, wins, draws, losses, mean_return
with its 95% interval return_low/return_high, nash_average with nash_low/nash_high and
nash_mass; rows in rank order: by the Nash average where the game scores margins, else by the
Bradley-Terry rating),
``OUT/payoff.csv`` (mean score of row vs column), ``OUT/returns.csv`` (mean return of row vs
column: chips in poker, where the score ignores margins), ``OUT/ratings.png`` (ratings with
their 95% intervals), ``OUT/payoff.png`` (the score matrix as a heatmap) and ``OUT/report.html``
(self-contained: inline style, the PNGs referenced beside it, so it opens without a server).
"""

from __future__ import annotations

import csv
import html
import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from rich.table import Table

from marl.orchestrator.arena.ratings import Rating, RatingReport

RATING_COLUMNS = (
    "name",
    "rating",
    "ci_low",
    "ci_high",
    "games",
    "wins",
    "draws",
    "losses",
    "mean_return",
    "return_low",
    "return_high",
    "nash_average",
    "nash_low",
    "nash_high",
    "nash_mass",
)


def _num(x: float, digits: int = 1) -> str:
    return "" if math.isnan(x) else f"{x:.{digits}f}"


def _score(r: Rating) -> float:
    return (r.wins + r.draws / 2) / r.games if r.games else math.nan


def write_ratings_csv(report: RatingReport, path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(RATING_COLUMNS)
        for r in report.ratings:
            w.writerow(
                [
                    r.name,
                    _num(r.rating, 2),
                    _num(r.ci_low, 2),
                    _num(r.ci_high, 2),
                    r.games,
                    r.wins,
                    r.draws,
                    r.losses,
                    _num(r.mean_return, 4),
                    _num(r.return_low, 4),
                    _num(r.return_high, 4),
                    _num(r.nash_average, 4),
                    _num(r.nash_low, 4),
                    _num(r.nash_high, 4),
                    _num(r.nash_mass, 4),
                ]
            )


def write_matrix_csv(names: list[str], matrix: np.ndarray, path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["row vs column", *names])
        for name, row in zip(names, matrix, strict=True):
            w.writerow([name, *(_num(float(v), 4) for v in row)])


def plot_ratings(report: RatingReport, path: Path, title: str) -> None:
    """Horizontal bars: each rating and its 95% bootstrap interval, best on top."""
    rows = report.ratings[::-1]
    fig = Figure(figsize=(7, 0.5 * len(rows) + 1.4))
    ax = fig.add_subplot()
    y = np.arange(len(rows))
    x = np.array([r.rating for r in rows])
    lo = np.array([r.ci_low for r in rows])
    hi = np.array([r.ci_high for r in rows])
    known = ~(np.isnan(lo) | np.isnan(hi))  # a fit at a bound may lie outside its interval
    ax.hlines(y[known], lo[known], hi[known], color="tab:blue")
    ax.plot(x, y, "o", color="tab:blue")
    ax.set_yticks(y, [r.name for r in rows])
    ax.axvline(next(r.rating for r in rows if r.name == report.anchor), color="0.7", lw=1, ls="--")
    ax.set_xlabel(f"rating (Elo-like points, {report.anchor} anchored; bars: 95% bootstrap)")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_payoff(report: RatingReport, path: Path, title: str) -> None:
    """Heatmap of the mean score of row vs column (0.5 = even), values written in the cells."""
    order = [report.players.index(r.name) for r in report.ratings]
    m = report.payoff[np.ix_(order, order)]
    names = [report.players[i] for i in order]
    size = 1.0 + 0.7 * len(names)
    fig = Figure(figsize=(size + 1.5, size))
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(m), cmap="RdBu", vmin=0, vmax=1)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    for i, j in np.ndindex(m.shape):
        if not math.isnan(m[i, j]):
            ax.text(
                j,
                i,
                f"{m[i, j]:.2f}",
                ha="center",
                va="center",
                fontsize=9,
                color="white" if abs(m[i, j] - 0.5) > 0.3 else "black",
            )
    fig.colorbar(im, ax=ax, label="mean score of row vs column")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def rating_rows(report: RatingReport) -> tuple[list[str], list[list[str]]]:
    """The rating table as text, shared by the screen and the HTML page; where the game
    scores margins the Nash average (chips against the field's Nash mixture) comes first."""
    skill = any(r.openskill for r in report.ratings)
    bt_head = ["rating", "95% CI", "W/D/L", "score"]
    ret_head = ["return", "return 95% CI"]
    nash_head = (
        ["Nash avg", "Nash 95% CI", "Nash p"] if report.by_return else ["Nash avg", "Nash p"]
    )
    header = (
        ["name", *nash_head, *ret_head, *bt_head]
        if report.by_return
        else ["name", *bt_head, *ret_head, *nash_head]
    )
    header += ["Elo"] + (["OpenSkill mu-3sigma"] if skill else [])
    rows = []
    for r in report.ratings:
        ci = "" if math.isnan(r.ci_low) else f"[{r.ci_low:.0f}, {r.ci_high:.0f}]"
        rci = "" if math.isnan(r.return_low) else f"[{r.return_low:.3f}, {r.return_high:.3f}]"
        nci = "" if math.isnan(r.nash_low) else f"[{r.nash_low:.3f}, {r.nash_high:.3f}]"
        bt = [f"{r.rating:.0f}", ci, f"{r.wins}/{r.draws}/{r.losses}", _num(_score(r), 2)]
        ret = [_num(r.mean_return, 3), rci]
        if report.by_return:
            row = [r.name, _num(r.nash_average, 3), nci, _num(r.nash_mass, 3), *ret, *bt]
        else:
            row = [r.name, *bt, *ret, _num(r.nash_average, 3), _num(r.nash_mass, 3)]
        row.append(f"{r.elo:.0f}")
        if skill:
            row.append(f"{r.openskill[0] - 3 * r.openskill[1]:.2f}" if r.openskill else "")
        rows.append(row)
    return header, rows


def summary_lines(report: RatingReport) -> list[str]:
    seats = ", ".join(f"seat {i + 1}: {_num(s, 3)}" for i, s in enumerate(report.seat_scores))
    ranked = (
        "ranked by the Nash average in chips (the game scores margins: the return "
        "against the field's Nash mixture), then the mean return against the field; 95% "
        "intervals by resampling deals"
        if report.by_return
        else "ranked by the Bradley-Terry rating"
    )
    return [
        f"{ranked}; Nash avg: mean return against the maximum-entropy Nash mixture of "
        "this field (Nash p), 0 for every player in it",
        f"mean score by seat ({seats}); first-seat advantage in the Bradley-Terry fit: "
        f"{report.home:+.0f} points",
        f"ratings: Bradley-Terry maximum likelihood, ties count half, 400 points = 10:1 "
        f"odds, {report.anchor} fixed; Elo: sequential, K = {report.elo_k:g}, match order",
        *report.notes,
    ]


def ratings_table(report: RatingReport, title: str) -> Table:
    """The rating table for the terminal (rich)."""
    header, rows = rating_rows(report)
    table = Table(title=title, caption="\n".join(summary_lines(report)))
    for h in header:
        table.add_column(h, justify="left" if h == "name" else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def write_report(report: RatingReport, out: Path, title: str) -> dict[str, Path]:
    """Write every report file into ``out``; returns them by name."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        name: out / name
        for name in (
            "ratings.csv",
            "payoff.csv",
            "returns.csv",
            "ratings.png",
            "payoff.png",
            "report.html",
        )
    }
    write_ratings_csv(report, files["ratings.csv"])
    write_matrix_csv(report.players, report.payoff, files["payoff.csv"])
    write_matrix_csv(report.players, report.mean_return, files["returns.csv"])
    plot_ratings(report, files["ratings.png"], title)
    plot_payoff(report, files["payoff.png"], title)
    header, rows = rating_rows(report)
    names = report.players
    payoff = [
        [n, *(_num(float(v), 3) for v in row)] for n, row in zip(names, report.payoff, strict=True)
    ]
    returns = [
        [n, *(_num(float(v), 3) for v in row)]
        for n, row in zip(names, report.mean_return, strict=True)
    ]
    notes = "".join(f"<p>{html.escape(line)}</p>" for line in summary_lines(report))
    files["report.html"].write_text(
        f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:.2em .6em;
text-align:right}}img{{max-width:100%}}</style></head><body>
<h1>{html.escape(title)}</h1>
<h2>Ratings</h2>{_html_table(header, rows)}{notes}
<img src="ratings.png" alt="ratings with 95% intervals">
<h2>Cross-play: mean score of row vs column</h2>{_html_table(["", *names], payoff)}
<img src="payoff.png" alt="payoff heatmap">
<h2>Cross-play: mean return of row vs column</h2>{_html_table(["", *names], returns)}
</body></html>
""",
        encoding="utf-8",
    )
    return files
