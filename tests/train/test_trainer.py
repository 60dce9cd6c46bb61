"""The training loop: learning on a trivially learnable game, bad-input handling, time
budgets, the best checkpoint and the per-seat RAE baseline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import tiny_team
from marl import games
from marl.config import load_config_text
from marl.games.base import TextGame
from marl.train.trainer import Trainer, TrainingError

# --- a game any policy gradient must learn ------------------------------------------------


@games.register("guess_blue")
class GuessBlue(TextGame):
    """One player picks A or B; B pays 1.  Used only to show learning in tests (names of
    equal length, so the untrained model starts near 50/50)."""

    metadata = {"name": "guess_blue", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ["player_0"]
    action_names = ["A", "B"]
    rules = "Pick a letter."
    obs_shape = (1,)

    def _setup(self, rng: np.random.Generator) -> None:
        self.done = False

    def _legal(self, agent: str) -> list[int]:
        return [0, 1]

    def _apply(self, agent: str, action: int) -> None:
        self._end({agent: float(action == 1)})

    def _encode(self, agent: str) -> np.ndarray:
        return np.zeros(1)

    def _describe(self, agent: str) -> str:
        return "A or B?"


def team(game: str, train: str, count: int = 1, extra: str = "") -> str:
    return tiny_team(game, train, count, extra)


LEARN = """\
  steps: 8
  group_size: 8
  groups_per_step: 4
  lr: 0.01
  checkpoint_every: 100
  ray: {enabled: false}
"""


def test_reward_rises_on_a_trivially_learnable_game(tmp_path: Path) -> None:
    cfg = load_config_text(team("guess_blue", LEARN))
    hist = Trainer(cfg, tmp_path / "run").fit()
    rewards = [h["agents"]["player@player_0"]["reward"] for h in hist]
    assert np.mean(rewards[:2]) < 0.75
    assert np.mean(rewards[-2:]) > np.mean(rewards[:2]) + 0.2
    assert all(h["learner"]["tiny-random"]["grad_norm"] > 0 for h in hist[:2])
    assert (
        tmp_path
        / "run"
        / "checkpoints"
        / "step_000008"
        / "adapters"
        / "player"
        / "adapter_model.safetensors"
    ).is_file()


def test_mismatched_game_fails_before_any_compute(tmp_path: Path) -> None:
    cfg = load_config_text(team("kuhn_poker", LEARN, count=1))
    with pytest.raises(TrainingError, match="2 seats .* 1 agents"):
        Trainer(cfg, tmp_path / "run")
    cfg = load_config_text(team("kuhn_poker", LEARN + "  league: {anchors: [nobody]}\n", 2))
    with pytest.raises(TrainingError, match="anchor 'nobody'"):
        Trainer(cfg, tmp_path / "run")
    frozen = team("kuhn_poker", LEARN).replace("    adapter: {r: 4, alpha: 8}\n", "")
    with pytest.raises(TrainingError, match="no trainable role"):
        Trainer(load_config_text(frozen), tmp_path / "run")


@games.register("guess_nan")
class GuessNaN(GuessBlue):
    """A broken reward: every outcome pays NaN."""

    metadata = {**GuessBlue.metadata, "name": "guess_nan"}

    def _apply(self, agent: str, action: int) -> None:
        self._end({agent: float("nan")})


def test_nan_losses_skip_steps_then_stop(tmp_path: Path) -> None:
    cfg = load_config_text(team("guess_nan", LEARN + "  max_bad_steps: 2\n"))
    tr = Trainer(cfg, tmp_path / "run")
    before = {k: v.clone() for k, v in tr.runtime.weights()["player"].items()}
    with pytest.raises(TrainingError, match="2 steps in a row"):
        tr.fit()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["skipped"] for ln in lines] == [True, True]
    after = tr.runtime.weights()["player"]
    assert all(torch.equal(before[k], after[k]) for k in before)  # no NaN reached the weights


def test_time_budget_stops_after_the_crossing_step_with_a_checkpoint(tmp_path: Path) -> None:
    cfg = load_config_text(team("guess_blue", LEARN + "  max_minutes: 0.00001\n"))
    hist = Trainer(cfg, tmp_path / "run").fit()
    assert [h["step"] for h in hist] == [1]
    assert (tmp_path / "run" / "latest").read_text() == "step_000001"


def test_a_time_budget_stop_still_evaluates_the_final_policy(tmp_path: Path) -> None:
    cfg = load_config_text(
        tiny_team(
            "kuhn_poker",
            "  steps: 50\n  eval_every: 20\n"
            "  groups_per_step: 1\n  max_minutes: 0.00001\n"
            "  ray: {enabled: false}\n",
        )
    )
    hist = Trainer(cfg, tmp_path / "run").fit()
    assert [h["step"] for h in hist] == [1]
    assert 0 < hist[0]["eval"]["exploitability"] < 1


def test_train_refuses_to_mix_into_an_existing_run(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from marl.cli import app

    run = tmp_path / "run"
    run.mkdir()
    (run / "latest").write_text("step_000001")
    cfg = tmp_path / "team.yaml"
    cfg.write_text(tiny_team("kuhn_poker", "  steps: 1\n"))
    result = CliRunner().invoke(app, ["train", str(cfg), "--out", str(run)])
    assert result.exit_code == 2 and "already holds a run" in result.output
    assert "Traceback" not in result.output


def test_best_checkpoint_is_kept_and_evaluates_as_logged(tmp_path: Path) -> None:
    """RUN/best names the checkpoint of the lowest exploitability (checkpointed even off the
    checkpoint schedule, without keeping every superseded one), and evaluating it from disk
    gives the figure the trainer logged."""
    from typer.testing import CliRunner

    from marl.cli import app

    run = tmp_path / "run"
    cfg = load_config_text(
        tiny_team(
            "kuhn_poker",
            "  steps: 4\n  eval_every: 1\n  lr: 0.05\n"
            "  groups_per_step: 2\n  checkpoint_every: 100\n"
            "  group_by: state\n  common_mode: 1.0\n"
            "  ray: {enabled: false}\n",
        )
    )
    hist = Trainer(cfg, run).fit()
    values = [h["eval"]["exploitability"] for h in hist]
    # a step whose groups all tie leaves the policy as it was (the sampled games decide
    # that, and they differ between CPUs' numerics); ties keep the earlier best
    assert len(set(values)) >= 3
    best = int(np.argmin(values)) + 1
    assert best > 1  # so at least one superseded best was written and dropped
    assert (run / "best").read_text() == f"step_{best:06d}"
    # superseded bests written off the schedule are gone: the last step and the best remain
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted(
        {f"step_{best:06d}", "step_000004"}
    )
    state = json.loads((run / "checkpoints" / f"step_{best:06d}" / "state.json").read_text())
    assert state["best"] == {"step": best, "exploitability": min(values)}
    out = tmp_path / "best.json"
    result = CliRunner().invoke(
        app, ["eval", "exploitability", str(run / "best"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["exploitability"] == pytest.approx(min(values), abs=1e-5)


def test_rae_keeps_one_baseline_per_seat_in_self_play(tmp_path: Path) -> None:
    """SPIRAL's role-conditioned baseline: the first and second player of one shared policy
    have their own (their expected returns differ)."""
    cfg = load_config_text(
        tiny_team(
            "kuhn_poker",
            "  steps: 1\n  advantage: rae\n  groups_per_step: 2\n  ray: {enabled: false}\n",
        )
    )
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.fit()
    assert sorted(trainer.estimator.baseline) == ["kuhn_poker/player_0", "kuhn_poker/player_1"]
