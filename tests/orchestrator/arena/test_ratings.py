"""Ratings: Bradley-Terry against hand-computed fits, ties, anchoring, the prior, bootstrap
intervals, Elo, OpenSkill, seat advantage and the cross-play matrices."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from marl.orchestrator.arena.ratings import (
    PRIOR_GAMES,
    SCALE,
    Comparisons,
    Outcome,
    bootstrap_intervals,
    cross_play,
    elo,
    fit_bt,
    mean_return_intervals,
    mle_exists,
    nash_average,
    openskill_ratings,
    rate,
    records,
    scores_margins,
    seat_scores,
)


def series(a: str, b: str, wins: int, draws: int, losses: int) -> list[Outcome]:
    """a vs b with a in the first seat, then the same results again with b first: a
    seat-balanced series (by symmetry its home term is exactly 0)."""
    out = []
    for first, second in ((a, b), (b, a)):
        for ra in [1.0] * wins + [0.0] * draws + [-1.0] * losses:
            rets = {a: ra, b: -ra}
            out.append(Outcome((first, second), (rets[first], rets[second])))
    return out


def ratings_of(outcomes: list[Outcome], players: list[str], anchor: str, **kw) -> dict[str, float]:
    report = rate(outcomes, players, anchor, bootstrap=0, **kw)
    return {r.name: r.rating for r in report.ratings}


def test_bt_matches_a_hand_computed_triangle() -> None:
    # Strengths gamma = (A, B, C) = (4, 2, 1) predict P(A>B) = 4/6 = 2/3, P(B>C) = 2/3 and
    # P(A>C) = 4/5.  Per seat order: A-B 3 games (A wins 2), B-C 3 games (B wins 2), A-C 5
    # games (A wins 4).  Every pair's observed share equals the prediction, so the score
    # equations W_i = sum_j n_ij gamma_i / (gamma_i + gamma_j) hold (A: 4 + 8 = 12 =
    # 6 * 2/3 + 10 * 4/5) and, the log-likelihood being strictly concave, (4, 2, 1) is the
    # MLE.  With C anchored at 0: B = 400 log10(2) = 120.41, A = 400 log10(4) = 240.82.
    games = series("A", "B", 2, 0, 1) + series("B", "C", 2, 0, 1) + series("A", "C", 4, 0, 1)
    r = ratings_of(games, ["A", "B", "C"], "C")
    assert r["C"] == 0.0
    assert r["B"] == pytest.approx(400 * math.log10(2), abs=1e-6)
    assert r["A"] == pytest.approx(400 * math.log10(4), abs=1e-6)
    report = rate(games, ["A", "B", "C"], "C", bootstrap=0)
    assert report.home == pytest.approx(0.0, abs=1e-6) and report.prior == 0.0


def test_ties_count_half_in_a_hand_computed_chain() -> None:
    # A-B only and B-C only: the likelihood factorises per pair, so each gap is the log of
    # that pair's score ratio.  A vs B: 3 wins 1 loss per seat order -> 3:1 -> 400 log10 3.
    # B vs C: 1 win 2 draws per seat order -> B scores 1 + 2 * 1/2 = 2 of 3 -> 2:1.
    # Anchor C = 0: B = 400 log10 2 = 120.41, A = 400 log10 6 = 311.26.
    games = series("A", "B", 3, 0, 1) + series("B", "C", 1, 2, 0)
    r = ratings_of(games, ["A", "B", "C"], "C")
    assert r["B"] == pytest.approx(400 * math.log10(2), abs=1e-6)
    assert r["A"] == pytest.approx(400 * math.log10(6), abs=1e-6)
    # two draws are worth exactly one win and one loss
    drawn = ratings_of(series("A", "B", 0, 2, 0), ["A", "B"], "B")
    split = ratings_of(series("A", "B", 1, 0, 1), ["A", "B"], "B")
    assert drawn["A"] == pytest.approx(0.0, abs=1e-9) == split["A"]


def test_anchor_fixes_one_rating_and_keeps_the_gaps() -> None:
    games = series("A", "B", 5, 1, 2) + series("B", "C", 3, 2, 2) + series("A", "C", 4, 0, 1)
    by_c = ratings_of(games, ["A", "B", "C"], "C")
    by_a = ratings_of(games, ["A", "B", "C"], "A", anchor_rating=1000.0)
    assert by_a["A"] == 1000.0
    for p in "ABC":
        assert by_a[p] - by_a["A"] == pytest.approx(by_c[p] - by_c["A"], abs=1e-6)


def test_home_advantage_is_fitted_and_does_not_bias_balanced_ratings() -> None:
    # Equal players; the first seat wins 3 of 4 in both seat orders: h = ln 3 = 190.85 points
    games = [Outcome(("A", "B"), (1.0, -1.0))] * 3 + [Outcome(("A", "B"), (-1.0, 1.0))]
    games += [Outcome(("B", "A"), (1.0, -1.0))] * 3 + [Outcome(("B", "A"), (-1.0, 1.0))]
    report = rate(games, ["A", "B"], "B", bootstrap=0)
    assert report.home == pytest.approx(400 * math.log10(3), abs=1e-6)
    assert {r.name: r.rating for r in report.ratings}["A"] == pytest.approx(0.0, abs=1e-6)
    assert report.seat_scores == [0.75, 0.25]


def test_prior_only_when_the_mle_does_not_exist() -> None:
    # C never scores against anyone: no finite MLE (C's gap grows without bound)
    games = series("A", "B", 2, 0, 1) + series("A", "C", 3, 0, 0)
    comp = Comparisons.of(games, ["A", "B", "C"])
    n, s = comp.matrices()
    assert not mle_exists(n, s, home=True)
    fit = fit_bt(n, s, anchor=0)
    assert fit.prior == PRIOR_GAMES and np.isfinite(fit.theta).all()
    assert fit.theta[2] < fit.theta[1] - 2  # far below, but finite
    report = rate(games, ["A", "B", "C"], "A", bootstrap=0)
    assert any("virtual drawn games" in note for note in report.notes)
    # an explicit prior of zero virtual games is the plain MLE again on good data
    good = series("A", "B", 2, 0, 1)
    n2, s2 = Comparisons.of(good, ["A", "B"]).matrices()
    assert mle_exists(n2, s2, home=True)
    assert fit_bt(n2, s2, 1).theta[0] == pytest.approx(math.log(2), abs=1e-9)


def test_bootstrap_intervals_cover_the_fit_and_are_reproducible() -> None:
    games = series("A", "B", 30, 10, 20) + series("B", "C", 25, 10, 25)
    comp = Comparisons.of(games, ["A", "B", "C"])
    ci = bootstrap_intervals(comp, anchor=2, samples=100, seed=3)
    again = bootstrap_intervals(comp, anchor=2, samples=100, seed=3)
    assert np.array_equal(ci, again)
    theta = fit_bt(*comp.matrices(), 2).theta
    assert (ci[:, 0] <= theta + 1e-9).all() and (theta <= ci[:, 1] + 1e-9).all()
    assert ci[2].tolist() == [0.0, 0.0]  # the anchor does not move
    width = (ci[:, 1] - ci[:, 0]) * SCALE
    assert 0 < width[1] < 200 and width[0] > width[1]  # A's gap to C goes through B


def test_elo_by_hand() -> None:
    # K = 16, both start at 0.  Game 1: E_A = 1/2, A wins: A = +8, B = -8.  Game 2: E_A =
    # 1 / (1 + 10^(-16/400)) = 0.52302, A wins again: A = 8 + 16 * 0.47698 = 15.632.
    games = [Outcome(("A", "B"), (1.0, 0.0)), Outcome(("B", "A"), (0.0, 1.0))]
    r = elo(Comparisons.of(games, ["A", "B"]), k=16)
    e = 1 / (1 + 10 ** (-16 / 400))
    assert r.tolist() == pytest.approx([8 + 16 * (1 - e), -8 - 16 * (1 - e)])


def test_payoff_returns_records_and_seats() -> None:
    games = [
        Outcome(("A", "B"), (2.0, -2.0)),
        Outcome(("B", "A"), (1.0, -1.0)),
        Outcome(("A", "B"), (0.0, 0.0)),
        Outcome(("A", "C"), (-1.0, 1.0)),
    ]
    comp = Comparisons.of(games, ["A", "B", "C"])
    score, ret = cross_play(comp)
    # A vs B: win, loss, draw -> 1.5 / 3; returns 2, -1, 0 -> 1/3
    assert score[0, 1] == pytest.approx(0.5) and score[1, 0] == pytest.approx(0.5)
    assert ret[0, 1] == pytest.approx(1 / 3) and ret[1, 0] == pytest.approx(-1 / 3)
    assert score[0, 2] == 0.0 and score[2, 0] == 1.0
    assert math.isnan(score[1, 2]) and math.isnan(score[0, 0])
    assert records(games, ["A", "B", "C"]) == {
        "A": (4, 1, 1, 2),
        "B": (3, 1, 1, 1),
        "C": (1, 1, 0, 0),
    }
    assert seat_scores(games) == [0.625, 0.375]  # first seat: 1 + 1 + 1/2 + 0 of 4


def three_player_games() -> list[Outcome]:
    """A always first of three, B second, C third, in every seat order."""
    value = {"A": 2.0, "B": 1.0, "C": 0.0}
    orders = [("A", "B", "C"), ("B", "C", "A"), ("C", "A", "B")] * 4
    return [Outcome(o, tuple(value[p] for p in o)) for o in orders]


def test_openskill_for_more_than_two_seats() -> None:
    games = three_player_games()
    skill = openskill_ratings(games, ["A", "B", "C"])
    ordinal = {p: mu - 3 * sigma for p, (mu, sigma) in skill.items()}
    assert ordinal["A"] > ordinal["B"] > ordinal["C"]
    report = rate(games, ["A", "B", "C"], "C", bootstrap=0)
    assert [r.name for r in report.ratings] == ["A", "B", "C"]
    assert all(r.openskill is not None for r in report.ratings)
    assert report.notes == [
        "no finite maximum-likelihood fit from these games alone: "
        f"{PRIOR_GAMES} virtual drawn games per pair were added"
    ]


def test_openskill_missing_is_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openskill.models", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'marl-teams\[openskill\]'"):
        openskill_ratings(three_player_games(), ["A", "B", "C"])
    report = rate(three_player_games(), ["A", "B", "C"], "C", bootstrap=0)
    assert any("marl-teams[openskill]" in n for n in report.notes)
    assert all(r.openskill is None for r in report.ratings)


RPS = np.array([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]])


def test_nash_average_of_rock_paper_scissors_is_uniform_and_rates_all_zero() -> None:
    p, r = nash_average(RPS)
    assert p == pytest.approx([1 / 3] * 3) and r == pytest.approx([0.0] * 3, abs=1e-12)


def test_nash_average_of_a_transitive_field_puts_all_mass_on_the_best() -> None:
    p, r = nash_average(np.array([[0.0, 1.0, 2.0], [-1.0, 0.0, 1.0], [-2.0, -1.0, 0.0]]))
    assert p == pytest.approx([1.0, 0.0, 0.0]) and r == pytest.approx([0.0, -1.0, -2.0])


def test_nash_average_ignores_a_dominated_player_and_splits_copies_evenly() -> None:
    dominated = np.zeros((4, 4))
    dominated[:3, :3], dominated[3, :3], dominated[:3, 3] = RPS, -0.5, 0.5
    p, r = nash_average(dominated)
    assert p == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0]) and r[3] == pytest.approx(-0.5)
    copy = [0, 1, 2, 0]  # a second rock: the two rocks share rock's third
    p, r = nash_average(RPS[np.ix_(copy, copy)])
    assert p == pytest.approx([1 / 6, 1 / 3, 1 / 3, 1 / 6]) and r == pytest.approx([0.0] * 4)


def test_mean_returns_resample_duplicate_deals_together() -> None:
    # each deal: A wins 2 from one seat and loses 1 from the other: every deal nets A +1
    games = [Outcome(("A", "B"), (2.0, -2.0), deal=d) for d in range(20)] + [
        Outcome(("B", "A"), (1.0, -1.0), deal=d) for d in range(20)
    ]
    means, ci = mean_return_intervals(games, ["A", "B"], samples=50)
    assert means == pytest.approx([0.5, -0.5])
    assert ci.ravel() == pytest.approx([0.5, 0.5, -0.5, -0.5])  # the luck cancels
    alone = [Outcome(o.players, o.returns) for o in games]
    assert np.ptp(mean_return_intervals(alone, ["A", "B"], samples=50)[1][0]) > 0


def test_chips_rank_by_mean_return_and_win_loss_games_by_bradley_terry() -> None:
    chips = [
        Outcome(("A", "B"), (-1.0, 1.0)),
        Outcome(("A", "B"), (-1.0, 1.0)),
        Outcome(("A", "B"), (2.0, -2.0)),
        Outcome(("A", "B"), (2.0, -2.0)),
        Outcome(("A", "B"), (2.0, -2.0)),
        Outcome(("B", "A"), (1.0, -1.0)),
        Outcome(("B", "A"), (1.0, -1.0)),
        Outcome(("B", "A"), (1.0, -1.0)),
    ]
    assert scores_margins(chips)
    report = rate(chips, ["A", "B"], "B", bootstrap=0)  # A wins 3 of 8 hands but +0.375 chips
    assert report.by_return and [r.name for r in report.ratings] == ["A", "B"]
    wins = [Outcome(o.players, tuple(math.copysign(1.0, x) for x in o.returns)) for o in chips]
    assert not scores_margins(wins)
    assert [r.name for r in rate(wins, ["A", "B"], "B", bootstrap=0).ratings] == ["B", "A"]


def test_rating_plot_draws_a_fit_outside_its_interval(tmp_path) -> None:
    # A player that always wins sits at the prior's bound, where the bootstrap interval need
    # not contain the fit: the plot draws the interval as it is instead of failing
    from dataclasses import replace

    from marl.orchestrator.arena.report import plot_ratings

    report = rate(series("A", "B", 5, 0, 0), ["A", "B"], "B", bootstrap=0)
    top = report.ratings[0]
    report.ratings[0] = replace(top, ci_low=top.rating + 10, ci_high=top.rating + 20)
    plot_ratings(report, tmp_path / "ratings.png", "always wins")
    assert (tmp_path / "ratings.png").stat().st_size > 0
