"""Advantage estimators and the common-mode projection against hand-computed numbers."""

from __future__ import annotations

import numpy as np
import pytest

from marl.train.advantages import (
    RoleBaseline,
    Samples,
    agent_wise_advantages,
    global_advantages,
    make_estimator,
    remove_common_mode,
    turn_level_advantages,
)


def test_global_pools_every_agent_of_a_group() -> None:
    s = Samples(rewards=[1, 3, 10, 30], groups=[0, 0, 0, 0], agents=["a", "a", "b", "b"])
    r = np.array([1, 3, 10, 30.0])
    expect = (r - r.mean()) / (r.std() + 1e-6)
    assert np.allclose(global_advantages(s).values, expect)


def test_agent_wise_normalises_per_group_and_agent() -> None:
    s = Samples(
        rewards=[1, 3, 10, 30, 5, 5],
        groups=[0, 0, 0, 0, 1, 1],
        agents=["a", "a", "b", "b", "a", "a"],
    )
    adv = agent_wise_advantages(s)
    # (1, 3): mean 2, std 1 -> -1, +1; (10, 30): mean 20, std 10 -> -1, +1; (5, 5): no signal
    assert np.allclose(adv.values, [-1, 1, -1, 1, 0, 0], atol=1e-5)
    assert adv.degenerate == 1 and adv.cells == 3


def test_scale_none_keeps_the_rewards_units() -> None:
    """advantage_scale none: r - mean of the cell, not divided, in every normalised estimator."""
    s = Samples(
        rewards=[1, 3, 10, 30, 5, 5],
        groups=[0, 0, 0, 0, 1, 1],
        agents=["a", "a", "b", "b", "a", "a"],
        episodes=[0, 0, 1, 1, 2, 2],
        turn_rewards=[1, 3, 10, 30, 5, 5],
    )
    adv = make_estimator("agent_wise", scale="none")(s)
    assert np.allclose(adv.values, [-1, 1, -10, 10, 0, 0])
    assert adv.degenerate == 1 and adv.cells == 3
    assert np.allclose(make_estimator("global", scale="none")(s).values, [-10, -8, -1, 19, 0, 0])
    # turn level, gamma 0: a's returns (1, 3, 5, 5), b's (10, 30), each centred on its mean
    assert np.allclose(
        make_estimator("turn_level", gamma=0.0, scale="none")(s).values,
        [-2.5, -0.5, -10, 10, 1.5, 1.5],
    )
    assert np.allclose(make_estimator("agent_wise")(s).values, agent_wise_advantages(s).values)


def test_rae_uses_the_baseline_before_updating_it() -> None:
    rae = RoleBaseline(decay=0.5)
    s = Samples(
        rewards=[1.0, 3.0, -1.0],
        groups=[0, 0, 0],
        agents=["x", "x", "y"],
        games=["g", "g", "g"],
        roles=["p0", "p0", "p1"],
    )
    assert np.allclose(rae(s).values, [1, 3, -1])  # baselines start at the first batch mean
    assert rae.baseline == {"g/p0": 2.0, "g/p1": -1.0}
    assert np.allclose(rae(s).values, [-1, 1, 0])
    assert rae.baseline == {"g/p0": 2.0, "g/p1": -1.0}
    s2 = Samples(rewards=[4.0], groups=[0], agents=["x"], games=["g"], roles=["p0"])
    assert np.allclose(rae(s2).values, [2.0])
    assert rae.baseline["g/p0"] == pytest.approx(0.5 * 2 + 0.5 * 4)


def test_turn_level_discounts_per_player_then_normalises() -> None:
    # episode 0: a acts twice (rewards 0 then 1), b once (reward -1); gamma 0.5
    s = Samples(
        rewards=[0] * 4,
        groups=[0] * 4,
        agents=["a", "b", "a", "a"],
        episodes=[0, 0, 0, 1],
        turn_rewards=[0.0, -1.0, 1.0, 2.0],
    )
    adv = turn_level_advantages(s, gamma=0.5)
    g_a = np.array([0.5, 1.0, 2.0])  # a's returns: 0 + 0.5*1, 1, and episode 1's 2
    assert np.allclose(adv.values[[0, 2, 3]], (g_a - g_a.mean()) / (g_a.std() + 1e-6))
    assert adv.values[1] == 0  # b has one sample: nothing to compare with
    assert set(make_estimator("turn_level", gamma=0.5)(s).values) == set(adv.values)


def test_common_mode_removal_keeps_only_what_depends_on_the_card() -> None:
    # public "?:" of seat a, actions (check, bet): K bets (pi = .5, .5) with A = +1, J bets
    # (pi = .2, .8) with A = -1, J checks with A = +0.5.  Score rows 1[a = k] - pi(k):
    # K bet (-.5, .5), J bet (-.2, .2), J check (.8, -.8): one direction v = (.5, .2, -.8).
    # Projection: A' = A - c v (v.A) / (v.v), v.A = .5 - .2 - .4 = -.1, v.v = .93.
    adv = np.array([1.0, -1.0, 0.5, 5.0])
    s = Samples(
        rewards=[0] * 4,
        groups=["K:", "J:", "J:", "x"],
        agents=["a"] * 4,
        publics=["?:", "?:", "?:", None],
        choices=[1, 1, 0, 1],
        probs=[[0.5, 0.5], [0.2, 0.8], [0.2, 0.8], [0.5, 0.5]],
    )
    v = np.array([0.5, 0.2, -0.8])
    full = remove_common_mode(adv, s, 1.0)
    assert np.allclose(full[:3], adv[:3] + v * 0.1 / 0.93)
    assert abs(full[:3] @ v) < 1e-12  # no net push on "bet" for every card alike
    assert full[3] == 5.0  # no public state: unchanged
    half = remove_common_mode(adv, s, 0.5)
    assert np.allclose(half[:3], adv[:3] + 0.5 * v * 0.1 / 0.93)
    assert remove_common_mode(adv, s, 0.0) is adv
