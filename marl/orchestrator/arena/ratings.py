"""Ratings from finished games: Bradley-Terry with bootstrap intervals, Elo, OpenSkill.

Every game is a set of seats with returns.  It is read as pairwise comparisons between its
seats (earlier seat first): 1 if the earlier seat's return is higher, 0 if lower, 1/2 if equal
(ties count half).  A two-seat game is one comparison.

Scale: ratings are natural log-odds ``theta`` printed in Elo-like points,
``rating = anchor_rating + 400 / ln(10) * (theta - theta_anchor)``, so a 400-point gap means
10:1 odds (the Elo and Chatbot Arena convention, ``P(i beats j) = 1 / (1 + 10^((R_j-R_i)/400))``).

- :func:`fit_bt` is the primary rating: the Bradley-Terry maximum-likelihood fit with a
  first-seat (home) advantage term, by Newton's method; :func:`bootstrap_intervals` gives 95%
  percentile intervals by resampling games.
- :func:`elo` is the sequential view (fixed K, match order); :func:`openskill_ratings` the
  Weng-Lin (Plackett-Luce) view for games with more than two seats (extra ``openskill``).
- :func:`seat_scores`, :func:`cross_play` and :func:`records` are plain counts.

Where the returns are more than win/draw/loss (chips in poker: :func:`scores_margins`), a
win count misranks: an equilibrium player wins small pots and loses few big ones.  There the
primary rating is the mean return against the field with bootstrap intervals
(:func:`mean_return_intervals`; the games of one duplicate deal resample together), and
:func:`nash_average` rates each player by its mean return against the maximum-entropy Nash
mixture of the population (Balduzzi et al. 2018, "Re-evaluating evaluation"), which no
non-transitive cycle or copy of a player can inflate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

#: Elo-like points per natural log-odds unit (400 points = a factor 10 in the odds).
SCALE = 400.0 / math.log(10.0)
#: Virtual drawn games added between every pair of players when the data alone have no finite
#: maximum-likelihood estimate (an undefeated or winless player, disconnected groups).
PRIOR_GAMES = 0.1


@dataclass(frozen=True)
class Outcome:
    """One finished game: the participants in seat order and their returns."""

    players: tuple[str, ...]
    returns: tuple[float, ...]
    deal: int | None = None  # games dealt alike (duplicate format) share it; None: alone


def pair_score(a: float, b: float) -> float:
    """The score of a return ``a`` against a return ``b``: win 1, tie 1/2, loss 0."""
    return 1.0 if a > b else 0.0 if a < b else 0.5


@dataclass
class Comparisons:
    """Every pairwise comparison of every game, as arrays (one row per seat pair and game)."""

    players: list[str]
    first: np.ndarray  # player index in the earlier seat
    second: np.ndarray  # player index in the later seat
    game: np.ndarray  # which game the comparison comes from
    score: np.ndarray  # the earlier seat's score: 1, 1/2 or 0
    ret_first: np.ndarray
    ret_second: np.ndarray
    n_games: int

    @classmethod
    def of(cls, outcomes: Sequence[Outcome], players: Sequence[str]) -> Comparisons:
        index = {p: i for i, p in enumerate(players)}
        rows = [
            (
                index[o.players[s]],
                index[o.players[t]],
                g,
                pair_score(o.returns[s], o.returns[t]),
                o.returns[s],
                o.returns[t],
            )
            for g, o in enumerate(outcomes)
            for s in range(len(o.players))
            for t in range(s + 1, len(o.players))
        ]
        cols = list(zip(*rows, strict=True)) if rows else [()] * 6
        ints = [np.asarray(c, dtype=np.int64) for c in cols[:3]]
        floats = [np.asarray(c, dtype=np.float64) for c in cols[3:]]
        return cls(list(players), *ints, *floats, n_games=len(outcomes))

    def matrices(self, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``N[a, b]``: comparisons with a in the earlier seat and b in the later one (games
        weighted by ``weights``); ``S[a, b]``: a's score in them."""
        p = len(self.players)
        w = np.ones(len(self.game)) if weights is None else weights[self.game]
        key = self.first * p + self.second
        n = np.bincount(key, weights=w, minlength=p * p).reshape(p, p)
        s = np.bincount(key, weights=w * self.score, minlength=p * p).reshape(p, p)
        return n, s


