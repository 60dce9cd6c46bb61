"""The main job's last steps: a tournament file for a finished run, then the summary.

    python -m scripts.main_report tournament RUN [--games N]  # writes RUN/tournament.yaml
    python -m scripts.main_report summary RUN                 # writes RUN/REPORT.md

The tournament seats the untrained model (the run's team file without adapters), up to three of
the run's checkpoints (evenly spaced, the last one included) plus its best one, the random bot
and the Nash (CFR) bot.  The summary puts the rating table, the exact exploitability before and
after training and the learning curve on one page, and says in plain words whether the last
checkpoint finished ahead of the untrained model: by its chips against it on duplicate deals
(with a 95% interval over deals), beside the exact expected value of the two tables.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import yaml

from marl.games.analysis import policy_value
from marl.infra.layout import (
    BEST,
    CHECKPOINTS,
    METRICS,
    STATE_FILE,
    TEAM_FILE,
    latest_checkpoint,
)

INITIAL, RANDOM, NASH = "initial", "random", "nash"


def checkpoints(run: Path, most: int = 3) -> list[Path]:
    """Up to ``most`` checkpoints of the run, evenly spaced, always including the last, plus
    the best one (``RUN/best``) if it is not among them."""
    found = sorted(p for p in (run / CHECKPOINTS).iterdir() if (p / TEAM_FILE).is_file())
    picks = (
        {round(i * (len(found) - 1) / (most - 1)) for i in range(most)}
        if len(found) > most
        else set(range(len(found)))
    )
    best = latest_checkpoint(run, BEST)
    if best is not None and best in found:
        picks.add(found.index(best))
    return [found[i] for i in sorted(picks)]


def trained_name(ckpt: Path) -> str:
    return f"trained@{int(ckpt.name.rsplit('_', 1)[-1])}"


def tournament_file(run: Path, games: int) -> Path:
    team = run / "team.yaml" if (run / "team.yaml").is_file() else None
    ckpts = checkpoints(run)
    if not ckpts:
        raise SystemExit(f"{run} has no checkpoints: train first")
    team = team or ckpts[-1] / "team.yaml"
    participants = [
        {"name": RANDOM, "source": "random"},
        {"name": NASH, "source": "optimal"},
        {"name": INITIAL, "source": str(team.resolve())},
        *({"name": trained_name(c), "source": str(c.resolve())} for c in ckpts),
    ]
    doc = {
        "schema": "marl-teams/tournament/v1",
        "name": f"{run.name}-tournament",
        "game": {"name": "kuhn_poker"},
        "participants": participants,
        "schedule": {"kind": "round_robin"},
        "games_per_pairing": games,
        "seed": 0,
        "anchor": RANDOM,
        "bootstrap": 200,
    }
    path = run / "tournament.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def read_ratings(path: Path) -> dict[str, dict[str, float]]:
    with path.open(newline="", encoding="utf-8") as f:
        return {
            row["name"]: {k: float(v) for k, v in row.items() if k != "name"}
            for row in csv.DictReader(f)
        }


def head_to_head(matches: Path, a: str, b: str) -> tuple[float, float, int]:
    """``a``'s mean chips per game against ``b`` and its 95% half-width, over duplicate deals:
    the games of one seed (the same cards, each player in each seat) are averaged first, so the
    luck of the deal cancels and the interval is over deals; also the number of games."""
    by_deal: dict[int, list[float]] = {}
    for line in matches.read_text().splitlines():
        rec = json.loads(line)
        by_player = {p: rec["returns"][s] for s, p in rec["seats"].items()}
        if set(by_player) == {a, b}:
            by_deal.setdefault(rec["seed"], []).append(by_player[a])
    deals = [sum(c) / len(c) for c in by_deal.values()]
    n = len(deals)
    if n < 2:
        return float("nan"), float("nan"), sum(map(len, by_deal.values()))
    mean = sum(deals) / n
    sd = (sum((c - mean) ** 2 for c in deals) / (n - 1)) ** 0.5
    return mean, 1.96 * sd / n**0.5, sum(map(len, by_deal.values()))


def exact_head_to_head(a: dict, b: dict) -> float:
    """The expected chips a game of table policy ``a`` against ``b``, seats averaged: the
    value the games above estimate, computed on Kuhn's game tree."""
    pa, pb = ({k: {int(x): p for x, p in d.items()} for k, d in t.items()} for t in (a, b))
    return (policy_value("kuhn_poker", pa, pb)[0] + policy_value("kuhn_poker", pb, pa)[1]) / 2


