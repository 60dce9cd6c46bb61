"""League sampling: self-play, the latest-policy share, uniform and win-rate weights, the
snapshot pool's schedule and eviction, and what the trainer learns from a snapshot's games."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from helpers import tiny_team
from marl.config import load_config_text
from marl.config.train import LeagueConfig
from marl.infra.seats import ParticipantId
from marl.train.league import League
from marl.train.trainer import Trainer, team_agents

RANDOM = ParticipantId("bot", "random")
HEURISTIC = ParticipantId("bot", "heuristic")


def _draws(league: League, n: int = 20_000, seed: int = 0) -> Counter:
    rng = random.Random(seed)
    return Counter(league.sample(rng) for _ in range(n))


def test_self_play_always_meets_the_latest_policy() -> None:
    league = League(LeagueConfig(opponents="self", anchors=["random"]), ["random"])
    assert set(_draws(league, 500)) == {None}


def test_an_empty_pool_plays_the_latest_policy() -> None:
    league = League(LeagueConfig(opponents="league", latest_prob=0.0), ["random"])
    assert set(_draws(league, 500)) == {None}


def test_latest_share_and_uniform_pool() -> None:
    cfg = LeagueConfig(
        opponents="league", anchors=["random", "heuristic"], latest_prob=0.3, sampling="uniform"
    )
    counts = _draws(League(cfg, ["random", "heuristic"]))
    n = sum(counts.values())
    assert counts[None] / n == pytest.approx(0.3, abs=0.015)
    assert counts[RANDOM] / n == pytest.approx(0.35, abs=0.015)
    assert counts[HEURISTIC] / n == pytest.approx(0.35, abs=0.015)


def test_winrate_sampling_meets_opponents_that_still_win_more_often() -> None:
    """Weights (losses + 1) / (games + 2): 9 losses in 10 games -> 10/12, 1 in 10 -> 2/12,
    so the strong opponent is drawn five times as often."""
    cfg = LeagueConfig(opponents="league", anchors=["random", "heuristic"], latest_prob=0.0)
    league = League(cfg, ["random", "heuristic"])
    for k in range(10):
        league.record(HEURISTIC, trainee_lost=k < 9)
        league.record(RANDOM, trainee_lost=k < 1)
    assert league.results == {HEURISTIC: [10, 9], RANDOM: [10, 1]}
    counts = _draws(league)
    assert counts[HEURISTIC] / counts[RANDOM] == pytest.approx(5.0, rel=0.08)
    assert None not in counts


def test_snapshots_follow_the_schedule_and_evict_the_oldest() -> None:
    cfg = LeagueConfig(opponents="league", snapshot_every=2, pool_size=2)
    league = League(cfg, [])
    taken = [league.maybe_snapshot(step, {"player": {}}) for step in range(1, 8)]
    assert taken == [False, True, False, True, False, True, False]
    assert list(league.snapshots) == [ParticipantId("snap", "4"), ParticipantId("snap", "6")]
    league.record(ParticipantId("snap", "4"), trainee_lost=True)
    league.maybe_snapshot(8, {"player": {}})  # evicts snap:4 and forgets its results
    assert list(league.snapshots) == [ParticipantId("snap", "6"), ParticipantId("snap", "8")]
    assert ParticipantId("snap", "4") not in league.results


def test_checkpoint_anchors_are_folders() -> None:
    league = League(LeagueConfig(opponents="league", anchors=["random", "runs/old"]), ["random"])
    assert league.pool() == [RANDOM, ParticipantId("ckpt", "runs/old")]


LEAGUE_RUN = """\
  steps: 2
  group_size: 2
  groups_per_step: 2
  lr: 0.005
  league: {{opponents: league, latest_prob: 0.0, snapshot_every: 1, learn_from_snapshots: {}}}
  ray: {{enabled: false}}
"""


@pytest.mark.parametrize("learn", [True, False])
def test_a_snapshot_s_turns_are_trained_on_only_when_asked(tmp_path: Path, learn: bool) -> None:
    cfg = load_config_text(tiny_team("kuhn_poker", LEAGUE_RUN.format(str(learn).lower())))
    tr = Trainer(cfg, tmp_path / "run")
    tr.train_step()
    res = tr.train_step()  # every game of step 2 meets step 1's snapshot
    turns = [t for ep in res.episodes for t in ep.turns]
    own = [t for t in turns if t.name in team_agents(cfg)]
    theirs = [t for t in turns if t not in own]
    assert own and theirs and {t.name for t in theirs} == {"snap:1"}
    assert bool({t.role for t in theirs} & tr.trainable_roles) is learn
    assert res.metrics["decisions"] == len(turns if learn else own)


def test_a_checkpoint_anchor_s_turns_are_never_trained_on(tmp_path: Path) -> None:
    old = Trainer(
        load_config_text(tiny_team("kuhn_poker", LEAGUE_RUN.format("true"))), tmp_path / "old"
    )
    old.train_step()
    folder = old.checkpoint()
    run = LEAGUE_RUN.format("true").replace("snapshot_every: 1", f"anchors: ['{folder}']")
    cfg = load_config_text(tiny_team("kuhn_poker", run))
    tr = Trainer(cfg, tmp_path / "new")
    res = tr.train_step()  # every game meets the anchor, which has the trainee's role name
    theirs = [t for ep in res.episodes for t in ep.turns if t.name not in team_agents(cfg)]
    assert theirs and {t.role for t in theirs} == {f"ckpt:{folder}@player"}
    assert res.metrics["decisions"] == sum(len(ep.turns) for ep in res.episodes) - len(theirs)


def test_the_untrained_anchor_is_the_trained_role_without_its_adapter(tmp_path: Path) -> None:
    assert League(LeagueConfig(anchors=["untrained"]), []).anchors == [
        ParticipantId("base", "untrained")
    ]
    run = LEAGUE_RUN.format("true").replace("snapshot_every: 1", "anchors: [untrained]")
    cfg = load_config_text(tiny_team("kuhn_poker", run))
    tr = Trainer(cfg, tmp_path / "run")
    res = tr.train_step()  # every game meets the untrained self, whose turns are not learned
    theirs = [t for ep in res.episodes for t in ep.turns if t.name not in team_agents(cfg)]
    assert theirs and {t.role for t in theirs} == {"base:untrained@player"}
    assert res.metrics["decisions"] == sum(len(ep.turns) for ep in res.episodes) - len(theirs)
    anchor = tr.runtime.worker.extra[ParticipantId("base", "untrained")]
    trainee = tr.runtime.worker.roster.agents[0]
    assert anchor.policy.adapter is None and trainee.policy.adapter is not None
    assert anchor.policy.host is trainee.policy.host  # one copy of the weights
