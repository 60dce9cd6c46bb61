"""Kuhn self-play with the trainer's algorithm on a tabular policy: seconds per variant.

A 45-minute SmolLM2 run gives one trajectory; this replica runs the same recipe on a table of
logits, many seeds and variants at once, to see what the *algorithm* does (cycling, pure
profiles, card-blind drift) apart from the model.  What is the trainer's own code: the advantage
estimator (agent-wise, grouped by information state), the common-mode projection, the GRPO
loss with its entropy term, AdamW with gradient clipping, the inverse-time learning-rate decay
and the exact exploitability.  What is the replica's: the policy (a logit pair per information
state, plus optionally ``kappa`` x a logit pair per *public* state shared by all three cards:
a crude stand-in for an LLM whose features barely tell the cards apart), and the league (half
the games against snapshots taken every 5 steps, pool of 8, as configs/kuhn_selfplay.yaml).

    .venv/bin/python -m scripts.experiments.kuhn_tabular [--steps 80 --seeds 3]
    .venv/bin/python -m scripts.experiments.kuhn_tabular --table magnet --steps 800 --seeds 5

Figures are exact exploitability; each variant is also shown as a ratio to its baseline (the
first variant with the same ``kappa``, measured in the same run with the same seeds).  The
magnet table (``train.magnet``: the trainer's exact KL to a magnet moved every k steps) reports
the last iterate instead: the final policy's mean and worst over seeds, and the mean over the
last 20% of the steps.  Its ``chips`` rows leave the advantages in chips
(``train.advantage_scale: none``, the same estimator): dividing by each information state's
std rescales each state's payoffs differently, so the magnet's regularised equilibria are
those of another game and the last iterate stalls near 0.06.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from marl.config.train import TrainConfig
from marl.games.analysis import exploitability, info_states
from marl.games.registry import make
from marl.train.advantages import Samples, make_estimator, remove_common_mode
from marl.train.loss import exact_kl, grpo_loss, k3
from marl.train.objectives.policy_target import (
    action_values,
    fit,
    gauss_newton_fit,
    jacobian,
    mmd_target,
    target_kl,
)

GAME = "kuhn_poker"


@dataclass(frozen=True)
class Variant:
    name: str
    entropy: float = 0.01
    common_mode: float = 1.0
    lr_decay: float = 0.0
    kappa: float = 0.0
    magnet: float = 0.0  # alpha of KL(pi || magnet); 0: off
    every: int = 20  # move the magnet every k steps
    mix: float = 1.0  # g: magnet <- normalise(magnet^(1-g) pi^g)
    exact: bool = True  # exact KL over the legal actions, else k3 on the chosen one
    optimizer: str = "adamw"  # or "sgd"
    lr: float | None = None  # None: --lr
    league: bool = True  # half the games against snapshots (the config's league)
    future: bool = False  # returns minus the KL of the player's later decisions, plus
    # the opponent's (the regularised game's values; self-play)
    scale: str = "std"  # train.advantage_scale: per-state std, or none (chips)
    decay: float = 1.0  # alpha <- decay * alpha at every magnet move (annealing)
    grow: float = 1.0  # k <- grow * k after every magnet move
    warm: int = 0  # first `warm` steps: c = 1, lr warm_lr, no magnet; then the
    warm_lr: float = 0.1  # magnet starts as a copy of the policy (a warm start)
    target: float = 0.0  # eta of MMD's closed-form step (train.policy_target); 0: off
    fit: int = 20  # steps of the fit on KL(target || pi)
    visits: bool = False  # eta per state x its share of the decisions / the mean share
    solver: str = "adam"  # the fit: adam (marl.train.objectives.policy_target.fit) or gauss_newton
    ridge: float = 1e-3  # gauss_newton's damping (train.policy_target.ridge)


VARIANTS = [
    Variant("constant lr, entropy 0.01, c=1"),
    Variant("lr_decay 0.03 (the config)", lr_decay=0.03),
    Variant("no common-mode removal, entropy 0.3, lr_decay 0.1", 0.3, 0.0, 0.1),
    Variant("coupled x10: constant lr, entropy 0.01, c=1", kappa=10),
    Variant("coupled x10: lr_decay 0.03 (the config)", lr_decay=0.03, kappa=10),
    Variant("coupled x10: no removal, entropy 0.01", common_mode=0.0, kappa=10),
    Variant("coupled x10: c=0.8, entropy 0.3, lr_decay 0.05", 0.3, 0.8, 0.05, 10),
]


# the last-iterate table (--table magnet); M: the magnet recipe without the config's
# common-mode removal and league (both keep the last iterate away, see docs/benchmarks.md)
M = dict(lr=0.03, entropy=0.0, common_mode=0.0, league=False)
MAGNET_VARIANTS = [
    Variant("no magnet: the config (lr 0.1, lr_decay 0.03, c=1, league)", lr_decay=0.03),
    Variant("no magnet, lr 0.02, c=0, self-play", **{**M, "lr": 0.02}),
    Variant(
        "naive: k3 on the chosen action, alpha 1, k 10, c=1, league",
        magnet=1.0,
        every=10,
        exact=False,
        lr=0.03,
    ),
    Variant("exact KL, alpha 1, k 10, c=1, league", magnet=1.0, every=10, lr=0.03),
    Variant("exact KL, alpha 1, fixed magnet (QRE)", magnet=1.0, every=10**9, **M),
    Variant(
        "exact KL, alpha 1, k 100, g 0.5, but c=1",
        magnet=1.0,
        every=100,
        mix=0.5,
        **{**M, "common_mode": 1.0},
    ),
    Variant(
        "exact KL, alpha 1, k 100, g 0.5, but league",
        magnet=1.0,
        every=100,
        mix=0.5,
        **{**M, "league": True},
    ),
    Variant("exact KL, alpha 1, k 10, g 1", magnet=1.0, every=10, **M),
    Variant("exact KL, alpha 1, k 1, g 0.01 (an EMA magnet)", magnet=1.0, every=1, mix=0.01, **M),
    Variant("exact KL, alpha 1, k 200, g 1", magnet=1.0, every=200, **M),
    Variant("exact KL, alpha 1, k 100, g 0.5", magnet=1.0, every=100, mix=0.5, **M),
    Variant(
        "exact KL, alpha 1, k 100, g 0.5, lr 0.02",
        magnet=1.0,
        every=100,
        mix=0.5,
        **{**M, "lr": 0.02},
    ),
    Variant(
        "exact KL, alpha 1, k 150, g 0.5, lr 0.02",
        magnet=1.0,
        every=150,
        mix=0.5,
        **{**M, "lr": 0.02},
    ),
    # candidate fixes of the k 150 row's floor: anneal alpha or k over the magnet moves
    Variant(
        "exact KL, alpha 1 x0.8 per move, k 150, g 0.5, lr 0.02",
        magnet=1.0,
        every=150,
        mix=0.5,
        decay=0.8,
        **{**M, "lr": 0.02},
    ),
    Variant(
        "exact KL, alpha 1, k 150 x1.3 per move, g 0.5, lr 0.02",
        magnet=1.0,
        every=150,
        mix=0.5,
        grow=1.3,
        **{**M, "lr": 0.02},
    ),
    # or keep each state's payoffs in chips (train.advantage_scale: none), alpha then in chips
    *[
        Variant(
            f"chips: alpha {a}, k {k}, g 0.5, lr {lr}"
            + (" (configs/kuhn_magnet.yaml)" if (a, k, lr) == (0.5, 100, 0.02) else ""),
            magnet=a,
            every=k,
            mix=0.5,
            scale="none",
            **{**M, "lr": lr},
        )
        for a, k, lr in (
            (0.5, 100, 0.02),
            (0.35, 100, 0.02),
            (0.25, 100, 0.02),
            (0.5, 75, 0.02),
            (0.5, 100, 0.015),
            (0.25, 150, 0.02),
            (0.35, 150, 0.02),
            (0.5, 150, 0.02),
            (1.0, 150, 0.02),
            (0.5, 200, 0.02),
            (0.5, 150, 0.03),
            (0.5, 150, 0.01),
        )
    ],
    Variant(
        "chips: alpha 0.5 x0.9 per move, k 100, g 0.5, lr 0.02",
        magnet=0.5,
        every=100,
        mix=0.5,
        decay=0.9,
        scale="none",
        **{**M, "lr": 0.02},
    ),
    Variant(
        "coupled x10, chips: alpha 0.5, k 100, g 0.5, lr 0.02",
        magnet=0.5,
        every=100,
        mix=0.5,
        scale="none",
        kappa=10,
        **{**M, "lr": 0.02},
    ),
    Variant(
        "R-NaD-style values: + the later decisions' KL, alpha 1, k 100, g 0.5",
        magnet=1.0,
        every=100,
        mix=0.5,
        future=True,
        **M,
    ),
    Variant(
        "SGD lr 3: exact KL, alpha 0.5, k 100, g 0.5",
        magnet=0.5,
        every=100,
        mix=0.5,
        optimizer="sgd",
        **{**M, "lr": 3.0},
    ),
    Variant(
        "coupled x10: exact KL, alpha 1, k 100, g 0.5, lr 0.02",
        magnet=1.0,
        every=100,
        mix=0.5,
        kappa=10,
        **{**M, "lr": 0.02},
    ),
    # SmolLM2 went card-blind under the chips recipe: a warm start with the projection first
    # (the magnet then starts from the card-aware policy), or a partial projection throughout
    *[
        Variant(
            (f"coupled x{kappa}" if kappa else "uncoupled")
            + ", chips, "
            + (f"warm start ({w} steps c=1, lr 0.1, no magnet), then " if w else "")
            + "alpha 0.5, k 100, lr 0.02",
            magnet=0.5,
            every=100,
            mix=0.5,
            scale="none",
            kappa=kappa,
            warm=w,
            **{**M, "lr": 0.02},
        )
        for kappa, w in ((0, 0), (0, 30), (10, 0), (10, 30))
    ],
    *[
        Variant(
            f"coupled x{kappa}, chips, c={c}: alpha 0.5, k 100, lr 0.02",
            magnet=0.5,
            every=100,
            mix=0.5,
            scale="none",
            kappa=kappa,
            **{**M, "lr": 0.02, "common_mode": c},
        )
        for kappa in (30, 100)
        for c in (0.0, 0.5, 0.9)
    ],
    # MMD's closed-form step fitted by the policy (train.policy_target): the fit moves the
    # card-specific part as far as the target asks, however strongly the cards are coupled
    *[
        Variant(
            (f"coupled x{kappa}" if kappa else "uncoupled") + f", target: eta {eta}, "
            f"alpha {a}, k {k}, g {g}, fit {fit}",
            magnet=a,
            every=k,
            mix=g,
            kappa=kappa,
            target=eta,
            fit=fit,
            **{**M, "lr": 0.05},
        )
        for kappa in (0, 100)
        for eta, a, k, g, fit in (
            (0.5, 1.0, 10, 0.5, 20),
            (1.0, 1.0, 10, 0.5, 20),
            (1.0, 0.5, 10, 0.5, 20),
            (2.0, 0.5, 10, 0.5, 20),
            (1.0, 1.0, 25, 0.5, 20),
            (0.5, 1.0, 25, 0.5, 20),
            (1.0, 1.0, 10, 0.5, 5),
            (1.0, 1.0, 10, 0.5, 50),
            (1.0, 0.5, 20, 1.0, 10),
            (0.5, 0.5, 20, 1.0, 10),
            (1.0, 0.5, 30, 1.0, 10),
            (0.3, 0.5, 30, 1.0, 10),
            (1.0, 0.5, 10, 1.0, 5),
            (1.0, 0.25, 20, 1.0, 5),
            (3.0, 0.3, 10, 1.0, 5),
        )
    ],
    *[
        Variant(
            (f"coupled x{kappa}" if kappa else "uncoupled") + ", target (configs/"
            f"kuhn_target.yaml): eta 1.0, alpha 0.5, k 10, g 1.0, Gauss-Newton x1, ridge "
            f"{ridge}",
            magnet=0.5,
            every=10,
            mix=1.0,
            kappa=kappa,
            target=1.0,
            fit=1,
            solver="gauss_newton",
            ridge=ridge,
            **M,
        )
        for kappa in (0, 100)
        for ridge in (1e-3, 1e-6)
    ],
    *[
        Variant(
            (f"coupled x{kappa}" if kappa else "uncoupled") + f", visit-weighted target: "
            f"eta {eta}, alpha {a}, k {k}, g {g}, fit 10",
            magnet=a,
            every=k,
            mix=g,
            kappa=kappa,
            target=eta,
            fit=10,
            visits=True,
            **{**M, "lr": 0.05},
        )
        for kappa in (0, 100)
        for eta, a, k, g in (
            (1.0, 0.5, 20, 1.0),
            (0.5, 0.5, 20, 1.0),
            (1.0, 0.5, 10, 0.5),
            (2.0, 0.5, 20, 1.0),
        )
    ],
]


class TablePolicy(torch.nn.Module):
    """logits(info state) = own[info state] + kappa * shared[public state]."""

    def __init__(self, keys: list[str], kappa: float, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.keys = {k: i for i, k in enumerate(keys)}
        publics = sorted({k.split(":", 1)[1] for k in keys})
        self.public_of = torch.tensor([publics.index(k.split(":", 1)[1]) for k in keys])
        self.own = torch.nn.Parameter(0.3 * torch.randn(len(keys), 2, generator=g))
        self.shared = torch.nn.Parameter(torch.zeros(len(publics), 2))
        self.kappa = kappa

    def logits(self) -> torch.Tensor:
        return self.own + self.kappa * self.shared[self.public_of]

    def table(self) -> dict[str, dict[int, float]]:
        probs = torch.softmax(self.logits().detach(), 1)
        return {
            k: dict(zip(legal, probs[self.keys[k]].tolist(), strict=True))
            for k, _, legal in info_states(GAME)
        }


def play(root, tables: list[dict], rng: random.Random) -> tuple[list[tuple], list[float]]:
    """One game; decisions as (seat, info key, choice index, probs)."""
    state, decisions = root, []
    while not state.is_terminal:
        if state.is_chance:
            outcomes, weights = zip(*state.chance_outcomes(), strict=True)
            state = state.apply(rng.choices(outcomes, weights)[0])
            continue
        seat, legal = state.current_player, state.legal()
        key = state.info_key(seat)
        probs = [tables[seat][key][a] for a in legal]
        choice = rng.choices(range(len(legal)), probs)[0]
        decisions.append((seat, key, choice, probs))
        state = state.apply(legal[choice])
    return decisions, list(state.returns())


def run(v: Variant, seed: int, steps: int, games: int, lr: float) -> list[float]:
    """Exploitability after every step."""
    rng = random.Random(seed)
    keys = [k for k, _, _ in info_states(GAME)]
    policy = TablePolicy(keys, v.kappa, seed)
    lr = v.lr or lr
    opt = (
        torch.optim.SGD(policy.parameters(), lr=lr)
        if v.optimizer == "sgd"
        else torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    )
    magnet = torch.log_softmax(policy.logits().detach(), 1)  # rho_0 = pi_0
    schedule = TrainConfig(lr=lr, lr_decay=v.lr_decay)
    estimate = make_estimator("agent_wise", scale=v.scale)
    warm_estimate = make_estimator("agent_wise", scale="std") if v.warm else estimate
    root, pool, curve = make(GAME).root_state(), [], []
    alpha, every, next_move = v.magnet, v.every, v.warm + v.every
    for step in range(1, steps + 1):
        warming = step <= v.warm
        if v.warm and step == v.warm + 1:  # the warm start ends: the magnet is the policy
            magnet = torch.log_softmax(policy.logits().detach(), 1)
        latest = policy.table()
        kl_at = {}
        if v.future:
            with torch.no_grad():
                lp = torch.log_softmax(policy.logits(), 1)
                kl_at = dict(zip(policy.keys, exact_kl(lp, magnet).tolist(), strict=True))
        rows = []  # (seat, key, choice, probs, return)
        for g in range(games):
            trained = (0, 1)
            tables = [latest, latest]
            if v.league and pool and rng.random() < 0.5:
                trained = (g % 2,)
                tables[1 - g % 2] = rng.choice(pool)
            decisions, returns = play(root, tables, rng)
            for i, d in enumerate(decisions):
                if d[0] in trained:
                    later = (
                        sum(
                            alpha * kl_at[e[1]] * (-1 if e[0] == d[0] else 1)
                            for e in decisions[i + 1 :]
                        )
                        if v.future
                        else 0.0
                    )
                    rows.append((*d, returns[d[0]] + later))
        s = Samples(
            rewards=[r[4] for r in rows],
            groups=[r[1] for r in rows],
            agents=[r[0] for r in rows],
            publics=[r[1].split(":", 1)[1] for r in rows],
            choices=[r[2] for r in rows],
            probs=[r[3] for r in rows],
        )
        adv = (
            remove_common_mode(warm_estimate(s).values, s, 1.0)
            if warming
            else remove_common_mode(estimate(s).values, s, v.common_mode)
        )
        if v.target > 0 and not warming:
            fit_target(policy, opt, rows, magnet, v)
        else:
            gradient_step(
                policy,
                opt,
                rows,
                adv,
                magnet,
                alpha,
                warming,
                v,
                v.warm_lr if warming else schedule.lr_at(step),
            )
        if v.magnet > 0 and step == next_move:  # in logit space: a geometric mix
            now = torch.log_softmax(policy.logits().detach(), 1)
            magnet = torch.log_softmax((1 - v.mix) * magnet + v.mix * now, 1)
            alpha, every = alpha * v.decay, every * v.grow
            next_move = step + max(1, round(every))
        if step % 5 == 0:
            pool = (pool + [policy.table()])[-8:]
        curve.append(exploitability(GAME, policy.table()))
    return curve


def fit_target(
    policy: TablePolicy, opt, rows: list[tuple], magnet: torch.Tensor, v: Variant
) -> None:
    """MMD's closed-form step on the visited states, then ``v.fit`` steps towards it."""
    q = action_values(
        [r[1] for r in rows], [r[2] for r in rows], [r[4] for r in rows], [len(r[3]) for r in rows]
    )
    idx = [policy.keys[k] for k in q]
    eta = torch.full((len(q), 1), v.target)
    if v.visits:
        n = Counter(r[1] for r in rows)
        eta = eta * torch.tensor([[n[k] * len(n) / len(rows)] for k in q])
    with torch.no_grad():
        logp = torch.log_softmax(policy.logits()[idx], 1)
        target = mmd_target(logp, magnet[idx], torch.tensor(list(q.values())), eta, v.magnet)

    if v.solver == "gauss_newton":
        params = list(policy.parameters())

        def linearise():
            lp = torch.log_softmax(policy.logits()[idx], 1)
            values = lp[:, 1] - lp[:, 0]
            return jacobian(values, params), (target[:, 1] - target[:, 0] - values).detach()

        def kl() -> float:
            with torch.no_grad():
                return float(target_kl(torch.log_softmax(policy.logits()[idx], 1), target).mean())

        gauss_newton_fit(linearise, params, kl, v.ridge, v.fit, kl())
        return

    def loss(grad: bool) -> float:
        opt.zero_grad()
        with torch.set_grad_enabled(grad):
            value = target_kl(torch.log_softmax(policy.logits()[idx], 1), target).mean()
        if grad:
            value.backward()
        return float(value.detach())

    def step(lr: float) -> None:
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()

    fit(
        loss,
        step,
        lambda: {k: t.clone() for k, t in policy.state_dict().items()},
        policy.load_state_dict,
        v.lr or 0.05,
        v.fit,
    )


