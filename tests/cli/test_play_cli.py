"""`marl play` end to end on the tiny model: decoding overrides, bots, counted parse errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from marl.cli import app

TINY = Path(__file__).parents[2] / "configs" / "tiny_test.yaml"


@pytest.mark.parametrize(
    ("game", "mode", "against", "extra"),
    [
        ("kuhn_poker", "free", "random", ["--temperature", "0.7"]),
        ("tic_tac_toe", "free", "optimal", []),
        ("tic_tac_toe", "choice", "random", ["--temperature", "0"]),
    ],
)
def test_play_runs_to_the_end_in_either_mode(
    tmp_path: Path, game: str, mode: str, against: str, extra: list[str]
) -> None:
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "play",
            str(TINY),
            "--game",
            game,
            "--mode",
            mode,
            "--against",
            against,
            "--episodes",
            "4",
            "--concurrency",
            "4",
            "--out",
            str(out),
            *extra,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "parse errors" in result.output
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(episodes) == 4
    player = [t for ep in episodes for t in ep["turns"] if t["name"] != against]
    assert player
    if mode == "choice":  # the model picks among legal moves: nothing to parse
        assert all(t["parsed"] and t["legal"] for t in player)
    else:  # random-weight text: failures are counted in the transcript, not raised
        assert any(len(t["text"]) > 0 for t in player)


def test_play_rejects_an_unknown_mode() -> None:
    result = CliRunner().invoke(app, ["play", str(TINY), "--mode", "greedy"])
    assert result.exit_code == 2
    assert "--mode must be free or choice" in result.output


def test_play_rejects_a_negative_temperature() -> None:
    result = CliRunner().invoke(app, ["play", str(TINY), "--temperature", "-1"])
    assert result.exit_code == 2


def test_json_gives_mean_returns_and_the_first_players_margin(tmp_path: Path) -> None:
    """The report's returns and margin against the transcripts' own returns, game by game."""
    out = tmp_path / "t.jsonl"
    args = ["play", str(TINY), "--game", "kuhn_poker", "--mode", "choice", "--against", "random"]
    result = CliRunner().invoke(
        app, [*args, "--episodes", "8", "--concurrency", "4", "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    me = doc["margin"]["participant"]
    assert me != "random" and doc["margin"]["games"] == 8
    margins = []
    for ep in episodes:
        (mine,) = [ep["returns"][s] for s, n in ep["seats"].items() if n == me]
        (theirs,) = [ep["returns"][s] for s, n in ep["seats"].items() if n == "random"]
        margins.append(mine - theirs)
    assert doc["margin"]["mean"] == pytest.approx(sum(margins) / 8)
    assert doc["margin"]["low"] < doc["margin"]["mean"] < doc["margin"]["high"]
    for rec in doc["records"]:
        got = [
            ep["returns"][rec["seat"]]
            for ep in episodes
            if ep["seats"][rec["seat"]] == rec["participant"]
        ]
        assert rec["return"]["games"] == rec["games"] == len(got) == 4
        assert rec["return"]["mean"] == pytest.approx(sum(got) / 4)