def verdict(ratings: dict[str, dict[str, float]], last: str, chips: float, half: float) -> str:
    """Kuhn is won in chips: the head-to-head margin decides (the rating counts hands won)."""
    t, i = ratings[last], ratings[INITIAL]
    rating = f"rating {t['rating']:.0f} vs {i['rating']:.0f}"
    if chips - half > 0:
        return (
            f"{last} is AHEAD of the untrained model: it wins {chips:+.3f} +/- {half:.3f} "
            f"chips a game against it (95% interval above 0); {rating}."
        )
    if chips > 0:
        return (
            f"{last} is ahead of the untrained model on the point estimate only: "
            f"{chips:+.3f} +/- {half:.3f} chips a game (the 95% interval includes 0); "
            f"{rating}."
        )
    return (
        f"{last} is NOT ahead of the untrained model: {chips:+.3f} +/- {half:.3f} chips a "
        f"game against it; {rating}."
    )


def summary(run: Path) -> str:
    before_doc = json.loads((run / "before.json").read_text())
    after_doc = json.loads((run / "after.json").read_text())
    before, after = before_doc["exploitability"], after_doc["exploitability"]
    expected = exact_head_to_head(after_doc["table"], before_doc["table"])
    tdir = run / "tournament"
    ratings = read_ratings(tdir / "ratings.csv")
    last = trained_name(checkpoints(run)[-1])
    chips, half, n = head_to_head(tdir / "matches.jsonl", last, INITIAL)
    steps = [json.loads(x) for x in (run / METRICS).read_text().splitlines()]
    trained_steps = max((s.get("step", 0) for s in steps), default=0)
    expl = {
        f"trained@{s['step']}": f"{s['eval']['exploitability']:.3f}" for s in steps if "eval" in s
    }
    expl |= {
        INITIAL: f"{before:.3f}",
        RANDOM: f"{11 / 24:.3f}",
        NASH: "<= 0.001 (CFR)",
        last: f"{after:.3f}",
    }  # after.json reads the last checkpoint
    best_line = ""
    best_ckpt = latest_checkpoint(run, BEST)
    if best_ckpt is not None:
        best = json.loads((best_ckpt / STATE_FILE).read_text())["best"]
        best_line = (
            f"\nThe best checkpoint (`{run}/best`, lowest exploitability measured "
            f"during training): step {best['step']}, {best['exploitability']:.4f}.\n"
        )
    rows = "\n".join(
        f"| {name} | {r['rating']:.0f} | [{r['ci_low']:.0f}, {r['ci_high']:.0f}] | "
        f"{r['games']:.0f} | {r['wins']:.0f} / {r['draws']:.0f} / {r['losses']:.0f} | "
        f"{r['nash_average']:+.3f} [{r['nash_low']:+.3f}, {r['nash_high']:+.3f}] | "
        f"{expl.get(name, 'n/a')} |"
        for name, r in ratings.items()
    )
    text = f"""# Main job: Kuhn poker self-play on SmolLM2-135M-Instruct

Training: `configs/kuhn_target.yaml` (MMD's policy targets, fitted), {trained_steps} steps
(`{run}/metrics.jsonl`); learning curve `curves.png`.

Exact exploitability of the table policy (0 = Nash; the random bot's is 11/24 = 0.458):
untrained {before:.4f} -> trained {after:.4f} ({
        "lower, better" if after < before else "NOT lower"
    }).
{best_line}
Tournament (round robin, both seats; Bradley-Terry ratings anchored on the random bot at 0,
95% bootstrap intervals; `tournament/report.html`):

| participant | rating | 95% interval | games | W / D / L | chips vs Nash [95%] | exploitability |
|---|---|---|---|---|---|---|
{rows}

Head to head, {last} against the untrained model: {chips:+.3f} +/- {half:.3f} chips a game
over {n} games on duplicate deals (95% interval over deals); its exact expected value from the
two policies' tables is {expected:+.4f}. The rating counts hands won; chips decide poker: the chips
column is each player's mean against the field's Nash mixture (Nash averaging, the
tournament's ranking for poker; 0 for an equilibrium player), and `tournament/returns.csv` has
every pair's mean chips.

**{verdict(ratings, last, chips, half)}**
"""
    (run / "REPORT.md").write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["tournament", "summary"])
    ap.add_argument("run", type=Path)
    ap.add_argument("--games", type=int, default=2000, help="games per pairing (both seats)")
    args = ap.parse_args()
    if args.what == "tournament":
        print(tournament_file(args.run, args.games))
    else:
        print(summary(args.run))


if __name__ == "__main__":
    main()
