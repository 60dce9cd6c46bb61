"""``decoding.choice_score``: a move's score as its text's summed or mean token log-prob, in the
policy that samples it, the table read off it, and the learner that recomputes it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from helpers import build_tiny_host, tiny_team, train_config
from marl import games
from marl.agents.agent import Agent
from marl.agents.builder import build_roster
from marl.agents.hf_policy import HFPolicy
from marl.agents.host import ModelHost
from marl.agents.policy import Request
from marl.agents.rollout import RolloutEngine
from marl.config import load_config_text
from marl.config.loader import ConfigError
from marl.train.learner import Learner, TrainItem

TEMPERATURE = 1.5


@pytest.fixture(scope="module")
def host() -> ModelHost:
    return build_tiny_host("red", perturb=True)


def _requests(policy: HFPolicy, mode: str, n: int = 3) -> list[Request]:
    """Negotiation openings: ``[propose a b c]`` moves are longer than ``[Accept]``."""
    out = []
    for seed in range(n):
        env = games.make("negotiation")
        env.reset(seed=seed)
        agent = Agent("p", "player", policy, "You negotiate.", mode)
        out.append(agent.request(env, env.agent_selection))
    return out


def _sums(host: ModelHost, context: list[int], cands: list[list[int]]) -> torch.Tensor:
    """``log p(candidate | context)`` at T = 1, each candidate its own forward."""
    with torch.no_grad(), host.use("red"):
        per = host.sequence_logprobs([context] * len(cands), cands)
    return torch.stack([p.sum() for p in per])


def _policy(host: ModelHost, mode: str, **kw) -> HFPolicy:
    kw = {"think_tokens": 5, "think_prompt": "Think first.", "seed": 2, **kw}
    return HFPolicy(host, "red", mode=mode, temperature=TEMPERATURE, choice_score="mean", **kw)


@pytest.mark.parametrize("mode", ["choice", "think"])
def test_mean_scores_divide_each_moves_log_prob_by_its_tokens(host: ModelHost, mode: str) -> None:
    policy = _policy(host, mode)
    requests = _requests(policy, mode)
    for req, resp in zip(requests, policy.act(requests), strict=True):
        lengths = torch.tensor([len(c) for c in resp.candidate_ids], dtype=torch.float32)
        assert lengths.min() < lengths.max()  # the test tells mean from sum
        context = resp.choice_prompt_ids if mode == "think" else resp.prompt_ids
        sums = _sums(host, context, resp.candidate_ids)
        logpi = torch.log_softmax(sums / lengths / TEMPERATURE, 0)
        assert resp.choice_score == "mean" and resp.text.endswith(req.action_texts[resp.choice])
        assert resp.logprobs[-1] == pytest.approx(float(logpi[resp.choice]), abs=1e-5)
        np.testing.assert_allclose(resp.action_probs, logpi.exp().numpy(), atol=1e-5)
        summed = torch.log_softmax(sums / TEMPERATURE, 0)
        assert not torch.allclose(summed, logpi, atol=1e-3)


def test_the_table_read_off_the_policy_is_the_distribution_it_samples(host: ModelHost) -> None:
    policy = _policy(host, "choice")
    requests = _requests(policy, "choice")
    tables = policy.probabilities(requests)
    for table, resp in zip(tables, policy.act(requests), strict=True):
        np.testing.assert_allclose(table, resp.action_probs, atol=1e-6)


@pytest.mark.parametrize("mode", ["choice", "think"])
def test_the_learner_recomputes_the_mean_scored_log_probs(host: ModelHost, mode: str) -> None:
    """Turns carry the setting to the learner's items; the first pass's ratio is one, and the
    same decisions read as summed scores are not (the learner follows the setting)."""
    policy = _policy(host, mode, seed=4)
    bot = Agent("p", "player", policy, "You negotiate.", mode)
    (episode,) = RolloutEngine(
        lambda: games.make("negotiation", max_proposals=2),
        lambda i: {"player_0": bot, "player_1": bot},
    ).play(1)
    items = [TrainItem.of_turn(t, advantage=1.0) for t in episode.turns]
    assert items and all(it.choice_score == "mean" for it in items)
    learner = Learner(train_config(lr=0.0), host, ["red"])
    logp = learner.logp_fn(items[0])(items)[0]
    last = logp[torch.arange(len(items)), [len(it.old_logprobs) - 1 for it in items]]
    want = torch.tensor([it.old_logprobs[-1] for it in items])
    torch.testing.assert_close(last, want, atol=1e-5, rtol=0)
    summed = [dataclasses.replace(it, choice_score="sum") for it in items]
    logp_sum = learner.logp_fn(summed[0])(summed)[0]
    last_sum = logp_sum[torch.arange(len(items)), [len(it.old_logprobs) - 1 for it in items]]
    assert not torch.allclose(last_sum, want, atol=1e-3)


def test_the_team_file_sets_it_and_refuses_unknown_scores(host: ModelHost) -> None:
    team = tiny_team("negotiation", "  steps: 1\n").replace(
        "decoding: {mode: choice}", "decoding: {mode: choice, choice_score: mean}"
    )
    assert build_roster(load_config_text(team)).policies["player"].choice_score == "mean"
    with pytest.raises(ConfigError, match="decoding.choice_score: input should be 'sum' or"):
        load_config_text(team.replace("choice_score: mean", "choice_score: max"))
    with pytest.raises(ValueError, match="choice_score must be one of sum, mean"):
        HFPolicy(host, "red", mode="choice", choice_score="max")
