"""A user's own env that misbehaves (tests/plugins/faulty_games.py): a call that raises, exits,
sleeps, or a game that never ends, at import, in its factory or in play, ends ``marl
validate``, ``play``, ``train`` (with Ray too) and ``games list`` with one line that names the
env and the call, exit 2, within ``game.call_timeout_s`` or the run's ``--max-minutes``; and
masked envs with any gymnasium observation space play."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pettingzoo.test import api_test

from helpers import PLUGINS, marl
from marl import games
from marl.agents.checks import game_problems
from marl.config import GameConfig

TEAM = """\
schema: marl-teams/v1
name: faulty
roles:
  - {{name: player, count: 2, model: tiny-random, adapter: {{r: 4, alpha: 8}},
     decoding: {{mode: choice}}}}
game: {{entry_point: "{entry_point}", kwargs: {kwargs}{extra}}}
train: {{steps: 3, group_size: 2, groups_per_step: 2, checkpoint_every: 1, ray: {{enabled: {ray}}}}}
"""


@pytest.fixture(autouse=True)
def plugins_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))


def team(tmp_path: Path, entry_point: str, kwargs: str = "{}", extra: str = "", ray=False) -> str:
    path = tmp_path / "team.yaml"
    path.write_text(
        TEAM.format(entry_point=entry_point, kwargs=kwargs, extra=extra, ray=str(ray).lower())
    )
    return str(path)


def one_line(done, *words: str) -> None:
    """Exit 2 and one ``error:`` line (after Ray's own start-up lines) saying ``words``."""
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: game "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    for w in words:
        assert w in errors[0], errors[0]


@pytest.mark.parametrize(
    ("spec", "kwargs", "says"),
    [
        ("faulty_games:faulty", {"fault": "reset"}, "reset raised RuntimeError: the reset of"),
        ("faulty_games:faulty", {"fault": "step"}, "step raised RuntimeError: the step of"),
        ("faulty_games:faulty", {"fault": "observe", "how": "exit"}, "observe raised SystemExit"),
        ("broken_at_import:game", {}, "import raised RuntimeError: this module is broken"),
        ("exits_at_import:game", {}, "import raised SystemExit: 0"),
        ("faulty_games:not_an_env", {}, "returned a int, not a PettingZoo AECEnv"),
    ],
)
def test_validate_plays_a_random_game_and_names_the_call_that_fails(spec, kwargs, says) -> None:
    problems, made = game_problems(GameConfig(entry_point=spec, kwargs=kwargs), tasks=False)
    assert made is None and len(problems) == 1, problems
    (path, message) = problems[0]
    assert path == ("game", "entry_point") and says in message, message


def test_a_call_that_hangs_is_stopped_after_call_timeout_s() -> None:
    game = GameConfig(
        entry_point="faulty_games:faulty",
        kwargs={"fault": "step", "how": "sleep"},
        call_timeout_s=1,
    )
    t = time.monotonic()
    problems, _ = game_problems(game, tasks=False)
    assert time.monotonic() - t < 10
    assert problems == [
        (
            ("game", "entry_point"),
            "game faulty_games:faulty: step did not return within game.call_timeout_s (1 s)",
        )
    ]


def test_a_game_that_never_ends_is_cut_at_max_turns() -> None:
    game = GameConfig(entry_point="faulty_games:faulty", kwargs={"endless": True}, max_turns=7)
    assert game_problems(game, tasks=False)[0] == []
    env = games.make_from_config(game)
    env.reset(seed=0)
    moves = 0
    while not any(env.truncations.values()):
        env.step(env.legal_actions()[0])
        moves += 1
    assert moves == 7 and all(env.truncations.values())
    assert env.infos["player_0"]["truncated"] == "game.max_turns (7) reached"


@pytest.mark.parametrize(
    "space", ["discrete", "box", "multi_discrete", "tuple", "dict", "text", "sequence"]
)
def test_masked_envs_with_any_observation_space_play(space: str) -> None:
    game = GameConfig(entry_point="space_games:masked", kwargs={"space": space})
    assert game_problems(game, tasks=False)[0] == []
    env = games.make_from_config(game)
    api_test(env, num_cycles=10)
    env.reset(seed=0)
    assert env.observe("player_0")["action_mask"].tolist() == [1, 1]
    env.step(1)
    assert env.observe("player_1")["action_mask"].tolist() == [1, 0]


def test_play_train_and_games_list_fail_in_one_line(tmp_path: Path) -> None:
    # the first 4 steps pass (validate's random game), the 5th raises
    config = team(tmp_path, "faulty_games:faulty", "{fault: step, after: 4}")
    out = str(tmp_path / "games.jsonl")
    done = marl(
        "play", config, "--episodes", "4", "--against", "random", "--out", out, cwd=tmp_path
    )
    one_line(done, "game faulty_games:faulty: step raised RuntimeError: the step of this env")
    done = marl("train", config, "--out", str(tmp_path / "run"), cwd=tmp_path)
    one_line(done, "game faulty_games:faulty: step raised RuntimeError: the step of this env")
    done = marl("games", "list", "--entry-point", "broken_at_import:game", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "import raised RuntimeError: this module is broken" in done.stderr


@pytest.mark.parametrize(("ray", "after", "minutes"), [(False, 12, "0.25"), (True, 8, "0.75")])
def test_max_minutes_stops_a_run_whose_game_hangs(
    tmp_path: Path, ray: bool, after: int, minutes: str
) -> None:
    """A step that sleeps (in the second training step: after validate's 2 moves and the
    first step's 8 in one process, or the Ray worker's first 8) is stopped 5 s after the budget,
    though game.call_timeout_s is an hour; the run keeps its last complete checkpoint.  On
    Ray the budget reaches the workers, and the error the driver."""
    config = team(
        tmp_path,
        "faulty_games:faulty",
        f"{{fault: step, how: sleep, after: {after}}}",
        extra=", call_timeout_s: 3600",
        ray=ray,
    )
    t = time.monotonic()
    done = marl(
        "train", config, "--out", str(tmp_path / "run"), "--max-minutes", minutes, cwd=tmp_path
    )
    assert time.monotonic() - t < 60 * float(minutes) + 90  # start-up, the budget, 5 s
    one_line(done, "step was still running 5 s after the run's --max-minutes budget ran out")
    assert (tmp_path / "run" / "latest").read_text().strip() == "step_000001"
