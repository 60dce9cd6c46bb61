"""Policy targets for think roles (marl.train.objectives.think_target): the loss against a hand
computation of the mixture over reasonings, the fit of that mixture by either solver (the
Gauss-Newton Jacobian of the mixture against one backward per value), the reasoning term, the
config's checks and training runs on the tiny model."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_magnet import KUHN, _learner, _perturbed

from helpers import build_tiny_host, tiny_smoke, tiny_team, train_config
from marl.agents.host import ModelHost
from marl.agents.host.generation import THINK_SEPARATOR
from marl.config import ConfigError, load_config_text
from marl.config.train import PolicyTargetConfig
from marl.train.learner import Learner, TrainItem, magnet_adapter
from marl.train.objectives.policy_target import jacobian, state_key, target_batch
from marl.train.objectives.think_target import ThinkTarget, mixtures, think_jacobian
from marl.train.trainer import Trainer

T = 0.25  # and the adapter perturbed: the moves after different reasonings differ
TARGET = "  advantage_scale: none\n  policy_target: {eta: 1.0, fit_steps: 3}\n"
THINK = "decoding: {mode: think, think_tokens: 4, temperature: 1.5}"


def _host() -> ModelHost:
    host = build_tiny_host("red", perturb=True)
    host.set_adapter_weights("red", _perturbed(host.adapter_weights("red"), 1))
    return host


def _think_items(
    host: ModelHost, states: int = 3, per_state: int = 3, alike: int = 1
) -> list[TrainItem]:
    """Think decisions: ``per_state`` random reasonings at each of ``states`` prompts (the
    first ``alike`` states with the same legal moves), the sampling-time log-probs the current
    policy's minus 0.1 per reasoning token (a ratio of e^0.1, inside the clip) and minus a
    different amount per move (which the reasoning term must leave out)."""
    rng = random.Random(0)
    sep = host.text_ids(THINK_SEPARATOR)
    items = []
    for s in range(states):
        prompt = [rng.randrange(3, 200) for _ in range(5)]
        if s == 0 or s >= alike:
            cands = [[rng.randrange(3, 200) for _ in range(2)] for _ in range(3)]
        for j in range(per_state):
            z = [rng.randrange(3, 200) for _ in range(rng.randint(2, 4))]
            items.append(
                TrainItem(
                    adapter="red",
                    agent=f"seat{(s + j) % 2}",
                    prompt_ids=prompt,
                    completion_ids=z,
                    old_logprobs=[],
                    advantage=rng.uniform(-1, 1),
                    candidate_ids=cands,
                    choice=rng.randrange(3),
                    choice_prompt_ids=prompt + z + sep,
                    temperature=T,
                )
            )
    reasoning, moves = _direct(host, items, "red")
    for k, (it, r, m) in enumerate(zip(items, reasoning, moves, strict=True)):
        it.old_logprobs = [*(r - 0.1).tolist(), float(m[it.choice]) - 0.05 * k]
    return items


def _direct(host: ModelHost, items: list[TrainItem], adapter: str):
    """Each decision's reasoning-token log-probs and its move distribution after the
    reasoning, by the plain scoring calls (not the learner's one-pass ``reasoned``)."""
    with torch.no_grad(), host.use(adapter):
        reasoning = host.sequence_logprobs(
            [it.prompt_ids for it in items], [it.completion_ids for it in items], T
        )
        scores = host.candidate_scores(
            [it.choice_prompt_ids for it in items], [it.candidate_ids for it in items]
        )
    return reasoning, [torch.log_softmax(s / T, 0) for s in scores]


def _by_state(items: list[TrainItem]) -> dict[tuple, list[int]]:
    out: dict[tuple, list[int]] = {}
    for i, it in enumerate(items):
        out.setdefault(tuple(it.prompt_ids), []).append(i)
    return out


def _hand_q(items: list[TrainItem]) -> dict[tuple, list[float]]:
    """Mean advantage per (state, action); an action not played: the state's mean."""
    q = {}
    for key, rows in _by_state(items).items():
        mean = sum(items[i].advantage for i in rows) / len(rows)
        played = [[items[i].advantage for i in rows if items[i].choice == a] for a in range(3)]
        q[key] = [sum(p) / len(p) if p else mean for p in played]
    return q


def _hand_targets(host, items, eta, alpha) -> dict[tuple, list[float]]:
    """pi_T(a) ~ [pibar(a) rhobar(a)^(alpha eta) exp(eta Q(a))]^(1 / (1 + alpha eta)), pibar and
    rhobar the plain means of the probabilities after each sampled reasoning."""
    _, pi = _direct(host, items, "red")
    _, rho = _direct(host, items, magnet_adapter("red"))
    q, out = _hand_q(items), {}
    for key, rows in _by_state(items).items():
        pbar = [sum(math.exp(pi[i][a]) for i in rows) / len(rows) for a in range(3)]
        rbar = [sum(math.exp(rho[i][a]) for i in rows) / len(rows) for a in range(3)]
        raw = [
            (p * r ** (alpha * eta) * math.exp(eta * v)) ** (1 / (1 + alpha * eta))
            for p, r, v in zip(pbar, rbar, q[key], strict=True)
        ]
        out[key] = [x / sum(raw) for x in raw]
    return out


def _hand_kl(host, items, targets) -> float:
    """mean_s KL(target_s || pibar_s), pibar the current policy's mixture."""
    _, pi = _direct(host, items, "red")
    kls = []
    for key, rows in _by_state(items).items():
        pbar = [sum(math.exp(pi[i][a]) for i in rows) / len(rows) for a in range(3)]
        kls.append(sum(t * math.log(t / p) for t, p in zip(targets[key], pbar, strict=True)))
    return sum(kls) / len(kls)


def _gauss_newton_by_hand(host: ModelHost, items: list[TrainItem], **target):
    """A Gauss-Newton update (2 steps, with a magnet) and the mixtures' KL to the hand-made
    targets before it: the update's ``loss`` is that KL, its ``fit_residual`` the KL after."""
    learner = _learner_with_magnet(host, fit_steps=2, solver="gauss_newton", **target)
    targets = _hand_targets(host, items, 2.0, 0.5)
    before = _hand_kl(host, items, targets)
    stats = learner.update(items)
    assert stats.loss == pytest.approx(before, rel=1e-4)
    assert stats.fit_residual == pytest.approx(_hand_kl(host, items, targets), rel=1e-4, abs=1e-6)
    return stats, before


def _learner_with_magnet(host: ModelHost, lr: float = 0.05, **target) -> Learner:
    learner = Learner(
        train_config(lr=lr, magnet={"alpha": 0.5}, policy_target={"eta": 2.0, **target}),
        host,
        ["red"],
    )
    learner.set_magnet({"red": _perturbed(host.adapter_weights("red"), 4)})
    return learner


def test_the_loss_is_the_mixture_s_kl_plus_the_reasoning_term_by_hand() -> None:
    """KL(target || mean_z pi(.|s, z)) with MMD's target of the mixture, plus w times the
    clipped surrogate of the reasoning tokens alone (ratio e^0.1, advantage Q(s, a) - V(s))."""
    host = _host()
    items = _think_items(host)
    learner = _learner_with_magnet(host, reasoning_weight=0.7)
    objective = ThinkTarget(learner)
    got = objective.evaluate(objective.batch(items), grad=False)

    want_kl = _hand_kl(host, items, _hand_targets(host, items, 2.0, 0.5))
    q, surrogate, tokens = _hand_q(items), 0.0, 0
    for key, rows in _by_state(items).items():
        v = sum(q[key][items[i].choice] for i in rows) / len(rows)
        for i in rows:
            adv = q[key][items[i].choice] - v
            surrogate -= math.exp(0.1) * adv * len(items[i].completion_ids)
            tokens += len(items[i].completion_ids)
    assert got.kl > 1e-3
    assert got.kl == pytest.approx(want_kl, rel=1e-4)
    assert got.reasoning == pytest.approx(surrogate / tokens, rel=1e-4, abs=1e-6)
    assert got.total == pytest.approx(want_kl + 0.7 * surrogate / tokens, rel=1e-4, abs=1e-6)
    assert got.clip_frac == 0.0


def test_the_fit_lowers_the_kl_of_the_mixture() -> None:
    host = _host()
    items = _think_items(host)
    learner = _learner_with_magnet(host, fit_steps=20, reasoning_weight=0.0)
    targets = _hand_targets(host, items, 2.0, 0.5)
    before = _hand_kl(host, items, targets)
    stats = learner.update(items)
    assert stats.loss == pytest.approx(before, rel=1e-4)
    assert stats.fit_residual is not None and stats.fit_residual < 0.5 * before
    assert _hand_kl(host, items, targets) == pytest.approx(stats.fit_residual, rel=1e-4)


def test_without_a_reasoning_weight_the_reasoning_is_never_scored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``reasoning_weight: 0`` every evaluation of the fit (the magnet's mixtures, the
    line search) scores the moves alone, :meth:`move_scores`, equal to what
    :meth:`reasoned_stats` gives after the same contexts, and the fit is the same as the
    hand-computed KL says."""
    host = _host()
    items = _think_items(host)
    args = (
        [it.prompt_ids for it in items],
        [it.choice_prompt_ids for it in items],
        [it.candidate_ids for it in items],
    )
    with torch.no_grad(), host.use("red"):
        alone = host.move_scores(*args)
        _, _, full = host.reasoned_stats(
            args[0], [it.completion_ids for it in items], *args[1:], items[0].temperature
        )
    for a, f in zip(alone, full, strict=True):
        torch.testing.assert_close(a, f, rtol=1e-5, atol=1e-6)

    def refused(*_a, **_k):
        raise AssertionError("the reasoning was scored")

    monkeypatch.setattr(host, "reasoned_stats", refused)
    stats, before = _gauss_newton_by_hand(host, items, reasoning_weight=0.0)
    assert stats.fit_residual < before and stats.clip_frac == 0.0


@pytest.mark.parametrize("forward_batch", [3, 64])
def test_evaluations_without_gradients_take_forward_batch_sequences(
    monkeypatch: pytest.MonkeyPatch, forward_batch: int
) -> None:
    """The fit's evaluations of its loss and the magnet's reads run ``forward_batch``
    decisions a forward (a state never split), the linearisation ``micro_batch``; the fit is
    the hand-checked one whatever the sizes."""
    host = _host()
    items = _think_items(host)  # 3 states of 3 decisions
    sizes: list[int] = []
    move_scores = host.move_scores
    monkeypatch.setattr(
        host, "move_scores", lambda p, x, c: sizes.append(len(p)) or move_scores(p, x, c)
    )
    backward: list[int] = []
    separate = host.separate_scores
    monkeypatch.setattr(
        host, "separate_scores", lambda p, c, *a: backward.append(len(p)) or separate(p, c, *a)
    )
    learner = _learner_with_magnet(host, fit_steps=2, solver="gauss_newton", reasoning_weight=0.0)
    learner.cfg.learner.micro_batch, learner.cfg.learner.forward_batch = 3, forward_batch
    targets = _hand_targets(host, items, 2.0, 0.5)
    stats = learner.update(items)
    assert set(sizes) == {min(forward_batch, 9)} and len(sizes) > 3
    assert backward and set(backward) <= {3}
    assert stats.fit_residual == pytest.approx(_hand_kl(host, items, targets), rel=1e-4, abs=1e-6)


def test_one_backward_per_action_gives_each_state_s_row_of_the_mean_move_s_jacobian(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Gauss-Newton Jacobian (each state's distinct contexts scored apart, one backward per
    action index) equals one backward per value (``jacobian``), through the learner's shared
    scoring of every decision, of the mean over each state's reasonings of the move's logit
    differences, and its residuals are the targets' less the mixtures' differences: for three
    states of three reasonings, one state with two legal actions and one with a reasoning
    sampled twice (scored once, it weighs twice in the mean and the mixture)."""
    host = _host()
    items = _think_items(host)
    items[1] = replace(  # state 0: reasoning 0 sampled twice
        items[1],
        completion_ids=items[0].completion_ids,
        choice_prompt_ids=items[0].choice_prompt_ids,
    )
    for it in items[6:]:  # state 2: two legal actions
        it.candidate_ids, it.choice = it.candidate_ids[:2], min(it.choice, 1)
    learner = Learner(
        train_config(lr=0.05, policy_target={"eta": 2.0, "solver": "gauss_newton"}),
        host,
        ["red"],
    )
    objective = ThinkTarget(learner)
    b = objective.batch(items)
    objective.evaluate(b, grad=False)  # makes the targets
    states = list(b.members.values())
    scored: list[int] = []
    separate = host.separate_scores
    monkeypatch.setattr(
        host,
        "separate_scores",
        lambda p, c, rows, units: scored.append(len(p)) or separate(p, c, rows, units),
    )
    with host.use("red"):
        jac, residual = think_jacobian(learner, states, learner.params, b.targets)
        dists = learner.reasoned(items)[2]
        values = torch.cat([m[1:] - m[0] for m in mixtures(states, dists)])
        means = [torch.stack(dists[i : i + 3]).mean(0) for i in range(0, len(dists), 3)]
        want = jacobian(torch.cat([m[1:] - m[0] for m in means]), learner.params)
    assert scored == [8]
    assert jac.shape == want.shape == (2 + 2 + 1, sum(p.numel() for p in learner.params))
    assert float(want.abs().max()) > 0.1
    torch.testing.assert_close(jac, want, rtol=1e-4, atol=1e-5)
    targets = [b.targets[state_key(s[0])] for s in states]
    wanted = torch.cat([t[1:] - t[0] for t in targets])
    torch.testing.assert_close(residual, wanted - values.detach(), rtol=1e-5, atol=1e-5)


def test_gauss_newton_fits_the_mixture_at_least_as_close_as_adam() -> None:
    """Both solvers from the same weights on the same batch (2 fit steps, the reasoning term
    off): Adam's lowers the moves' KL to the targets (0.136 -> 0.024 at lr 0.01), and
    Gauss-Newton's ends below half the start and at or below Adam's (3e-6).  What could fail:
    Gauss-Newton's step is right to first order only, so a far target on a strongly curved
    model can leave even its shortest length (1/32) no lower than the start (the fit then ends
    where it began), while Adam's halving steps can still get closer; on the tiny model the
    targets (eta 2) are within reach of a linear step."""
    after = {}
    for solver in ("adam", "gauss_newton"):
        host = _host()
        items = _think_items(host)
        learner = _learner_with_magnet(
            host, lr=0.01, fit_steps=2, reasoning_weight=0.0, solver=solver
        )
        targets = _hand_targets(host, items, 2.0, 0.5)
        before = _hand_kl(host, items, targets)
        stats = learner.update(items)
        assert stats.loss == pytest.approx(before, rel=1e-4)
        after[solver] = _hand_kl(host, items, targets)
        assert stats.fit_residual == pytest.approx(after[solver], rel=1e-4, abs=1e-6)
    assert after["adam"] < before
    assert after["gauss_newton"] < 0.5 * before
    assert after["gauss_newton"] <= after["adam"]


def test_gauss_newton_with_the_reasoning_term_reports_the_weights_kept() -> None:
    """After the Gauss-Newton steps, one optimizer step on the whole loss (reasoning weight
    0.7), kept only if it lowers it: ``fit_residual`` is the moves' KL at the final weights."""
    host = _host()
    items = _think_items(host)
    stats, before = _gauss_newton_by_hand(host, items, reasoning_weight=0.7)
    assert stats.fit_residual < 0.5 * before
    assert 0.0 <= stats.clip_frac <= 1.0


@pytest.mark.parametrize("solver", ["adam", "gauss_newton"])
def test_the_reasoning_term_raises_the_reasonings_of_positive_advantage(solver: str) -> None:
    """With the targets at the policy (eta ~ 0) only the reasoning term moves the weights:
    sum_j A_j (log pi(z_j) after - before) > 0, where A_j = Q(s, a_j) - V(s).  Gauss-Newton
    leaves it one optimizer step after fitting the moves."""
    host = _host()
    items = _think_items(host)
    learner = Learner(
        train_config(lr=0.01, policy_target={"eta": 1e-6, "fit_steps": 3, "solver": solver}),
        host,
        ["red"],
    )
    adv = [it.advantage for s in ThinkTarget(learner).batch(items).members.values() for it in s]
    order = [it for s in _by_state(items).values() for it in (items[i] for i in s)]
    before = [float(r.sum()) for r in _direct(host, order, "red")[0]]
    learner.update(items)
    after = [float(r.sum()) for r in _direct(host, order, "red")[0]]
    moved = sum(a * (y - x) for a, x, y in zip(adv, before, after, strict=True))
    assert moved > 1e-3


def test_free_text_outside_a_states_rollout_is_refused_and_think_accepted() -> None:
    text = tiny_team("kuhn_poker", KUHN + TARGET)
    with pytest.raises(ConfigError, match="free-text roles .player. at the game's information"):
        load_config_text(text.replace("decoding: {mode: choice}", "decoding: {mode: free}"))
    think = text.replace("decoding: {mode: choice}", THINK)
    assert load_config_text(think).roles[0].decoding.mode == "think"
    gn = load_config_text(think.replace("fit_steps: 3}", "fit_steps: 3, solver: gauss_newton}"))
    assert gn.train.policy_target.solver == "gauss_newton"
    assert gn.roles[0].decoding.mode == "think"


@pytest.mark.parametrize("solver", ["adam", "gauss_newton"])
def test_a_think_role_trains_with_targets_and_logs_the_fit(tmp_path: Path, solver: str) -> None:
    train = KUHN.replace("steps: 4", "steps: 2").replace("lr: 0.05", "lr: 0.005")
    target = TARGET.replace("fit_steps: 3}", f"fit_steps: 3, solver: {solver}}}")
    text = tiny_team("kuhn_poker", train + target + "  magnet: {alpha: 0.5, every: 2}\n")
    tr = Trainer(load_config_text(text.replace("decoding: {mode: choice}", THINK)), tmp_path)
    start = tr.runtime.weights()["player"]
    hist = tr.fit()
    assert [h["step"] for h in hist] == [1, 2]
    for h in hist:
        s = _learner(h)
        assert s["loss"] > 0 and s["fit_residual"] <= s["loss"]
        assert "kl_to_magnet" in s and 0.0 <= s["clip_frac"] <= 1.0
    end = tr.runtime.weights()["player"]
    assert any(not torch.equal(start[k], end[k]) for k in start)


def test_the_kuhn_think_target_recipe_runs_on_the_tiny_model(tmp_path: Path) -> None:
    cfg = tiny_smoke("configs/kuhn_think_target.yaml")
    cfg = cfg.replace(train=cfg.train.replace(groups_per_step=8))  # states seen twice: a signal
    assert cfg.roles[0].decoding.mode == "think" and cfg.train.policy_target.eta > 0
    hist = Trainer(cfg, tmp_path / "run").fit()
    assert [h["step"] for h in hist] == [1, 2]
    assert all(_learner(h)["fit_residual"] <= _learner(h)["loss"] for h in hist)
    assert math.isfinite(hist[-1]["eval"]["exploitability"])  # eval_every 3: the last step


def test_each_reasoning_s_move_is_fitted_to_its_state_s_target() -> None:
    """``think_fit: each``: a Jacobian row per (distinct reasoning, a >= 1) equal to one backward
    per value of the move's logit differences after that reasoning, residuals towards its
    state's target; a Gauss-Newton update lowers the mean KL of the moves after every
    reasoning."""
    host = _host()
    items = _think_items(host)
    cfg = {"eta": 2.0, "solver": "gauss_newton", "think_fit": "each", "reasoning_weight": 0.0}
    learner = Learner(train_config(lr=0.05, policy_target=cfg), host, ["red"])
    objective = ThinkTarget(learner)
    b = objective.batch(items)
    before = objective.evaluate(b, grad=False).kl  # makes the targets
    states = list(b.members.values())
    with host.use("red"):
        jac, residual = think_jacobian(learner, states, learner.params, b.targets, each=True)
        dists = learner.reasoned(items)[2]
        want = jacobian(torch.cat([d[1:] - d[0] for d in dists]), learner.params)
    torch.testing.assert_close(jac, want, rtol=1e-4, atol=1e-5)
    targets = [b.targets[state_key(s[0])] for s in states for _ in s]
    wanted = torch.cat(
        [(t[1:] - t[0]) - (d[1:] - d[0]).detach() for t, d in zip(targets, dists, strict=True)]
    )
    torch.testing.assert_close(residual, wanted, rtol=1e-5, atol=1e-5)
    stats = learner.update(items)
    assert stats.loss == pytest.approx(before, rel=1e-4)
    assert stats.fit_residual < 0.5 * before


def test_pooled_states_are_scored_after_the_same_reasonings_drawn_from_theirs() -> None:
    """``think_fit: pooled``: the states with the same legal moves are each scored after the
    same reasonings, drawn from the ones they wrote, behind their own prompts; a state alone
    in its pool keeps its own; a Gauss-Newton update lowers the pooled KL.  With a reasoning
    weight the setting is refused."""
    host = _host()
    sep = host.text_ids(THINK_SEPARATOR)
    items = _think_items(host, states=3, per_state=3, alike=2)
    cfg = {"eta": 2.0, "solver": "gauss_newton", "think_fit": "pooled", "reasoning_weight": 0.0}
    learner = Learner(train_config(lr=0.05, policy_target=cfg), host, ["red"])
    objective = ThinkTarget(learner)
    own = {k: [it.completion_ids for it in g] for k, g in target_batch(items).members.items()}
    a, b, alone = own
    mixed = 0
    for _ in range(5):  # each batch draws again
        tails = {}
        for key, group in objective.batch(items).members.items():
            assert len(group) == 3
            for it in group:
                assert it.choice_prompt_ids == list(key[1]) + it.completion_ids + sep
            tails[key] = [it.completion_ids for it in group]
        assert tails[a] == tails[b] and all(z in own[a] + own[b] for z in tails[a])
        mixed += any(z in own[a] for z in tails[a]) and any(z in own[b] for z in tails[a])
        assert sorted(tails[alone]) == sorted(own[alone])
    assert mixed > 0
    stats = learner.update(items)
    assert stats.loss > 0 and stats.fit_residual < 0.5 * stats.loss
    with pytest.raises(ValueError, match="think_fit: pooled .* set reasoning_weight: 0"):
        PolicyTargetConfig(**{**cfg, "reasoning_weight": 0.5})
