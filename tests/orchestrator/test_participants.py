"""The typed participant id: its written form, and checkpoints that keep holding the same
strings (a run resumes from checkpoints written before the id was typed)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from marl.agents.participants import bot_name
from marl.config import load_config
from marl.config.train import LeagueConfig
from marl.infra.seats import ParticipantId
from marl.train.checkpoint import load_checkpoint, save_checkpoint
from marl.train.league import League

TINY = Path(__file__).parents[2] / "configs" / "tiny_test.yaml"


def test_ids_parse_and_write_back() -> None:
    for text in ("team:0", "bot:random", "ckpt:/runs/a:b", "snap:10"):
        pid = ParticipantId.parse(text)
        assert str(pid) == text and ParticipantId.parse(str(pid)) == pid
    assert ParticipantId.parse("ckpt:/runs/a:b").arg == "/runs/a:b"
    assert ParticipantId.team(3) == ParticipantId("team", "3")
    assert ParticipantId.team(3).index == 3
    assert len({ParticipantId.parse("snap:1"), ParticipantId("snap", "1")}) == 1
    assert f"{ParticipantId('snap', '4')}@player" == "snap:4@player"


@pytest.mark.parametrize("text", ["random", "latest", "seat:1", ":x"])
def test_malformed_ids_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        ParticipantId.parse(text)


def test_bot_sources_with_or_without_prefix() -> None:
    assert bot_name("random", "kuhn_poker") == "random"
    assert bot_name("bot:optimal", "kuhn_poker") == "optimal"
    assert bot_name("bot:nobody", "kuhn_poker") is None
    assert bot_name("runs/random", "kuhn_poker") is None


def test_league_ids_and_an_old_state_resume_alike() -> None:
    cfg = LeagueConfig(
        opponents="league",
        anchors=["random", "/runs/x"],
        pool_size=2,
        snapshot_every=1,
        sampling="winrate",
        latest_prob=0.0,
    )
    league = League(cfg, ["random", "heuristic"])
    assert league.anchors == [ParticipantId("bot", "random"), ParticipantId("ckpt", "/runs/x")]
    for step in (1, 2, 3):
        league.maybe_snapshot(step, {"player": {}})
    assert list(league.snapshots) == [ParticipantId("snap", "2"), ParticipantId("snap", "3")]
    league.record(ParticipantId("bot", "random"), True)
    league.record(ParticipantId("snap", "3"), False)
    old_state = {
        "snapshots": ["snap:2", "snap:3"],
        "results": {"bot:random": [1, 1], "snap:3": [1, 0]},
    }  # as written before
    assert json.dumps(league.state()) == json.dumps(old_state)
    resumed = League(cfg, ["random", "heuristic"])
    resumed.load_state(old_state, dict(league.snapshots))
    assert resumed.snapshots == league.snapshots and resumed.results == league.results
    a, b = random.Random(7), random.Random(7)
    assert [league.sample(a) for _ in range(20)] == [resumed.sample(b) for _ in range(20)]
    assert League(LeagueConfig(), []).sample(random.Random(0)) is None  # self-play


def test_checkpoints_keep_the_written_snapshot_ids(tmp_path: Path) -> None:
    weights = {"player": {"w": torch.ones(2)}}
    sid = ParticipantId("snap", "5")
    state = {"league": {"snapshots": ["snap:5"], "results": {"snap:5": [2, 1]}}}
    ck = save_checkpoint(tmp_path / "run", 5, load_config(TINY), {}, {}, {sid: weights}, state)
    assert (ck / "league" / "snap_5.safetensors").is_file()
    assert json.loads((ck / "state.json").read_text())["league"] == state["league"]
    loaded = load_checkpoint(ck, {})
    assert list(loaded.snapshots) == [sid]
    assert torch.equal(loaded.snapshots[sid]["player"]["w"], torch.ones(2))
