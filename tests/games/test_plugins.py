"""Bring your own game: PettingZoo envs the project does not register (tests/plugins/), named
by ``entry_point`` in team and tournament files, through the plain ``marl`` command."""

from __future__ import annotations

import csv
import json
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from pettingzoo.test import api_test

from helpers import PLUGINS, marl
from marl import games
from marl.config import ConfigError, GameConfig, TeamConfig, load_config
from marl.games import registry
from marl.games.bots import bot_names

TEAM = """\
schema: marl-teams/v1
name: plug
roles:
  - name: player
    count: 2
    model: tiny-random
    adapter: {{r: 4, alpha: 8}}
    decoding: {{mode: choice}}
game: {{entry_point: "{entry_point}", kwargs: {kwargs}}}
train:
  steps: 2
  groups_per_step: 2
  group_size: 2
  ray: {{enabled: true}}
"""


@pytest.fixture(autouse=True)
def plugins_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))


@pytest.mark.parametrize("entry_point", ["pz_games:closest_number", "pz_games:pennies"])
def test_entry_point_games_pass_the_pettingzoo_api_test(entry_point: str) -> None:
    env = games.make_from_config(GameConfig(entry_point=entry_point))
    api_test(env, num_cycles=20)
    env.reset(seed=0)
    text = env.observe(env.agent_selection)["text"]
    assert "Legal moves: [0] [1]" in text  # no action mask: every action is legal


def test_a_describe_method_gives_the_view_else_a_readable_default() -> None:
    env = games.make_from_config(
        GameConfig(entry_point="pz_games:closest_number", kwargs={"target": 3})
    )
    env.reset(seed=0)
    env.step(1)
    assert "closest to 3 wins. player_0 called 1." in env.observe("player_1")["text"]
    env = games.make_from_config(GameConfig(entry_point="pz_games:pennies"))
    env.reset(seed=0)
    text = env.observe("even")["text"]
    assert "You are even. It is even's turn." in text and "array of shape 2" in text


def test_check_config_names_the_problem_field() -> None:
    assert games.check_config(GameConfig(entry_point="pz_games:closest_number")) is None
    field, msg = games.check_config(GameConfig(entry_point="nowhere_mod:f"))
    assert field == "entry_point" and "No module named 'nowhere_mod'" in msg
    field, msg = games.check_config(GameConfig(entry_point="pz_games:nope"))
    assert field == "entry_point" and "has no 'nope'" in msg
    field, msg = games.check_config(
        GameConfig(entry_point="pz_games:closest_number", kwargs={"targte": 1})
    )
    assert field == "kwargs" and "did you mean 'target'?" in msg


