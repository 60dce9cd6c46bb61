"""Benchmarks of the game layer; prints a markdown table for docs/benchmarks.md.

Each benchmark is a function registered with ``@benchmark(name)`` that returns table rows, so
new ones (e.g. exploitability timings) are one decorated function each.

    .venv/bin/python -m scripts.bench.games [--seconds 1.0] [--repeats 5] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections.abc import Callable
from time import perf_counter

import numpy as np

from marl import games

Row = tuple[str, str]  # (measurement, value with unit)
BENCHMARKS: list[tuple[str, Callable[[argparse.Namespace], list[Row]]]] = []


def benchmark(name: str) -> Callable:
    def deco(fn: Callable[[argparse.Namespace], list[Row]]) -> Callable:
        BENCHMARKS.append((name, fn))
        return fn

    return deco


def random_play_rate(env, seconds: float, seed: int = 0) -> float:
    """Steps per second of the standard AEC loop under uniform random legal play: ``last()``
    (which builds the observation), a random action from the mask, ``step`` (dead steps
    included).  Whole games only, until ``seconds`` have passed."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    steps, start = 0, perf_counter()
    while True:
        for _agent in env.agent_iter():
            obs, _, terminated, truncated, _ = env.last()
            action = (
                None
                if terminated or truncated
                else int(rng.choice(np.flatnonzero(obs["action_mask"])))
            )
            env.step(action)
            steps += 1
        if perf_counter() - start >= seconds:
            return steps / (perf_counter() - start)
        env.reset()


def interleaved_rates(envs: dict[str, object], args: argparse.Namespace) -> dict[str, float]:
    """Median rate of each env over ``repeats`` rounds, alternating envs within each round so
    that a change in machine load hits all of them alike."""
    rates: dict[str, list[float]] = {name: [] for name in envs}
    for repeat in range(args.repeats):
        for name, env in envs.items():
            rates[name].append(random_play_rate(env, args.seconds, seed=repeat))
    return {name: statistics.median(r) for name, r in rates.items()}


@benchmark("tic_tac_toe_vs_pettingzoo")
def tictactoe_vs_pettingzoo(args: argparse.Namespace) -> list[Row]:
    from pettingzoo.classic import tictactoe_v3  # needs pygame (the dev extra)

    rates = interleaved_rates(
        {"ours": games.make("tic_tac_toe"), "pettingzoo": tictactoe_v3.env()}, args
    )
    return [
        (
            "marl-teams `tic_tac_toe` (observation includes the text)",
            f"{rates['ours']:,.0f} steps/s",
        ),
        (
            "PettingZoo `tictactoe_v3` (wrapped, as `env()` returns it)",
            f"{rates['pettingzoo']:,.0f} steps/s",
        ),
        ("ratio ours / PettingZoo (goal >= 1.0)", f"{rates['ours'] / rates['pettingzoo']:.2f}"),
    ]


@benchmark("random_play_all_games")
def random_play_all_games(args: argparse.Namespace) -> list[Row]:
    rates = interleaved_rates({name: games.make(name) for name in games.names()}, args)
    return [(f"`{name}` random play", f"{rate:,.0f} steps/s") for name, rate in rates.items()]


def exact_exploitability_rows(
    game: str, goal_s: float, cfr_iterations: int, args: argparse.Namespace
) -> list[Row]:
    """Exact exploitability of a table policy: first call in the process (builds and caches
    the game tree) and warm calls (median of ``repeats``), each as a ratio to the goal; then
    a CFR+ solve from scratch and the exploitability it reaches."""
    from marl.games import analysis, cfr

    analysis.game_tree.cache_clear()
    start = perf_counter()
    table = analysis.to_table(game, analysis.uniform_policy)
    analysis.exploitability(game, table)
    cold = perf_counter() - start
    warm = []
    for _ in range(args.repeats):
        start = perf_counter()
        analysis.exploitability(game, table)
        warm.append(perf_counter() - start)
    warm_s = statistics.median(warm)
    start = perf_counter()
    nash = cfr.solve(game, cfr_iterations, use_cache=False)
    solve_s = perf_counter() - start
    return [
        (
            f"`{game}` exact exploitability, first call (tree build included; goal < "
            f"{goal_s * 1e3:g} ms)",
            f"{cold * 1e3:.1f} ms = {cold / goal_s:.3f} x goal",
        ),
        (
            f"`{game}` exact exploitability, warm (goal < {goal_s * 1e3:g} ms)",
            f"{warm_s * 1e3:.2f} ms = {warm_s / goal_s:.4f} x goal",
        ),
        (
            f"`{game}` CFR+ solve, {cfr_iterations} iterations (no cache)",
            f"{solve_s:.2f} s, exploitability {analysis.exploitability(game, nash):.1e}",
        ),
    ]


@benchmark("kuhn_exploitability")
def kuhn_exploitability(args: argparse.Namespace) -> list[Row]:
    return exact_exploitability_rows("kuhn_poker", 0.050, 1000, args)


@benchmark("leduc_exploitability")
def leduc_exploitability(args: argparse.Namespace) -> list[Row]:
    return exact_exploitability_rows("leduc_poker", 5.0, 1000, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    parser.add_argument("--repeats", type=int, default=5, help="median over this many")
    parser.add_argument(
        "--only", nargs="*", choices=[n for n, _ in BENCHMARKS], help="run only these benchmarks"
    )
    args = parser.parse_args()
    print(
        f"Machine: {os.cpu_count()}-core CPU ({platform.machine()}), no GPU, Python "
        f"{platform.python_version()}, load average at start {os.getloadavg()[0]:.2f}."
    )
    print(
        f"Command: `.venv/bin/python -m scripts.bench.games --seconds {args.seconds} "
        f"--repeats {args.repeats}` (medians; engines alternate within each repeat).\n"
    )
    print("| measurement | value |\n|---|---|")
    for name, fn in BENCHMARKS:
        if args.only and name not in args.only:
            continue
        for measurement, value in fn(args):
            print(f"| {measurement} | {value} |", flush=True)


if __name__ == "__main__":
    main()
