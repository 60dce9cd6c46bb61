"""The main job's head-to-head: games of one deal are averaged before the interval, and the
exact value of two tables is what those games estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marl.games.analysis import policy_value
from marl.games.cfr import solve
from scripts.main_report import exact_head_to_head, head_to_head


def test_duplicate_deals_cancel_the_luck_of_the_cards(tmp_path: Path) -> None:
    # each deal is won by whoever holds the better cards: +c for a in one seat, -c in the other
    lines = []
    for seed, c in enumerate([1, 2, 1, 2, 1, 2]):
        for order, ret in ((("a", "b"), c), (("b", "a"), -c + 0.5)):
            seats = dict(zip(("player_0", "player_1"), order, strict=True))
            a_seat = next(s for s, p in seats.items() if p == "a")
            b_seat = next(s for s, p in seats.items() if p == "b")
            lines.append({"seed": seed, "seats": seats, "returns": {a_seat: ret, b_seat: -ret}})
    path = tmp_path / "matches.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    mean, half, games = head_to_head(path, "a", "b")
    assert games == 12 and mean == pytest.approx(0.25) and half == pytest.approx(0.0)


def test_exact_head_to_head_averages_the_seats() -> None:
    nash = solve("kuhn_poker")
    as_json = {k: {str(a): p for a, p in d.items()} for k, d in nash.items()}
    always = {k: {str(a): float(a == min(d)) for a in d} for k, d in nash.items()}
    pa = {k: {int(a): p for a, p in d.items()} for k, d in always.items()}
    expected = (
        policy_value("kuhn_poker", nash, pa)[0] + policy_value("kuhn_poker", pa, nash)[1]
    ) / 2
    assert exact_head_to_head(as_json, always) == pytest.approx(expected)
    assert expected > 0.05  # the equilibrium beats a player that never bets or calls
    assert exact_head_to_head(as_json, as_json) == pytest.approx(0.0, abs=1e-3)
