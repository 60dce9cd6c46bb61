"""Branched action values (train.branch): every action of a trained decision valued by playing
copies of the game out, checked against a direct play-out, the exact values of winning moves,
the targets they feed and a training run on the tiny model."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from helpers import tiny_team
from marl import games
from marl.agents.agent import Agent
from marl.agents.rollout import Episode, RolloutEngine
from marl.agents.scripted import ScriptedPolicy
from marl.config import ConfigError, load_config_text
from marl.games.bots import make_bot
from marl.games.tictactoe import wins
from marl.train.objectives.policy_target import action_values
from marl.train.trainer import Trainer, TrainingError

PILES = (2, 3, 1)


def _state_before(ep: Episode, turn_index: int, make):
    """The game as it stood when ``ep.turns[turn_index]`` was decided."""
    env = make()
    env.reset(seed=ep.seed)
    for t in ep.turns[:turn_index]:
        env.step(t.action)
    return env


def _play_out(env, action: int, who: str, bot) -> float:
    """``who``'s return from playing ``action`` on, every seat then playing ``bot``."""
    env = copy.deepcopy(env)
    env.step(action)
    total = float(env.rewards[who])
    while any(not (env.terminations[a] or env.truncations[a]) for a in env.agents):
        env.step(bot.act(env, env.agent_selection))
        total += float(env.rewards[who])
    return total


def test_branches_value_every_action_as_a_direct_play_out() -> None:
    """Deterministic seats (Bouton's rule on both sides): each branch's value is the return of
    one play-out, so the engine's values must equal a play-out done here by hand."""
    make = lambda: games.make("nim", piles=PILES)  # noqa: E731
    me = Agent("me", "player", ScriptedPolicy("nim", "optimal"), mode="choice")
    bot = Agent("bot", "bot", ScriptedPolicy("nim", "optimal"), mode="choice")
    seats = make().possible_agents
    engine = RolloutEngine(
        make,
        lambda i: dict(zip(seats, [me, bot] if i % 2 == 0 else [bot, me], strict=True)),
        branch=2,
        branch_roles=["player"],
    )
    eps = engine.play(2)  # K = 2 equal play-outs: a copy left uncredited would halve a value
    assert len(eps) == 2  # branches are not episodes
    optimal = make_bot("nim", "optimal")
    valued = 0
    for ep in eps:
        for i, t in enumerate(ep.turns):
            if t.name != "me":
                assert t.action_values is None  # only the branched roles' decisions
                continue
            env = _state_before(ep, i, make)
            legal = env.legal_actions(t.agent)
            assert t.action_values == [_play_out(env, a, t.agent, optimal) for a in legal]
            valued += len(legal)
    assert valued > 0
    assert {1.0, -1.0} <= {v for ep in eps for t in ep.turns for v in t.action_values or ()}


def test_a_branch_agent_plays_every_seat_of_the_copies() -> None:
    """Random seats, the optimal bot as ``branch_agent``: the values are those of optimal
    play after each action (a direct play-out with the optimal bot), not of the seats."""
    make = lambda: games.make("nim", piles=PILES)  # noqa: E731
    me = Agent("me", "player", ScriptedPolicy("nim", "random", seed=1), mode="choice")
    bot = Agent("bot", "bot", ScriptedPolicy("nim", "random", seed=2), mode="choice")
    rollout = Agent(
        "bot:optimal", "bot:optimal@bot", ScriptedPolicy("nim", "optimal"), mode="choice"
    )
    seats = make().possible_agents
    eps = RolloutEngine(
        make,
        lambda i: dict(zip(seats, [me, bot] if i % 2 == 0 else [bot, me], strict=True)),
        branch=1,
        branch_roles=["player"],
        branch_agent=rollout,
    ).play(6)
    optimal = make_bot("nim", "optimal")
    valued = 0
    for ep in eps:
        for i, t in enumerate(ep.turns):
            if t.action_values is not None:
                env = _state_before(ep, i, make)
                legal = env.legal_actions(t.agent)
                assert t.action_values == [_play_out(env, a, t.agent, optimal) for a in legal]
                valued += len(legal)
    assert valued > 10


