"""A role on a :class:`~marl.agents.host.ModelHost`: the ``hf`` backend's policy.

Each role's :class:`HFPolicy` names its adapter (or none: the base) and its decoding: free
text, a choice among the legal moves' texts, or think (reason, then choose).
"""

from __future__ import annotations

import contextlib
import random

import torch

from marl.agents.host import ModelHost
from marl.agents.host.generation import (
    free_responses,
    reasoning_text,
    think_contexts,
    think_responses,
)
from marl.agents.host.prompts import action_ids, role_prompts
from marl.agents.policy import (
    Request,
    Response,
    choice_probs,
    choice_response,
    greedy,
    move_scores,
    register_backend,
    score_divisors,
)
from marl.agents.precision import autocast

MODES = ("free", "choice", "think")


class HFPolicy:
    """One role on a :class:`ModelHost`: its adapter (or none) and its decoding settings."""

    def __init__(
        self,
        host: ModelHost,
        adapter: str | None = None,
        mode: str = "free",
        temperature: float = 1.0,
        max_new_tokens: int = 64,
        top_p: float = 1.0,
        max_prompt_tokens: int = 1024,
        precision: str = "fp32",
        seed: int = 0,
        think_tokens: int = 48,
        think_prompt: str = "",
        choice_score: str = "sum",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"decoding mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.host, self.adapter, self.mode, self.precision = host, adapter, mode, precision
        self.temperature, self.max_new_tokens, self.top_p = temperature, max_new_tokens, top_p
        self.max_prompt_tokens = max_prompt_tokens
        self.think_tokens, self.think_prompt = think_tokens, think_prompt
        score_divisors([], choice_score)  # an unknown name fails here, not at the first move
        self.choice_score = choice_score
        self.rng = random.Random(seed)

    @property
    def reasons(self) -> bool:
        """Think mode with a reasoning budget (with none it is choice mode, prompt and all)."""
        return self.mode == "think" and self.think_tokens > 0

    @property
    def sampled_table(self) -> bool:
        """Whether :meth:`probabilities` is a sample: the choice distribution after one
        sampled reasoning (greedy reasoning is one fixed path, so exact)."""
        return self.reasons and not greedy(self.temperature)

    def reseed(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def _seed(self) -> int:
        return self.rng.randrange(2**31 - 1)

    def _compute(self) -> contextlib.AbstractContextManager:
        """This role's precision, on the device the host is on now (Ray may move it)."""
        return autocast(self.precision, self.host.device)

    def _prompts(self, requests: list[Request]) -> tuple[list[list[int]], list[bool]]:
        return role_prompts(
            self.host, requests, self.max_prompt_tokens, self.think_prompt if self.reasons else ""
        )

    def act(self, requests: list[Request]) -> list[Response]:
        if not requests:
            return []
        prompts, cut = self._prompts(requests)
        with self.host.use(self.adapter), self._compute():
            if self.reasons:
                return self._think(requests, prompts, cut)
            if self.mode != "free":
                return self._choose(requests, prompts, cut)
            comps, logps = self.host.generate(
                prompts, self.max_new_tokens, self.temperature, self.top_p, self._seed()
            )
        return free_responses(self.host, requests, prompts, comps, logps, cut, self.temperature)

    @torch.no_grad()
    def _scores(
        self, requests: list[Request], prompts: list[list[int]]
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Candidate token ids and ``log p(text_a | prompt)`` of every legal action."""
        cands = action_ids(self.host, requests)
        scores = [s.tolist() for s in self.host.candidate_scores(prompts, cands)]
        return cands, scores

    @torch.no_grad()
    def _scores_after(
        self, requests: list[Request], prompts: list[list[int]], contexts: list[list[int]]
    ) -> tuple[list[list[int]], list[list[float]]]:
        """:meth:`_scores` after think ``contexts`` that begin with ``prompts``: each distinct
        prompt runs once however many reasonings follow it (``ModelHost.move_scores``)."""
        cands = action_ids(self.host, requests)
        scores = [s.tolist() for s in self.host.move_scores(prompts, contexts, cands)]
        return cands, scores

    def _choose(
        self, requests: list[Request], prompts: list[list[int]], cut: list[bool]
    ) -> list[Response]:
        """Sample from the normalised candidate scores."""
        cands, scores = self._scores(requests, prompts)
        return [
            choice_response(req, p, cs, s, self.temperature, self.rng, t, self.choice_score)
            for req, p, cs, s, t in zip(requests, prompts, cands, scores, cut, strict=True)
        ]

    def _reason(
        self, prompts: list[list[int]]
    ) -> tuple[list[list[int]], list[list[float]], list[list[int]]]:
        """Sampled reasoning per prompt, its token log-probs, and the context the choice is
        scored after: prompt, reasoning (its end-of-sequence token dropped), separator."""
        reasoning, logps = self.host.generate(
            prompts, self.think_tokens, self.temperature, self.top_p, self._seed()
        )
        return reasoning, logps, think_contexts(self.host, prompts, reasoning)

    def _think(
        self, requests: list[Request], prompts: list[list[int]], cut: list[bool]
    ) -> list[Response]:
        """Reason, then choose after the reasoning; both parts' log-probs go to the learner."""
        reasoning, logps, contexts = self._reason(prompts)
        cands, scores = self._scores_after(requests, prompts, contexts)
        return think_responses(
            self.host,
            requests,
            prompts,
            reasoning,
            logps,
            contexts,
            cands,
            scores,
            cut,
            self.temperature,
            self.rng,
            self.choice_score,
        )

    def probabilities(self, requests: list[Request]) -> list[list[float]]:
        """The choice distribution over each request's legal actions: how table policies
        are read off a model.  Exact, with ``choice`` semantics whatever this policy's mode,
        except for a reasoning policy: the distribution after one sampled reasoning
        (:attr:`sampled_table`), an unbiased one-sample estimate of its table."""
        if self.reasons:
            return self.probabilities_after(requests, self.reasonings(requests))
        prompts, _ = self._prompts(requests)
        with self.host.use(self.adapter), self._compute():
            cands, scores = self._scores(requests, prompts)
        return self._probs(cands, scores)

    @torch.no_grad()
    def answer_probs(self, responses: list[Response]) -> list[list[float]]:
        """Free decoding: the probability of each legal move's own answer (the responses'
        ``answer_ids``) after the prompt it was asked, as sampling at temperature 1 draws
        it, per response."""
        with self.host.use(self.adapter), self._compute():
            scores = self.host.candidate_scores(
                [r.prompt_ids for r in responses], [r.answer_ids for r in responses]
            )
        return [s.double().exp().tolist() for s in scores]

    def reasonings(self, requests: list[Request]) -> list[list[int]]:
        """One sampled reasoning per request (token ids, as :meth:`act` samples them)."""
        prompts, _ = self._prompts(requests)
        with self.host.use(self.adapter), self._compute():
            return self._reason(prompts)[0]

    def probabilities_after(
        self, requests: list[Request], reasoning: list[list[int]]
    ) -> list[list[float]]:
        """The choice distribution after a given reasoning per request: scored after
        ``think_contexts`` (prompt, reasoning, separator) as in :meth:`act`, whichever state
        the reasoning was written at; an empty one leaves prompt + separator."""
        prompts, _ = self._prompts(requests)
        with self.host.use(self.adapter), self._compute():
            contexts = think_contexts(self.host, prompts, reasoning)
            cands, scores = self._scores_after(requests, prompts, contexts)
        return self._probs(cands, scores)

    def _probs(self, cands: list[list[list[int]]], logps: list[list[float]]) -> list[list[float]]:
        """The choice distributions from the candidates' summed log-probs."""
        return [
            choice_probs(move_scores(s, cs, self.choice_score), self.temperature)
            for cs, s in zip(cands, logps, strict=True)
        ]

    def reasoning_text(self, reasoning: list[int]) -> str:
        return reasoning_text(self.host, reasoning)


@register_backend("hf")
def hf_policy(host: ModelHost, **kwargs) -> HFPolicy:
    return HFPolicy(host, **kwargs)
