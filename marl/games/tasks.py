"""Verifiable cooperative tasks, shared by the discrete team games and a free-text team runtime.

A :class:`Task` is one procedurally generated problem instance, a pure value built from
``(seed, difficulty, ...)`` with no environment attached:

- ``question``: what the whole team is told (rules of the task, who answers, answer format);
- ``private_views``: what each agent alone knows (its operand, the target, its candidate list);
- ``answer``: the ground truth, an ``int``;
- ``answerer``: the agent whose final text is graded;
- ``score(text)``: 1.0 if ``text`` (free model output) states the answer, else 0.0.
- optionally ``role_scores(said)``: each agent's score for its own job, from each agent's
  last message (``plan_execute``'s planner and executor), for per-role rewards.

The games ``referential`` and ``split_arithmetic`` play exactly these instances with discrete
message/answer actions; a free-text runtime can instead hand ``question`` + ``private_views`` to
chatting LLM agents and grade the answerer's last message with ``score``.  Both see the same
problem for the same seed, so results are comparable across the two settings.

:class:`CooperativeGame` is the base of the team games: one shared reward, and a forfeit by one
teammate costs the whole team (a team is only as good as its weakest member's formatting).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from marl.games.base import TextGame
from marl.games.registry import accepted_kwargs, make_from, register_in


@runtime_checkable
class Task(Protocol):
    """One instance of a cooperative task with a verifiable integer answer."""

    @property
    def game(self) -> str: ...

    @property
    def seed(self) -> int: ...

    @property
    def difficulty(self) -> int: ...

    @property
    def question(self) -> str: ...

    @property
    def private_views(self) -> Mapping[str, str]: ...

    @property
    def answer(self) -> int: ...

    @property
    def answerer(self) -> str: ...

    def score(self, text: str) -> float: ...


# ----- grading free text
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
# A number not glued to a word on its left, so "x2" or "agent_1" never count as answers.
_NUMBER = re.compile(r"(?<![\w.])[-\u2212]?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _numbers(text: str) -> list[str]:
    return _NUMBER.findall(_THOUSANDS.sub("", text))


def _as_int(token: str) -> int | None:
    token = token.replace("\u2212", "-")
    whole, _, frac = token.partition(".")
    return int(whole) if frac.strip("0") == "" else None


def final_integer(text: Any) -> int | None:
    """The integer a free-text answer commits to, or ``None``.

    The last ``\\boxed{...}`` holding a number wins (the convention for final answers);
    otherwise the last number in the text (models reason first, answer last).  A final number
    that is not an integer (``3.5``) yields ``None`` rather than a truncated guess.
    """
    if not isinstance(text, str):
        return None
    for boxed in reversed(_BOXED.findall(text)):
        found = _numbers(boxed)
        if found:
            return _as_int(found[-1])
    found = _numbers(text)
    return _as_int(found[-1]) if found else None


def score_integer(text: Any, answer: int) -> float:
    """1.0 iff the integer that ``text`` commits to equals ``answer``."""
    return float(final_integer(text) == answer)


# ----- registry of task generators, for runtimes that pick tasks by name
TaskGenerator = Callable[..., Task]
_TASKS: dict[str, TaskGenerator] = {}


def register_task(name: str) -> Callable[[TaskGenerator], TaskGenerator]:
    """Decorator on ``generate(seed, difficulty, **kwargs) -> Task``."""
    return register_in(_TASKS, "task", name)


def task_names() -> list[str]:
    return sorted(_TASKS)


def task_takes(name: str, kwarg: str) -> bool:
    """Whether task ``name``'s generator takes ``kwarg`` (e.g. a ``split`` of held-out seeds)."""
    allowed = accepted_kwargs(_TASKS[name])
    return allowed is not None and kwarg in allowed


def make_task(name: str, seed: int, difficulty: int = 0, **kwargs: Any) -> Task:
    """Generate one instance of a registered task (deterministic in its arguments)."""
    return make_from(_TASKS, "task", name, {"seed": seed, "difficulty": difficulty, **kwargs})


# ----- base class of team games
class CooperativeGame(TextGame):
    """A TextGame where every agent receives the same team reward.

    ``reset(options=...)`` keeps the options in ``self.reset_options`` so ``_setup`` can replay a
    chosen instance (a given ``Task`` or chance outcome) instead of sampling one.
    """

    zero_sum = False

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.reset_options = dict(options or {})
        super().reset(seed, options)

    def _end_team(self, reward: float) -> None:
        self._end({a: reward for a in self.agents})

    def _illegal(self, agent: str, action: Any) -> None:
        super()._illegal(agent, action)
        if self.infos[agent]["forfeit"]:
            # The team shares the penalty; ``infos[agent]["forfeit"]`` still says who caused it.
            for a in self.agents:
                self.rewards[a] = float(self.illegal_reward)


def task_seed(rng: Any) -> int:
    """A task seed drawn from the environment's generator, so env seeds fix task instances."""
    return int(rng.integers(0, 2**63 - 1))
