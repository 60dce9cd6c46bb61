"""What a policy is: a batch of decision requests in, a batch of responses out.

Every backend (transformers + LoRA, vLLM, an OpenAI-compatible server, a scripted bot, a
person at a terminal) implements :class:`Policy`.  The rollout engine batches requests per
policy object, so one call covers every pending decision of that policy across many games.

A response carries what training needs: prompt and completion token ids and the log-probs of
the completion under the policy that produced it.  In ``choice`` decoding the policy samples from
the distribution over the legal actions' texts, ``pi(a|s) = softmax_a(log p(text_a | s) / T)``,
and reports that single log-prob plus every candidate's token ids, so a learner can recompute
``log pi(a|s)`` exactly; with ``choice_score: mean`` a move's score is its text's mean token
log-prob instead (:data:`CHOICE_SCORES`).  ``think`` decoding first samples reasoning tokens,
then chooses the same way after them: the response carries both (docs/algorithms.md#think-then-act).
"""

from __future__ import annotations

import importlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class PolicyError(ValueError):
    """A policy that cannot decide (e.g. its scores are not finite numbers)."""


@dataclass
class Request:
    """One pending decision.

    ``messages`` is the chat so far (system + user turns).  ``action_texts`` are the legal moves
    as the game writes them (``[Bet]``), index-aligned with ``legal``.  ``env``/``agent`` are set
    for policies that read the game directly (scripted bots, humans).
    """

    messages: list[dict[str, str]]
    legal: list[int]
    action_texts: list[str]
    env: Any = None
    agent: str = ""


@dataclass
class Response:
    """A policy's answer to one :class:`Request`.

    ``choice`` is an index into the request's ``legal`` when the policy picked directly (choice
    decoding, bots); otherwise the game parses ``text``.  ``logprobs`` holds one entry per
    completion token (free decoding) or a single ``log pi(a|s)`` (choice decoding), at the
    sampling ``temperature`` the policy stamps here, so a learner recomputes them at the same
    one (:func:`scale_temperature`).

    Think decoding: ``completion_ids`` are the reasoning tokens, ``logprobs`` their log-probs
    followed by the choice's, and ``choice_prompt_ids`` the context the candidates were scored
    after (prompt, reasoning, separator); ``text`` is the reasoning and the move.

    Free decoding: ``answer_ids`` are the complete answers that name one legal move each
    (its text, then the end of the answer), in ``legal`` order, for policy targets.
    """

    text: str
    choice: int | None = None
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    candidate_ids: list[list[int]] | None = None
    action_probs: list[float] | None = None  # choice decoding: the sampling distribution
    choice_prompt_ids: list[int] | None = None  # think decoding
    answer_ids: list[list[int]] | None = None  # free decoding: each legal move's own answer
    truncated_prompt: bool = False
    temperature: float = 1.0  # what the policy sampled at; 0: greedy
    choice_score: str = "sum"  # choice and think: how moves were scored (CHOICE_SCORES)
    usage: tuple[int, int] | None = None  # (prompt, completion) tokens a server reported

    def token_counts(self) -> tuple[int, int]:
        """Prompt and completion tokens: the ids' lengths, or a server's ``usage`` when it
        sent no ids (a hosted model)."""
        if self.usage is not None and not (self.prompt_ids or self.completion_ids):
            return self.usage
        return len(self.prompt_ids), len(self.completion_ids)


@runtime_checkable
class Policy(Protocol):
    """Anything that answers a batch of requests."""

    def act(self, requests: list[Request]) -> list[Response]: ...


_BACKENDS: dict[str, Callable[..., Policy]] = {}
# the modules whose import registers the built-in backends: imported on first use, so that
# what needs no model (``marl validate``, the config checks) loads no torch or transformers
BACKEND_MODULES = ("hf_policy", "openai_backend", "scripted", "vllm_backend")


def _load_backends() -> None:
    for name in BACKEND_MODULES:
        importlib.import_module(f"marl.agents.{name}")


