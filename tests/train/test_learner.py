"""The learner's update: one pass is the GRPO step written out by hand, and ``epochs`` passes
step again against the sampling-time log-probs, where the clip acts."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

from helpers import build_tiny_host, tiny_team, train_config
from marl.agents.host import ModelHost
from marl.agents.policy import choice_logprobs
from marl.config import load_config_text
from marl.train.learner import Learner, TrainItem
from marl.train.loss import grpo_loss, importance_weights
from marl.train.runtime import LearnerProcess, trainable_hosts

TEMPERATURE = 2.0


def _host() -> ModelHost:
    return build_tiny_host("red")


def _batch(host: ModelHost, n: int = 6, seed: int = 0) -> list[TrainItem]:
    """Choice decisions with the log-probs of the policy that sampled them (the adapter as
    it is now, at TEMPERATURE)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 200) for _ in range(5)] for _ in range(n)]
    cands = [[[rng.randrange(3, 200) for _ in range(2)] for _ in range(3)] for _ in range(n)]
    with torch.no_grad(), host.use("red"):
        scores = [s.tolist() for s in host.candidate_scores(prompts, cands)]
    items = []
    for i, (p, cs, s) in enumerate(zip(prompts, cands, scores, strict=True)):
        choice = i % 3
        items.append(
            TrainItem(
                adapter="red",
                agent=f"seat{i % 2}",
                prompt_ids=p,
                completion_ids=cs[choice],
                old_logprobs=[choice_logprobs(s, TEMPERATURE)[choice]],
                advantage=rng.uniform(-1, 1),
                candidate_ids=cs,
                choice=choice,
                temperature=TEMPERATURE,
            )
        )
    return items


def _trained(epochs: int, lr: float = 0.05, updates: int = 1) -> tuple[Learner, list]:
    host = _host()
    learner = Learner(train_config(lr=lr, epochs=epochs), host, ["red"])
    items = _batch(host)
    stats = [learner.update(items) for _ in range(updates)]
    return learner, stats


def test_one_epoch_is_the_grpo_step_by_hand() -> None:
    """epochs = 1: the token-averaged clipped loss over the whole batch, gradient clipped to
    norm 1, one AdamW step (no weight decay) -- the update as it has always been."""
    learner, (stats,) = _trained(epochs=1)
    host = _host()
    items = _batch(host)
    params = [p for n, p in host.model.named_parameters() if "lora_" in n and ".red." in n]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=0.05, weight_decay=0.0)
    host.model.train()
    with host.use("red"):
        scores = host.candidate_scores(
            [it.prompt_ids for it in items], [it.candidate_ids for it in items]
        )
        logp = torch.stack(
            [
                torch.log_softmax(s / TEMPERATURE, 0)[it.choice]
                for it, s in zip(items, scores, strict=True)
            ]
        )[:, None]
    old = torch.tensor([it.old_logprobs[0] for it in items])[:, None]
    adv = torch.tensor([it.advantage for it in items])
    loss = grpo_loss(logp, old, adv, torch.ones_like(old), 0.2, 0.28).loss
    loss.backward()
    norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
    opt.step()
    assert stats.loss == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    assert stats.grad_norm == pytest.approx(norm, rel=1e-5)
    assert norm > 0 and stats.clip_frac == 0.0  # on-policy: every ratio is 1
    want = host.adapter_weights("red")
    for k, v in learner.weights()["red"].items():  # the learner sums per-agent micro-batches
        torch.testing.assert_close(v, want[k], rtol=1e-4, atol=1e-5)


def test_two_epochs_step_twice_against_the_sampling_log_probs() -> None:
    """epochs = 2 moves the adapter differently from epochs = 1 on the same batch and seed,
    and exactly as two one-pass updates on that batch (old log-probs kept)."""
    one, _ = _trained(epochs=1)
    two, (stats,) = _trained(epochs=2)
    twice, _ = _trained(epochs=1, updates=2)
    w1, w2, w11 = one.weights()["red"], two.weights()["red"], twice.weights()["red"]
    assert any(not torch.allclose(w1[k], w2[k]) for k in w1)
    for k in w2:
        torch.testing.assert_close(w2[k], w11[k], rtol=0, atol=0)
    assert not stats.skipped and stats.agent_grad_norms.keys() == {"red/seat0", "red/seat1"}


