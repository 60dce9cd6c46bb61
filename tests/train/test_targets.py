"""Policy targets (train.policy_target): MMD's closed form by hand, the action values, the
fit on the tiny model, the config's checks and a training run."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_learner import TEMPERATURE, _batch, _host
from test_magnet import KUHN, _learner, _perturbed

from helpers import metrics_rows, tiny_smoke, tiny_team, train_config
from marl.config import ConfigError, load_config_text
from marl.train.learner import Learner, magnet_adapter
from marl.train.objectives.policy_target import (
    Fit,
    action_values,
    fit,
    gauss_newton,
    gauss_newton_fit,
    jacobian,
    magnet_read,
    mmd_target,
    state_jacobian,
    state_key,
    target_kl,
)
from marl.train.trainer import Trainer

TARGET = "  advantage_scale: none\n  policy_target: {eta: 1.0, fit_steps: 3}\n"


def test_the_closed_form_is_mmd_s_step_by_hand() -> None:
    """pi_t(a) = [pi(a) rho(a)^(alpha eta) exp(eta Q(a))]^(1 / (1 + alpha eta)) / Z."""
    pi, rho, q = [0.2, 0.5, 0.3], [0.6, 0.1, 0.3], [1.0, -0.5, 0.25]
    eta, alpha = 0.8, 0.5
    raw = [
        (p * r ** (alpha * eta) * math.exp(eta * v)) ** (1 / (1 + alpha * eta))
        for p, r, v in zip(pi, rho, q, strict=True)
    ]
    want = [x / sum(raw) for x in raw]
    got = mmd_target(
        torch.tensor(pi).log(), torch.tensor(rho).log(), torch.tensor(q), eta, alpha
    ).exp()
    assert got.tolist() == pytest.approx(want, rel=1e-6)
    # no magnet: Hedge, pi exp(eta Q); a constant added to Q changes nothing
    hedge = mmd_target(torch.tensor(pi).log(), torch.zeros(3), torch.tensor(q) + 7.0, eta, 0.0)
    h = [p * math.exp(eta * v) for p, v in zip(pi, q, strict=True)]
    assert hedge.exp().tolist() == pytest.approx([x / sum(h) for x in h], rel=1e-6)


def test_per_state_step_sizes_broadcast_by_row() -> None:
    logp = torch.log_softmax(torch.tensor([[0.0, 1.0], [2.0, 0.0]]), 1)
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    both = mmd_target(logp, logp, q, torch.tensor([[0.5], [2.0]]), 1.0)
    for row, eta in ((0, 0.5), (1, 2.0)):
        one = mmd_target(logp[row], logp[row], q[row], eta, 1.0)
        assert both[row].tolist() == pytest.approx(one.tolist(), rel=1e-6)


def test_action_values_are_means_per_state_and_action() -> None:
    keys = ["J:", "J:", "J:", "K:b", "K:b"]
    q = action_values(keys, [0, 0, 1, 1, 1], [1.0, 3.0, -2.0, 2.0, 4.0], [2, 2, 2, 2, 2])
    assert q["J:"] == [2.0, -2.0]
    assert q["K:b"] == [3.0, 3.0]  # action 0 never played there: the state's mean


def test_target_kl_is_zero_at_the_target_and_positive_elsewhere() -> None:
    t = torch.log_softmax(torch.tensor([0.3, -1.0, 2.0]), 0)
    assert float(target_kl(t, t)) == pytest.approx(0.0, abs=1e-7)
    assert float(target_kl(torch.log_softmax(torch.zeros(3), 0), t)) > 0.1


def test_the_fit_moves_each_state_to_its_target() -> None:
    """An update fits the policy to the closed form of the batch's own states: the KL to the
    targets falls by more than half, and what is fitted is the formula's table (recomputed
    here from the policy, the magnet and the mean advantages per state and action)."""
    host = _host()
    items = _batch(host, n=6)
    for it in items[3:]:  # a state seen twice, with its two decisions' advantages averaged
        it.prompt_ids, it.candidate_ids = items[0].prompt_ids, items[0].candidate_ids
    learner = Learner(
        train_config(lr=0.05, magnet={"alpha": 0.5}, policy_target={"eta": 2.0, "fit_steps": 25}),
        host,
        ["red"],
    )
    learner.set_magnet({"red": _perturbed(host.adapter_weights("red"), 4)})
    states = {tuple(it.prompt_ids): it for it in items}
    reps = list(states.values())
    q = action_values(
        [tuple(it.prompt_ids) for it in items],
        [it.choice for it in items],
        [it.advantage for it in items],
        [3] * len(items),
    )
    with torch.no_grad():
        with host.use("red"):
            pi = [
                torch.log_softmax(s / TEMPERATURE, 0)
                for s in host.candidate_scores(
                    [it.prompt_ids for it in reps], [it.candidate_ids for it in reps]
                )
            ]
        with host.use(magnet_adapter("red")):
            rho = [
                torch.log_softmax(s / TEMPERATURE, 0)
                for s in host.candidate_scores(
                    [it.prompt_ids for it in reps], [it.candidate_ids for it in reps]
                )
            ]
    targets = [
        mmd_target(p, r, torch.tensor(q[k]), 2.0, 0.5)
        for k, p, r in zip(states, pi, rho, strict=True)
    ]
    before = sum(float(target_kl(p, t)) for p, t in zip(pi, targets, strict=True)) / len(reps)
    stats = learner.update(items)
    assert stats.loss == pytest.approx(before, rel=1e-4)
    assert stats.fit_residual is not None and stats.fit_residual < 0.5 * before
    with torch.no_grad(), host.use("red"):
        after = [
            torch.log_softmax(s / TEMPERATURE, 0)
            for s in host.candidate_scores(
                [it.prompt_ids for it in reps], [it.candidate_ids for it in reps]
            )
        ]
    got = sum(float(target_kl(p, t)) for p, t in zip(after, targets, strict=True)) / len(reps)
    assert got == pytest.approx(stats.fit_residual, rel=1e-4)


def test_the_config_asks_for_what_the_estimates_need() -> None:
    with pytest.raises(ConfigError, match="advantage_scale: none"):
        load_config_text(tiny_team("kuhn_poker", KUHN + "  policy_target: {eta: 1.0}\n"))
    load_config_text(tiny_team("kuhn_poker", KUHN + TARGET))  # group_by state, chips: valid


def test_free_decoding_in_games_is_refused_before_any_compute() -> None:
    text = tiny_team("kuhn_poker", KUHN + TARGET).replace("{mode: choice}", "{mode: free}")
    with pytest.raises(ConfigError, match="set train.rollout: states"):
        load_config_text(text)


def test_a_training_run_with_targets_and_a_magnet_logs_the_fit(tmp_path: Path) -> None:
    train = KUHN.replace("lr: 0.05", "lr: 0.005")  # Adam's first steps are lr-sized
    train = "".join(
        "  eval_every: 1\n" if "eval_every" in line else line
        for line in train.splitlines(keepends=True)
    )
    text = tiny_team("kuhn_poker", train + TARGET + "  magnet: {alpha: 0.5, every: 2}\n")
    tr = Trainer(load_config_text(text), tmp_path / "run")
    start = tr.runtime.weights()["player"]
    hist = tr.fit()
    assert [h["step"] for h in hist] == [1, 2, 3, 4]
    for h in hist:
        s = _learner(h)
        assert s["loss"] > 0 and s["fit_residual"] < s["loss"]
        assert "kl_to_magnet" in s
    end = tr.runtime.weights()["player"]
    assert any(not torch.equal(start[k], end[k]) for k in start)


def test_fit_keeps_the_best_weights_and_halves_the_step_after_a_rise() -> None:
    """On f(w) = w^2 from w = 1, steps of -lr * sign(f') at lr 1.5: 1 -> -0.5 -> 1.0 (a
    rise: lr 0.75) -> 0.25 -> -0.5 (a rise: lr 0.375); the fit ends on 0.25, the best seen."""
    w = [1.0]
    seen = []

    def loss(grad: bool) -> float:
        seen.append(w[0])
        return w[0] ** 2

    def step(lr: float) -> None:
        w[0] -= lr * (1 if w[0] > 0 else -1)

    result = fit(loss, step, lambda: w[0], lambda v: w.__setitem__(0, v), 1.5, 4)
    assert seen == [1.0, -0.5, 1.0, 0.25, -0.5]
    assert result.first == 1.0 and result.best == 0.0625 and w[0] == 0.25
    assert result.lr == 0.375
    w[0] = 1.0
    r = fit(
        loss,
        lambda lr: w.__setitem__(0, w[0] + lr),
        lambda: w[0],
        lambda v: w.__setitem__(0, v),
        1.0,
        2,
    )  # every step worse: back to the start
    assert r.best == 1.0 and w[0] == 1.0


def test_gauss_newton_moves_coupled_values_to_their_targets() -> None:
    """Two values that share a direction 100x stronger than their own: one damped step lands
    both on the target to first order (a gradient step would move the shared part only)."""
    jac = torch.tensor([[100.0, 1.0, 0.0], [100.0, 0.0, 1.0]], dtype=torch.float64)
    r = torch.tensor([0.3, -0.2], dtype=torch.float64)
    delta = gauss_newton(jac, r, ridge=1e-9)
    assert (jac @ delta).tolist() == pytest.approx(r.tolist(), abs=1e-5)
    grad = jac.T @ r
    assert (jac @ grad)[0] * (jac @ grad)[1] > 0  # the gradient moves both the same way


def test_gauss_newton_resolves_weak_directions_of_a_wide_float32_jacobian() -> None:
    """A float32 Jacobian over 2M parameters (an LLM's adapter): a shared direction 100x
    stronger than each state's own.  The step must still land every value on its target: the
    Gram matrix's float32 rounding swamps the own directions (every value missed)."""
    gen = torch.Generator().manual_seed(0)
    p, k = 2_000_000, 6
    shared = torch.randn(p, generator=gen) * 100
    own = torch.randn(k, p, generator=gen)
    jac = (shared + own).float()
    r = torch.randn(k, generator=gen, dtype=torch.float64) * 0.1
    delta = gauss_newton(jac, r, ridge=1e-9)
    assert (jac.double() @ delta.double()).tolist() == pytest.approx(r.tolist(), abs=1e-4)


def test_one_backward_gives_every_state_s_row_of_the_jacobian() -> None:
    """The learner's per-state Jacobian (states scored apart, each state's gradient read off
    its own rows in one backward per action index) equals one backward per logit difference
    through the shared-head scoring, for states with three and with two actions."""
    host = _host()
    host.set_adapter_weights("red", _perturbed(host.adapter_weights("red"), 1))  # B != 0
    items = _batch(host, n=5)
    for it in items:  # a common head, which the shared scoring computes once
        it.prompt_ids = [7, 8, 9, 10, 11, 12] + it.prompt_ids
    items[4].candidate_ids = items[4].candidate_ids[:2]
    learner = Learner(
        train_config(lr=0.01, policy_target={"eta": 1.0, "solver": "gauss_newton"}), host, ["red"]
    )
    g = torch.Generator().manual_seed(3)
    targets = {
        state_key(it): torch.log_softmax(torch.randn(len(it.candidate_ids), generator=g), 0)
        for it in items
    }
    with host.use("red"):
        jac, residual = state_jacobian(learner, items, learner.params, targets)
        scores = host.candidate_scores(
            [it.prompt_ids for it in items], [it.candidate_ids for it in items]
        )
        dists = [torch.log_softmax(s / TEMPERATURE, 0) for s in scores]
        values = torch.cat([lp[1:] - lp[0] for lp in dists])
        want = jacobian(values, learner.params)
    assert jac.shape == want.shape == (4 * 2 + 1, sum(p.numel() for p in learner.params))
    assert float(want.abs().max()) > 0.1
    torch.testing.assert_close(jac, want, rtol=1e-4, atol=1e-5)
    wanted = torch.cat([targets[state_key(it)][1:] - targets[state_key(it)][0] for it in items])
    torch.testing.assert_close(residual, wanted - values.detach(), rtol=1e-5, atol=1e-5)


def _fit_one_weight(
    v: Callable, target: float, search: str = "all", steps: int = 1, away: bool = False
) -> tuple[Fit, list[float], float]:
    """:func:`gauss_newton_fit` of one weight w from 0 towards v(w) = ``target`` (loss
    (target - v)^2, 4 lengths): the fit, the w at each loss evaluated (rounded) and w after.
    ``away``: the residual points the wrong way, so every step is worse."""
    w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    seen: list[float] = []

    def loss() -> float:
        seen.append(round(float(w.detach()), 4))
        return (target - float(v(w).detach())) ** 2

    def linearise():
        residual = (target - v(w)).detach()
        return jacobian(v(w), [w]), -residual if away else residual

    result = gauss_newton_fit(linearise, [w], loss, 1e-9, steps, loss(), 4, search)
    return result, seen, float(w.detach())


def test_the_gauss_newton_step_takes_its_best_length() -> None:
    """v(w) = w - 2 w^3 from w = 0 towards 1.5 (J = 1, so the full step is w = 1.5): of the
    lengths 1, 1/2, 1/4, 1/8, 0.375 lands closest (v 0.27; 0.75 overshoots to v -0.09) and
    is kept.  Steps that all raise the loss leave w as it was and end the fit."""
    result, seen, w = _fit_one_weight(lambda w: w - 2 * w**3, 1.5)
    assert seen == [0.0, 1.5, 0.75, 0.375, 0.1875]
    assert w == pytest.approx(0.375)
    assert result.best == pytest.approx((1.5 - 0.375 + 2 * 0.375**3) ** 2)
    # v(w) = w, but a residual pointing the wrong way: every step is worse
    result, seen, w = _fit_one_weight(lambda w: w * 1.0, 1.5, steps=3, away=True)
    assert len(seen) == 1 + 4 and w == 0.0
    assert result.best == result.first == 2.25


def test_a_descent_search_stops_once_the_loss_rises_and_may_double_the_step() -> None:
    """``search: descent`` tries 2, 1, 1/2, ... of the step and stops at the first loss above
    the one before once one is below the start.  v(w) = w / (1 + |w|) from 0 towards 0.6
    (J = 1, full step 0.6): the full step undershoots (v 0.375), twice it lands near (v 0.545)
    and is kept after two losses.  v(w) = w towards 1.5: 3 is no better than the start, 1.5
    exact, 0.75 worse: three losses.  v(w) = w - 2 w^3 (a step far too long): it walks down
    every length as ``all`` does and keeps the same 0.375."""
    _, seen, w = _fit_one_weight(lambda w: w / (1 + w.abs()), 0.6, "descent")
    assert seen == [0.0, 1.2, 0.6] and w == pytest.approx(1.2)
    _, seen, w = _fit_one_weight(lambda w: w * 1.0, 1.5, "descent")
    assert seen == [0.0, 3.0, 1.5, 0.75] and w == pytest.approx(1.5)
    result, seen, w = _fit_one_weight(lambda w: w - 2 * w**3, 1.5, "descent")
    assert seen == [0.0, 3.0, 1.5, 0.75, 0.375, 0.1875]
    assert w == pytest.approx(0.375)
    assert result.best == pytest.approx((1.5 - 0.375 + 2 * 0.375**3) ** 2)


def test_gauss_newton_fits_the_tiny_model_closer_than_adam() -> None:
    items_host = []
    for solver in ("adam", "gauss_newton"):
        host = _host()
        items = _batch(host, n=6)
        for j, it in enumerate(items[3:]):  # three states, each played two ways
            it.prompt_ids = items[(j + 1) % 3].prompt_ids
            it.candidate_ids = items[(j + 1) % 3].candidate_ids
        learner = Learner(
            train_config(lr=0.01, policy_target={"eta": 2.0, "fit_steps": 3, "solver": solver}),
            host,
            ["red"],
        )
        items_host.append(learner.update(items))
    adam, gn = items_host
    assert gn.loss > 1e-3  # the targets are away from the policy
    assert adam.loss == pytest.approx(gn.loss, rel=1e-5)  # the same targets
    assert gn.fit_residual < 0.5 * gn.loss
    assert gn.fit_residual < adam.fit_residual


def test_the_kuhn_target_recipe_runs_on_the_tiny_model(tmp_path: Path) -> None:
    cfg = tiny_smoke("configs/kuhn_target.yaml")
    pt = cfg.train.policy_target
    assert pt.eta > 0 and pt.solver == "gauss_newton" and cfg.train.magnet.alpha > 0
    hist = Trainer(cfg, tmp_path / "run").fit()
    assert [h["step"] for h in hist] == [1, 2]
    assert all(_learner(h)["fit_residual"] <= _learner(h)["loss"] for h in hist)
    assert all("exploitability" in h["eval"] for h in hist)


def test_a_uniform_magnet_read_keeps_its_share_of_the_adapter_and_its_pads() -> None:
    """``magnet.start: uniform``: log rho = share x log p_M, normalised; share 0 is uniform
    over the legal moves, share 1 the adapter's own distribution (returned as it is)."""
    logp = torch.log_softmax(torch.tensor([[2.0, -1.0, 0.5], [1.0, 3.0, -math.inf]]), -1)
    torch.testing.assert_close(magnet_read(logp, 0.0)[0].exp(), torch.full((3,), 1 / 3))
    assert magnet_read(logp, 0.0)[1].tolist() == pytest.approx([math.log(0.5)] * 2 + [-math.inf])
    assert magnet_read(logp, 1.0) is logp
    torch.testing.assert_close(magnet_read(logp, 0.5)[0], torch.log_softmax(0.5 * logp[0], -1))


def test_a_uniform_magnet_start_moves_its_share_and_resumes_as_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    """From a uniform start every move gives the policy g of the magnet: the share goes
    0 -> 0.5 -> 0.75 (g 0.5), the adapter a copy of the policy at the first move and then
    mixed g / share of the way; the learners read that share, and a run resumed from a
    checkpoint (the share in the magnet's safetensors metadata) equals an uninterrupted one.
    Without policy targets the setting is refused."""
    magnet = "  magnet: {alpha: 0.5, every: 1, mix: 0.5, start: uniform}\n"
    cfg = load_config_text(tiny_team("kuhn_poker", KUHN + TARGET + magnet))
    tr = Trainer(cfg, tmp_path / "steps")
    learner = next(iter(tr.runtime.learners.values())).learner
    assert tr.magnet is not None and tr.magnet.share == learner.magnet_share == 0.0
    tr.train_step()
    first = tr.runtime.weights()["player"]
    assert tr.magnet.share == learner.magnet_share == 0.5
    assert all(torch.equal(tr.magnet.weights["player"][k], v) for k, v in first.items())
    tr.train_step()
    second = tr.runtime.weights()["player"]
    assert tr.magnet.share == learner.magnet_share == 0.75
    for k, v in second.items():
        torch.testing.assert_close(tr.magnet.weights["player"][k], (first[k] + 2 * v) / 3)
    Trainer(cfg, tmp_path / "full").fit()
    Trainer(cfg.replace(train=cfg.train.replace(steps=2)), tmp_path / "cut").fit()
    resumed = Trainer(cfg, tmp_path / "cut", resume=True)
    assert resumed.step == 2 and resumed.magnet is not None and resumed.magnet.share == 0.75
    resumed.fit()
    assert metrics_rows(tmp_path / "cut") == metrics_rows(tmp_path / "full")
    with pytest.raises(ConfigError, match="magnet.start uniform .* policy_target.eta > 0"):
        load_config_text(tiny_team("kuhn_poker", KUHN + magnet))
