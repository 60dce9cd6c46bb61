"""The trainer: estimators and loss against hand-computed numbers, learning on a trivially
learnable game, checkpoints that survive SIGKILL, bad-input handling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_team

import games
from configs import load_config_text
from games.base import TextGame
from marl.advantages import (
    RoleBaseline,
    Samples,
    agent_wise_advantages,
    global_advantages,
    make_estimator,
    remove_common_mode,
    turn_level_advantages,
)
from marl.loss import grpo_loss
from marl.trainer import Trainer, TrainingError

# --- estimators, by hand -------------------------------------------------------------------


def test_global_pools_every_agent_of_a_group() -> None:
    s = Samples(rewards=[1, 3, 10, 30], groups=[0, 0, 0, 0], agents=["a", "a", "b", "b"])
    r = np.array([1, 3, 10, 30.0])
    expect = (r - r.mean()) / (r.std() + 1e-6)
    assert np.allclose(global_advantages(s).values, expect)


def test_agent_wise_normalises_per_group_and_agent() -> None:
    s = Samples(rewards=[1, 3, 10, 30, 5, 5], groups=[0, 0, 0, 0, 1, 1],
                agents=["a", "a", "b", "b", "a", "a"])
    adv = agent_wise_advantages(s)
    # (1, 3): mean 2, std 1 -> -1, +1; (10, 30): mean 20, std 10 -> -1, +1; (5, 5): no signal
    assert np.allclose(adv.values, [-1, 1, -1, 1, 0, 0], atol=1e-5)
    assert adv.degenerate == 1 and adv.cells == 3


def test_rae_uses_the_baseline_before_updating_it() -> None:
    rae = RoleBaseline(decay=0.5)
    s = Samples(rewards=[1.0, 3.0, -1.0], groups=[0, 0, 0], agents=["x", "x", "y"],
                games=["g", "g", "g"], roles=["p0", "p0", "p1"])
    assert np.allclose(rae(s).values, [1, 3, -1])  # baselines start at the first batch mean
    assert rae.baseline == {"g/p0": 2.0, "g/p1": -1.0}
    assert np.allclose(rae(s).values, [-1, 1, 0])
    assert rae.baseline == {"g/p0": 2.0, "g/p1": -1.0}
    s2 = Samples(rewards=[4.0], groups=[0], agents=["x"], games=["g"], roles=["p0"])
    assert np.allclose(rae(s2).values, [2.0])
    assert rae.baseline["g/p0"] == pytest.approx(0.5 * 2 + 0.5 * 4)


def test_turn_level_discounts_per_player_then_normalises() -> None:
    # episode 0: a acts twice (rewards 0 then 1), b once (reward -1); gamma 0.5
    s = Samples(rewards=[0] * 4, groups=[0] * 4, agents=["a", "b", "a", "a"],
                episodes=[0, 0, 0, 1], turn_rewards=[0.0, -1.0, 1.0, 2.0])
    adv = turn_level_advantages(s, gamma=0.5)
    g_a = np.array([0.5, 1.0, 2.0])  # a's returns: 0 + 0.5*1, 1, and episode 1's 2
    assert np.allclose(adv.values[[0, 2, 3]], (g_a - g_a.mean()) / (g_a.std() + 1e-6))
    assert adv.values[1] == 0  # b has one sample: nothing to compare with
    assert set(make_estimator("turn_level", gamma=0.5)(s).values) == set(adv.values)


def test_common_mode_removal_keeps_only_what_depends_on_the_card() -> None:
    # public "?:" of seat a, actions (check, bet): K bets (pi = .5, .5) with A = +1, J bets
    # (pi = .2, .8) with A = -1, J checks with A = +0.5.  Score rows 1[a = k] - pi(k):
    # K bet (-.5, .5), J bet (-.2, .2), J check (.8, -.8): one direction v = (.5, .2, -.8).
    # Projection: A' = A - c v (v.A) / (v.v), v.A = .5 - .2 - .4 = -.1, v.v = .93.
    adv = np.array([1.0, -1.0, 0.5, 5.0])
    s = Samples(rewards=[0] * 4, groups=["K:", "J:", "J:", "x"], agents=["a"] * 4,
                publics=["?:", "?:", "?:", None], choices=[1, 1, 0, 1],
                probs=[[0.5, 0.5], [0.2, 0.8], [0.2, 0.8], [0.5, 0.5]])
    v = np.array([0.5, 0.2, -0.8])
    full = remove_common_mode(adv, s, 1.0)
    assert np.allclose(full[:3], adv[:3] + v * 0.1 / 0.93)
    assert abs(full[:3] @ v) < 1e-12  # no net push on "bet" for every card alike
    assert full[3] == 5.0  # no public state: unchanged
    half = remove_common_mode(adv, s, 0.5)
    assert np.allclose(half[:3], adv[:3] + 0.5 * v * 0.1 / 0.93)
    assert remove_common_mode(adv, s, 0.0) is adv


def test_poker_public_state_hides_only_the_own_card() -> None:
    env = games.make("kuhn_poker")
    env.reset(seed=3)
    env.step(env.legal_actions()[0])
    who = env.agent_selection
    info, public = env.information_state(who), env.public_state(who)
    assert public == "?" + info[1:] and info[0] in "JQK" and "?" not in info
    assert games.make("tic_tac_toe").public_state("player_0") is None


def test_grpo_loss_clips_by_hand() -> None:
    logp = torch.log(torch.tensor([[1.5], [0.5], [1.1]]))  # ratios 1.5, 0.5, 1.1 (old = 0)
    old = torch.zeros(3, 1)
    adv = torch.tensor([1.0, -1.0, 2.0])
    parts = grpo_loss(logp, old, adv, torch.ones(3, 1), clip_low=0.2, clip_high=0.2)
    # A>0, rho 1.5 -> clipped 1.2; A<0, rho 0.5 -> min(-0.5, -0.8) = -0.8; rho 1.1 -> 2.2
    assert float(parts.loss) == pytest.approx(-(1.2 - 0.8 + 2.2) / 3)
    assert parts.clip_frac == pytest.approx(2 / 3)


def test_grpo_loss_kl_is_k3_and_zero_at_the_reference() -> None:
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    parts = grpo_loss(logp, logp.detach(), torch.zeros(1), torch.ones(1, 2),
                      ref_logp=logp.detach(), beta=0.1)
    assert float(parts.kl) == 0.0
    ref = torch.tensor([[-1.5, -2.0]])
    parts = grpo_loss(logp, logp.detach(), torch.zeros(1), torch.ones(1, 2), ref_logp=ref,
                      beta=0.1)
    q = -0.5
    assert parts.kl == pytest.approx((np.exp(q) - q - 1) / 2)


def test_scheduled_learning_rate_reaches_the_optimizer() -> None:
    from agents.hf import ModelHost
    from agents.models import load_model
    from configs.train import TrainConfig
    from marl.learner import Learner, TrainItem

    assert TrainConfig(lr=0.1, lr_decay=0.5).lr_at(1) == pytest.approx(0.1)
    assert TrainConfig(lr=0.1, lr_decay=0.5).lr_at(3) == pytest.approx(0.05)
    host = ModelHost(*load_model("tiny-random"))
    host.add_adapter("a", r=4, alpha=8, seed=0)
    learner = Learner(host, ["a"], lr=0.05)
    items = [TrainItem(adapter="a", agent="p", prompt_ids=[5, 6, 7], completion_ids=[9],
                       old_logprobs=[-0.7], advantage=adv, candidate_ids=[[9], [11]],
                       choice=0) for adv in (1.0, -0.5)]

    def moved(lr: float | None) -> bool:
        before = {k: v.clone() for k, v in learner.weights()["a"].items()}
        learner.update(items, lr)
        return any(not torch.equal(v, learner.weights()["a"][k]) for k, v in before.items())

    assert moved(None) and not moved(0.0) and moved(0.01)


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
    assert (tmp_path / "run" / "checkpoints" / "step_000008" / "adapters" / "player"
            / "adapter_model.safetensors").is_file()


def test_mismatched_game_fails_before_any_compute(tmp_path: Path) -> None:
    cfg = load_config_text(team("kuhn_poker", LEARN, count=1))
    with pytest.raises(TrainingError, match="2 seats .* 1 agents"):
        Trainer(cfg, tmp_path / "run")
    cfg = load_config_text(team("kuhn_poker", LEARN + "  league: {anchors: [nobody]}\n", 2))
    with pytest.raises(TrainingError, match="anchor 'nobody'"):
        Trainer(cfg, tmp_path / "run")


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


# --- checkpoints survive SIGKILL --------------------------------------------------------------

KUHN = """\
  steps: 4
  group_size: 4
  groups_per_step: 2
  lr: 0.02
  checkpoint_every: 1
  ray: {enabled: false}
  league: {opponents: league, snapshot_every: 1, anchors: [random]}