def mle_exists(n: np.ndarray, s: np.ndarray, home: bool) -> bool:
    """Whether the BT likelihood has a finite maximum (Ford 1957 for the strengths).

    Draw an edge a -> b when a scored anything against b.  The strengths are finite iff that
    graph is strongly connected (else some group beat everyone outside it every time and its
    gap to them grows without bound).  The home term additionally needs the first seat to have
    scored something and conceded something.
    """
    beat = (s > 0) | (n - s > 0).T
    if home and not 0 < s.sum() < n.sum():
        return False

    def reaches_all(adj: np.ndarray) -> bool:
        seen = np.zeros(len(adj), dtype=bool)
        seen[0] = True
        while True:
            grown = seen | adj[seen].any(axis=0)
            if (grown == seen).all():
                return bool(seen.all())
            seen = grown

    return reaches_all(beat) and reaches_all(beat.T)


@dataclass
class BTFit:
    """Log-odds strengths (anchor at 0), the first-seat term, and the virtual games used."""

    theta: np.ndarray
    home: float
    prior: float
    iterations: int


def fit_bt(
    n: np.ndarray,
    s: np.ndarray,
    anchor: int,
    home: bool = True,
    prior: float | None = None,
    tol: float = 1e-10,
    max_iter: int = 100,
) -> BTFit:
    """Bradley-Terry MLE with a home term, by Newton's method with step halving.

    Model: the earlier seat a beats the later seat b with ``p_ab = sigmoid(theta_a - theta_b
    + h)``.  A comparison of score ``y`` (ties y = 1/2) adds ``y log p + (1 - y) log(1 - p)``,
    so with ``N``, ``S`` from :meth:`Comparisons.matrices`, ``G = S - N * p`` and
    ``W = N * p * (1 - p)``::

        dL/dtheta_i = sum_b G_ib - sum_a G_ai          dL/dh = sum G
        Fisher information J = D^T diag(W) D, D the design of (theta_a - theta_b + h)

    and the step is ``J^{-1} grad`` (L is concave, so halving the step until L does not drop
    converges).  ``theta_anchor = 0`` is fixed by dropping its column.  ``prior`` virtual
    drawn games per pair of players (half in each seat order) regularise; ``None`` means
    ``PRIOR_GAMES`` only when :func:`mle_exists` says the data need it (or Newton stalls).
    """
    if prior is None:
        fit = None
        if mle_exists(n, s, home):
            fit = fit_bt(n, s, anchor, home, 0.0, tol, max_iter)
        return (
            fit
            if fit is not None and fit.iterations < max_iter
            else fit_bt(n, s, anchor, home, PRIOR_GAMES, tol, max_iter)
        )
    p = len(n)
    off = prior * (1 - np.eye(p))
    n, s = n + off / 2, s + off / 4
    keep = [i for i in range(p) if i != anchor] + ([p] if home else [])
    x = np.zeros(p + 1)  # theta..., h
    it, cur = 0, _bt_loglik(x, n, s)
    while it < max_iter:
        it += 1
        step = np.zeros(p + 1)
        step[keep] = _newton_step(x, n, s, keep)
        t = 1.0
        while _bt_loglik(x + t * step, n, s) < cur - 1e-12 and t > 1e-9:
            t /= 2
        x = x + t * step
        cur = _bt_loglik(x, n, s)
        if np.abs(t * step).max() < tol:
            break
    return BTFit(x[:p] - x[anchor], float(x[p]), prior, it)


def _bt_loglik(x: np.ndarray, n: np.ndarray, s: np.ndarray) -> float:
    """The Bradley-Terry log-likelihood of ``x = (theta..., h)``."""
    p = len(n)
    z = x[:p, None] - x[None, :p] + x[p]
    return float(-(s * np.logaddexp(0, -z) + (n - s) * np.logaddexp(0, z)).sum())


