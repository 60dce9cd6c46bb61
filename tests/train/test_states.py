"""``train.rollout: states`` (marl.train.states): every information state visited, each decision
valued on the game tree under the table the step's decisions read, on the tiny model; and the
checks that keep it to games with a tree and to policy targets in self-play."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from helpers import tiny_team
from marl.agents.checks import team_problems
from marl.agents.policy import Response
from marl.agents.rollout import answer_read
from marl.config import ConfigError, load_config_text
from marl.games.analysis import (
    exploitability,
    info_state_envs,
    info_states,
    state_action_values,
)
from marl.train.trainer import Trainer

STATES = """\
  rollout: states
  steps: 1
  group_size: 3
  advantage_scale: none
  policy_target: {eta: 1.0, fit_steps: 1}
  lr: 0.005
  eval_every: 0
  ray: {enabled: false}
"""
THINK = "decoding: {mode: think, think_tokens: 4, temperature: 1.5}"
FREE = "decoding: {mode: free, max_new_tokens: 4}"


@pytest.mark.parametrize("mode", ["choice", "think", "free"])
def test_every_state_is_asked_and_valued_on_the_tree(tmp_path: Path, mode: str) -> None:
    """Free text: each read is the moves' own answers' probabilities (the same at every
    decision of a state) plus the sampled answer's move when it is none of them, and the
    table their normalised mean; an unplayable answer's return is the mean of Q(s, .)."""
    text = tiny_team("kuhn_poker", STATES)
    if mode != "choice":
        text = text.replace("decoding: {mode: choice}", THINK if mode == "think" else FREE)
    trainer = Trainer(load_config_text(text), tmp_path)
    states = info_states("kuhn_poker")
    masses = {}  # free text: the moves' own answers' probabilities before the step
    if mode == "free":
        agent, envs = trainer.runtime.roster.agents[0], info_state_envs("kuhn_poker")
        for key, (env, who) in envs.items():
            asked = agent.policy.act([agent.request(env, who)])
            masses[key] = agent.policy.answer_probs(asked)[0]
            assert 0 < sum(masses[key]) < 1
    result = trainer.train_step()
    assert len(result.episodes) == 3 * len(states)
    reads: dict[str, list] = defaultdict(list)
    seen = []
    for ep in result.episodes:
        (turn,) = ep.turns
        key, player, _ = states[ep.index // 3]  # the plan: G decisions a state, in tree order
        assert turn.agent == f"player_{player}"
        reads[key].append(turn.action_probs)
        seen.append((key, turn, ep))
        assert (turn.choice_prompt_ids is not None) == (mode == "think")
    assert set(reads) == {k for k, _, _ in states} and all(len(r) == 3 for r in reads.values())
    means = {k: np.mean(r, axis=0) for k, r in reads.items()}
    table = {k: dict(zip(lg, means[k] / means[k].sum(), strict=True)) for k, _, lg in states}
    q = state_action_values("kuhn_poker", table)
    for key, turn, ep in seen:
        legal = next(lg for k, _, lg in states if k == key)
        assert turn.action_values == pytest.approx([q[key][a] for a in legal])
        value = q[key][turn.action] if turn.legal else np.mean(turn.action_values)
        assert ep.returns == {turn.agent: pytest.approx(value)}
        if mode == "free":
            resp = Response("", completion_ids=turn.completion_ids, answer_ids=turn.answer_ids)
            move = turn.action if turn.legal else None
            want = answer_read(masses[key], resp, legal, move)
            assert turn.action_probs == pytest.approx(want, rel=1e-6, abs=1e-30)
    m = result.metrics
    assert m["states"]["exploitability"] == pytest.approx(exploitability("kuhn_poker", table))
    assert m["states"]["reads"] == 3 and m["decisions_per_min"] > 0
    assert m["agents"] == {} and "games_per_min" not in m


def test_states_need_policy_targets_in_self_play() -> None:
    text = tiny_team("kuhn_poker", STATES)
    with pytest.raises(ConfigError, match="needs policy_target.eta > 0"):
        load_config_text(text.replace("eta: 1.0", "eta: 0.0"))
    league = text + "  league: {opponents: league, anchors: [random]}\n"
    with pytest.raises(ConfigError, match="needs league.opponents: self"):
        load_config_text(league)


def test_states_need_a_game_with_a_tree() -> None:
    cfg = load_config_text(tiny_team("tic_tac_toe", STATES))
    problems = team_problems(cfg)
    assert [p for p, _ in problems] == [("train", "rollout")]
    assert "kuhn_poker" in problems[0][1] and "tic_tac_toe has none" in problems[0][1]
