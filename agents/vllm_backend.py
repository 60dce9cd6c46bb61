"""The vLLM rollout backend (extra ``gpu``): the :class:`~agents.policy.Policy` interface on a
vLLM engine with multi-LoRA.  GPU only; vLLM is imported when a policy is built.

Adapters are PEFT folders on disk; after each learner update the trainer saves the new adapter
under a fresh folder and calls :meth:`VLLMEngine.update_adapter`, which gives it a new LoRA id
so vLLM reloads it.  ``choice`` decoding scores prompt + candidate with ``prompt_logprobs``.
"""

from __future__ import annotations

import random
from typing import Any

from agents.policy import Request, Response, choice_response, register_backend


class VLLMEngine:
    """One vLLM ``LLM`` per base model, shared by every role on it."""

    def __init__(self, model: str, max_lora_rank: int = 64, max_loras: int = 8,
                 **engine_kwargs: Any) -> None:
        try:
            from vllm import LLM
        except ImportError as e:  # pragma: no cover - exercised on GPU machines only
            raise ImportError("the vllm backend needs the gpu extra: "
                              "pip install 'marl-teams[gpu]'") from e
        self.llm = LLM(model=model, enable_lora=True, max_lora_rank=max_lora_rank,
                       max_loras=max_loras, **engine_kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self._loras: dict[str, Any] = {}
        self._next_id = 1

    def update_adapter(self, name: str, path: str) -> None:
        from vllm.lora.request import LoRARequest

        self._loras[name] = LoRARequest(name, self._next_id, path)
        self._next_id += 1

    def lora(self, name: str | None) -> Any:
        return None if name is None else self._loras[name]

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


class VLLMPolicy:
    def __init__(self, engine: VLLMEngine, adapter: str | None = None, mode: str = "free",
                 temperature: float = 1.0, max_new_tokens: int = 64, top_p: float = 1.0,
                 seed: int = 0) -> None:
        self.engine, self.adapter, self.mode = engine, adapter, mode
        self.temperature, self.max_new_tokens, self.top_p = temperature, max_new_tokens, top_p
        self.seed = seed
        self.rng = random.Random(seed)

    def reseed(self, seed: int) -> None:
        self.seed, self.rng = seed, random.Random(seed)

    def act(self, requests: list[Request]) -> list[Response]:
        from vllm import SamplingParams

        prompts = [self.engine.prompt_ids(r.messages) for r in requests]
        if self.mode == "choice":
            return self._choose(requests, prompts)
        params = SamplingParams(temperature=self.temperature, top_p=self.top_p,
                                max_tokens=self.max_new_tokens, logprobs=1, seed=self.seed)
        self.seed += 1
        outs = self.engine.llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                        lora_request=self.engine.lora(self.adapter),
                                        use_tqdm=False)
        res = []
        for p, o in zip(prompts, outs, strict=True):
            c = o.outputs[0]
            lps = [step[t].logprob for t, step in zip(c.token_ids, c.logprobs, strict=True)]
            res.append(Response(text=c.text, prompt_ids=p, completion_ids=list(c.token_ids),
                                logprobs=lps, temperature=self.temperature))
        return res

    def _choose(self, requests: list[Request], prompts: list[list[int]]) -> list[Response]:
        from vllm import SamplingParams

        tok = self.engine.tokenizer
        cands = [[tok(t, add_special_tokens=False)["input_ids"] for t in r.action_texts]
                 for r in requests]
        seqs = [{"prompt_token_ids": p + c} for p, cs in zip(prompts, cands, strict=True)
                for c in cs]
        outs = self.engine.llm.generate(seqs, SamplingParams(max_tokens=1, prompt_logprobs=0),
                                        lora_request=self.engine.lora(self.adapter),
                                        use_tqdm=False)
        res, k = [], 0
        for r, p, cs in zip(requests, prompts, cands, strict=True):
            scores = []
            for c in cs:
                plp = outs[k].prompt_logprobs
                scores.append(sum(plp[len(p) + j][t].logprob for j, t in enumerate(c)))
                k += 1
            res.append(choice_response(r, p, cs, scores, self.temperature, self.rng))
        return res


@register_backend("vllm")
def vllm_policy(engine: VLLMEngine, **kwargs: Any) -> VLLMPolicy:
    return VLLMPolicy(engine, **kwargs)
