"""The population meta-strategy: mixtures of table policies, their exact exploitability and
the least exploitable mixture, checked against mixtures worked out by hand on Kuhn poker."""

from __future__ import annotations

import pytest

from games.analysis import exploitability, game_tree
from games.cfr import run_cfr
from games.population import least_exploitable_mixture, mixture_exploitability, mixture_policy

GAME = "kuhn_poker"
CHECK, BET, CALL, FOLD = 0, 1, 2, 3


def pure(**moves: int) -> dict[str, dict[int, float]]:
    """A pure Kuhn strategy for both seats: ``J_`` is the key ``J:``, ``Q_cb`` is ``Q:cb``."""
    table = {}
    for name, action in moves.items():
        key = name.replace("_", ":")
        legal = [CHECK, BET] if key[-1] in ":c" else [CALL, FOLD]
        table[key] = {a: float(a == action) for a in legal}
    return table


# Two pure strategies that differ only where the Nash profile (alpha = 0) mixes 1/3 : 2/3:
# player 0 calls a bet with the queen, player 1 bets the jack after a check and calls a bet
# with the queen.  Every such state is reached by both members, so the (1/3, 2/3) mixture is
# that Nash profile.
SHARED = dict(J_=CHECK, Q_=CHECK, K_=CHECK, J_cb=FOLD, K_cb=CALL, J_b=FOLD, K_b=CALL, K_c=BET,
              Q_c=CHECK)
A = pure(**SHARED, Q_cb=CALL, J_c=BET, Q_b=CALL)
B = pure(**SHARED, Q_cb=FOLD, J_c=CHECK, Q_b=FOLD)


def table(sigma) -> dict[str, dict[int, float]]:
    """A slot vector as a table."""
    tree = game_tree(GAME)
    return {key: {a: float(sigma[tree.slot_start[i] + j]) for j, a in enumerate(acts)}
            for i, (key, acts) in enumerate(zip(tree.infoset_keys, tree.infoset_actions,
                                                strict=True))}


def test_two_pure_strategies_mix_to_the_nash_profile() -> None:
    assert exploitability(GAME, A) > 0.1 and exploitability(GAME, B) > 0.1
    assert mixture_exploitability(GAME, [A, B], [1 / 3, 2 / 3]) == pytest.approx(0, abs=1e-12)
    mixed = mixture_policy(GAME, [A, B], [1, 2])  # weights are normalised
    assert mixed["Q:cb"][CALL] == pytest.approx(1 / 3)
    assert mixed["J:c"][BET] == pytest.approx(1 / 3)
    solution = least_exploitable_mixture(GAME, [A, B], tol=1e-4)
    assert solution.weights == pytest.approx([1 / 3, 2 / 3], abs=1e-3)
    assert solution.exploitability <= 1e-4
    assert solution.lower_bound <= solution.exploitability


def test_the_mixture_weights_each_member_by_its_own_reach() -> None:
    # C bets the jack (and would fold it after check-bet), D checks it and calls: only D
    # reaches J:cb, so the mixture calls there for sure, not half the time.
    c = pure(**{**SHARED, "J_": BET}, Q_cb=CALL, J_c=BET, Q_b=CALL)
    d = pure(**{**SHARED, "J_cb": CALL}, Q_cb=CALL, J_c=BET, Q_b=CALL)
    mixed = mixture_policy(GAME, [c, d], [0.5, 0.5])
    assert mixed["J:"][BET] == pytest.approx(0.5)
    assert mixed["J:cb"] == {CALL: 1.0, FOLD: 0.0}
    assert mixed["K:cb"] == {CALL: 1.0, FOLD: 0.0}  # where both agree, they agree


def test_a_member_repeated_is_that_member() -> None:
    member = table(run_cfr(game_tree(GAME), 3))
    mixed = mixture_policy(GAME, [member] * 3, [1, 1, 1])
    for key, row in member.items():
        assert mixed[key] == pytest.approx(row)
    assert mixture_exploitability(GAME, [member] * 3, [1, 1, 1]) == pytest.approx(
        exploitability(GAME, member))
    solution = least_exploitable_mixture(GAME, [member] * 3)
    assert solution.exploitability == pytest.approx(exploitability(GAME, member), abs=1e-9)


def test_cfr_iterates_as_a_population_beat_their_best_member_and_cfrs_average() -> None:
    tree = game_tree(GAME)
    iterates: list = []
    average = run_cfr(tree, 10, on_iterate=iterates.append)
    members = [table(s) for s in iterates]
    best = min(exploitability(GAME, m) for m in members)
    solution = least_exploitable_mixture(GAME, members, tol=1e-4)
    assert solution.exploitability <= 0.01 < best
    assert solution.exploitability < exploitability(GAME, table(average))
    assert solution.exploitability - solution.lower_bound <= 1e-4 + 1e-12
    assert sum(solution.weights) == pytest.approx(1.0)


def test_bad_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        mixture_policy(GAME, [A, B], [1.0, -0.5])
    with pytest.raises(ValueError, match="empty"):
        least_exploitable_mixture(GAME, [])
