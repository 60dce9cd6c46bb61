"""Think-then-act decoding on the tiny model: the log-probs the policy reports (reasoning tokens
and the choice after them) against a direct computation, the learner's recomputation of them,
a short training run, transcripts, and the sampled table policy's exploitability."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from helpers import build_tiny_host, tiny_smoke, tiny_team, train_config
from marl import games
from marl.agents.agent import Agent
from marl.agents.builder import build_roster
from marl.agents.hf_policy import HFPolicy
from marl.agents.host import ModelHost
from marl.agents.host.generation import THINK_SEPARATOR
from marl.agents.tables import (
    agent_probs,
    agent_report,
    exploitability_report,
    sampled_report,
)
from marl.config import load_config_text
from marl.config.schema import RoleConfig
from marl.orchestrator.arena.play import play
from marl.train.learner import Learner, TrainItem
from marl.train.trainer import Trainer

TEMPERATURE = 1.5


@pytest.fixture(scope="module")
def host() -> ModelHost:
    return build_tiny_host("red", perturb=True)  # B != 0: the adapter's path is checked


def _requests(policy: HFPolicy, n: int = 3) -> list:
    out = []
    for seed in range(n):
        env = games.make("kuhn_poker")
        env.reset(seed=seed)
        agent = Agent("p", "player", policy, "You play poker.", "think")
        out.append(agent.request(env, env.agent_selection))
    return out


def _direct_logprobs(host: ModelHost, ids: list[int], start: int) -> list[float]:
    """``log softmax(logits / T)`` of ``ids[start:]``, one plain forward, no cache."""
    with torch.no_grad(), host.use("red"):
        logits = host.model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits / TEMPERATURE, -1)
    return [float(logp[t - 1, ids[t]]) for t in range(start, len(ids))]


def _direct_scores(host: ModelHost, context: list[int], cands: list[list[int]]) -> list[float]:
    """``log p(candidate | context)`` at T = 1, each candidate its own forward."""
    out = []
    for c in cands:
        ids = context + c
        with torch.no_grad(), host.use("red"):
            logits = host.model(input_ids=torch.tensor([ids])).logits[0].float()
        logp = torch.log_softmax(logits, -1)
        out.append(sum(float(logp[t - 1, ids[t]]) for t in range(len(context), len(ids))))
    return out


def _think_policy(host: ModelHost, **kw) -> HFPolicy:
    kw = {"think_tokens": 6, "think_prompt": "Think first.", "seed": 3, **kw}
    return HFPolicy(host, "red", mode="think", temperature=TEMPERATURE, **kw)


def test_reported_log_probs_are_the_direct_computation(host: ModelHost) -> None:
    policy = _think_policy(host)
    requests = _requests(policy)
    responses = policy.act(requests)
    eos = host.tokenizer.eos_token_id
    sep = host.text_ids(THINK_SEPARATOR)
    for req, resp in zip(requests, responses, strict=True):
        reasoning = resp.completion_ids
        assert 1 <= len(reasoning) <= 6
        assert len(resp.logprobs) == len(reasoning) + 1
        assert "Think first." in host.tokenizer.decode(resp.prompt_ids)
        direct = _direct_logprobs(host, resp.prompt_ids + reasoning, len(resp.prompt_ids))
        np.testing.assert_allclose(resp.logprobs[:-1], direct, atol=1e-5)
        kept = reasoning[:-1] if reasoning[-1] == eos else reasoning
        context = resp.prompt_ids + kept + sep
        assert resp.choice_prompt_ids == context
        cands = [host.text_ids(t) for t in req.action_texts]
        assert resp.candidate_ids == cands
        scores = torch.tensor(_direct_scores(host, context, cands))
        logpi = torch.log_softmax(scores / TEMPERATURE, 0)
        assert resp.logprobs[-1] == pytest.approx(float(logpi[resp.choice]), abs=1e-5)
        np.testing.assert_allclose(resp.action_probs, logpi.exp().numpy(), atol=1e-5)
        assert resp.text.endswith(THINK_SEPARATOR + req.action_texts[resp.choice])


def test_the_learner_recomputes_them_ratio_one_at_the_first_pass(host: ModelHost) -> None:
    policy = _think_policy(host, seed=5)
    responses = policy.act(_requests(policy, 4))
    items = [
        TrainItem(
            adapter="red",
            agent=f"seat{i % 2}",
            prompt_ids=r.prompt_ids,
            completion_ids=r.completion_ids,
            old_logprobs=r.logprobs,
            advantage=1.0 if i % 2 else -1.0,
            candidate_ids=r.candidate_ids,
            choice=r.choice,
            choice_prompt_ids=r.choice_prompt_ids,
            temperature=TEMPERATURE,
        )
        for i, r in enumerate(responses)
    ]
    assert all(it.kind == "think" and it.tokens == len(it.completion_ids) + 1 for it in items)
    before = {k: v.clone() for k, v in host.adapter_weights("red").items()}
    learner = Learner(train_config(lr=1e-3), host, ["red"], correction="recompute")
    stats = learner.update(items)
    try:
        assert stats.mismatch is not None and stats.mismatch < 1e-5
        assert stats.clip_frac == 0.0  # ratio 1 on every token of the single pass
        assert stats.tokens == sum(len(r.logprobs) for r in responses)
        assert math.isfinite(stats.grad_norm) and stats.grad_norm > 0
    finally:
        host.set_adapter_weights("red", before)


@pytest.mark.parametrize("draws", [1, 4])
def test_one_pass_gives_the_two_separate_computations(host: ModelHost, draws: int) -> None:
    """``reasoned_stats`` (one forward per context) against the reasoning's own forward and
    the choice scoring after it, with gradients on as in the learner; with several reasonings
    per prompt each prompt runs once (its own unit) and the results are the same."""
    policy = _think_policy(host, seed=7)
    responses = policy.act(_requests(policy, 4 if draws == 1 else 2) * draws)
    args = ([r.prompt_ids for r in responses], [r.completion_ids for r in responses])
    ctx, cands = [r.choice_prompt_ids for r in responses], [r.candidate_ids for r in responses]
    if draws > 1:  # each prompt's contexts are a unit: the prompt runs once for them
        assert host._prompt_units(args[0]) is not None
    with host.use("red"):
        per, ents, scores = host.reasoned_stats(*args, ctx, cands, TEMPERATURE, entropy=True)
        want, want_ents = host.sequence_stats(*args, TEMPERATURE, entropy=True)
        want_scores = host.candidate_scores(ctx, cands)
    assert per[0].requires_grad
    for got, exp in zip([*per, *ents, *scores], [*want, *want_ents, *want_scores], strict=True):
        np.testing.assert_allclose(got.detach().numpy(), exp.detach().numpy(), atol=1e-5)


def _team(train: str, decoding: str = "{mode: think, think_tokens: 4, temperature: 1.5}") -> str:
    return tiny_team("kuhn_poker", train).replace(
        "decoding: {mode: choice}", f"decoding: {decoding}"
    )


def test_two_training_steps_on_kuhn_and_transcripts_hold_the_reasoning(tmp_path: Path) -> None:
    cfg = load_config_text(
        _team(
            "  steps: 2\n  group_size: 2\n  groups_per_step: 2\n"
            "  checkpoint_every: 100\n  ray: {enabled: false}\n"
        )
    )
    trainer = Trainer(cfg, tmp_path / "run")
    hist = trainer.fit()
    assert len(hist) == 2
    assert all(h["parse_error_rate"] == 0.0 and h["tokens_per_s"] > 0 for h in hist)
    assert hist[-1]["learner"]["tiny-random"]["grad_norm"] > 0
    roster = build_roster(cfg)
    sink = tmp_path / "t.jsonl"
    play(roster, "kuhn_poker", {}, 2, transcripts=sink)
    turns = [t for line in sink.read_text().splitlines() for t in json.loads(line)["turns"]]
    assert turns and all(THINK_SEPARATOR in t["text"] for t in turns)
    assert all(len(t["text"].split(THINK_SEPARATOR)[1]) > 0 for t in turns)
    assert "choice_prompt_ids" not in turns[0]


def test_k_sampled_reasonings_give_a_finite_interval(host: ModelHost) -> None:
    policy = _think_policy(host, think_tokens=3)
    agent = Agent("p", "player", policy, "You play poker.", "think")
    report = agent_report(agent, "kuhn_poker", samples=3)
    lo, hi = report.interval
    assert report.samples == 3
    assert math.isfinite(lo) and math.isfinite(hi) and 0 <= lo <= hi
    for row in report.table.values():
        assert sum(row.values()) == pytest.approx(1.0)


def test_without_reasoning_it_is_the_choice_mode_figure(host: ModelHost) -> None:
    choice = HFPolicy(host, "red", mode="choice", temperature=TEMPERATURE)
    exact = exploitability_report(
        agent_probs(Agent("p", "player", choice, "S", "choice")), "kuhn_poker"
    )
    silent = _think_policy(host, think_tokens=0)
    assert not silent.sampled_table
    report = agent_report(Agent("p", "player", silent, "S", "think"), "kuhn_poker", samples=4)
    assert report.exploitability == pytest.approx(exact.exploitability, abs=1e-9)
    assert report.interval is None
    # a deterministic read sampled K times: the exact figure, an interval of width 0
    sampled = sampled_report(
        agent_probs(Agent("p", "player", choice, "S", "choice")),
        "kuhn_poker",
        samples=3,
        resamples=20,
    )
    assert sampled.exploitability == pytest.approx(exact.exploitability, abs=1e-9)
    assert sampled.interval == pytest.approx((exact.exploitability,) * 2, abs=1e-9)


def test_think_is_refused_where_it_cannot_run() -> None:
    with pytest.raises(
        ValidationError, match="the openai backend samples text and cannot score candidates"
    ):
        RoleConfig.model_validate(
            {
                "name": "p",
                "backend": "openai",
                "model": "m",
                "endpoint": {"base_url": "http://127.0.0.1:1/v1"},
                "decoding": {"mode": "think"},
            }
        )
    with pytest.raises(ValidationError, match="cannot score candidates"):
        RoleConfig.model_validate(
            {
                "name": "p",
                "backend": "openai",
                "endpoint": {"base_url": "http://x/v1"},
                "decoding": {"mode": "think"},
            }
        )


def test_the_shipped_think_config_trains_on_the_tiny_model(tmp_path: Path) -> None:
    cfg = tiny_smoke("configs/kuhn_think.yaml")
    assert cfg.roles[0].decoding.mode == "think"
    hist = Trainer(cfg, tmp_path / "run").fit()
    assert len(hist) == 2 and math.isfinite(hist[-1]["eval"]["exploitability"])
