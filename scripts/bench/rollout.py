"""Benchmark the rollout engine against a bare ``generate`` call, sequential play, and memory.

All figures come from one run on one model (SmolLM2-135M by default), for each batch size B:

* **bare**: ``model.generate`` (the PEFT-wrapped model, role adapter active, no engine) with
  the role's sampling settings, called right after each engine step that had all B games in
  flight, on exactly the B prompts that step sent and with its sampling seed (paired: same
  inputs, same samples, same load);
* **engine**: ``RolloutEngine`` with ``concurrency=B`` playing ``waves * B`` self-play games in
  free decoding (finished games are replaced while episodes remain);
* **sequential**: games with ``concurrency=1``, half of them before and half after the rest
  (the two cores are shared, so the load drifts during a run).

Throughput is completion tokens (up to and including end-of-sequence, as the engine records
them) divided by wall time.  Memory is the resident set (VmRSS) of fresh interpreters: one plain
model vs the same base with four LoRA role adapters.

    .venv/bin/python -m scripts.bench.rollout                        # SmolLM2-135M, B = 8, 32
    .venv/bin/python -m scripts.bench.rollout --model tiny-random    # quick plumbing check
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see cli/__init__.py
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

from scripts.workloads import REPO, recipe  # noqa: E402

ROLES = ("planner", "critic", "solver", "judge")

_MEMORY = """
import json, warnings
warnings.filterwarnings("ignore")
import torch
from marl.agents.host import ModelHost
from marl.agents.models import load_model

def rss_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

model, tok = load_model({model!r})
host = ModelHost(model, tok)
for name in {roles!r}:
    host.add_adapter(name, r=8, alpha=16)
ids = host.prompt_ids([{{"role": "user", "content": "Pick a cell: [4]."}}])[0]
for name in ({roles!r} or (None,)):
    with host.use(name):
        host.generate([ids], 8, 1.0, 1.0, 0)
print(json.dumps({{"rss_kib": rss_kib("VmRSS"), "hwm_kib": rss_kib("VmHWM"),
                  "params": sum(p.numel() for p in host.model.parameters())}}))
