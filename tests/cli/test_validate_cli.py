"""``marl validate``: every problem of every file in one run, each at its line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from helpers import RECIPES, REPO
from marl.cli import app

FOUR_MISTAKES = """\
schema: marl-teams/v1
name: four
roles:
  - name: player
    model: tiny-random
    colour: red
    decoding: {mode: choice, temperature: -1}
topology: {kind: chain, final: nobody}
game: {name: kuhn_poker, kwargs: {foo: 1}}
"""


def validate(*files: Path | str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, ["validate", *map(str, files)])
    assert "Traceback" not in result.output
    return result.exit_code, result.output.splitlines()


def test_a_file_with_four_mistakes_reports_all_four_at_once(tmp_path: Path) -> None:
    """A schema error, an unknown key, a rule spanning sections and a game check: one run."""
    path = tmp_path / "four.yaml"
    path.write_text(FOUR_MISTAKES)
    code, lines = validate(path)
    assert code == 2
    where = [re.match(rf"{re.escape(str(path))}:(\d+):\d+: ([\w.]+): ", ln) for ln in lines]
    assert all(where), lines
    assert [(int(m[1]), m[2]) for m in where] == [
        (6, "roles.0.colour"),
        (7, "roles.0.decoding.temperature"),
        (8, "topology.final"),
        (9, "game.kwargs"),
    ]
    assert "unknown role 'nobody'" in lines[2] and "'foo'" in lines[3]


def test_rules_and_game_checks_run_beside_each_other(tmp_path: Path) -> None:
    """A rule spanning sections fails; the checks needing the game run all the same."""
    path = tmp_path / "two.yaml"
    text = FOUR_MISTAKES.replace("    colour: red\n", "").replace("kwargs: {foo: 1}", "kwargs: {}")
    path.write_text(
        text.replace("temperature: -1", "temperature: 0")
        + "train: {steps: 1, reward_scales: {nobody: 1.0}}\n"
    )
    code, lines = validate(path)
    assert code == 2
    assert [ln.split(": ")[1] for ln in lines] == ["topology.final", "train", "train.reward_scales"]
    assert "self-play puts the team in all 2 seats" in lines[1]


def test_every_file_is_validated_and_any_failure_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(FOUR_MISTAKES)
    tournament = tmp_path / "cup.yaml"
    tournament.write_text(
        "schema: marl-teams/tournament/v1\nname: cup\ngame: {name: kuhn_poker}\n"
        "participants:\n  - {name: a, source: random}\n  - {name: b, source: gone/run}\n"
        "games_per_pairing: 3\nbootstrap: -1\n"
    )
    good = RECIPES / "tiny_test.yaml"
    code, lines = validate(bad, good, tmp_path / "missing.yaml", tournament)
    assert code == 2
    assert sum(ln.startswith(f"{bad}:") for ln in lines) == 4
    assert f"{good}: ok" in lines
    assert f"{tmp_path / 'missing.yaml'}:1:1: no such file" in lines
    cup = [ln for ln in lines if ln.startswith(f"{tournament}:")]
    assert [ln.split(": ")[1] for ln in cup] == [
        "participants.1.source",
        "games_per_pairing",
        "bootstrap",
    ], cup
    code, lines = validate(good, RECIPES / "tournament_kuhn.yaml")
    assert code == 0 and len(lines) == 2


def test_validating_a_team_loads_no_model_library() -> None:
    """`marl validate` answers in a second or two: the checks import neither torch nor
    transformers (the agents and topologies packages load those on first use)."""
    code = (
        "import sys; from marl.cli import app; from typer.testing import CliRunner; "
        f"r = CliRunner().invoke(app, ['validate', {str(RECIPES / 'tiny_test.yaml')!r}]); "
        "assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
