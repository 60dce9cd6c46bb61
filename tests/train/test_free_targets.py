"""Policy targets for free-text roles: the moves read through the answers that name one move
each, the answers' total probability fitted towards 1, the states rollout's reads of
unplayable answers, the sampled-answers table and the recipe on the tiny model."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from test_magnet import KUHN, _learner
from test_think_targets import _host
from typer.testing import CliRunner

from helpers import tiny_smoke, tiny_team, train_config
from marl import games
from marl.agents import Agent
from marl.agents.hf_policy import HFPolicy
from marl.agents.host import ModelHost
from marl.agents.host.generation import answer_ids
from marl.agents.policy import Response
from marl.agents.rollout import Episode, answer_read, decision_turn, move_read, read_action
from marl.agents.tables import agent_report
from marl.cli import app
from marl.config import ConfigError, load_config_text
from marl.games.analysis import info_states
from marl.train.learner import Learner, TrainItem
from marl.train.objectives.policy_target import (
    as_answers,
    jacobian,
    state_jacobian,
    state_key,
)
from marl.train.states import plan_states, value_states
from marl.train.trainer import Trainer

STATES = "  rollout: states\n  advantage_scale: none\n  policy_target: {eta: 1.0, fit_steps: 2}\n"
FREE = "decoding: {mode: free, max_new_tokens: 4}"


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "120"})
    return result.exit_code, result.stdout, result.stderr


def _free_items(host: ModelHost, n: int = 4, seed: int = 0) -> list[TrainItem]:
    """Free-text decisions at ``n`` states of two legal moves, two answers sampled each (only
    their prompts and moves' answers matter to the fit), valued by hand."""
    rng = random.Random(seed)
    items = []
    for s in range(n):
        prompt = [rng.randrange(3, 200) for _ in range(6)]
        moves = [[rng.randrange(3, 200), rng.randrange(3, 200)] for _ in range(2)]
        q = [rng.uniform(-1, 1), rng.uniform(-1, 1)]
        for j in range(2):
            items.append(
                TrainItem(
                    adapter="red",
                    agent=f"seat{s % 2}",
                    prompt_ids=prompt,
                    completion_ids=[rng.randrange(3, 200) for _ in range(3)],
                    old_logprobs=[-1.0] * 3,
                    advantage=q[j] - sum(q) / 2,
                    temperature=1.0,
                    action_values=q,
                    answer_ids=[m + [host.tokenizer.eos_token_id] for m in moves],
                )
            )
    return items


def _log_mass(host: ModelHost, items: list[TrainItem]) -> float:
    """Mean over the states of log M, the log of their moves' answers' total probability, by
    hand from the answers' sequence log-probs."""
    states = {state_key(it): it for it in map(as_answers, items)}
    out = []
    with torch.no_grad(), host.use("red"):
        for it in states.values():
            seqs = host.sequence_logprobs([it.prompt_ids] * 2, it.candidate_ids)
            out.append(float(torch.logsumexp(torch.stack([s.sum() for s in seqs]), 0)))
    return float(np.mean(out))


def test_a_free_decision_is_fitted_through_its_moves_answers() -> None:
    host = _host()
    it = _free_items(host, n=1)[0]
    assert it.kind == "free"
    read = as_answers(it)
    assert read.kind == "choice" and read.candidate_ids == it.answer_ids
    assert read.completion_ids == [] and read.prompt_ids == it.prompt_ids
    with pytest.raises(ValueError, match="answer_ids"):
        as_answers(TrainItem("red", "a", [1], [2], [-1.0], 0.0))


def test_the_mass_row_is_each_state_s_log_mass_gradient() -> None:
    """With ``free`` the per-state Jacobian gains a row per state: the gradient of log M(s)
    (the answers' total log-probability), equal to one backward per state, its residual
    -log M(s)."""
    host = _host()
    items = [as_answers(it) for it in _free_items(host)[::2]]
    learner = Learner(
        train_config(lr=0.01, policy_target={"eta": 1.0, "solver": "gauss_newton"}), host, ["red"]
    )
    targets = {state_key(it): torch.log_softmax(torch.randn(2), 0) for it in items}
    with host.use("red"):
        jac, residual = state_jacobian(learner, items, learner.params, targets, free=True)
        plain, plain_residual = state_jacobian(learner, items, learner.params, targets)
        scores = host.candidate_scores(
            [it.prompt_ids for it in items], [it.candidate_ids for it in items]
        )
        log_m = torch.stack([torch.logsumexp(s, 0) for s in scores])
        want = jacobian(log_m, learner.params)
    assert jac.shape == (2 * len(items), sum(p.numel() for p in learner.params))
    torch.testing.assert_close(jac[: len(items)], plain, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(jac[len(items) :], want, rtol=1e-4, atol=1e-5)
    assert float(want.abs().max()) > 0.01
    torch.testing.assert_close(residual[: len(items)], plain_residual)
    torch.testing.assert_close(residual[len(items) :], -log_m.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("solver", ["adam", "gauss_newton"])
def test_a_free_update_raises_the_playable_mass(solver: str) -> None:
    """At targets equal to the policy (eta ~ 0) the update's loss is the mean -log M, as
    computed by hand from the answers' sequence log-probs; the fit raises M.  With a real
    step (eta 2) it also lowers the whole loss."""
    for eta in (1e-6, 2.0):
        host = _host()
        items = _free_items(host)
        learner = Learner(
            train_config(lr=0.01, policy_target={"eta": eta, "fit_steps": 3, "solver": solver}),
            host,
            ["red"],
        )
        before = _log_mass(host, items)
        stats = learner.update(items)
        assert stats.fit_residual < stats.loss
        if eta < 1e-3:
            assert stats.loss == pytest.approx(-before, rel=1e-4)
            assert _log_mass(host, items) > before + 0.05
        else:
            assert stats.loss > -before + 1e-3  # the targets are away from the policy


def test_free_targets_need_a_states_rollout_at_temperature_one() -> None:
    text = tiny_team("kuhn_poker", KUHN + STATES).replace("decoding: {mode: choice}", FREE)
    cfg = load_config_text(text)
    assert cfg.roles[0].decoding.mode == "free" and cfg.train.rollout == "states"
    with pytest.raises(ConfigError, match="set train.rollout: states"):
        load_config_text(text.replace("  rollout: states\n", ""))
    with pytest.raises(ConfigError, match="decoding.temperature 1"):
        load_config_text(text.replace("max_new_tokens: 4", "max_new_tokens: 4, temperature: 2"))
    extra = "  - name: other\n    model: tiny-random\n    adapter: {r: 4, alpha: 8}\n"
    mixed = tiny_team("kuhn_poker", KUHN + STATES, count=1, extra=extra + f"    {FREE}\n")
    with pytest.raises(ConfigError, match="one decoding.mode in a run"):
        load_config_text(mixed)


def test_an_answer_is_read_as_its_move_or_as_a_random_legal_one() -> None:
    env = games.make("kuhn_poker")
    env.reset(seed=0)
    who, legal = env.agent_selection, env.legal_actions()
    bet = env.action_names.index("Bet")
    assert read_action(env, who, legal, Response(text="I bet. [Bet]")) == (bet, None)
    call = env.action_names.index("Call")
    action, error = read_action(env, who, legal, Response(text="[Call]"))
    assert action == call and "not a legal move" in error
    action, error = read_action(env, who, legal, Response(text="hmm"))
    assert action is None and "no action found" in error
    assert move_read(legal, bet) == [float(a == bet) for a in legal]
    assert move_read(legal, call) == move_read(legal, None) == [0.5, 0.5]


def test_a_states_step_values_unplayable_answers_as_a_random_legal_move() -> None:
    """Free-text decisions at every state: the table the step reads counts each answer's move
    (unplayable: uniform), and an unplayable decision's return is the mean of its Q(s, .)."""
    game = "kuhn_poker"
    states = info_states(game)
    specs = plan_states(game, ["player_0", "player_1"], 2, seed=0, step=1)
    agent = Agent("p", "player", None, mode="free")  # type: ignore[arg-type]
    episodes, texts = [], ["[Check]", "[Call]", "nothing"]
    for spec in specs:
        key, player, legal = states[spec.group]
        text = texts[spec.index % 3]
        env = games.make(game)
        action, _ = read_action(env, f"player_{player}", legal, Response(text=text))
        resp = Response(text=text)
        turn = decision_turn(spec.index, f"player_{player}", agent, legal, resp, action, None, 0.0)
        episodes.append(Episode(spec.index, game, spec.seed, {}, [turn]))
    visited = value_states(game, episodes, specs)
    assert visited["reads"] == 2 and 0 <= visited["exploitability"] <= 1
    for ep in episodes:
        turn = ep.turns[0]
        if not turn.legal:
            assert ep.returns[turn.agent] == pytest.approx(np.mean(turn.action_values))
        else:
            legal = states[next(s.group for s in specs if s.index == ep.index)][2]
            assert ep.returns[turn.agent] == turn.action_values[legal.index(turn.action)]


def test_a_free_agent_s_table_is_read_from_sampled_answers() -> None:
    """Every information state asked K times; each answer's move (or a random legal one)
    makes the table, with its bootstrap interval and the unplayable share: a random tiny
    model names no move, so its table is uniform and every answer unplayable."""
    host = _host()
    policy = HFPolicy(host, "red", mode="free", max_new_tokens=3)
    report = agent_report(Agent("p", "player", policy, mode="free"), "kuhn_poker", samples=2)
    assert report.samples == 2 and report.interval is not None
    assert report.unplayable == 1.0
    assert all(set(row.values()) == {0.5} for row in report.table.values())
    assert len(report.table) == 12


def test_the_free_recipe_runs_on_the_tiny_model_and_evaluates_from_answers(
    tmp_path: Path,
) -> None:
    cfg = tiny_smoke("configs/kuhn_freetext_target.yaml")
    role = cfg.roles[0]
    assert role.decoding.mode == "free" and cfg.train.rollout == "states"
    assert cfg.train.policy_target.eta > 0 and role.decoding.temperature == 1
    tr = Trainer(cfg, tmp_path / "run")
    start = tr.runtime.weights()["player"]
    hist = tr.fit()
    assert [h["step"] for h in hist] == [1, 2]
    for h in hist:
        s = _learner(h)
        assert s["fit_residual"] <= s["loss"]  # a fit that lowers nothing keeps the weights
        assert 0 <= h["states"]["exploitability"] <= 1
        assert h["parse_error_rate"] + h["illegal_move_rate"] <= 1
    end = tr.runtime.weights()["player"]
    assert any(not torch.equal(start[k], end[k]) for k in start)
    code, stdout, stderr = cli(
        "eval", "exploitability", str(tmp_path / "run"), "--samples", "2", "--json"
    )
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert doc["samples"] == 2 and 0 <= doc["unplayable"] <= 1 and len(doc["table"]) == 12
    code, stdout, _ = cli("eval", "exploitability", str(tmp_path / "run"), "--samples", "2")
    assert code == 0 and "sampled answers per information state" in stdout
    assert "unplayable answers:" in stdout


def test_answer_ids_end_each_move_s_text() -> None:
    host = _host()
    ids = answer_ids(host, ["[Bet]", "[Check]"])
    eos = host.tokenizer.eos_token_id
    assert ids == [host.text_ids("[Bet]") + [eos], host.text_ids("[Check]") + [eos]]


def test_a_free_read_is_unbiased_from_the_answers_masses_and_one_sample() -> None:
    """Answers: the two moves' own (p 0.3, 0.2), another naming the first move (0.1), an
    unplayable one (0.4).  The read of each, weighed by its probability, sums to the free
    policy with unplayable answers as random legal moves: [0.3 + 0.1 + 0.2, 0.2 + 0.2]."""
    legal, own = [0, 1], [[5, 2], [6, 2]]
    answers = [([5, 2], 0, 0.3), ([6, 2], 1, 0.2), ([7, 5, 2], 0, 0.1), ([9, 9], None, 0.4)]
    masses = [0.3, 0.2]
    mean = np.zeros(2)
    for ids, move, p in answers:
        resp = Response(text="", completion_ids=ids, answer_ids=own)
        read = answer_read(masses, resp, legal, move)
        if ids in own:
            assert read == masses  # the sample adds nothing the masses do not hold
        mean += p * np.asarray(read)
    np.testing.assert_allclose(mean, [0.6, 0.4])


def test_a_policy_scores_its_moves_own_answers() -> None:
    host = _host()
    policy = HFPolicy(host, "red", mode="free", max_new_tokens=3)
    agent = Agent("p", "player", policy, mode="free")
    env = games.make("kuhn_poker")
    env.reset(seed=0)
    request = agent.request(env, env.agent_selection)
    (resp,) = policy.act([request])
    (probs,) = policy.answer_probs([resp])
    assert resp.answer_ids == answer_ids(host, request.action_texts)
    with torch.no_grad(), host.use("red"):
        seqs = host.sequence_logprobs([resp.prompt_ids] * 2, resp.answer_ids)
    want = [math.exp(float(s.sum())) for s in seqs]
    assert probs == pytest.approx(want, rel=1e-4)
    assert 0 < sum(probs) < 1