def _newton_step(x: np.ndarray, n: np.ndarray, s: np.ndarray, keep: list[int]) -> np.ndarray:
    """``J^{-1} grad`` over the ``keep`` coordinates of ``x = (theta..., h)``."""
    p = len(n)
    z = x[:p, None] - x[None, :p] + x[p]
    prob = 1 / (1 + np.exp(-z))
    g, w = s - n * prob, n * prob * (1 - prob)
    grad = np.append(g.sum(1) - g.sum(0), g.sum())
    info = np.zeros((p + 1, p + 1))
    info[:p, :p] = np.diag(w.sum(1) + w.sum(0)) - w - w.T
    info[:p, p] = info[p, :p] = w.sum(1) - w.sum(0)
    info[p, p] = w.sum()
    return np.linalg.lstsq(info[np.ix_(keep, keep)], grad[keep], rcond=None)[0]


def bootstrap_intervals(
    comp: Comparisons, anchor: int, samples: int, seed: int = 0, home: bool = True
) -> np.ndarray:
    """95% percentile intervals of the anchored strengths, shape (players, 2), log-odds.

    Each sample draws ``n_games`` games with replacement (a game's comparisons stay together)
    and refits; the interval is the 2.5th and 97.5th percentile of the refitted strengths.
    """
    if samples <= 0 or comp.n_games == 0:
        return np.full((len(comp.players), 2), np.nan)
    rng = np.random.default_rng(seed)
    draws = np.empty((samples, len(comp.players)))
    for b in range(samples):
        weights = np.bincount(
            rng.integers(0, comp.n_games, comp.n_games), minlength=comp.n_games
        ).astype(np.float64)
        draws[b] = fit_bt(*comp.matrices(weights), anchor, home).theta
    return np.percentile(draws, [2.5, 97.5], axis=0).T


def elo(comp: Comparisons, k: float = 16.0) -> np.ndarray:
    """Sequential Elo in match order, from 0: ``E_a = 1 / (1 + 10^((R_b - R_a) / 400))``,
    ``R_a += K (S_a - E_a)`` and ``R_b -= K (S_a - E_a)``.  Order-dependent by design."""
    r = np.zeros(len(comp.players))
    for a, b, y in zip(comp.first, comp.second, comp.score, strict=True):
        delta = k * (y - 1 / (1 + 10 ** ((r[b] - r[a]) / 400)))
        r[a] += delta
        r[b] -= delta
    return r


def openskill_ratings(
    outcomes: Sequence[Outcome], players: Sequence[str]
) -> dict[str, tuple[float, float]]:
    """Weng-Lin Plackett-Luce ratings ``(mu, sigma)`` over whole games (any number of seats,
    each seat a team of one), updated in match order; display ``mu - 3 sigma``."""
    try:
        from openskill.models import PlackettLuce
    except ImportError as exc:
        raise ImportError(
            "OpenSkill ratings need the optional package openskill: "
            "pip install 'marl-teams[openskill]'"
        ) from exc
    model = PlackettLuce()
    rating = {p: model.rating(name=p) for p in players}
    for o in outcomes:
        teams = model.rate([[rating[p]] for p in o.players], scores=list(o.returns))
        for p, (new,) in zip(o.players, teams, strict=True):
            rating[p] = new
    return {p: (float(r.mu), float(r.sigma)) for p, r in rating.items()}


def scores_margins(outcomes: Sequence[Outcome]) -> bool:
    """Whether the returns say by how much, not just who won: more than one nonzero size
    (Kuhn poker's 1 and 2 chips; tic-tac-toe's 1 is a win and nothing more)."""
    return len({abs(r) for o in outcomes for r in o.returns} - {0.0}) > 1


def deal_units(outcomes: Sequence[Outcome]) -> np.ndarray:
    """The resampling unit of each game: games dealt alike (``Outcome.deal``) share one, a
    game without a deal is its own."""
    units: dict[object, int] = {}
    return np.array(
        [
            units.setdefault(("deal", o.deal) if o.deal is not None else ("game", g), len(units))
            for g, o in enumerate(outcomes)
        ],
        dtype=int,
    )


