"""Generation: sampled completions with their log-probs, and think decoding's contexts.

Think decoding samples a reasoning, then scores the legal moves after
``prompt + reasoning + THINK_SEPARATOR``; the helpers here build those contexts and the
responses every local backend (transformers, vLLM) returns, free decoding's too.
"""

from __future__ import annotations

import dataclasses
import random
from typing import TYPE_CHECKING

import torch

from marl.agents.host.prefill import Prefill, left_pad
from marl.agents.policy import Request, Response, choice_response, greedy, scale_temperature

if TYPE_CHECKING:
    from marl.agents.host import ModelHost


class Generation(Prefill):
    """Batched sampling (a :class:`ModelHost` part)."""

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
        share_prefix: bool = True,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample completions for a batch; returns token ids and their log-probs.

        With ``share_prefix`` (and the host's ``share_prefix``) the heads that prompts share
        are computed once (:meth:`_prefilled`); without, the batch is simply left-padded.
        Log-probs are of the sampling distribution ``softmax(logits / T)`` (``T = 1`` for
        greedy: :func:`~marl.agents.policy.scale_temperature`), cut at the first
        end-of-sequence token.
        """
        pad = self.tokenizer.pad_token_id
        eos = self.tokenizer.eos_token_id
        ids, mask, cache = (
            self._prefilled(prompts) if share_prefix else (*left_pad(prompts, pad), None)
        )
        width = ids.shape[1]
        argmax = greedy(temperature)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                max_new_tokens=max_new_tokens,
                do_sample=not argmax,
                temperature=None if argmax else temperature,
                top_p=None if argmax else top_p,
                top_k=None,
                pad_token_id=pad,
                eos_token_id=eos,
                output_logits=True,
                return_dict_in_generate=True,
                **({self._cache_kw: cache} if cache is not None else {}),
            )
        new = out.sequences[:, width:]
        scale = scale_temperature(temperature)
        # log softmax(z)[token] = z[token] - logsumexp(z), step by step: no (batch, steps,
        # vocab) log-prob tensor (0.5-1.3 s and 400 MB per call at B = 32, 32 steps, 49k vocab)
        cols = []
        for i, x in enumerate(out.logits):
            z = x.float() / scale
            cols.append(z.gather(1, new[:, i : i + 1]).squeeze(1) - torch.logsumexp(z, dim=-1))
        tok_logp = torch.stack(cols, 1)
        completions, logprobs = [], []
        for row, lp in zip(new.tolist(), tok_logp.tolist(), strict=True):
            n = row.index(eos) + 1 if eos in row else len(row)
            completions.append(row[:n])
            logprobs.append(lp[:n])
        return completions, logprobs


#: What separates the reasoning from the move in think decoding: the candidates are scored
#: after ``prompt + reasoning + THINK_SEPARATOR``.
THINK_SEPARATOR = "\nMove: "


def think_contexts(
    host: ModelHost, prompts: list[list[int]], reasoning: list[list[int]]
) -> list[list[int]]:
    """What each choice is scored after: prompt, reasoning (its end-of-sequence token
    dropped), :data:`THINK_SEPARATOR`."""
    eos, sep = host.tokenizer.eos_token_id, host.text_ids(THINK_SEPARATOR)
    return [
        p + (r[:-1] if r and r[-1] == eos else r) + sep
        for p, r in zip(prompts, reasoning, strict=True)
    ]


def reasoning_text(host: ModelHost, reasoning: list[int]) -> str:
    """A reasoning's text as transcripts show it: decoded, special tokens dropped, stripped."""
    return host.tokenizer.decode(reasoning, skip_special_tokens=True).strip()


def think_responses(
    host: ModelHost,
    requests: list[Request],
    prompts: list[list[int]],
    reasoning: list[list[int]],
    logps: list[list[float]],
    contexts: list[list[int]],
    cands: list[list[list[int]]],
    scores: list[list[float]],
    cut: list[bool],
    temperature: float,
    rng: random.Random,
    choice_score: str = "sum",
) -> list[Response]:
    """A choice sampled after each reasoning; the response carries the reasoning's and the
    choice's log-probs for the learner, and both in its text for transcripts."""
    out = []
    for req, p, r, lp, ctx, cs, s, t in zip(
        requests, prompts, reasoning, logps, contexts, cands, scores, cut, strict=True
    ):
        picked = choice_response(req, p, cs, s, temperature, rng, t, choice_score)
        text = reasoning_text(host, r)
        out.append(
            dataclasses.replace(
                picked,
                text=f"{text}{THINK_SEPARATOR}{picked.text}",
                completion_ids=r,
                logprobs=lp + picked.logprobs,
                choice_prompt_ids=ctx,
            )
        )
    return out


def answer_ids(host: ModelHost, texts: list[str]) -> list[list[int]]:
    """Each move's own answer in free decoding: its text, then the end of the answer (the
    one complete answer that names just that move, which a policy target fits)."""
    eos = host.tokenizer.eos_token_id
    return [host.text_ids(t) + [eos] for t in texts]


def free_responses(
    host: ModelHost,
    requests: list[Request],
    prompts: list[list[int]],
    completions: list[list[int]],
    logps: list[list[float]],
    cut: list[bool],
    temperature: float,
) -> list[Response]:
    """Free decoding's responses: the sampled answer (decoded, special tokens dropped), its
    tokens' log-probs and the legal moves' own answers (:func:`answer_ids`)."""
    return [
        Response(
            text=host.tokenizer.decode(c, skip_special_tokens=True),
            prompt_ids=p,
            completion_ids=c,
            logprobs=lp,
            answer_ids=answer_ids(host, r.action_texts),
            truncated_prompt=t,
            temperature=temperature,
        )
        for r, p, c, lp, t in zip(requests, prompts, completions, logps, cut, strict=True)
    ]
