"""TextArena's two-player games (``source: textarena``): legal moves read from the
observation, the env's own rules for free text, its rewards as returns; play and train on the
tiny model.  ``make test`` installs textarena and sets MARL_REQUIRE_TEXTARENA, so these run."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

if os.environ.get("MARL_REQUIRE_TEXTARENA"):
    import textarena  # noqa: F401  (make test: a missing package is a failure, not a skip)
else:
    pytest.importorskip("textarena")

from marl import games
from marl.cli import app
from marl.config import GameConfig

GAMES = ["KuhnPoker-v0", "TicTacToe-v0", "SimpleNegotiation-v0"]


def ta(name: str, **kwargs) -> games.TextGame:
    return games.make_from_config(GameConfig(name=name, source="textarena", kwargs=kwargs))


def random_game(env, seed: int) -> int:
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    turns = 0
    while not all(env.terminations.values()):
        agent = env.agent_selection
        action = int(rng.choice(env.legal_actions(agent)))
        if env.action_names[action] == "say":
            action = env.parse_action(agent, "Deal? [Offer: 1 Wheat -> 1 Wood]")
        env.step(action)
        turns += 1
    return turns


@pytest.mark.parametrize("name", GAMES)
def test_random_legal_play_ends_with_textarena_rewards(name: str) -> None:
    env = ta(name)
    for seed in range(3):
        assert random_game(env, seed) >= 5
        assert set(env.rewards.values()) <= {-1.0, 0.0, 1.0}
        assert sum(env.rewards.values()) == 0 and env.result
        assert not any(info["forfeit"] for info in env.infos.values())


def test_kuhn_legal_moves_come_from_the_observation() -> None:
    env = ta("KuhnPoker-v0")
    env.reset(seed=0)
    obs = env.observe(env.agent_selection)
    assert "Kuhn Poker" in obs["text"] and "Legal moves: [check] [bet]" in obs["text"]
    assert obs["action_mask"].tolist() == [1, 1, 0, 0]
    env.step(env.parse_action(env.agent_selection, "I will [bet]"))
    assert env.legal_actions() == [2, 3]  # call, fold


def test_a_move_not_listed_forfeits_before_textarena_sees_it() -> None:
    env = ta("KuhnPoker-v0")
    env.reset(seed=0)
    mover = env.agent_selection
    env.step(env.action_names.index("fold"))  # nothing to fold against
    assert env.infos[mover]["forfeit"] and env.rewards[mover] == -1.0


def test_free_text_goes_to_the_env_and_its_rules_judge_it() -> None:
    env = ta("SimpleNegotiation-v0")
    env.reset(seed=0)
    mover = env.agent_selection
    free = env.parse_action(mover, "[Offer: 1000 Ore -> 1 Wheat]")  # more than it has
    assert env.action_names[free] == "say"
    env.step(free)  # TextArena allows one retry, then ends the game for the mover
    assert env.agent_selection == mover and not any(env.terminations.values())
    env.step(env.parse_action(mover, "[Offer: 1000 Ore -> 1 Wheat]"))
    assert all(env.terminations.values()) and env.infos[mover]["forfeit"]
    assert env.rewards[mover] < 0


def test_unknown_ids_and_missing_moves_are_config_problems() -> None:
    field, msg = games.check_config(GameConfig(name="Kuhn-v9", source="textarena"))
    assert field == "name" and "unknown TextArena game 'Kuhn-v9'" in msg
    assert games.check_config(GameConfig(name="KuhnPoker-v0-long", source="textarena")) is None


def views(env, seed: int, actions: list[int]) -> list[str]:
    """What the seat to move sees at each turn of a game played with ``actions``."""
    env.reset(seed=seed)
    seen = []
    for action in actions:
        if all(env.terminations.values()):
            break
        seen.append(env.observe(env.agent_selection)["text"])
        env.step(action if action in env.legal_actions() else env.legal_actions()[0])
    return seen


def test_interleaved_games_replay_from_their_seeds() -> None:
    """TextArena's Kuhn shuffles Python's shared ``random``: each game keeps its own."""
    actions = [0, 1, 2, 0, 0, 1, 3, 0, 1, 2, 0, 0, 1, 2, 0, 0]
    for seeds in [(1, 2), (3, 4), (5, 6), (7, 8)]:
        alone = {s: views(ta("KuhnPoker-v0"), s, actions) for s in seeds}
        pair = [ta("KuhnPoker-v0") for _ in seeds]
        for env, s in zip(pair, seeds, strict=True):
            env.reset(seed=s)
        seen: dict[int, list[str]] = {s: [] for s in seeds}
        for action in actions:  # one move in each game in turn
            for env, s in zip(pair, seeds, strict=True):
                if not all(env.terminations.values()):
                    seen[s].append(env.observe(env.agent_selection)["text"])
                    legal = env.legal_actions()
                    env.step(action if action in legal else legal[0])
        assert seen == alone
        assert views(pair[0], seeds[0], actions) == alone[seeds[0]]  # a reset replays it too


def test_games_for_other_player_counts_are_refused_by_validate() -> None:
    from marl.agents.checks import game_problems

    problems, _ = game_problems(GameConfig(name="Blackjack-v0", source="textarena"), tasks=False)
    assert problems == [
        (
            ("game", "name"),
            "game Blackjack-v0: reset raised AssertionError: The number of players has to be "
            "1, received 2",
        )
    ]


def test_kuhn_says_that_bets_stay_out_of_the_pot() -> None:
    env = ta("KuhnPoker-v0")
    env.reset(seed=0)
    assert "never adds bets to the pot" in env.observe(env.agent_selection)["text"]


TEAM = """\
schema: marl-teams/v1
name: ta
roles:
  - name: player
    count: 2
    model: tiny-random
    adapter: {{r: 4, alpha: 8}}
    decoding: {{mode: {mode}}}
game: {{source: textarena, name: {name}}}
train:
  steps: 2
  groups_per_step: 2
  group_size: 2
  ray: {{enabled: false}}
"""


@pytest.mark.parametrize(
    ("name", "mode"),
    [("KuhnPoker-v0", "choice"), ("TicTacToe-v0", "choice"), ("SimpleNegotiation-v0", "free")],
)
def test_play_and_train_two_steps_on_the_tiny_model(tmp_path: Path, name: str, mode: str) -> None:
    team = tmp_path / "team.yaml"
    team.write_text(TEAM.format(name=name, mode=mode))
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "play",
            str(team),
            "--episodes",
            "2",
            "--against",
            "random",
            "--out",
            str(tmp_path / "t.jsonl"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"ta on {name}" in result.output
    result = runner.invoke(app, ["train", str(team), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "done: 2 steps" in result.output
