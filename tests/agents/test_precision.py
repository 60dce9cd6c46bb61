"""bf16 compute (autocast over a bf16 frozen base; LoRA weights and optimizer state kept fp32)
and shared prompt heads in free generation: what they change must stay within numerics, and
what they must not change (the sampled distribution, the dtypes of what is trained) does not."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

import marl.agents.precision as prec
from helpers import build_tiny_host, tiny_team, train_config
from marl.agents.builder import build_roster
from marl.agents.hf_policy import HFPolicy
from marl.agents.host import ModelHost
from marl.agents.policy import Request
from marl.agents.precision import autocast, native_bf16, resolve, weights_dtype
from marl.config import load_config, load_config_text
from marl.config.schema import DecodingConfig
from marl.config.train import RayConfig, TrainConfig
from marl.train.learner import Learner, TrainItem
from marl.train.optim import deepspeed_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _host(seed: int = 0, dtype: torch.dtype = torch.float32) -> ModelHost:
    """The tiny model (base in ``dtype``) with an adapter that already differs from the base
    (B != 0)."""
    return build_tiny_host("red", seed=seed, dtype=dtype, perturb=True)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 200) for _ in range(n)]


# ----- schema
def test_precision_settings_default_to_fp32_and_are_checked() -> None:
    assert DecodingConfig().precision == "fp32" and TrainConfig().precision == "fp32"
    assert DecodingConfig(precision="bf16").precision == "bf16"
    assert TrainConfig(precision="bf16").precision == "bf16"
    with pytest.raises(ValidationError):
        DecodingConfig(precision="fp8")
    with pytest.raises(ValidationError, match="fp16 needs a GPU"):
        TrainConfig(precision="fp16")
    gpu = TrainConfig(precision="fp16", ray=RayConfig(gpus_per_learner=1))
    assert gpu.precision == "fp16"


def test_fp16_is_refused_on_a_cpu() -> None:
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        autocast("fp16", "cpu")
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        Learner(train_config(lr=1e-3, precision="fp16"), _host(), ["red"])
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        deepspeed_config(1, 1.0, torch.device("cpu"), "fp16")


def test_deepspeed_keeps_fp32_weights_on_a_cpu() -> None:
    """On a CPU the bf16 compute is the learner's autocast; DeepSpeed's half-precision mode
    (model cast to bf16) is for GPUs."""
    cfg = deepspeed_config(1, 1.0, torch.device("cpu"), "bf16")
    assert not cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"]


# ----- auto: bf16 only where the hardware multiplies it
@pytest.fixture
def hardware(monkeypatch: pytest.MonkeyPatch):
    """Pretend the machine has (True) or lacks (False) bf16 matrix units."""

    def pretend(native: bool) -> None:
        monkeypatch.setattr(prec, "native_bf16", lambda: native)
        resolve.cache_clear()

    yield pretend
    resolve.cache_clear()


def test_auto_is_bf16_exactly_where_the_hardware_has_bf16_units(hardware) -> None:
    probes = [
        getattr(torch.cpu, n)() for n in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    ]
    if not torch.cuda.is_available():
        assert native_bf16() is any(probes)
    assert resolve("auto") == ("bf16" if native_bf16() else "fp32")
    hardware(False)
    assert resolve("auto") == "fp32" and weights_dtype(["auto", "auto"]) is torch.float32
    assert isinstance(autocast("auto", "cpu"), type(autocast("fp32", "cpu")))
    hardware(True)
    assert resolve("auto") == "bf16" and weights_dtype(["auto", "bf16"]) is torch.bfloat16
    with autocast("auto", "cpu"):
        assert torch.get_autocast_dtype("cpu") is torch.bfloat16 and torch.is_autocast_enabled(
            "cpu"
        )


def test_emulated_bf16_is_kept_as_asked_but_warned_about(hardware) -> None:
    hardware(False)
    with pytest.warns(UserWarning, match="emulated and several times slower"):
        assert resolve("bf16") == "bf16"
    hardware(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve("bf16") == "bf16" and resolve("fp32") == "fp32"
    with pytest.raises(ValueError, match="unknown precision 'fp8'; known: fp32, bf16, fp16, auto"):
        resolve("fp8")


def test_the_shipped_recipes_ask_for_auto() -> None:
    for name in (
        "kuhn_selfplay",
        "kuhn_magnet",
        "leduc_selfplay",
        "tictactoe_vs_random",
        "tictactoe_rollout_values",
        "coop_plan_execute",
    ):
        cfg = load_config(CONFIGS / f"{name}.yaml")
        assert {r.decoding.precision for r in cfg.roles} == {"auto"}, name
        assert cfg.train is not None and cfg.train.precision == "auto", name


# ----- where the base is stored in half precision
def test_the_base_is_half_only_where_every_forward_on_it_is() -> None:
    assert weights_dtype(["bf16", "bf16"]) is torch.bfloat16
    assert weights_dtype(["fp16"]) is torch.float16
    assert weights_dtype(["bf16", "fp32"]) is torch.float32
    assert weights_dtype(["bf16", "fp16"]) is torch.float32
    assert weights_dtype([]) is torch.float32


@pytest.mark.parametrize(
    ("decoding", "train", "base"),
    [
        ("bf16", "bf16", torch.bfloat16),
        ("bf16", "fp32", torch.float32),
        ("fp32", "bf16", torch.float32),
    ],
)
def test_a_roster_stores_the_base_in_the_precision_its_forwards_share(
    decoding: str, train: str, base: torch.dtype
) -> None:
    text = tiny_team("kuhn_poker", f"  precision: {train}\n  ray: {{enabled: false}}\n")
    cfg = load_config_text(
        text.replace("{mode: choice}", f"{{mode: choice, precision: {decoding}}}")
    )
    host = build_roster(cfg).hosts["tiny-random"]
    dtypes = {n: p.dtype for n, p in host.model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {base}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}


# ----- scoring and updates in bf16
@pytest.mark.parametrize("base", [torch.float32, torch.bfloat16])
def test_bf16_choice_probabilities_are_close_to_fp32(base: torch.dtype) -> None:
    rules = "You play a small game. " * 6
    requests = [
        Request(
            messages=[{"role": "user", "content": f"{rules}State {i}."}],
            legal=[0, 1, 2],
            action_texts=["[a1]", "[b2]", "[c3]"],
        )
        for i in range(4)
    ]
    host = _host()
    fp32 = HFPolicy(host, "red", mode="choice").probabilities(requests)
    if base is torch.float32:  # one host scores in both precisions and remembers them apart
        bf16 = HFPolicy(host, "red", mode="choice", precision="bf16").probabilities(requests)
        assert {k[2] for k in host._memo["red"]} == {torch.float32, torch.bfloat16}
    else:
        bf16 = HFPolicy(_host(dtype=base), "red", mode="choice", precision="bf16").probabilities(
            requests
        )
    diff = max(
        abs(a - b) for pa, pb in zip(fp32, bf16, strict=True) for a, b in zip(pa, pb, strict=True)
    )
    assert 0 < diff < 0.02


def _free_items(host: ModelHost, n: int = 6) -> list[TrainItem]:
    rng = random.Random(3)
    head = _tokens(rng, 24)
    prompts = [head + _tokens(rng, 4 + i) for i in range(n)]
    comps = [_tokens(rng, 6) for _ in range(n)]
    with torch.no_grad(), host.use("red"):
        old = host.sequence_logprobs(prompts, comps)
    adv = [1.0, -1.0, 0.5, -0.5, 1.5, -1.5][:n]
    return [
        TrainItem(
            adapter="red",
            agent=f"seat{i % 2}",
            prompt_ids=p,
            completion_ids=c,
            old_logprobs=o.tolist(),
            advantage=a,
        )
        for i, (p, c, o, a) in enumerate(zip(prompts, comps, old, adv, strict=True))
    ]


def _loss_change(precision: str) -> tuple[float, Learner]:
    """The loss before and after one update on the same batch, from the same weights."""
    torch.manual_seed(0)
    host = _host(dtype=weights_dtype([precision]))  # as a roster stores it
    learner = Learner(train_config(lr=0.02, precision=precision), host, ["red"])
    items = _free_items(host)
    before = learner.update(items).loss
    after = learner.update(items).loss  # the loss at the updated weights (then steps again)
    return after - before, learner


def test_a_bf16_update_moves_the_loss_like_fp32() -> None:
    fp32, _ = _loss_change("fp32")
    bf16, learner = _loss_change("bf16")
    assert fp32 < 0 and bf16 < 0  # the step lowers the loss it followed
    assert abs(bf16 - fp32) <= 0.2 * abs(fp32)
    # what is trained and what the optimizer keeps stay fp32
    assert all(p.dtype == torch.float32 for p in learner.params)
    state = learner.optimizer.state_dict()["state"]
    assert state and all(
        v.dtype == torch.float32 for st in state.values() for k, v in st.items() if k != "step"
    )


# ----- shared heads in free generation
def _prompts() -> list[list[int]]:
    """Four prompts with a 40-token head, two with another head, one on its own."""
    rng = random.Random(7)
    head, other = _tokens(rng, 40), _tokens(rng, 30)
    return (
        [head + _tokens(rng, k) for k in (3, 7, 12, 1)]
        + [other + [9, 9], other + [8]]
        + [_tokens(rng, 20)]
    )


def _repeated() -> list[list[int]]:
    """Each of _prompts() three times, in mixed order (a group of samples per state)."""
    prompts = _prompts() * 3
    random.Random(3).shuffle(prompts)
    return prompts


@pytest.mark.parametrize("case", ["shared", "disjoint", "repeated"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_heads_generate_what_the_plain_batch_does(case: str, temperature: float) -> None:
    host = _host()
    prompts = {
        "shared": _prompts,
        "disjoint": lambda: [_tokens(random.Random(i), 10 + 3 * i) for i in range(4)],
        "repeated": _repeated,
    }[case]()
    assert (host._prefilled(prompts)[2] is not None) == (case != "disjoint")
    with host.use("red"):
        plain = host.generate(prompts, 10, temperature, 1.0, seed=5, share_prefix=False)
        shared = host.generate(prompts, 10, temperature, 1.0, seed=5)
    assert shared[0] == plain[0]
    for a, b in zip(shared[1], plain[1], strict=True):
        assert a == pytest.approx(b, abs=1e-5)


def test_a_repeated_prompt_runs_once_before_generation() -> None:
    """Four states asked four times each (a group of samples per state): each state's own
    tokens run once for its four rows, after the head all states share, so the decoder
    runs under half the batch's prompt tokens (one row per prompt: 500 of 800 slots)."""
    host, rng = _host(), random.Random(11)
    head = _tokens(rng, 20)
    prompts = [head + _tokens(rng, 30) for _ in range(4)] * 4
    slots: list[int] = []
    hook = (
        host._base()
        .get_decoder()
        .register_forward_hook(
            lambda _m, _i, out: slots.append(out.last_hidden_state.shape[:2].numel())
        )
    )
    try:
        with host.use("red"):
            host.generate(prompts, 1, 1.0, 1.0, seed=5)
    finally:
        hook.remove()
    assert sum(slots) < sum(len(p) for p in prompts) / 2


def test_bf16_base_generates_with_log_probs_close_to_fp32() -> None:
    """Free generation over a bf16 base (the rollout path of a bf16 role): the sampled
    tokens' log-probs are those fp32 gives the same tokens, within bf16 numerics."""
    prompts = _prompts()
    fp32, bf16 = _host(), _host(dtype=torch.bfloat16)
    with bf16.use("red"), autocast("bf16", "cpu"):
        tokens, logps = bf16.generate(prompts, 8, 1.0, 1.0, seed=5)[:2]
    with torch.no_grad(), fp32.use("red"):
        exact = fp32.sequence_logprobs(prompts, tokens)
    diffs = [
        abs(a - b)
        for got, ref in zip(logps, exact, strict=True)
        for a, b in zip(got, ref.tolist(), strict=True)
    ]
    assert len(diffs) == sum(len(t) for t in tokens) > 0
    assert 0 < sum(diffs) / len(diffs) < 0.05