def test_the_clip_acts_from_the_second_epoch() -> None:
    """With a large step the second pass's ratios leave the clip range [0.8, 1.28]."""
    _, (first,) = _trained(epochs=1, lr=0.5)
    _, (second,) = _trained(epochs=2, lr=0.5)
    assert first.clip_frac == 0.0 and second.clip_frac > 0.0


def test_a_non_finite_pass_ends_the_update() -> None:
    host = _host()
    learner = Learner(train_config(lr=0.05, epochs=3), host, ["red"])
    items = _batch(host)
    items[2].advantage = float("nan")
    before = {k: v.clone() for k, v in learner.weights()["red"].items()}
    assert learner.update(items).skipped
    assert all(torch.equal(v, learner.weights()["red"][k]) for k, v in before.items())
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        Learner(train_config(lr=0.05, epochs=0), host, ["red"])


def test_train_epochs_and_dual_clip_reach_the_learner() -> None:
    cfg = load_config_text(
        tiny_team("kuhn_poker", "  epochs: 3\n  dual_clip: 3.0\n  ray: {enabled: false}\n")
    )
    (key,) = trainable_hosts(cfg)
    learner = LearnerProcess(cfg.model_dump(by_alias=True), key).learner
    assert (learner.cfg.epochs, learner.cfg.dual_clip) == (3, 3.0)


def test_scheduled_learning_rate_reaches_the_optimizer() -> None:
    from marl.config.train import TrainConfig
    from marl.train.learner import Learner, TrainItem

    assert TrainConfig(lr=0.1, lr_decay=0.5).lr_at(1) == pytest.approx(0.1)
    assert TrainConfig(lr=0.1, lr_decay=0.5).lr_at(3) == pytest.approx(0.05)
    host = build_tiny_host("a")
    learner = Learner(train_config(lr=0.05), host, ["a"])
    items = [
        TrainItem(
            adapter="a",
            agent="p",
            prompt_ids=[5, 6, 7],
            completion_ids=[9],
            old_logprobs=[-0.7],
            advantage=adv,
            candidate_ids=[[9], [11]],
            choice=0,
        )
        for adv in (1.0, -0.5)
    ]

    def moved(lr: float | None) -> bool:
        before = {k: v.clone() for k, v in learner.weights()["a"].items()}
        learner.update(items, lr)
        return any(not torch.equal(v, learner.weights()["a"][k]) for k, v in before.items())

    assert moved(None) and not moved(0.0) and moved(0.01)


def _shifted(items: list[TrainItem], by: float) -> list[TrainItem]:
    """The batch as an engine with other numerics would have logged it."""
    return [dataclasses.replace(it, old_logprobs=[x + by for x in it.old_logprobs]) for it in items]


def test_recompute_makes_the_ratio_the_learners_and_logs_the_mismatch() -> None:
    host = _host()
    items = _batch(host)
    exact = Learner(train_config(lr=0.05), host, ["red"]).update(items)
    host = _host()
    fixed = Learner(train_config(lr=0.05), host, ["red"], correction="recompute").update(
        _shifted(items, 0.1)
    )
    assert fixed.mismatch == pytest.approx(0.1, abs=1e-5)
    assert fixed.loss == pytest.approx(exact.loss, abs=1e-6)
    assert exact.mismatch is None  # no correction: nothing recomputed


def test_a_one_pass_correction_takes_no_forward_of_its_own() -> None:
    """With one epoch the recomputed old log-probs are the loss forward's own (the same
    weights): the update scores the batch as often as without a correction.  With two
    epochs they are computed first, and both report the same mismatch."""
    items = _shifted(_batch(_host()), 0.1)
    forwards = {}
    for correction, epochs in (("none", 1), ("recompute", 1), ("recompute", 2)):
        host = _host()
        calls = [0]

        def counted(*args, _score=host.candidate_scores, _calls=calls):
            _calls[0] += 1
            return _score(*args)

        host.candidate_scores = counted
        learner = Learner(
            train_config(lr=0.05, epochs=epochs), host, ["red"], correction=correction
        )
        stats = learner.update(items)
        if correction != "none":
            assert stats.mismatch == pytest.approx(0.1, abs=1e-5)
        forwards[correction, epochs] = calls[0]
    assert forwards["none", 1] == forwards["recompute", 1] > 0
    relabelling = len(learner.chunks(items))  # one pass over the batch, before two epochs
    assert forwards["recompute", 2] == relabelling + 2 * forwards["none", 1]


