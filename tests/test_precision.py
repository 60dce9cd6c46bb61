"""bf16 compute (autocast, weights and optimizer state kept fp32) and shared prompt heads in
free generation: what they change must stay within numerics, and what they must not change
(the sampled distribution, the dtypes of what is trained) does not."""

from __future__ import annotations

import random

import pytest
import torch
from pydantic import ValidationError

from agents.hf import HFPolicy, ModelHost
from agents.models import load_model
from agents.policy import Request
from agents.precision import autocast
from configs.schema import DecodingConfig
from configs.train import RayConfig, TrainConfig
from marl.learner import Learner, TrainItem
from marl.optim import deepspeed_config


def _host(seed: int = 0) -> ModelHost:
    """The tiny model with an adapter that already differs from the base (B != 0)."""
    host = ModelHost(*load_model("tiny-random"))
    host.add_adapter("red", r=4, alpha=8, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in host.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return host


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
        Learner(_host(), ["red"], lr=1e-3, precision="fp16")
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        deepspeed_config(1, 1.0, torch.device("cpu"), "fp16")


def test_deepspeed_keeps_fp32_weights_on_a_cpu() -> None:
    """On a CPU the bf16 compute is the learner's autocast; DeepSpeed's half-precision mode
    (model cast to bf16) is for GPUs."""
    cfg = deepspeed_config(1, 1.0, torch.device("cpu"), "bf16")
    assert not cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"]


# ----- scoring and updates in bf16
def test_bf16_choice_probabilities_are_close_to_fp32() -> None:
    host = _host()
    rules = "You play a small game. " * 6
    requests = [Request(messages=[{"role": "user", "content": f"{rules}State {i}."}],
                        legal=[0, 1, 2], action_texts=["[a1]", "[b2]", "[c3]"])
                for i in range(4)]
    fp32 = HFPolicy(host, "red", mode="choice").probabilities(requests)
    bf16 = HFPolicy(host, "red", mode="choice", precision="bf16").probabilities(requests)
    assert {k[2] for k in host._memo["red"]} == {torch.float32, torch.bfloat16}  # apart
    diff = max(abs(a - b) for pa, pb in zip(fp32, bf16, strict=True)
               for a, b in zip(pa, pb, strict=True))
    assert 0 < diff < 0.02


def _free_items(host: ModelHost, n: int = 6) -> list[TrainItem]:
    rng = random.Random(3)
    head = _tokens(rng, 24)
    prompts = [head + _tokens(rng, 4 + i) for i in range(n)]
    comps = [_tokens(rng, 6) for _ in range(n)]
    with torch.no_grad(), host.use("red"):
        old = host.sequence_logprobs(prompts, comps)
    adv = [1.0, -1.0, 0.5, -0.5, 1.5, -1.5][:n]
    return [TrainItem(adapter="red", agent=f"seat{i % 2}", prompt_ids=p, completion_ids=c,
                      old_logprobs=o.tolist(), advantage=a)
            for i, (p, c, o, a) in enumerate(zip(prompts, comps, old, adv, strict=True))]


def _loss_change(precision: str) -> tuple[float, Learner]:
    """The loss before and after one update on the same batch, from the same weights."""
    torch.manual_seed(0)
    host = _host()
    learner = Learner(host, ["red"], lr=0.02, precision=precision)
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
    assert state and all(v.dtype == torch.float32 for st in state.values()
                         for k, v in st.items() if k != "step")


# ----- shared heads in free generation
def _prompts() -> list[list[int]]:
    """Four prompts with a 40-token head, two with another head, one on its own."""
    rng = random.Random(7)
    head, other = _tokens(rng, 40), _tokens(rng, 30)
    return ([head + _tokens(rng, k) for k in (3, 7, 12, 1)] + [other + [9, 9], other + [8]]
            + [_tokens(rng, 20)])


@pytest.mark.parametrize("case", ["shared", "disjoint"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_heads_generate_what_the_plain_batch_does(case: str, temperature: float) -> None:
    host = _host()
    prompts = _prompts() if case == "shared" else [_tokens(random.Random(i), 10 + 3 * i)
                                                   for i in range(4)]
    assert (host._prefilled(prompts)[2] is not None) == (case == "shared")
    with host.use("red"):
        plain = host.generate(prompts, 10, temperature, 1.0, seed=5, share_prefix=False)
        shared = host.generate(prompts, 10, temperature, 1.0, seed=5)
    assert shared[0] == plain[0]
    for a, b in zip(shared[1], plain[1], strict=True):
        assert a == pytest.approx(b, abs=1e-5)