"""


@dataclass
class Rate:
    tokens: int
    seconds: float
    cpu: float  # process CPU seconds (all threads): steadier than wall time on shared cores
    calls: int = 1
    turns: int = 0
    parse_errors: int = 0
    batches: list[int] = field(default_factory=list)
    full: Rate | None = None  # the engine steps that ran with all B games in flight

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def tok_cpu(self) -> float:
        return self.tokens / self.cpu

    def __add__(self, other: Rate) -> Rate:
        return Rate(
            self.tokens + other.tokens,
            self.seconds + other.seconds,
            self.cpu + other.cpu,
            self.calls + other.calls,
            self.turns + other.turns,
            self.parse_errors + other.parse_errors,
        )


def measure_memory(model: str, roles: tuple[str, ...]) -> dict:
    code = _MEMORY.format(model=model, roles=roles)  # run in REPO: its marl is imported
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def build(model: str, max_new_tokens: int, seed: int):
    from marl.agents.builder import build_roster

    cfg = recipe("tictactoe_selfplay", model, mode="free", max_new_tokens=max_new_tokens)
    return cfg, build_roster(cfg, seed=seed)


def bare_generate(roster, prompts: list[list[int]], seed: int) -> Rate:
    """One ``model.generate`` call on the left-padded prompts, nothing else timed."""
    import torch

    from marl.agents.host.prefill import left_pad

    host = next(iter(roster.hosts.values()))
    pol = roster.policies["player"]
    tok = host.tokenizer
    pad, eos = tok.pad_token_id, tok.eos_token_id
    ids, mask = left_pad(prompts, pad)
    with host.use(pol.adapter), torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        t0, c0 = time.perf_counter(), time.process_time()
        out = host.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=pol.max_new_tokens,
            do_sample=True,
            temperature=pol.temperature,
            top_p=pol.top_p,
            top_k=None,
            pad_token_id=pad,
            eos_token_id=eos,
        )
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = 0
    for row in out[:, ids.shape[1] :].tolist():
        tokens += row.index(eos) + 1 if eos in row else len(row)
    return Rate(tokens, seconds, cpu, turns=len(prompts))


def engine_play(
    roster, episodes: int, concurrency: int, seed: int, paired: bool = False
) -> tuple[Rate, Rate | None]:
    """Self-play tic-tac-toe through the engine; completion tokens of every turn / wall time.

    Every engine step makes one ``act`` call (one policy plays both seats).  A step's time runs
    from the end of the previous step's call to the end of its own, so it includes the engine's
    bookkeeping; steps whose batch is the full ``concurrency`` make up ``full``.  With
    ``paired``, each full step is followed by a bare ``generate`` call on the very prompts that
    step sent, with the sampling seed that step used (same inputs, same samples, same moment;
    its time is kept out of the engine's), returned second.
    """
    from marl import games
    from marl.agents.rollout import RolloutEngine

    pol = roster.policies["player"]
    steps: list[tuple[int, int, float, float]] = []  # (batch, tokens, seconds, cpu seconds)
    act = pol.act

    bare: list[Rate] = []
    host = next(iter(roster.hosts.values()))
    generate, seeds = host.generate, []

    def seeded(prompts, max_new_tokens, temperature, top_p, seed):
        seeds.append(seed)
        return generate(prompts, max_new_tokens, temperature, top_p, seed)

    def timed(reqs):
        out = act(reqs)
        now = (time.perf_counter(), time.process_time())
        steps.append(
            (
                len(reqs),
                sum(len(r.completion_ids) for r in out),
                now[0] - last[0][0],
                now[1] - last[0][1],
            )
        )
        if paired and len(reqs) == concurrency:
            bare.append(bare_generate(roster, [r.prompt_ids for r in out], seeds[-1]))
            pause[0] += time.perf_counter() - now[0]
            pause[1] += time.process_time() - now[1]
            now = (time.perf_counter(), time.process_time())
        last[0] = now
        return out

    pol.act = timed
    host.generate = seeded
    seats = dict(zip(("player_0", "player_1"), roster.agents, strict=True))
    engine = RolloutEngine(lambda: games.make("tic_tac_toe"), lambda i: seats, concurrency)
    try:
        pause = [0.0, 0.0]
        last = [(time.perf_counter(), time.process_time())]
        t0, c0 = last[0]
        eps = engine.play(episodes, seed=seed)
        seconds = time.perf_counter() - t0 - pause[0]
        cpu = time.process_time() - c0 - pause[1]
    finally:
        del pol.act, host.generate
    turns = [t for e in eps for t in e.turns]
    full = [s for s in steps if s[0] == concurrency]
    rate = Rate(
        sum(len(t.completion_ids) for t in turns),
        seconds,
        cpu,
        calls=len(steps),
        turns=len(turns),
        parse_errors=sum(not t.parsed for t in turns),
        batches=[s[0] for s in steps],
        full=Rate(
            sum(s[1] for s in full),
            sum(s[2] for s in full),
            sum(s[3] for s in full),
            calls=len(full),
            turns=sum(s[0] for s in full),
        )
        if full
        else None,
    )
    return rate, (sum(bare[1:], bare[0]) if bare else None)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def both(r: Rate | None) -> str:
    return f"{r.tok_s:.1f} ({r.tok_cpu:.1f})" if r else "-"


def both_ratio(x: Rate | None, y: Rate) -> str:
    return f"{ratio(x.tok_s, y.tok_s)} ({ratio(x.tok_cpu, y.tok_cpu)})" if x else "-"


def print_throughput(rows: list[tuple[int, Rate, Rate]], seq: Rate) -> None:
    print(
        "Tokens per wall-clock second (in brackets: per CPU-second of this process, all "
        "threads; steadier when other jobs take the cores).\n"
    )
    print("| B | bare generate | engine, B games in flight | engine, whole run | sequential |")
    print("|---|---|---|---|---|")
    for b, bare, eng in rows:
        print(f"| {b} | {both(bare)} | {both(eng.full)} | {both(eng)} | {both(seq)} |")
    print(
        "\n| B | engine (B in flight) / bare | engine (whole run) / bare | "
        "engine (B in flight) / sequential | engine (whole run) / sequential | "
        "bare / sequential |"
    )
    print("|---|---|---|---|---|---|")
    for b, bare, eng in rows:
        print(
            f"| {b} | {both_ratio(eng.full, bare)} | {both_ratio(eng, bare)} | "
            f"{both_ratio(eng.full, seq)} | {both_ratio(eng, seq)} | {both_ratio(bare, seq)} |"
        )


def print_details(args: argparse.Namespace, rows: list[tuple[int, Rate, Rate]], seq: Rate) -> None:
    print(
        f"\n- sequential: {seq.tokens} tokens in {seq.seconds:.1f} s over {seq.turns} turns "
        f"({seq.tokens / seq.turns:.1f} tokens/turn), parse errors "
        f"{seq.parse_errors}/{seq.turns}."
    )
    for b, bare, eng in rows:
        full = (
            f"; {eng.full.calls} steps with all {b} in flight: {eng.full.tokens} tokens in "
            f"{eng.full.seconds:.1f} s"
            if eng.full
            else ""
        )
        print(
            f"- B={b}: paired bare calls {bare.tokens} tokens in {bare.seconds:.1f} s; "
            f"engine "
            f"{args.waves * b} episodes, {eng.turns} turns, {eng.tokens} tokens in "
            f"{eng.seconds:.1f} s, parse errors {eng.parse_errors}/{eng.turns}; batch per "
            f"step {' '.join(map(str, eng.batches))}{full}."
        )


def print_memory(plain: dict, lora: dict) -> None:
    print(
        "\n| resident memory, fresh process (load + one generate per adapter) | VmRSS MiB "
        "| peak VmHWM MiB | parameters |"
    )
    print("|---|---|---|---|")
    print(
        f"| one plain model | {plain['rss_kib'] / 1024:.0f} | "
        f"{plain['hwm_kib'] / 1024:.0f} | {plain['params']:,} |"
    )
    print(
        f"| one base + {len(ROLES)} LoRA role adapters ({', '.join(ROLES)}) | "
        f"{lora['rss_kib'] / 1024:.0f} | {lora['hwm_kib'] / 1024:.0f} | "
        f"{lora['params']:,} |"
    )
    print(
        f"| ratio | {ratio(lora['rss_kib'], plain['rss_kib'])} | "
        f"{ratio(lora['hwm_kib'], plain['hwm_kib'])} | "
        f"{lora['params'] / plain['params']:.4f}x |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--waves", type=int, default=2, help="engine episodes per batch size = waves * B"
    )
    parser.add_argument(
        "--sequential-episodes",
        type=int,
        default=8,
        help="games played one at a time (half first, half last)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import torch
    from transformers.utils import logging as hf_logging

    from marl import games

    hf_logging.set_verbosity_error()
    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()
    _, roster = build(args.model, args.max_new_tokens, args.seed)
    host = next(iter(roster.hosts.values()))
    pol = roster.policies["player"]
    env = games.make("tic_tac_toe")
    env.reset(seed=args.seed)
    warm = roster.agents[0].request(env, "player_0")
    with host.use(pol.adapter):  # warm-up: first-call costs stay out of every figure
        host.generate([host.prompt_ids(warm.messages)[0]], 4, 1.0, 1.0, 0)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    half = args.sequential_episodes // 2
    seq, _ = engine_play(roster, half, 1, args.seed)
    log(f"sequential, first half: {seq.tokens} tokens in {seq.seconds:.1f}s, {seq.turns} turns")
    rows = []
    for b in args.batch_sizes:
        eng, bare = engine_play(roster, args.waves * b, b, args.seed, paired=True)
        assert bare is not None and eng.full is not None
        log(
            f"B={b} engine: {eng.tokens} tokens in {eng.seconds:.1f}s = {eng.tok_s:.1f} tok/s; "
            f"step batches {eng.batches}; full steps {eng.full.tokens} tokens in "
            f"{eng.full.seconds:.1f}s; paired bare calls {bare.tokens} tokens in "
            f"{bare.seconds:.1f}s"
        )
        rows.append((b, bare, eng))
    rest, _ = engine_play(roster, args.sequential_episodes - half, 1, args.seed + half)
    log(f"sequential, second half: {rest.tokens} tokens in {rest.seconds:.1f}s, {rest.turns} turns")
    seq = seq + rest
    load1 = os.getloadavg()[0]
    mem = None
    if not args.skip_memory:
        mem = measure_memory(args.model, ()), measure_memory(args.model, ROLES)
    total = time.perf_counter() - t_start

    print("### Rollout engine throughput\n")
    print(
        f"Machine: {os.cpu_count()}-core CPU ({platform.machine()}), Python "
        f"{platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} "
        f"threads), load average {load0:.2f} at start and {load1:.2f} at the end (other jobs "
        "share the cores). "
        "OMP_WAIT_POLICY=PASSIVE."
    )
    print(
        f"Model: {args.model} (float32), role adapter active (LoRA r=8 on q_proj/v_proj) in "
        f"every measurement. Game: tic_tac_toe self-play (one policy, both seats), free "
        f"decoding, temperature {pol.temperature}, top_p {pol.top_p}, max_new_tokens "
        f"{args.max_new_tokens}."
    )
    print(
        f"Engine: {args.waves} x B episodes at concurrency B; bare: one call after each "
        "engine step that had all B games in flight, on that step's prompts with that step's "
        "sampling seed (identical completions). Sequential: "
        f"{args.sequential_episodes} episodes at concurrency 1, half before and half after "
        f"the batched runs (its rate does not depend on B). Total runtime {total:.0f} s.\n"
    )

    print_throughput(rows, seq)
    print_details(args, rows, seq)
    if mem:
        print_memory(*mem)


if __name__ == "__main__":
    main()