def test_tis_weights_tokens_by_the_truncated_engine_ratio() -> None:
    items = _batch(_host())
    exact = Learner(train_config(lr=0.05), _host(), ["red"]).update(items)
    # engine log-probs 0.1 below the learner's: every weight exp(0.1), then capped at 1.05
    tis = Learner(
        train_config(lr=0.05, mismatch={"cap": 1.05}), _host(), ["red"], correction="tis"
    ).update(_shifted(items, -0.1))
    assert tis.mismatch == pytest.approx(0.1, abs=1e-5)
    assert tis.loss == pytest.approx(1.05 * exact.loss, rel=1e-5)


def test_importance_weights_are_one_where_behaviour_is_proximal_and_cut_at_the_cap() -> None:
    prox = torch.tensor([[-0.5, -1.25, -2.0], [-0.1, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    w, raw = importance_weights(prox, prox.clone(), mask, 2.0)
    assert torch.equal(w, mask) and torch.equal(raw, mask)  # exp(0) = 1, exactly
    behav = prox - torch.log(torch.tensor([[3.0, 1.5, 0.5], [4.0, 9.0, 9.0]]))
    w, raw = importance_weights(prox, behav, mask, 2.0)
    assert torch.allclose(raw, torch.tensor([[3.0, 1.5, 0.5], [4.0, 0.0, 0.0]]))
    assert torch.allclose(w, torch.tensor([[2.0, 1.5, 0.5], [2.0, 0.0, 0.0]]))  # padding: 0


def _own(items: list[TrainItem]) -> list[TrainItem]:
    """The batch with the learner's own log-probs as the behaviour's (a synchronous run)."""
    host = _host()
    learner = Learner(train_config(), host, ["red"])
    with torch.no_grad(), host.use("red"):
        logp = learner.choice_logp(items)[0]
    return [
        dataclasses.replace(it, old_logprobs=[float(x)]) for it, x in zip(items, logp, strict=True)
    ]


@pytest.mark.parametrize("epochs", [1, 2])
@pytest.mark.parametrize("correction", ["decoupled", "truncated_is"])
def test_async_corrections_weigh_by_the_behaviour_ratio(correction: str, epochs: int) -> None:
    """Behaviour log-probs equal to the learner's give weights of exactly 1; log 3 below
    them, weights of 3 (decoupled) or the cap (truncated_is), every token clipped."""
    items = _own(_batch(_host()))
    cfg = train_config(lr=0.05, epochs=epochs, asynchrony={"is_cap": 2.0})
    same = Learner(cfg, _host(), ["red"], correction=correction).update(items)
    assert same.is_weights == {"mean": 1.0, "max": 1.0, "clipped": 0.0}
    exact = Learner(cfg, _host(), ["red"], correction="recompute").update(items)
    assert exact.is_weights is None  # no weights, nothing to report
    assert same.loss == exact.loss
    stale = Learner(cfg, _host(), ["red"], correction=correction).update(
        _shifted(items, -math.log(3.0))
    )
    w = {"decoupled": 3.0, "truncated_is": 2.0}[correction]
    assert stale.is_weights["mean"] == pytest.approx(w, rel=1e-5)
    assert stale.is_weights["max"] == pytest.approx(3.0, rel=1e-5)
    assert stale.is_weights["clipped"] == (1.0 if correction == "truncated_is" else 0.0)
    assert stale.mismatch == pytest.approx(math.log(3.0), abs=1e-5)
    if epochs == 1:  # the one pass: the loss is the weighted one
        assert stale.loss == pytest.approx(w * exact.loss, rel=1e-5)