def gradient_step(
    policy: TablePolicy,
    opt,
    rows: list[tuple],
    adv,
    magnet: torch.Tensor,
    alpha: float,
    warming: bool,
    v: Variant,
    lr: float,
) -> None:
    """The trainer's GRPO step with the magnet's KL term."""
    logp_all = torch.log_softmax(policy.logits()[[policy.keys[r[1]] for r in rows]], 1)
    logp = logp_all[torch.arange(len(rows)), [r[2] for r in rows]][:, None]
    entropy = -(logp_all.exp() * logp_all).sum(1)
    rho = magnet[[policy.keys[r[1]] for r in rows]]
    mag_kl = (
        exact_kl(logp_all, rho)[:, None]
        if v.exact
        else k3(logp, rho[torch.arange(len(rows)), [r[2] for r in rows]][:, None])
    )
    parts = grpo_loss(
        logp,
        logp.detach(),
        torch.tensor(adv, dtype=torch.float32),
        torch.ones_like(logp),
        entropy=entropy,
        entropy_coef=v.entropy,
        magnet_kl=mag_kl,
        alpha=0.0 if warming else alpha,
    )
    opt.zero_grad()
    parts.loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()


def baseline_table(args, console: Console) -> Table:
    table = Table(
        title=f"Kuhn self-play, tabular replica: exact exploitability "
        f"({args.seeds} seeds, {args.steps} steps x {args.games} games)"
    )
    for col in (
        "variant",
        "final",
        "best",
        "last 20 mean",
        "final / baseline",
        "last 20 / baseline",
    ):
        table.add_column(col, justify="left" if col == "variant" else "right")
    base: dict[float, tuple[float, float]] = {}  # per kappa: the first variant with it
    for v in VARIANTS:
        curves = np.array(
            [run(v, seed, args.steps, args.games, args.lr) for seed in range(args.seeds)]
        )
        final, best, late = curves[:, -1].mean(), curves.min(1).mean(), curves[:, -20:].mean()
        ref = base.setdefault(v.kappa, (final, late))
        table.add_row(
            v.name,
            f"{final:.3f}",
            f"{best:.3f}",
            f"{late:.3f}",
            f"{final / ref[0]:.2f}x",
            f"{late / ref[1]:.2f}x",
        )
        console.print(f"{v.name}: final {final:.3f}, best {best:.3f}, last 20 {late:.3f}")
    return table