def register_backend(name: str) -> Callable:
    """``@register_backend("hf")`` on a factory building a policy for one role."""

    def deco(factory: Callable[..., Policy]) -> Callable[..., Policy]:
        _BACKENDS[name] = factory
        return factory

    return deco


def backend_names() -> list[str]:
    _load_backends()
    return sorted(_BACKENDS)


def make_policy(backend: str, **kwargs: Any) -> Policy:
    _load_backends()
    try:
        factory = _BACKENDS[backend]
    except KeyError:
        raise KeyError(
            f"unknown policy backend {backend!r}; known: {', '.join(backend_names())}"
        ) from None
    return factory(**kwargs)


def greedy(temperature: float) -> bool:
    """A sampling temperature of 0 (or below) means greedy: the most likely answer is taken."""
    return temperature <= 0


def scale_temperature(temperature: float) -> float:
    """What logits are divided by for the log-probs of a decision sampled at ``temperature``:
    ``T`` itself, or 1 for greedy decoding (its log-probs are read at ``T = 1``)."""
    return 1.0 if greedy(temperature) else temperature


# A move's score from its text's token log-probs, as what their sum is divided by for a text of
# n tokens.  sum: the text's log-prob, under which a long move is unlikely however well each of
# its tokens fits (an untrained model facing ``[propose 2 0 1]`` and ``[No deal]`` picks the short
# one); mean: the mean token log-prob, so moves of different lengths compete on how well their
# tokens fit (the length-normalised score of multiple-choice evaluations).
CHOICE_SCORES: dict[str, Callable[[int], int]] = {"sum": lambda n: 1, "mean": lambda n: n}


def score_divisors(candidates: list[list[int]], how: str) -> list[int]:
    """What each candidate's summed log-prob is divided by to make its score
    (:data:`CHOICE_SCORES`)."""
    try:
        per_length = CHOICE_SCORES[how]
    except KeyError:
        known = ", ".join(CHOICE_SCORES)
        raise ValueError(f"choice_score must be one of {known}, got {how!r}") from None
    return [per_length(len(c)) for c in candidates]


def move_scores(logps: list[float], candidates: list[list[int]], how: str) -> list[float]:
    """The candidates' scores from their summed log-probs ``logps``."""
    return [s / d for s, d in zip(logps, score_divisors(candidates, how), strict=True)]


def choice_logprobs(scores: list[float], temperature: float) -> list[float]:
    """``log softmax(scores / T)``, ``T`` from :func:`scale_temperature`."""
    t = scale_temperature(temperature)
    z = max(s / t for s in scores)
    logz = z + math.log(sum(math.exp(s / t - z) for s in scores))
    return [s / t - logz for s in scores]


def choice_probs(scores: list[float], temperature: float) -> list[float]:
    """``softmax(scores / T)``: the distribution a choice-mode policy samples from."""
    return [math.exp(x) for x in choice_logprobs(scores, temperature)]


def choice_response(
    request: Request,
    prompt_ids: list[int],
    candidates: list[list[int]],
    scores: list[float],
    temperature: float,
    rng: random.Random,
    truncated: bool = False,
    choice_score: str = "sum",
) -> Response:
    """Sample one of ``request``'s legal actions from its candidates' summed log-probs
    ``scores`` (made into scores by ``choice_score``; greedy when ``T = 0``); the response
    carries ``log pi`` of the pick and the whole distribution."""
    if not all(math.isfinite(s) for s in scores):
        raise PolicyError(f"non-finite action scores {scores} (the model's weights diverged?)")
    scores = move_scores(scores, candidates, choice_score)
    logpi = choice_logprobs(scores, temperature)
    probs = [math.exp(x) for x in logpi]
    if greedy(temperature):
        i = max(range(len(scores)), key=logpi.__getitem__)
    else:
        i = rng.choices(range(len(scores)), weights=probs)[0]
    return Response(
        text=request.action_texts[i],
        choice=i,
        prompt_ids=prompt_ids,
        completion_ids=candidates[i],
        logprobs=[logpi[i]],
        candidate_ids=candidates,
        action_probs=probs,
        truncated_prompt=truncated,
        temperature=temperature,
        choice_score=choice_score,
    )