def test_a_team_file_never_calls_what_is_not_a_game_factory(tmp_path: Path) -> None:
    """``os:system`` and the like are refused before any call: validate reports the field,
    and the command they were given never runs."""
    marker = tmp_path / "ran"
    for spec, says in [
        ("os:system", "standard library"),
        ("subprocess:run", "standard library"),
        ("builtins:exec", "standard library"),
        ("pz_games:np.random", "not a game factory"),  # a module: not a class or function
    ]:
        path = tmp_path / "team.yaml"
        kwargs = f'{{command: "touch {marker}"}}'
        path.write_text(TEAM.format(entry_point=spec, kwargs=kwargs))
        done = marl("validate", str(path), cwd=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "game.entry_point" in done.stdout and says in done.stdout, done.stdout
        assert "Traceback" not in done.stdout + done.stderr
        assert not marker.exists()


def test_the_schema_labels_entry_points_and_refuses_two_routes() -> None:
    game = GameConfig(entry_point="pz_games:pennies")
    assert game.name == "pz_games:pennies"
    assert GameConfig.model_validate(game.model_dump()) == game
    with pytest.raises(ValueError, match="entry_point or source, not both"):
        GameConfig(entry_point="pz_games:pennies", source="textarena", name="x")
    with pytest.raises(ValueError, match="pattern"):
        GameConfig(entry_point="no colon here")


def test_validate_reports_seats_that_do_not_fit(tmp_path: Path) -> None:
    path = tmp_path / "team.yaml"
    text = TEAM.format(entry_point="pz_games:closest_number", kwargs="{}")
    path.write_text(text.replace("count: 2", "count: 3"))
    with pytest.raises(ConfigError, match="3 agents but pz_games:closest_number has 2 seats"):
        from marl.agents.checks import team_problems

        load_config(path, TeamConfig, checks=[team_problems])


def test_an_entry_point_group_registers_games_lazily(monkeypatch) -> None:
    ep = EntryPoint("closest", "pz_games:closest_number", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "installed_plugins", lambda: {"closest": ep})
    monkeypatch.setattr(registry, "_GAMES", dict(registry._GAMES))
    assert "closest" in games.names() and "closest" not in registry._GAMES  # not imported
    assert games.check_config(GameConfig(name="closest", kwargs={"target": 1})) is None
    env = games.make("closest", numbers=3)
    assert env.action_names == ["0", "1", "2"] and env.metadata["name"] == "closest_number"


def test_validate_play_train_on_ray_and_tournament_from_the_plain_cli(tmp_path: Path) -> None:
    team = tmp_path / "team.yaml"
    team.write_text(TEAM.format(entry_point="pz_games:closest_number", kwargs="{target: 3}"))
    done = marl("validate", str(team), cwd=tmp_path)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr
    done = marl(
        "play",
        str(team),
        "--episodes",
        "4",
        "--against",
        "random",
        "--out",
        str(tmp_path / "t.jsonl"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "plug on pz_games:closest_number" in done.stdout and "parse errors 0" in done.stdout
    done = marl("train", str(team), "--out", str(tmp_path / "run"), cwd=tmp_path, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Started a local Ray instance" in done.stderr and "done: 2 steps" in done.stdout
    tour = tmp_path / "tour.yaml"
    tour.write_text(
        "schema: marl-teams/tournament/v1\nname: t\n"
        "game: {entry_point: 'pz_games:closest_number', kwargs: {target: 3}}\n"
        "participants:\n  - {name: a, source: random}\n  - {name: b, source: random}\n"
        "  - {name: run, source: run}\n"
        "games_per_pairing: 4\nbootstrap: 10\n"
    )
    done = marl("tournament", str(tour), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    with (tmp_path / "out" / "ratings.csv").open() as f:
        assert sorted(r["name"] for r in csv.DictReader(f)) == ["a", "b", "run"]


def test_games_list_shows_seats_kinds_kwargs_bots_and_exact_evaluations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every exact evaluation a game has (exploitability on a tree, outcomes against its bots
    where it has perfect information) and its bots, read from the registries; a factory that
    fails is one line."""
    from typer.testing import CliRunner

    from marl.cli import app

    result = CliRunner().invoke(
        app, ["games", "list", "--entry-point", "pz_games:closest_number", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["kuhn_poker"]["source"] == "registry" and rows["kuhn_poker"]["seats"] == 2
    assert rows["kuhn_poker"]["exact"] == rows["leduc_poker"]["exact"] == ["exploitability"]
    for game in ("tic_tac_toe", "connect_four", "nim"):
        assert rows[game]["exact"] == ["outcomes vs bots"], game
        assert rows[game]["bots"] == bot_names(game)
    assert "optimal" in rows["connect_four"]["bots"] and rows["rps"]["exact"] == []
    assert rows["tiny_hanabi"]["kind"] == "cooperative"
    assert rows["negotiation"]["kind"] == "general-sum"
    own = rows["pz_games:closest_number"]
    assert (own["source"], own["seats"], own["kind"], own["exact"]) == (
        "entry_point",
        2,
        "competitive",
        [],
    )
    assert own["kwargs"] == {"target": 2, "numbers": 4}
    table = CliRunner().invoke(app, ["games", "list"], env={"COLUMNS": "80"})
    line = next(ln for ln in table.stdout.splitlines() if ln.startswith("│ tic_tac_toe "))
    assert "heuristic, optimal, random" in line and "outcomes vs bots" in line
    (tmp_path / "broken_games.py").write_text(
        "def make(**kwargs):\n    raise RuntimeError('boom')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = CliRunner().invoke(app, ["games", "list", "--entry-point", "broken_games:make"])
    assert broken.exit_code == 2 and "Traceback" not in broken.output
    assert broken.output.strip().splitlines() == [
        "error: --entry-point broken_games:make: game broken_games:make: factory raised "
        "RuntimeError: boom"
    ]
    bad = CliRunner().invoke(app, ["games", "list", "--entry-point", "nowhere_mod:f"])
    assert bad.exit_code == 2 and "does not import" in bad.output