def mean_return_intervals(
    outcomes: Sequence[Outcome], players: Sequence[str], samples: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Each player's mean return over its games, and 95% percentile bootstrap intervals,
    shape (players, 2).  A resample draws deals (the games sharing ``Outcome.deal``, every
    seat order of one duplicate deal) with replacement, so the luck of the cards that the
    duplicate format cancels stays cancelled in the intervals too."""
    index = {p: i for i, p in enumerate(players)}
    unit_of = deal_units(outcomes)
    n_units = int(unit_of.max(initial=-1)) + 1
    total, count = np.zeros((n_units, len(players))), np.zeros((n_units, len(players)))
    for o, u in zip(outcomes, unit_of, strict=True):
        for p, r in zip(o.players, o.returns, strict=True):
            total[u, index[p]] += r
            count[u, index[p]] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        means = total.sum(0) / count.sum(0)
        if samples <= 0 or not n_units:
            return means, np.full((len(players), 2), np.nan)
        rng = np.random.default_rng(seed)
        weights = np.stack(
            [
                np.bincount(rng.integers(0, n_units, n_units), minlength=n_units)
                for _ in range(samples)
            ]
        )
        draws = (weights @ total) / (weights @ count)
        return means, np.nanpercentile(draws, [2.5, 97.5], axis=0).T


#: Players beyond which :func:`nash_average` is not attempted (it tries every support).
NASH_MAX_PLAYERS = 14
#: Players beyond which its bootstrap intervals are not (one solve per resample).
NASH_INTERVAL_PLAYERS = 8


def nash_average(payoff: np.ndarray, tol: float = 1e-9) -> tuple[np.ndarray, np.ndarray]:
    """The maximum-entropy Nash mixture ``p`` of the symmetric zero-sum game ``A`` (the
    antisymmetric part of ``payoff``; never-met pairs count 0) and each player's return
    against it, ``A p``: <= 0 for everyone, 0 on the mixture's support.

    Because ``A = -A^T`` the game's value is 0 and its equilibria are ``{p in simplex: A p
    <= 0}``.  Exactly, by support enumeration: on each support ``S`` the equilibrium solves
    ``A_SS p_S = 0, sum p_S = 1`` (least squares, kept when the residual, positivity and
    ``A p <= 0`` hold to ``tol`` relative to the largest payoff); the one of highest entropy
    is returned.  That is the unique equilibrium when there is one (the generic case) and
    spreads a player's copies evenly; among several equilibria on one support it is the
    least-norm one.
    """
    a = np.nan_to_num(np.asarray(payoff, dtype=np.float64))
    a = (a - a.T) / 2
    n, scale = len(a), float(np.abs(a).max(initial=0.0))
    if n > NASH_MAX_PLAYERS:
        raise ValueError(
            f"Nash averaging enumerates supports: at most {NASH_MAX_PLAYERS} players, not {n}"
        )
    if scale == 0:
        return np.full(n, 1 / max(n, 1)), np.zeros(n)
    a = a / scale
    best, best_entropy = None, -math.inf
    for mask in range(1, 2**n):
        support = [i for i in range(n) if mask >> i & 1]
        system = np.vstack([a[np.ix_(support, support)], np.ones(len(support))])
        target = np.append(np.zeros(len(support)), 1.0)
        sub = np.linalg.lstsq(system, target, rcond=None)[0]
        if np.abs(system @ sub - target).max() > tol or sub.min() < -tol:
            continue
        p = np.zeros(n)
        p[support] = np.clip(sub, 0.0, None)
        p /= p.sum()
        if (a @ p).max() > tol:
            continue
        entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
        if entropy > best_entropy + tol:
            best, best_entropy = p, entropy
    assert best is not None  # a finite symmetric zero-sum game has an equilibrium
    return best, scale * (a @ best)


def seat_scores(outcomes: Sequence[Outcome]) -> list[float]:
    """Mean score per seat (against every other seat; 1/2 means no seat advantage)."""
    seats = max((len(o.players) for o in outcomes), default=0)
    total, count = np.zeros(seats), np.zeros(seats)
    for o in outcomes:
        for s, ret in enumerate(o.returns):
            others = [pair_score(ret, r) for t, r in enumerate(o.returns) if t != s]
            total[s] += sum(others) / len(others)
            count[s] += 1
    return [float(t / c) if c else math.nan for t, c in zip(total, count, strict=True)]


def mean_return_matrix(comp: Comparisons, weights: np.ndarray | None = None) -> np.ndarray:
    """Mean return of row vs column over both seat orders, games weighted by ``weights``
    (NaN: never met)."""
    p = len(comp.players)
    w = np.ones(len(comp.game)) if weights is None else weights[comp.game]
    fwd, rev = comp.first * p + comp.second, comp.second * p + comp.first
    count = np.bincount(fwd, weights=w, minlength=p * p) + np.bincount(
        rev, weights=w, minlength=p * p
    )
    ret = np.bincount(fwd, weights=w * comp.ret_first, minlength=p * p) + np.bincount(
        rev, weights=w * comp.ret_second, minlength=p * p
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ret / count).reshape(p, p)


def nash_average_intervals(
    comp: Comparisons, outcomes: Sequence[Outcome], samples: int, seed: int = 0
) -> np.ndarray:
    """95% percentile bootstrap intervals of each player's return against the Nash mixture,
    shape (players, 2): deals resampled as in :func:`mean_return_intervals`, the mean-return
    matrix rebuilt and its maximum-entropy Nash mixture solved again per resample."""
    if samples <= 0 or not outcomes or len(comp.players) > NASH_INTERVAL_PLAYERS:
        return np.full((len(comp.players), 2), np.nan)
    unit_of = deal_units(outcomes)
    n_units = int(unit_of.max()) + 1
    rng = np.random.default_rng(seed)
    draws = np.empty((samples, len(comp.players)))
    for b in range(samples):
        counts = np.bincount(rng.integers(0, n_units, n_units), minlength=n_units)
        draws[b] = nash_average(mean_return_matrix(comp, counts[unit_of].astype(float)))[1]
    return np.percentile(draws, [2.5, 97.5], axis=0).T


def cross_play(comp: Comparisons) -> tuple[np.ndarray, np.ndarray]:
    """Mean score and mean return of row vs column over both seat orders (NaN: never met)."""
    p = len(comp.players)
    count, score = np.zeros((p, p)), np.zeros((p, p))
    for a, b, y in zip(comp.first, comp.second, comp.score, strict=True):
        count[a, b] += 1
        count[b, a] += 1
        score[a, b] += y
        score[b, a] += 1 - y
    with np.errstate(invalid="ignore", divide="ignore"):
        return score / count, mean_return_matrix(comp)


def records(outcomes: Sequence[Outcome], players: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """(games, wins, draws, losses): a win is the strictly highest return, a draw a shared
    highest, anything else a loss."""
    out = {p: [0, 0, 0, 0] for p in players}
    for o in outcomes:
        best = max(o.returns)
        n_best = sum(r == best for r in o.returns)
        for p, r in zip(o.players, o.returns, strict=True):
            row = out[p]
            row[0] += 1
            row[1 if r == best and n_best == 1 else 2 if r == best else 3] += 1
    return {p: tuple(v) for p, v in out.items()}


@dataclass
class Rating:
    name: str
    rating: float
    ci_low: float
    ci_high: float
    games: int
    wins: int
    draws: int
    losses: int
    elo: float
    mean_return: float  # chips in poker, where a win/loss score ignores the margin
    openskill: tuple[float, float] | None = None  # (mu, sigma)
    return_low: float = math.nan  # 95% bootstrap interval of mean_return
    return_high: float = math.nan
    nash_average: float = math.nan  # mean return against the max-entropy Nash mixture
    nash_mass: float = math.nan  # this player's probability in that mixture
    nash_low: float = math.nan  # 95% bootstrap interval of nash_average
    nash_high: float = math.nan


@dataclass
class RatingReport:
    """Everything the report shows; ``ratings`` best first, matrices in ``players`` order."""

    players: list[str]
    anchor: str
    ratings: list[Rating]
    payoff: np.ndarray
    mean_return: np.ndarray
    seat_scores: list[float]
    home: float  # first-seat advantage of the BT fit, in points
    prior: float
    notes: list[str] = field(default_factory=list)
    elo_k: float = 16.0
    by_return: bool = False  # the game scores margins: ranked by Nash average, else by BT


def rate(
    outcomes: Sequence[Outcome],
    players: Sequence[str],
    anchor: str,
    anchor_rating: float = 0.0,
    bootstrap: int = 200,
    seed: int = 0,
    elo_k: float = 16.0,
) -> RatingReport:
    """All views of a tournament's games; OpenSkill when a game has more than two seats.
    Where the game scores margins (:func:`scores_margins`) players are ranked by their return
    against the field's maximum-entropy Nash mixture (Nash averaging, with bootstrap
    intervals), else by the Bradley-Terry rating."""
    players = list(players)
    a = players.index(anchor)
    comp = Comparisons.of(outcomes, players)
    n, s = comp.matrices()
    fit = fit_bt(n, s, a)
    ci = bootstrap_intervals(comp, a, bootstrap, seed)
    elo_r = elo(comp, elo_k)
    elo_r += anchor_rating - elo_r[a]
    skill, notes = _openskill_and_notes(outcomes, players, fit)
    counts = records(outcomes, players)
    means, means_ci = mean_return_intervals(outcomes, players, bootstrap, seed)
    payoff, mean_return = cross_play(comp)
    by_return = scores_margins(outcomes)
    mass, versus_nash, nash_ci = _nash_views(comp, outcomes, mean_return, bootstrap, seed, notes)
    rows = [
        Rating(
            p,
            float(anchor_rating + SCALE * fit.theta[i]),
            float(anchor_rating + SCALE * ci[i, 0]),
            float(anchor_rating + SCALE * ci[i, 1]),
            *counts[p],
            elo=float(elo_r[i]),
            mean_return=float(means[i]),
            openskill=skill.get(p),
            return_low=float(means_ci[i, 0]),
            return_high=float(means_ci[i, 1]),
            nash_average=float(versus_nash[i]),
            nash_mass=float(mass[i]),
            nash_low=float(nash_ci[i, 0]),
            nash_high=float(nash_ci[i, 1]),
        )
        for i, p in enumerate(players)
    ]
    rows.sort(key=lambda r: _rank_key(r, by_return))
    return RatingReport(
        players,
        anchor,
        rows,
        payoff,
        mean_return,
        seat_scores(outcomes),
        SCALE * fit.home,
        fit.prior,
        notes,
        elo_k,
        by_return,
    )


def _openskill_and_notes(
    outcomes: Sequence[Outcome], players: list[str], fit: BTFit
) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """OpenSkill ratings where a game has more than two seats, and the notes: OpenSkill
    missing, the Bradley-Terry fit regularised."""
    skill: dict[str, tuple[float, float]] = {}
    notes: list[str] = []
    if any(len(o.players) > 2 for o in outcomes):
        try:
            skill = openskill_ratings(outcomes, players)
        except ImportError as exc:
            notes.append(str(exc))
    if fit.prior:
        notes.append(
            f"no finite maximum-likelihood fit from these games alone: {fit.prior} "
            "virtual drawn games per pair were added"
        )
    return skill, notes


def _nash_views(
    comp: Comparisons,
    outcomes: Sequence[Outcome],
    mean_return: np.ndarray,
    bootstrap: int,
    seed: int,
    notes: list[str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Nash mixture's mass, each player's return against it and its bootstrap interval;
    NaN (with a note) where the field is too large to enumerate supports."""
    players = len(mean_return)
    if players <= NASH_MAX_PLAYERS:
        mass, versus_nash = nash_average(mean_return)
        return mass, versus_nash, nash_average_intervals(comp, outcomes, bootstrap, seed)
    notes.append(
        f"no Nash average: it enumerates supports, at most {NASH_MAX_PLAYERS} "
        f"players (here {players})"
    )
    return np.full(players, np.nan), np.full(players, np.nan), np.full((players, 2), np.nan)


def _rank_key(r: Rating, by_return: bool) -> tuple[float, ...]:
    """Margins (chips): ranked by the return against the field's Nash mixture, where an
    equilibrium player is never below one it beats; the field average breaks ties.  Else by
    the Bradley-Terry rating."""
    if by_return:
        return (-np.nan_to_num(r.nash_average, nan=-np.inf), -r.mean_return)
    return (-r.rating,)
