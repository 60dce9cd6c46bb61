"""train.reward: what return a decision is trained on (individual, team, relative)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import tiny_smoke, tiny_team
from marl.agents.rollout import Episode
from marl.config import ConfigError, load_config_text
from marl.train.trainer import Trainer


def test_relative_return_is_own_less_the_mean_of_the_others() -> None:
    two = Episode(0, "negotiation", 0, {}, returns={"player_0": 0.7, "player_1": 0.2})
    assert two.relative_return("player_0") == pytest.approx(0.5)
    assert two.relative_return("player_1") == pytest.approx(-0.5)
    three = Episode(0, "g", 0, {}, returns={"a": 3.0, "b": 1.0, "c": 0.0})
    assert three.relative_return("a") == pytest.approx(2.5)
    assert sum(three.relative_return(a) for a in three.returns) == pytest.approx(0.0)


def test_the_negotiation_recipe_trains_on_its_margin(tmp_path: Path) -> None:
    """Every trained decision's reward is its seat's share less the partner's, so a deal that
    gives the partner more is worth less than no deal."""
    cfg = tiny_smoke("configs/negotiation_vs_untrained.yaml", steps=1)
    assert cfg.train.reward == "relative"
    trainer = Trainer(cfg, tmp_path / "run")
    res = trainer.train_step()
    rows, samples = trainer.samples(res.episodes, trainer.plan(1))
    assert any(min(ep.returns.values()) > 0 for ep, _ in rows)  # a deal: the partner got some
    for (ep, t), r in zip(rows, samples.rewards, strict=True):
        (partner,) = set(ep.returns) - {t.agent}
        assert r == pytest.approx(ep.returns[t.agent] - ep.returns[partner] + t.format_reward)


def test_relative_reward_refuses_turn_level_credit() -> None:
    train = "  reward: relative\n  advantage: turn_level\n"
    with pytest.raises(ConfigError, match="reward relative compares whole-game returns"):
        load_config_text(tiny_team("negotiation", train))
