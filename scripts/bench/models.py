"""Benchmark model loading: SmolLM2 first conversion vs cached load, `marl chat`, tiny-random.

Each measurement runs in a fresh interpreter (so "first call" really is first) against a
throwaway MARL_HOME. Prints a markdown section for docs/benchmarks.md.

    .venv/bin/python -m scripts.bench.models [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.workloads import REPO

QUESTION = "What is 2+3? Answer with a number."

_LOAD = """
import json, time
t0 = time.perf_counter()
import torch, transformers  # noqa: F401
from marl.agents.models import generate, load_model
t1 = time.perf_counter()
model, tok = load_model("smollm2-135m-instruct")
t2 = time.perf_counter()
answer = generate(model, tok, {question!r}, max_new_tokens=32)
t3 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "load_s": t2 - t1, "generate_s": t3 - t2,
                  "answer": answer}}))
"""

_TINY = """
import json, time
t0 = time.perf_counter()
import torch, transformers  # noqa: F401
from marl.agents.models import build_tiny_random, generate
t1 = time.perf_counter()
model, tok = build_tiny_random(seed=0)
answer = generate(model, tok, "Hello!", max_new_tokens=32, temperature=1.0, seed=0)
t2 = time.perf_counter()
model, tok = build_tiny_random(seed=1)
t3 = time.perf_counter()
answer = generate(model, tok, "Hello!", max_new_tokens=32, temperature=1.0, seed=0)
t4 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "first_build_generate_s": t2 - t1,
                  "build_s": t3 - t2, "generate32_s": t4 - t3}}))
"""


def _run_json(code: str, env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="marl-bench-"))
    env = {
        **os.environ,
        "MARL_HOME": str(home),
        "OMP_WAIT_POLICY": "PASSIVE",
        "TQDM_DISABLE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    try:
        load_avg = os.getloadavg()
        first = _run_json(_LOAD.format(question=QUESTION), env)
        cached = [_run_json(_LOAD.format(question=QUESTION), env) for _ in range(args.repeats)]
        chat_cmd = [str(Path(sys.executable).parent / "marl"), "chat", QUESTION]
        chat_times, chat_answer = [], ""
        for _ in range(args.repeats):
            t = time.perf_counter()
            proc = subprocess.run(
                chat_cmd, cwd=REPO, env=env, check=True, capture_output=True, text=True
            )
            chat_times.append(time.perf_counter() - t)
            chat_answer = proc.stdout.strip()
        tiny = [_run_json(_TINY.format(), env) for _ in range(args.repeats)]
        size_mb = sum(p.stat().st_size for p in (home / "models").rglob("*")) / 1e6
    finally:
        shutil.rmtree(home, ignore_errors=True)

    med = statistics.median
    cached_s = med(c["load_s"] for c in cached)
    print("## Model loading\n")
    print(
        f"Machine: {os.cpu_count()}-core CPU ({platform.machine()}), Python "
        f"{platform.python_version()}, load average at start "
        f"{load_avg[0]:.2f} (other jobs share the cores). OMP_WAIT_POLICY=PASSIVE."
    )
    print(
        "Command: `.venv/bin/python -m scripts.bench.models` "
        f"(fresh interpreter per measurement, medians of {args.repeats}).\n"
    )
    print("| measurement | seconds |")
    print("|---|---|")
    print(
        f"| smollm2-135m-instruct first call: GGUF -> safetensors conversion + verification "
        f"(`load_model`, after imports) | {first['load_s']:.1f} |"
    )
    print(f"| smollm2-135m-instruct cached load (`load_model`, after imports) | {cached_s:.2f} |")
    print(
        f"| `import torch, transformers, marl.agents.models` | "
        f"{med(c['import_s'] for c in cached):.2f} |"
    )
    print(
        f"| greedy answer to the 2+3 question (cached model, in-process) | "
        f"{med(c['generate_s'] for c in cached):.2f} |"
    )
    print(f'| `marl chat "{QUESTION}"` wall clock, cached | {med(chat_times):.1f} |')
    print(
        f"| tiny-random build + 32 sampled tokens, first in process (after imports) | "
        f"{med(t['first_build_generate_s'] for t in tiny):.2f} |"
    )
    print(f"| tiny-random build, warm | {med(t['build_s'] for t in tiny):.3f} |")
    print(f"| tiny-random 32 sampled tokens, warm | {med(t['generate32_s'] for t in tiny):.3f} |")
    print(
        f"\nCached load against the first call (the baseline): "
        f"{first['load_s'] / cached_s:.1f}x faster."
    )
    print(f"Cache size: {size_mb:.0f} MB (float32 safetensors + tokenizer).")
    print(
        f'\n`marl chat "{QUESTION}"` answers: `{chat_answer}` '
        f"(first in-process answer: `{first['answer']}`)."
    )


if __name__ == "__main__":
    main()