"""


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        for volatile in ("seconds", "tokens_per_s"):
            r.pop(volatile)
    return rows


def _train(cfg: Path, run: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "train", str(cfg), "--out",
                             str(run), *extra], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "120"})


@pytest.mark.slow
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    cfg = tmp_path / "team.yaml"
    cfg.write_text(team("kuhn_poker", KUHN, count=2))
    full = _train(cfg, tmp_path / "full")
    killed = _train(cfg, tmp_path / "killed")
    ckpts = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 240
    while not (ckpts / "step_000002").is_dir() and time.time() < deadline:
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert (ckpts / "step_000002").is_dir()
    assert not (ckpts / "step_000004").exists()
    resumed = _train(cfg, tmp_path / "killed", "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()[-2000:]
    assert full.wait(timeout=300) == 0, full.stderr.read().decode()[-2000:]
    assert [r["step"] for r in _metrics(tmp_path / "killed")] == [1, 2, 3, 4]
    assert _metrics(tmp_path / "killed") == _metrics(tmp_path / "full")


def test_time_budget_stops_after_the_crossing_step_with_a_checkpoint(tmp_path: Path) -> None:
    cfg = load_config_text(team("guess_blue", LEARN + "  max_minutes: 0.00001\n"))
    hist = Trainer(cfg, tmp_path / "run").fit()
    assert [h["step"] for h in hist] == [1]
    assert (tmp_path / "run" / "latest").read_text() == "step_000001"


def test_a_time_budget_stop_still_evaluates_the_final_policy(tmp_path: Path) -> None:
    cfg = load_config_text(tiny_team("kuhn_poker", "  steps: 50\n  eval_every: 20\n"
                                     "  groups_per_step: 1\n  max_minutes: 0.00001\n"
                                     "  ray: {enabled: false}\n"))
    hist = Trainer(cfg, tmp_path / "run").fit()
    assert [h["step"] for h in hist] == [1]
    assert 0 < hist[0]["eval"]["exploitability"] < 1


def test_train_refuses_to_mix_into_an_existing_run(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli import app

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

    from cli import app

    run = tmp_path / "run"
    cfg = load_config_text(tiny_team("kuhn_poker", "  steps: 4\n  eval_every: 1\n  lr: 0.05\n"
                                     "  groups_per_step: 2\n  checkpoint_every: 100\n"
                                     "  group_by: state\n  common_mode: 1.0\n"
                                     "  ray: {enabled: false}\n"))
    hist = Trainer(cfg, run).fit()
    values = [h["eval"]["exploitability"] for h in hist]
    assert len(set(values)) == 4  # the policy moved at every step
    best = int(np.argmin(values)) + 1
    assert best > 1  # so at least one superseded best was written and dropped
    assert (run / "best").read_text() == f"step_{best:06d}"
    # superseded bests written off the schedule are gone: the last step and the best remain
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted(
        {f"step_{best:06d}", "step_000004"})
    state = json.loads((run / "checkpoints" / f"step_{best:06d}" / "state.json").read_text())
    assert state["best"] == {"step": best, "exploitability": min(values)}
    out = tmp_path / "best.json"
    result = CliRunner().invoke(app, ["eval", "exploitability", str(run / "best"),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["exploitability"] == pytest.approx(min(values), abs=1e-5)


def test_rae_keeps_one_baseline_per_seat_in_self_play(tmp_path: Path) -> None:
    """SPIRAL's role-conditioned baseline: the first and second player of one shared policy
    have their own (their expected returns differ)."""
    cfg = load_config_text(tiny_team("kuhn_poker", "  steps: 1\n  advantage: rae\n"
                                     "  groups_per_step: 2\n  ray: {enabled: false}\n"))
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.fit()
    assert sorted(trainer.estimator.baseline) == ["kuhn_poker/player_0", "kuhn_poker/player_1"]