def magnet_table(args, console: Console) -> Table:
    """Last-iterate figures: the final policy, and the mean over the last 20% of the steps
    (whether it stays there)."""
    late_n = max(1, args.steps // 5)
    table = Table(
        title=f"Kuhn self-play, tabular replica, magnet schedules: exact "
        f"exploitability ({args.seeds} seeds, {args.steps} steps x "
        f"{args.games} games)"
    )
    for col in (
        "variant",
        "final mean",
        "final worst",
        f"last {late_n} mean",
        f"last {late_n} worst",
        "seeds final <= 0.05",
    ):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for v in MAGNET_VARIANTS:
        if args.only and not any(o in v.name for o in args.only):
            continue
        curves = np.array(
            [run(v, seed, args.steps, args.games, args.lr) for seed in range(args.seeds)]
        )
        late = curves[:, -late_n:].mean(1)
        row = (
            f"{curves[:, -1].mean():.3f}",
            f"{curves[:, -1].max():.3f}",
            f"{late.mean():.3f}",
            f"{late.max():.3f}",
            f"{int((curves[:, -1] <= 0.05).sum())}/{args.seeds}",
        )
        table.add_row(v.name, *row)
        console.print(f"{v.name}: " + ", ".join(row), highlight=False)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--games", type=int, default=128, help="games per step")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument(
        "--table",
        choices=("baseline", "magnet"),
        default="baseline",
        help="magnet: the last-iterate schedules (MAGNET_VARIANTS)",
    )
    ap.add_argument(
        "--only",
        nargs="*",
        default=[],
        help="magnet table: the variants whose name has one of these",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest
    console = Console()
    console.print((magnet_table if args.table == "magnet" else baseline_table)(args, console))


if __name__ == "__main__":
    main()
