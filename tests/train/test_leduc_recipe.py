"""configs/leduc_selfplay.yaml: the recipe loads, and one step of it on the tiny model records
the exact exploitability of Leduc poker (every information state scored)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from marl.config import load_config
from marl.train.trainer import Trainer

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "leduc_selfplay.yaml"


def test_the_leduc_recipe_is_magnet_self_play_in_choice_decoding() -> None:
    cfg = load_config(RECIPE)
    (player,) = cfg.roles
    assert (player.count, player.model, player.decoding.mode) == (
        2,
        "smollm2-135m-instruct",
        "choice",
    )
    assert (player.decoding.precision, cfg.train.precision) == ("auto", "auto")
    assert cfg.game.name == "leduc_poker" and cfg.train.max_minutes == 20
    assert cfg.train.league.opponents == "self" and cfg.train.magnet is not None
    assert "public card" in player.goal


@pytest.mark.filterwarnings("ignore:prompt of")  # the tiny model's byte tokens: > 1024
def test_one_step_of_the_leduc_recipe_on_the_tiny_model_records_exploitability(
    tmp_path: Path,
) -> None:
    cfg = load_config(RECIPE)
    roles = [r.replace(model="tiny-random") for r in cfg.roles]
    cfg = cfg.replace(roles=roles, train=cfg.train.replace(steps=1, max_minutes=None))
    (step,) = Trainer(cfg, tmp_path / "run").fit()
    value = step["eval"]["exploitability"]
    assert math.isfinite(value) and 0 < value < 13  # |payoff| <= 13 chips in Leduc
    assert step["seconds"]["eval"] > 0
