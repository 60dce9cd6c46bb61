"""The GPU paths checked in one command (under ten minutes on one GPU), as a table for the docs.

Parts, each in a fresh interpreter with a time limit (the limits add up to under ten minutes;
a part that crashes, runs past its limit or misses its tolerance is a failed row with its
one-line reason, and the next part runs):

- ``vllm``: the vLLM rollout engine (fp32, the GPU's weight sync: LoRA requests) samples free
  text under a perturbed adapter; the learner's log-probs of the same tokens
  (``ModelHost.sequence_logprobs``) against the engine's;
- ``ranks``: one learner process against a learner group (``train.learner.ranks``) of two
  NCCL ranks (one GPU each; one rank on a one-GPU machine): three updates, the weight and
  gradient-norm gaps (``scripts/bench/learner_ranks.py``);
- ``zero2``, ``zero3``: DeepSpeed ZeRO-2 and ZeRO-3 on one GPU against the torch backend;
- ``kuhn``: 20 steps of ``configs/kuhn_target.yaml`` on the embedded SmolLM2-135M, rollouts
  and the learner as Ray actors sharing the GPU, with the step's parts timed.

Without CUDA it says so in one line and exits 0.  ``--device cpu --quick`` runs ``ranks`` (two
gloo ranks) and ``kuhn`` (two small steps in this process) on the tiny model: what the
tests run.  Exit status 1 when a part failed.

    .venv/bin/python -m scripts.gpu_check                 # markdown table
    .venv/bin/python -m scripts.gpu_check --json
    .venv/bin/python -m scripts.gpu_check --device cpu --quick
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see cli/__init__.py
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

from scripts.workloads import CONFIGS, REPO  # noqa: E402

MODEL = "smollm2-135m-instruct"  # the embedded model
QUICK_MODEL = "tiny-random"
KUHN_STEPS = 20
#: Largest gaps a part passes with: fp32 engine against fp32 learner (log-prob, nats); the
#: weights after three updates, learner against learner (one AdamW step moves a weight by up
#: to lr = 0.05: a wrong reduction or a lost micro-batch shows at that order, not at 1e-3).
TOLERANCE = {"vllm": 1e-2, "weights": 1e-3}


@dataclass(frozen=True)
class Part:
    title: str
    run: Callable[[argparse.Namespace], str]  # the figure; raises on failure
    timeout_s: float
    quick: bool  # runs in --quick mode (on a CPU too)


PARTS: dict[str, Part] = {}


def part(name: str, title: str, timeout_s: float, quick: bool = False) -> Callable:
    def register(fn: Callable[[argparse.Namespace], str]) -> Callable:
        PARTS[name] = Part(title, fn, timeout_s, quick)
        return fn

    return register


class CheckFailed(RuntimeError):
    """A part ran but its figure is outside its tolerance."""


def within(name: str, value: float, tol: float, figure: str) -> str:
    if not value <= tol:
        raise CheckFailed(f"{figure}: {name} {value:.2e} > {tol:.0e}")
    return figure


# ----- the parts (each runs in a child interpreter)
@part("vllm", "vLLM rollout log-probs vs the learner's", 150)
def vllm_logprobs(args: argparse.Namespace) -> str:
    import torch

    from marl.agents.builder import model_path
    from marl.agents.policy import Request
    from marl.agents.vllm_backend import VLLMEngine, VLLMPolicy
    from scripts.workloads import load_host

    host = load_host(args.model)
    host.add_adapter("player", r=8, alpha=16, targets=["q_proj", "v_proj", "o_proj"], seed=0)
    gen = torch.Generator().manual_seed(1)
    sd = host.adapter_weights("player")
    host.set_adapter_weights(
        "player", {k: torch.randn(v.shape, generator=gen) * 0.02 for k, v in sd.items()}
    )
    host.model.to(args.device)
    engine = VLLMEngine(
        model_path(args.model), max_model_len=1024, precision="fp32", gpu_memory_utilization=0.4
    )
    policy = VLLMPolicy(engine, host, "player", temperature=1.0, max_new_tokens=32)
    requests = [
        Request([{"role": "user", "content": f"Tell me about the number {i}."}], [], [])
        for i in range(16)
    ]
    out = policy.act(requests)
    with torch.no_grad(), host.use("player"):
        ref = host.sequence_logprobs(
            [r.prompt_ids for r in out], [r.completion_ids for r in out], 1.0
        )
    gaps = torch.cat(
        [(torch.tensor(r.logprobs) - lp.cpu()).abs() for r, lp in zip(out, ref, strict=True)]
    )
    figure = (
        f"{gaps.numel()} tokens ({engine.weight_sync}): max |dlogp| {gaps.max():.1e}, "
        f"mean {gaps.mean():.1e}"
    )
    return within("max |dlogp|", float(gaps.max()), TOLERANCE["vllm"], figure)


@part("ranks", "1-rank vs 2-rank learner group (NCCL on GPU, gloo on CPU)", 90, quick=True)
def learner_ranks(args: argparse.Namespace) -> str:
    import ray
    import torch

    from scripts.bench.learner_ranks import gaps

    ranks = 2 if args.device == "cpu" or torch.cuda.device_count() >= 2 else 1
    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        w, g = gaps("torch", 1, args.model, args.device, ranks)
    finally:
        ray.shutdown()
    backend = "nccl" if args.device == "cuda" else "gloo"
    figure = f"{ranks} {backend} rank(s): max |w2 - w1| {w:.1e}, grad-norm gap {g:.1e}"
    return within("max |w2 - w1|", w, TOLERANCE["weights"], figure)


def zero_stage(args: argparse.Namespace, stage: int) -> str:
    from scripts.bench.learner_ranks import config, one_process, update_gaps

    torch_ = one_process(config("torch", 1, args.model), args.device)
    zero = one_process(config("deepspeed", stage, args.model), args.device)
    w, g = update_gaps(torch_, zero)
    figure = f"1 rank vs torch AdamW: max |w2 - w1| {w:.1e}, grad-norm gap {g:.1e}"
    return within("max |w2 - w1|", w, TOLERANCE["weights"], figure)


@part("zero2", "DeepSpeed ZeRO-2", 75)
def zero2(args: argparse.Namespace) -> str:
    return zero_stage(args, 2)


@part("zero3", "DeepSpeed ZeRO-3 (one rank)", 75)
def zero3(args: argparse.Namespace) -> str:
    return zero_stage(args, 3)


@part("kuhn", "Kuhn training steps (configs/kuhn_target.yaml), timed", 200, quick=True)
def kuhn_steps(args: argparse.Namespace) -> str:
    from marl.train import Trainer

    trainer = Trainer(kuhn_config(args), Path(args.run))
    try:
        trainer.fit()
    finally:
        trainer.runtime.shutdown()
    return step_figure(Path(args.run) / "metrics.jsonl")


def kuhn_config(args: argparse.Namespace):
    """The recipe as shipped; on a GPU its rollout worker and learner as Ray actors sharing
    the GPU; ``--quick``: the tiny model, two small steps in this process."""
    from marl.config import load_config

    cfg = load_config(CONFIGS / "kuhn_target.yaml")
    train = cfg.train.replace(steps=args.steps, max_minutes=None)
    if args.quick:
        roles = [
            r.replace(model=args.model, adapter=r.adapter.replace(r=4, alpha=8)) for r in cfg.roles
        ]
        cfg = cfg.replace(roles=roles)
        train = train.replace(group_size=2, groups_per_step=4)
    if args.device == "cuda":
        ray = train.ray.replace(enabled=True, gpus_per_worker=0.5, gpus_per_learner=0.5)
    else:
        ray = train.ray.replace(enabled=False)
    return cfg.replace(train=train.replace(ray=ray))


def step_figure(metrics: Path) -> str:
    """Steps done, the median step (after the first) and its parts, the first step."""
    rows = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
    steps = [r for r in rows if "seconds" in r]
    if not steps:
        raise CheckFailed("no step finished")
    later = steps[1:] or steps
    parts = {k: statistics.median(r["seconds"][k] for r in later) for k in later[0]["seconds"]}
    total = statistics.median(sum(r["seconds"].values()) for r in later)
    first = sum(steps[0]["seconds"].values())
    split = ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
    return f"{len(steps)} steps: median step {total:.2f} s ({split}); first {first:.1f} s"


# ----- the parent: one child per part, a table of their rows
@dataclass
class Row:
    part: str
    title: str
    status: str  # ok | failed | skipped
    figure: str
    seconds: float


def run_part(name: str, args: argparse.Namespace) -> Row:
    p = PARTS[name]
    cmd = [sys.executable, "-m", "scripts.gpu_check", "--child", name, "--device", args.device]
    cmd += ["--model", args.model, "--steps", str(args.steps)] + ["--quick"] * args.quick
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="marl-gpu-check-") as run:
        child = subprocess.Popen(
            [*cmd, "--run", run],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its Ray processes too go with it on a timeout
        )
        try:
            out, err = child.communicate(timeout=p.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            reason = f"timed out after {p.timeout_s:.0f} s"
            if name == "kuhn" and (Path(run) / "metrics.jsonl").exists():
                reason += f" ({step_figure(Path(run) / 'metrics.jsonl')})"
            return Row(name, p.title, "failed", reason, time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if child.returncode == 0:
        return Row(name, p.title, "ok", out.strip().splitlines()[-1], seconds)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()] or [f"exit {child.returncode}"]
    return Row(name, p.title, "failed", lines[-1].strip(), seconds)


def child(args: argparse.Namespace) -> None:
    try:
        print(PARTS[args.child].run(args))
    except Exception as exc:  # the parent shows the last line: make it the reason
        exc = getattr(exc, "cause", None) or exc  # a Ray actor's error: the actor's own
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"{type(exc).__name__}: {first}", file=sys.stderr)
        sys.exit(1)


def table(rows: list[Row], header: str) -> str:
    lines = [
        header,
        "",
        "| part | check | result | figure | seconds |",
        "| --- | --- | --- | --- | ---: |",
    ]
    for r in rows:
        cells = [r.part, r.title, r.status, r.figure.replace("|", "\\|"), f"{r.seconds:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def header(args: argparse.Namespace) -> str:
    import torch

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    return (
        f"gpu_check on {device} ({os.cpu_count()} cores), torch {torch.__version__}, "
        f"commit {commit or '?'}, {time.strftime('%Y-%m-%d')}, model {args.model}"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="ranks and kuhn only, shrunk")
    p.add_argument("--json", action="store_true", help="the rows as JSON instead of a table")
    p.add_argument("--only", default="", help="comma-separated parts: " + ", ".join(PARTS))
    p.add_argument("--model", default=None, help=f"default {MODEL} ({QUICK_MODEL} with --quick)")
    p.add_argument("--steps", type=int, default=None, help=f"Kuhn steps (default {KUHN_STEPS})")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--run", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.model = args.model or (QUICK_MODEL if args.quick else MODEL)
    args.steps = args.steps or (2 if args.quick else KUHN_STEPS)
    unknown = [n for n in args.only.split(",") if n and n not in PARTS]
    if unknown:
        p.error(f"--only: unknown part(s) {', '.join(unknown)}; known: {', '.join(PARTS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.child:
        child(args)
        return
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "no CUDA device is present: gpu_check would run "
            + "; ".join(f"{n}: {p.title}" for n, p in PARTS.items())
            + " (on a CPU: --device cpu --quick)"
        )
        return
    chosen = [n for n in args.only.split(",") if n] or list(PARTS)
    rows = []
    for name in chosen:
        if args.quick and not PARTS[name].quick:
            rows.append(Row(name, PARTS[name].title, "skipped", "not in --quick", 0.0))
            continue
        rows.append(run_part(name, args))
        print(f"{name}: {rows[-1].status}: {rows[-1].figure}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        print(table(rows, header(args)))
    sys.exit(1 if any(r.status == "failed" for r in rows) else 0)


if __name__ == "__main__":
    main()
