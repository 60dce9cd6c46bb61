"""The magnet schedule (train.magnet): its KL term by hand, its moves, its checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from test_learner import TEMPERATURE, _batch, _host

from helpers import metrics_rows, timeless, tiny_team, train_config
from marl.config import TeamConfig, load_config_text
from marl.train.advantages import Advantages, Samples, agent_wise_advantages
from marl.train.learner import Learner, TrainItem, magnet_adapter
from marl.train.loss import grpo_loss, k3
from marl.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
KUHN = """\
  steps: 4
  group_size: 4
  groups_per_step: 4
  group_by: state
  lr: 0.05
  checkpoint_every: 1
  eval_every: 0  # off: a run cut short evaluates its last step, a whole one does not
  ray: {enabled: false}
"""
MAGNET = "  magnet: {alpha: 0.5, every: 2}\n"


def _learner(metrics: dict) -> dict:
    """The one learner's stats of a metrics line."""
    (stats,) = metrics["learner"].values()
    return stats


def _perturbed(weights: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in weights.items()}


def test_the_magnet_term_is_the_exact_kl_over_the_candidates() -> None:
    """loss = GRPO + alpha * mean_decisions KL(pi(.|s) || rho(.|s)), over the legal actions."""
    host = _host()
    items = _batch(host)
    learner = Learner(train_config(lr=0.0, magnet={"alpha": 0.7}), host, ["red"])
    rho_weights = _perturbed(host.adapter_weights("red"), 1)
    learner.set_magnet({"red": rho_weights})
    prompts, cands = [it.prompt_ids for it in items], [it.candidate_ids for it in items]
    with torch.no_grad():
        with host.use("red"):
            pi = [
                torch.log_softmax(s / TEMPERATURE, 0) for s in host.candidate_scores(prompts, cands)
            ]
        with host.use(magnet_adapter("red")):
            rho = [
                torch.log_softmax(s / TEMPERATURE, 0) for s in host.candidate_scores(prompts, cands)
            ]
    kl = torch.stack([(p.exp() * (p - r)).sum() for p, r in zip(pi, rho, strict=True)])
    assert float(kl.min()) > 0
    logp = torch.stack([p[it.choice] for p, it in zip(pi, items, strict=True)])[:, None]
    old = torch.tensor([it.old_logprobs[0] for it in items])[:, None]
    adv = torch.tensor([it.advantage for it in items])
    base = grpo_loss(logp, old, adv, torch.ones_like(old), 0.2, 0.28).loss
    stats = learner.update(items)
    assert stats.kl_magnet == pytest.approx(float(kl.mean()), rel=1e-4)
    assert stats.loss == pytest.approx(float(base + 0.7 * kl.mean()), rel=1e-4, abs=1e-6)


def test_the_free_text_magnet_term_is_k3_per_token() -> None:
    """Free decoding has only the sampled tokens: alpha * k3(pi, rho) per token, averaged."""
    host = _host()
    prompts = [[5, 9, 17, 33], [7, 8, 40]]
    completions = [[11, 12, 13], [21, 22]]
    with torch.no_grad(), host.use("red"):
        old = host.sequence_logprobs(prompts, completions, 1.0)
    items = [
        TrainItem(
            adapter="red",
            agent="a",
            prompt_ids=p,
            completion_ids=c,
            old_logprobs=o.tolist(),
            advantage=0.0,
        )
        for p, c, o in zip(prompts, completions, old, strict=True)
    ]
    learner = Learner(train_config(lr=0.0, magnet={"alpha": 0.3}), host, ["red"])
    learner.set_magnet({"red": _perturbed(host.adapter_weights("red"), 3)})
    with torch.no_grad(), host.use(magnet_adapter("red")):
        rho = host.sequence_logprobs(prompts, completions, 1.0)
    per = torch.cat([k3(o, r) for o, r in zip(old, rho, strict=True)])
    stats = learner.update(items)
    assert stats.kl_magnet == pytest.approx(float(per.mean()), rel=1e-4)
    assert stats.loss == pytest.approx(0.3 * float(per.mean()), rel=1e-4)


def test_the_magnet_is_frozen_and_its_gradient_pulls_towards_it() -> None:
    """An update with only the KL term (zero advantages) moves pi towards rho, not rho."""
    host = _host()
    items = _batch(host)
    for it in items:
        it.advantage = 0.0
    learner = Learner(train_config(lr=0.01, magnet={"alpha": 1.0}), host, ["red"])
    learner.set_magnet({"red": _perturbed(host.adapter_weights("red"), 2)})
    rho_before = host.adapter_weights(magnet_adapter("red"))
    first = learner.update(items).kl_magnet
    for _ in range(5):
        last = learner.update(items).kl_magnet
    assert last < first
    after = host.adapter_weights(magnet_adapter("red"))
    assert all(torch.equal(after[k], v) for k, v in rho_before.items())