def test_a_winning_move_is_worth_exactly_one_whatever_the_seats_sample() -> None:
    """Random seats on both sides: a move that completes a line ends the game at +1 in each of
    its K copies, so its value is exactly 1; every value is a mean of K returns in [-1, 1]."""
    k = 3
    me = Agent("me", "player", ScriptedPolicy("tic_tac_toe", "random", seed=1), mode="choice")
    bot = Agent("bot", "bot", ScriptedPolicy("tic_tac_toe", "random", seed=2), mode="choice")
    make = lambda: games.make("tic_tac_toe")  # noqa: E731
    seats = make().possible_agents
    eps = RolloutEngine(
        make,
        lambda i: dict(zip(seats, [me, bot] if i % 2 == 0 else [bot, me], strict=True)),
        branch=k,
        branch_roles=["player"],
    ).play(40)
    winning = 0
    for ep in eps:
        for i, t in enumerate(ep.turns):
            if t.action_values is None:
                continue
            env = _state_before(ep, i, make)
            for a, v in zip(env.legal_actions(t.agent), t.action_values, strict=True):
                board = list(env.board)
                board[a] = env.mark_of(t.agent)
                if wins(board, a):
                    assert v == 1.0
                    winning += 1
                assert -1.0 <= v <= 1.0 and v * k == pytest.approx(round(v * k))
    assert winning > 10


def test_branched_values_replace_the_batch_s_estimate_of_a_state() -> None:
    keys = ["s", "s", "t"]
    q = action_values(keys, [0, 1, 0], [1.0, -1.0, 0.5], [2, 2, 2], [[0.5, -0.5], [1.0, 0.0], None])
    assert q["s"] == [0.75, -0.25]  # the mean of the state's branched vectors
    assert q["t"] == [0.5, 0.5]  # no branches there: the batch's means


BRANCH = """\
  steps: 2
  group_size: 2
  groups_per_step: 2
  advantage: rae
  lr: 0.005
  branch: 1
  policy_target: {eta: 2.0, fit_steps: 2}
  league: {opponents: league, anchors: [random], latest_prob: 0.0, snapshot_every: 1000}
  ray: {enabled: false}
"""


def test_branch_needs_the_policy_target_step() -> None:
    with pytest.raises(ConfigError, match="policy_target.eta"):
        load_config_text(
            tiny_team(
                "tic_tac_toe",
                BRANCH.replace("  policy_target: {eta: 2.0, fit_steps: 2}\n", ""),
                count=1,
            )
        )


def test_branch_rollout_is_a_bot_of_the_game_and_needs_branching(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="set branch: K > 0"):
        load_config_text(
            tiny_team(
                "tic_tac_toe",
                BRANCH.replace("branch: 1", "branch: 0") + "  branch_rollout: random\n",
                count=1,
            )
        )
    cfg = load_config_text(tiny_team("tic_tac_toe", BRANCH + "  branch_rollout: nobody\n", count=1))
    with pytest.raises(TrainingError, match="neither policy nor a bot of tic_tac_toe"):
        Trainer(cfg, tmp_path / "run")


@pytest.mark.parametrize("rollout", ["policy", "random"])
def test_a_branched_training_run_fits_every_decision_s_values(tmp_path: Path, rollout: str) -> None:
    tr = Trainer(
        load_config_text(
            tiny_team("tic_tac_toe", BRANCH + f"  branch_rollout: {rollout}\n", count=1)
        ),
        tmp_path / "run",
    )
    hist = tr.fit()
    for h in hist:
        assert h["branches"] >= h["decisions"] * 2  # at least two legal moves a decision
        (s,) = h["learner"].values()
        assert s["loss"] > 0 and s["fit_residual"] < s["loss"]
