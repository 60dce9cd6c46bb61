"""`marl play --human`: a person, driven here through the input stream, against a bot or a
trained run's best checkpoint; moves announced, typos re-asked, results and a summary shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import tiny_team
from marl.cli import app
from marl.config import load_config_text

TINY = Path(__file__).parents[3] / "configs" / "tiny_test.yaml"


@pytest.fixture(scope="module")
def best_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two evaluated steps of the tiny team on Kuhn poker, so RUN/best exists."""
    from marl.train.trainer import Trainer

    run = tmp_path_factory.mktemp("human") / "run"
    Trainer(
        load_config_text(
            tiny_team(
                "kuhn_poker",
                "  steps: 2\n  eval_every: 1\n  groups_per_step: 1\n  group_size: 2\n"
                "  checkpoint_every: 1\n  ray: {enabled: false}\n",
            )
        ),
        run,
    ).fit()
    assert (run / "best").is_file()
    return run


def play(*args: str, stdin: str) -> str:
    result = CliRunner().invoke(app, ["play", str(TINY), "--human", *args], input=stdin)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result.output


def test_human_against_a_runs_best_checkpoint_through_stdin(best_run: Path, tmp_path: Path) -> None:
    # "call" is never legal first; "9" is no move's number; "quit" ends the session
    moves = "\n".join(["call", "9", "1"] * 4)
    out = play(
        "--against",
        str(best_run / "best"),
        "--episodes",
        "2",
        "--out",
        str(tmp_path),
        stdin=moves + "\n",
    )
    assert "you play against run" in out
    assert "opponent (run) plays [" in out
    assert "'call' is not one of your moves" in out and "'9' is not one of your moves" in out
    assert out.count("game 1 over") == 1 and out.count("game 2 over") == 1
    assert "Your opponent held" in out and "chips" in out
    summary = out.split("summary")[-1]
    assert "2 game(s)" in summary and "mean" in summary and "(95%)" in summary
    episodes = [
        json.loads(line) for line in (tmp_path / "transcripts.jsonl").read_text().splitlines()
    ]
    assert len(episodes) == 2
    assert [ep["seats"]["player_0"] for ep in episodes] == ["you", "run"]  # seats alternate


def test_end_of_input_stops_cleanly_with_the_summary_so_far(tmp_path: Path) -> None:
    out = play(
        "--against",
        "random",
        "--episodes",
        "5",
        "--out",
        str(tmp_path / "t.jsonl"),
        "--seat",
        "player_1",
        stdin="",
    )
    assert "stopped" in out
    assert "0 game(s)" in out.split("summary")[-1]
    assert all("you are player_1" in line for line in out.splitlines() if "you are" in line)


def test_without_against_the_configs_first_role_plays_and_says_so(tmp_path: Path) -> None:
    out = play("--episodes", "1", "--out", str(tmp_path), stdin="quit\n")
    assert "no --against: you play tiny-test's first role 'player'" in out


def test_a_board_game_ends_with_its_board(tmp_path: Path) -> None:
    # every cell in order: the ones taken are re-asked, so the game always finishes
    cells = "\n".join(str(c) for c in range(9) for _ in range(2))
    out = play(
        "--game",
        "tic_tac_toe",
        "--against",
        "random",
        "--episodes",
        "1",
        "--seat",
        "player_0",
        "--out",
        str(tmp_path),
        stdin=cells + "\n",
    )
    over = out.split("game 1 over")[1]
    assert "X" in over and "O" in over  # the final board
    assert "1 game(s)" in out.split("summary")[-1]


def test_human_play_refuses_an_unknown_seat(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "play",
            str(TINY),
            "--human",
            "--against",
            "random",
            "--seat",
            "north",
            "--out",
            str(tmp_path),
        ],
        input="",
    )
    assert result.exit_code == 2
    assert (
        result.output.strip() == "error: --seat north: kuhn_poker has the seats player_0, player_1"
    )


def test_play_writes_transcripts_under_a_fresh_play_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["play", str(TINY), "--against", "random", "--episodes", "1"])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "transcripts.jsonl").exists()
    [folder] = (tmp_path / "runs").iterdir()
    assert folder.name.startswith("play-")
    assert len((folder / "transcripts.jsonl").read_text().splitlines()) == 1


def test_digits_that_are_no_number_are_asked_again(tmp_path: Path) -> None:
    # "²" and "①" are digits to str.isdigit but no number to int(): asked again, not a crash
    out = play(
        "--against", "random", "--episodes", "1", "--out", str(tmp_path), stdin="²\n①\n1\n1\n1\n"
    )
    assert "'²' is not one of your moves" in out and "'①' is not one of your moves" in out
    assert "game 1 over" in out
