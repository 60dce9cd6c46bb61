"""``marl eval`` and the other table commands: a run is evaluated on its own game, arguments
are refused before any model loads, ``--json`` is one document on stdout, and no figure is
cut short at 80 columns or in a pipe."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from helpers import RECIPES, tiny_team
from marl.cli import app, output
from marl.config import load_config_text
from marl.infra.layout import METRICS
from marl.train.checkpoint import save_checkpoint

UNLOADABLE = "/nonexistent/model"  # a local path that is not there: loading it fails


def fake_run(run: Path, game: str, model: str = "tiny-random", kwargs: str = "{}") -> Path:
    """A run folder with one checkpoint of a one-role team (no adapter) on ``game``."""
    text = tiny_team(game, "  steps: 1\n").replace("    adapter: {r: 4, alpha: 8}\n", "")
    text = text.replace(f"game: {{name: {game}}}", f"game: {{name: {game}, kwargs: {kwargs}}}")
    cfg = load_config_text(text.replace("model: tiny-random", f"model: {model}"))
    save_checkpoint(run, 1, cfg, {}, {}, {}, {"league": {}})
    (run / METRICS).write_text('{"step": 1}\n')
    return run


def cli(*args: str, columns: int = 80) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
    return result.exit_code, result.stdout, result.stderr


def refused(code: int, stdout: str, stderr: str, *words: str) -> None:
    """Exit 2 with one ``error:`` line on stderr saying ``words``."""
    assert code == 2, stdout + stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for w in words:
        assert w in lines[0], stderr


def test_a_leduc_run_is_evaluated_on_leduc(tmp_path: Path) -> None:
    """Without --game a run's own game is scored: the exact Leduc figure, not Kuhn's."""
    from marl.agents.participants import ParticipantLoader
    from marl.agents.tables import agent_report

    run = fake_run(tmp_path / "run", "leduc_poker")
    code, stdout, stderr = cli("eval", "exploitability", str(run), "--json")
    assert code == 0, stderr
    doc = json.loads(stdout)
    direct = agent_report(ParticipantLoader("leduc_poker").load(str(run)), "leduc_poker")
    assert doc["game"] == "leduc_poker"
    assert doc["exploitability"] == pytest.approx(direct.exploitability, abs=1e-9)
    kuhn = agent_report(ParticipantLoader("kuhn_poker").load(str(run)), "kuhn_poker")
    assert abs(kuhn.exploitability - direct.exploitability) > 1e-3  # the two would differ
    code, stdout, _ = cli("eval", "exploitability", str(run), "--game", "leduc_poker")
    assert code == 0 and f"leduc_poker exploitability: {direct.exploitability:.6f}" in stdout
    refused(
        *cli("eval", "exploitability", str(run), "--game", "kuhn_poker"),
        "--game kuhn_poker contradicts",
        "leduc_poker",
    )
    team = tmp_path / "team.yaml"  # an untrained team file: its game unless --game says
    team.write_text((run / "checkpoints" / "step_000001" / "team.yaml").read_text())
    code, stdout, _ = cli("eval", "exploitability", str(team), "--json")
    assert code == 0 and json.loads(stdout)["exploitability"] == doc["exploitability"]
    code, stdout, _ = cli("eval", "exploitability", str(team), "--game", "kuhn_poker", "--json")
    assert code == 0 and json.loads(stdout)["game"] == "kuhn_poker"


def test_a_board_run_is_evaluated_on_its_own_board(tmp_path: Path) -> None:
    """A Connect Four run on a 3x3 board: the exact outcomes on that board (the default 6x7
    board's tree would be another game, and out of reach)."""
    from functools import partial

    from marl.agents.participants import ParticipantLoader
    from marl.agents.tables import agent_probs, outcome_report
    from marl.config import GameConfig
    from marl.games import make_from_config
    from marl.games.bots import make_bot

    run = fake_run(tmp_path / "run", "connect_four", kwargs="{rows: 3, cols: 3, connect: 3}")
    code, stdout, stderr = cli("eval", "against", str(run), "--bot", "random", "--json")
    assert code == 0, stderr
    doc = json.loads(stdout)
    board = GameConfig(name="connect_four", kwargs={"rows": 3, "cols": 3, "connect": 3})
    agent = ParticipantLoader("connect_four").load(str(run))
    random = make_bot("connect_four", "random").action_probs
    direct = outcome_report(agent_probs(agent), partial(make_from_config, board), random)
    assert doc["kwargs"] == board.kwargs and doc["positions"] == direct.positions
    for seat, p in direct.seats.items():
        assert doc["seats"][seat] == pytest.approx(p, abs=1e-9)


def test_bad_arguments_are_refused_before_the_model_loads(tmp_path: Path) -> None:
    """The run's model cannot load, so each of these refusals came before any load."""
    poker = fake_run(tmp_path / "poker", "leduc_poker", UNLOADABLE)
    board = fake_run(tmp_path / "board", "tic_tac_toe", UNLOADABLE)
    refused(*cli("eval", "exploitability", str(poker), "--game", "kuhn_poker"), "contradicts")
    refused(*cli("eval", "against", str(poker)), "perfect-information", "leduc_poker")
    refused(*cli("eval", "against", str(board), "--bot", "nosuch"), "no bot 'nosuch'")
    refused(*cli("eval", "exploitability", str(board)), "exact tree", "tic_tac_toe")
    for command in (("eval", "exploitability"), ("eval", "team"), ("eval", "against")):
        refused(
            *cli(*command, str(poker / "best")),
            f"{poker / 'best'} does not exist",
            "train.eval_every",
        )
    tiny = str(RECIPES / "tiny_test.yaml")
    best = str(poker / "best")
    refused(*cli("play", tiny, "--against", best), f"{best} does not exist", "train.eval_every")
    refused(*cli("play", tiny, "--human", "--seat", "nope"), "--seat nope", "player_0")
    refused(*cli("run", best, "--task", "hi"), f"{best} does not exist")
    refused(*cli("eval", "population", str(tmp_path / "nowhere")), "does not exist")
    refused(*cli("eval", "population", str(tmp_path)), "not a training run folder")
    refused(*cli("eval", "exploitability", "nosuch"), "neither a bot of kuhn_poker")
    code, _, stderr = cli("eval", "exploitability", str(poker))
    assert code == 2 and UNLOADABLE in stderr  # the model is the one problem left


def test_exploitability_prints_the_figure_and_the_table_on_request(tmp_path: Path) -> None:
    code, stdout, _ = cli("eval", "exploitability", "random")
    assert code == 0 and stdout.splitlines() == [
        "kuhn_poker exploitability: 0.458333  (NashConv 0.916667)"
    ]
    code, stdout, _ = cli("eval", "exploitability", "random", "--table")
    assert code == 0 and sum(line.startswith("│") for line in stdout.splitlines()) == 12
    code, stdout, _ = cli(
        "eval", "exploitability", "random", "--json", "--out", str(tmp_path / "r.json")
    )
    doc = json.loads(stdout)
    assert doc == json.loads((tmp_path / "r.json").read_text())
    assert doc["exploitability"] == pytest.approx(11 / 24) and len(doc["table"]) == 12


def test_eval_against_json_and_its_table_agree_at_80_columns() -> None:
    code, stdout, _ = cli("eval", "against", "heuristic", "--json")
    assert code == 0
    doc = json.loads(stdout)
    code, table, _ = cli("eval", "against", "heuristic")
    assert code == 0 and "…" not in table
    for seat, p in doc["seats"].items():
        row = next(line for line in table.splitlines() if line.startswith(f"│ {seat} "))
        assert all(f"{p[k]:.4f}" in row for k in ("win", "draw", "loss")), row
        assert str(doc["positions"][seat]) in row


def test_tables_keep_every_figure_at_80_columns_on_a_terminal_and_in_a_pipe() -> None:
    """A table wider than 80 columns: on an 80-column terminal and piped, every figure is
    printed whole (rich alone would cut them to ``…``)."""
    figures = [f"{1234.5678901 * (i + 1):.7f}" for i in range(6)]
    for terminal in (True, False):
        shown = output.table("wide", {"name": "left", **{f"figure {i}": "right" for i in range(6)}})
        shown.add_row("a rather long participant name that takes room", *figures)
        buffer = io.StringIO()
        out = Console(file=buffer, width=80, force_terminal=terminal, color_system=None)
        output.show(out, shown)
        assert "…" not in buffer.getvalue()
        assert all(f in buffer.getvalue() for f in figures), buffer.getvalue()
        assert out.width == 80  # the console is left as it was


def test_tournament_and_models_list_print_json(tmp_path: Path) -> None:
    spec = tmp_path / "t.yaml"
    spec.write_text(
        "schema: marl-teams/tournament/v1\nname: t\ngame: {name: tic_tac_toe}\n"
        "participants:\n  - {name: random, source: random}\n"
        "  - {name: other, source: random}\n"
        "games_per_pairing: 4\nanchor: random\nbootstrap: 5\n"
    )
    code, stdout, stderr = cli("tournament", str(spec), "--out", str(tmp_path / "o"), "--json")
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert sorted(r["name"] for r in doc["ratings"]) == ["other", "random"] and doc["games"] == 4
    assert Path(doc["files"]["ratings.csv"]).is_file()
    code, stdout, _ = cli("tournament", str(spec), "--out", str(tmp_path / "o"))
    assert code == 0 and "…" not in stdout and "4 games (4 read back" in stdout
    code, stdout, _ = cli("models", "list", "--json")
    names = [m["name"] for m in json.loads(stdout)["models"]]
    assert code == 0 and "tiny-random" in names


def think_team(tmp_path: Path) -> Path:
    """An untrained think-mode team file on the tiny model (4 reasoning tokens)."""
    text = tiny_team("kuhn_poker", "  steps: 1\n").replace(
        "decoding: {mode: choice}",
        "decoding: {mode: think, think_tokens: 4, temperature: 1.5, think_prompt: Think.}",
    )
    (tmp_path / "think.yaml").write_text(text)
    return tmp_path / "think.yaml"


def test_reasoning_modes_side_by_side_in_json_and_in_a_table(tmp_path: Path) -> None:
    team = str(think_team(tmp_path))
    args = ("eval", "exploitability", team, "--samples", "2", "--reasoning", "all")
    code, stdout, stderr = cli(*args, "--json", "--show", "1")
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert doc["reasoning"] == "all" and list(doc["modes"]) == ["own", "empty", "swap"]
    for mode, m in doc["modes"].items():
        assert m["reasoning"] == mode and len(m["table"]) == 12 and m["exploitability"] >= 0
        assert [len(t) for t in m["transcripts"].values()] == [1] * 12
        sampled = mode != "empty"
        assert ("interval" in m) == ("naming" in m) == sampled
        if sampled:
            assert m["samples"] == 2 and m["naming"]["reasonings"] == 24
            assert 0 <= m["naming"]["own"] <= 1 and 0 <= m["naming"]["other"] <= 1
    for key, (t,) in doc["modes"]["swap"]["transcripts"].items():
        assert t["from"] != key and set(t["policy"]) <= {"Check", "Bet", "Call", "Fold"}
    code, table, _ = cli(*args)  # the same seeds: the same figures, none cut short
    assert code == 0 and "…" not in table
    for mode, m in doc["modes"].items():
        row = next(line for line in table.splitlines() if line.startswith(f"│ {mode} "))
        assert f"{m['exploitability']:.6f}" in row, row
        assert ("exact" in row) == (mode == "empty"), row
    code, stdout, _ = cli("eval", "exploitability", team, "--samples", "2", "--json")
    own = json.loads(stdout)  # a think policy's default: its own reasonings
    assert (
        own["reasoning"] == "own" and own["exploitability"] == doc["modes"]["own"]["exploitability"]
    )


def test_reasoning_options_are_refused_for_a_policy_that_writes_none(tmp_path: Path) -> None:
    """A choice-mode run whose model cannot load: the refusal comes before any load."""
    run = str(fake_run(tmp_path / "run", "kuhn_poker", UNLOADABLE))
    for option in (("--reasoning", "swap"), ("--reasoning", "own"), ("--show", "2")):
        refused(
            *cli("eval", "exploitability", run, *option),
            f"{option[0]} needs a think-mode policy",
            "choice mode",
        )
    refused(*cli("eval", "exploitability", "random", "--reasoning", "empty"), "is a bot")
    team = str(think_team(tmp_path))
    refused(*cli("eval", "exploitability", team, "--reasoning", "nope"), "own, empty, swap")
