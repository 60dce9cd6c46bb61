"""Iterated rock-paper-scissors: hidden simultaneous moves, per-round rewards, both forms."""

from __future__ import annotations

import numpy as np
import pytest

from marl import games
from marl.games.bots import make_bot
from marl.games.rps import ParallelRockPaperScissors, RockPaperScissors, payoff

ROCK, PAPER, SCISSORS = 0, 1, 2


def test_payoff_is_the_cycle():
    assert [payoff(PAPER, ROCK), payoff(SCISSORS, PAPER), payoff(ROCK, SCISSORS)] == [1, 1, 1]
    assert [payoff(ROCK, PAPER), payoff(ROCK, ROCK)] == [-1, 0]


def test_first_move_stays_hidden_until_the_round_completes():
    views = []
    for first in (ROCK, PAPER, SCISSORS):
        env = RockPaperScissors(rounds=2)
        env.reset(seed=0)
        env.step(first)
        obs = env.observe("player_1")
        views.append((obs["observation"].tolist(), obs["text"]))
    assert views[0] == views[1] == views[2]


def test_rewards_are_paid_per_round():
    env = RockPaperScissors(rounds=2)
    env.reset(seed=0)
    env.step(PAPER)
    assert env.rewards == {"player_0": 0.0, "player_1": 0.0}
    env.step(ROCK)
    assert env.rewards == {"player_0": 1.0, "player_1": -1.0}
    assert "Round 1: you Rock, opponent Paper (lost)" in env.observe("player_1")["text"]
    env.step(ROCK)
    assert env._cumulative_rewards["player_0"] == 0.0  # claimed by acting
    env.step(ROCK)
    assert all(env.terminations.values()) and env.rewards == {"player_0": 0.0, "player_1": 0.0}
    assert env.score("player_0") == 1 and env.score("player_1") == -1


def test_parallel_form_plays_the_same_game():
    env = games.make_parallel("rps", rounds=2)
    obs, infos = env.reset(seed=0)
    assert set(obs) == set(infos) == {"player_0", "player_1"}
    obs, rewards, terms, truncs, _ = env.step({"player_0": SCISSORS, "player_1": PAPER})
    assert rewards == {"player_0": 1.0, "player_1": -1.0} and not any(terms.values())
    assert "Round 1: you Paper, opponent Scissors (lost)" in obs["player_1"]["text"]
    obs, rewards, terms, truncs, _ = env.step({"player_0": ROCK, "player_1": PAPER})
    assert rewards == {"player_0": -1.0, "player_1": 1.0}
    assert all(terms.values()) and not any(truncs.values()) and env.agents == []


@pytest.mark.parametrize(
    "actions, loser",
    [
        ({"player_1": ROCK}, "player_0"),  # missing action
        ({"player_0": ROCK, "player_1": 7}, "player_1"),
    ],
)
def test_parallel_form_forfeits_missing_or_illegal_actions(actions, loser):
    env = ParallelRockPaperScissors(rounds=3)
    env.reset(seed=0)
    _, rewards, terms, _, infos = env.step(actions)
    assert rewards[loser] == -1.0 and sum(rewards.values()) == 0.0
    assert all(terms.values()) and infos[loser]["forfeit"] and env.agents == []


def test_bots():
    env = RockPaperScissors(rounds=5)
    env.reset(seed=0)
    uniform = make_bot("rps", "optimal", seed=0)
    assert uniform.action_probs(env, "player_0") == {0: 1 / 3, 1: 1 / 3, 2: 1 / 3}
    counter = make_bot("rps", "heuristic", seed=0)
    assert counter.action_probs(env, "player_1") == uniform.action_probs(env, "player_1")
    for move in (ROCK, PAPER, ROCK, SCISSORS):  # player_0 favours Rock
        env.step(move)
    assert counter.action_probs(env, "player_1") == {PAPER: 1.0}
    assert counter.act(env, "player_1") == PAPER


def test_uniform_bot_breaks_even_against_the_counter_bot():
    env = RockPaperScissors(rounds=200)
    env.reset(seed=0)
    bots = {
        "player_0": make_bot("rps", "optimal", seed=1),
        "player_1": make_bot("rps", "heuristic", seed=2),
    }
    total = 0.0
    while not all(env.terminations.values()):
        agent = env.agent_selection
        env.step(bots[agent].act(env, agent))
        total += env.rewards["player_0"]
    assert abs(total) < 3 * np.sqrt(200 * 2 / 3)  # 3 sigma of 200 uniform rounds