def test_the_option_off_leaves_the_update_bit_identical(tmp_path: Path) -> None:
    plain = Trainer(load_config_text(tiny_team("kuhn_poker", KUHN)), tmp_path / "a")
    off = Trainer(
        load_config_text(tiny_team("kuhn_poker", KUHN + "  magnet: {alpha: 0}\n")), tmp_path / "b"
    )
    for _ in range(2):
        ma, mb = timeless(plain.train_step().metrics), timeless(off.train_step().metrics)
        assert ma == mb and "kl_to_magnet" not in json.dumps(ma)
    wa, wb = plain.runtime.weights()["player"], off.runtime.weights()["player"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    host = next(iter(off.runtime.learners.values())).learner.host
    assert not any(a.endswith("@magnet") for a in host.adapters)


def _magnet(trainer: Trainer) -> dict[str, torch.Tensor]:
    host = next(iter(trainer.runtime.learners.values())).learner.host
    return host.adapter_weights(magnet_adapter("player"))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_the_magnet_moves_every_k_steps_to_the_policy(tmp_path: Path) -> None:
    tr = Trainer(load_config_text(tiny_team("kuhn_poker", KUHN + MAGNET)), tmp_path / "run")
    start = tr.runtime.weights()["player"]
    assert _same(_magnet(tr), start)
    policy = {}
    for step in range(1, 5):  # steps 2 and 4 move it (rho <- pi); step 3 keeps step 2's
        m = tr.train_step().metrics
        assert _learner(m)["kl_to_magnet"] >= 0
        policy[step] = tr.runtime.weights()["player"]
        assert not _same(policy[step], start)
        expected = policy[step - step % 2] if step >= 2 else start
        assert _same(_magnet(tr), expected)
    assert not _same(_magnet(tr), policy[3])
    assert tr.magnet is not None and _same(tr.magnet.weights["player"], policy[4])


def test_resume_keeps_the_magnet_and_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    cfg = load_config_text(tiny_team("kuhn_poker", KUHN + "  magnet: {alpha: 0.5, every: 3}\n"))
    full = Trainer(cfg, tmp_path / "full")
    full.fit()
    cut = cfg.replace(train=cfg.train.replace(steps=3))
    Trainer(cut, tmp_path / "cut").fit()
    assert (
        tmp_path / "cut" / "checkpoints" / "step_000003" / "magnet" / "player.safetensors"
    ).is_file()
    resumed = Trainer(cfg, tmp_path / "cut", resume=True)
    assert resumed.step == 3
    resumed.fit()
    assert metrics_rows(tmp_path / "cut") == metrics_rows(tmp_path / "full")
    assert _same(_magnet(resumed), _magnet(full))
    assert _same(resumed.runtime.weights()["player"], full.runtime.weights()["player"])


def test_advantage_scale_none_trains_on_the_returns_in_chips(tmp_path: Path) -> None:
    """train.advantage_scale: none hands the learner each return minus its information
    state's mean, in chips (the game whose regularised equilibrium the magnet pulls to), not
    the per-state z-scores."""
    text = tiny_team("kuhn_poker", KUHN + MAGNET + "  advantage_scale: none\n")
    tr = Trainer(load_config_text(text), tmp_path / "run")
    seen: dict = {}
    estimate, update = tr.estimator, tr.runtime.update

    def spy_estimate(s: Samples) -> Advantages:
        seen["samples"] = s
        return estimate(s)

    def spy_update(items, *args):
        seen["items"] = items
        return update(items, *args)

    tr.estimator, tr.runtime.update = spy_estimate, spy_update
    tr.train_step()
    got = sorted(it.advantage for its in seen["items"].values() for it in its)
    chips = agent_wise_advantages(seen["samples"], scale="none").values
    z = agent_wise_advantages(seen["samples"]).values
    assert got == pytest.approx(sorted(chips[chips != 0]))
    assert got != pytest.approx(sorted(z[z != 0]))
    assert max(abs(a) for a in got) <= 4  # Kuhn's returns lie in [-2, 2]


def test_the_kuhn_magnet_config_runs_two_steps_on_the_tiny_model(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "configs" / "kuhn_magnet.yaml").read_text())
    assert data["train"]["magnet"]["alpha"] > 0
    for role in data["roles"]:
        role["model"] = "tiny-random"
    data["train"].update(steps=2, max_minutes=None, group_size=2, groups_per_step=2, eval_every=1)
    data["train"]["magnet"]["every"] = 1
    hist = Trainer(TeamConfig.model_validate(data), tmp_path / "run").fit()
    assert [h["step"] for h in hist] == [1, 2]
    assert all("kl_to_magnet" in _learner(h) for h in hist)
