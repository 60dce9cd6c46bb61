"""Split arithmetic: a team computes an expression whose operands are spread over its agents.

The public question is an expression such as ``x1 + x2 * x3`` (usual precedence); agent ``i``
alone knows ``x{i+1}``.  Agents act in seat order.  Every agent but the last sends one message
token ``[say N]`` (N in ``0..max_operand``: the vocabulary covers exactly one operand value, so
the obvious protocol is "say your number", but nothing forces it); the last agent then answers
``[answer N]`` over a bounded range that contains every possible value at this difficulty.  The
whole team scores 1 if the answer is right, else 0.

Difficulty levels (``LEVELS``): 0 sums of digits; 1 sums and differences of numbers up to 20;
2 adds one multiplication with digits; 3 the same with numbers up to 20.

Design for two runtimes: each instance is an :class:`ArithmeticTask` from
``generate(seed, difficulty, n_agents)`` with ``question``, ``private_views``, ``answer`` and
``score(text)`` (last ``\\boxed{}`` or last integer in free text).  The discrete game below plays
the very same instance with token messages; a free-text runtime lets the agents talk and scores
the last agent's message.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache

import numpy as np

from marl.games.base import InvalidAction
from marl.games.bots import register_bot
from marl.games.registry import register
from marl.games.tasks import CooperativeGame, final_integer, register_task, score_integer, task_seed

OPS = "+-*"


@dataclass(frozen=True)
class Level:
    max_operand: int
    ops: str
    max_mul: int  # at most this many '*' per expression, so answers stay in a small range


LEVELS: tuple[Level, ...] = (
    Level(9, "+", 0),
    Level(20, "+-", 0),
    Level(9, "+-*", 1),
    Level(20, "+-*", 1),
)
MAX_AGENTS = 8


def level(difficulty: int) -> Level:
    if not 0 <= difficulty < len(LEVELS):
        raise ValueError(f"difficulty must be in [0, {len(LEVELS) - 1}], got {difficulty}")
    return LEVELS[difficulty]


def agent_names(n_agents: int) -> list[str]:
    if not 2 <= n_agents <= MAX_AGENTS:
        raise ValueError(f"n_agents must be in [2, {MAX_AGENTS}], got {n_agents}")
    return [f"agent_{i}" for i in range(n_agents)]


def _products(terms: tuple[int, ...], ops: tuple[str, ...]) -> list[tuple[int, list[int]]]:
    """The expression as signed products: ``a - b * c`` -> [(+1, [a]), (-1, [b, c])]."""
    groups = [(1, [terms[0]])]
    for op, term in zip(ops, terms[1:], strict=True):
        if op == "*":
            groups[-1][1].append(term)
        else:
            groups.append((1 if op == "+" else -1, [term]))
    return groups


def evaluate(terms: tuple[int, ...], ops: tuple[str, ...]) -> int:
    return sum(sign * int(np.prod(factors)) for sign, factors in _products(terms, ops))


def _op_sequences(lv: Level, n_terms: int) -> list[tuple[str, ...]]:
    return [
        ops for ops in itertools.product(lv.ops, repeat=n_terms - 1) if ops.count("*") <= lv.max_mul
    ]


@cache
def answer_bounds(difficulty: int, n_agents: int) -> tuple[int, int]:
    """Smallest and largest possible answer over every instance at this difficulty.

    Operands are >= 0, so each signed product ranges over [0, max_operand ** len] and the
    extremes of the sum put every product at 0 or at its maximum.
    """
    lv, lo, hi = level(difficulty), 0, 0
    for ops in _op_sequences(lv, n_agents):
        top = [
            (sign, lv.max_operand ** len(factors))
            for sign, factors in _products((0,) * n_agents, ops)
        ]
        lo = min(lo, -sum(m for sign, m in top if sign < 0))
        hi = max(hi, sum(m for sign, m in top if sign > 0))
    return lo, hi


@dataclass(frozen=True)
class ArithmeticTask:
    """One instance: agent ``i`` holds ``terms[i]``; ``ops`` join the terms left to right."""

    seed: int
    difficulty: int
    terms: tuple[int, ...]
    ops: tuple[str, ...]
    game: str = "split_arithmetic"

    @property
    def agents(self) -> list[str]:
        return agent_names(len(self.terms))

    @property
    def answerer(self) -> str:
        return self.agents[-1]

    @property
    def expression(self) -> str:
        return " ".join(
            itertools.chain(["x1"], *([op, f"x{i + 2}"] for i, op in enumerate(self.ops)))
        )

    @property
    def answer(self) -> int:
        return evaluate(self.terms, self.ops)

    @property
    def question(self) -> str:
        n = len(self.terms)
        holders = ", ".join(f"{a} knows x{i + 1}" for i, a in enumerate(self.agents))
        return (
            f"A team of {n} agents must compute {self.expression} (multiplication before "
            f"addition and subtraction). Each value is private: {holders}; every x is an "
            f"integer from 0 to {level(self.difficulty).max_operand}. The agents speak in "
            f"turn and {self.answerer} gives the final answer as an integer, e.g. "
            f"\\boxed{{42}}."
        )

    @property
    def private_views(self) -> dict[str, str]:
        return {
            a: f"You are {a}. You know x{i + 1} = {t}."
            for i, (a, t) in enumerate(zip(self.agents, self.terms, strict=True))
        }

    def score(self, text: str) -> float:
        return score_integer(text, self.answer)


@register_task("split_arithmetic")
def generate(seed: int, difficulty: int = 0, n_agents: int = 3) -> ArithmeticTask:
    """Draw one operand per agent and the operators, all from ``seed``."""
    lv = level(difficulty)
    agent_names(n_agents)  # validates n_agents
    rng = np.random.default_rng(seed)
    choices = _op_sequences(lv, n_agents)
    ops = choices[int(rng.integers(len(choices)))]
    terms = tuple(int(t) for t in rng.integers(0, lv.max_operand + 1, size=n_agents))
    return ArithmeticTask(seed=seed, difficulty=difficulty, terms=terms, ops=ops)


@register("split_arithmetic")
class SplitArithmetic(CooperativeGame):
    """Token messages from all but the last agent, then the last agent's numeric answer."""

    metadata = {"name": "split_arithmetic", "render_modes": ["ansi"], "is_parallelizable": False}

    def __init__(self, difficulty: int = 0, n_agents: int = 3, **kwargs) -> None:
        self.difficulty = difficulty
        self.level = level(difficulty)
        self.possible_agents = agent_names(n_agents)
        self.lo, self.hi = answer_bounds(difficulty, n_agents)
        self.n_tokens = self.level.max_operand + 1
        self.action_names = [
            *(f"say {v}" for v in range(self.n_tokens)),
            *(f"answer {v}" for v in range(self.lo, self.hi + 1)),
        ]
        self._index = {name: i for i, name in enumerate(self.action_names)}
        # own value, everyone's message so far, one-hot seat, one-hot operators
        self.obs_shape = (1 + (n_agents - 1) + n_agents + len(OPS) * (n_agents - 1),)
        self.rules = (
            f"Split arithmetic (cooperative, {n_agents} agents). Each agent privately "
            f"knows one operand. In turn, every agent except the last sends one token "
            f"[say N] (N from 0 to {self.level.max_operand}); the last agent answers "
            f"[answer N] (N from {self.lo} to {self.hi}) or \\boxed{{N}}. Everyone "
            f"scores 1 if the answer is correct, else 0."
        )
        super().__init__(**kwargs)

    def _setup(self, rng: np.random.Generator) -> None:
        task = self.reset_options.get("task")
        self.task: ArithmeticTask = (
            task
            if task is not None
            else generate(task_seed(rng), self.difficulty, len(self.possible_agents))
        )
        if task is not None and (task.difficulty, len(task.terms)) != (
            self.difficulty,
            len(self.possible_agents),
        ):
            raise ValueError("the given task does not match this game's difficulty and size")
        self.messages: list[int] = []
        self.final_answer: int | None = None

    @property
    def answerer(self) -> str:
        return self.possible_agents[-1]

    def _legal(self, agent: str) -> list[int]:
        if agent != self.agent_selection:
            return []
        if agent == self.answerer:
            return list(range(self.n_tokens, len(self.action_names)))
        return list(range(self.n_tokens))

    def _apply(self, agent: str, action: int) -> None:
        if agent != self.answerer:
            self.messages.append(action)  # the token "say v" has index v
            return
        self.final_answer = self.lo + action - self.n_tokens
        self._end_team(float(self.final_answer == self.task.answer))

    def _encode(self, agent: str) -> np.ndarray:
        n = len(self.possible_agents)
        seat = self.possible_agents.index(agent)
        scale = self.level.max_operand
        said = np.zeros(n - 1)
        said[: len(self.messages)] = (np.array(self.messages) + 1) / (scale + 1)
        ops = np.zeros((n - 1, len(OPS)))
        ops[np.arange(n - 1), [OPS.index(op) for op in self.task.ops]] = 1.0
        return np.concatenate([[self.task.terms[seat] / scale], said, np.eye(n)[seat], ops.ravel()])

    def _describe(self, agent: str) -> str:
        parts = [self.task.question, self.task.private_views[agent]]
        parts += [
            f"{a} said {m}." for a, m in zip(self.possible_agents, self.messages, strict=False)
        ]
        if self.final_answer is not None:
            parts.append(
                f"{self.answerer} answered {self.final_answer}; the correct answer is "
                f"{self.task.answer}."
            )
        return "\n".join(parts)

    def legal_text(self, agent: str) -> str:
        if agent != self.answerer:
            return super().legal_text(agent)
        return f"[answer N] for an integer N from {self.lo} to {self.hi}"

    def parse_action(self, agent: str, text: str) -> int | InvalidAction:
        """Also accepts a bare or boxed number: a token for speakers, the answer for the last."""
        parsed = super().parse_action(agent, text)
        value = final_integer(text)
        if not isinstance(parsed, InvalidAction) or value is None:
            return parsed
        prefix = "answer" if agent == self.answerer else "say"
        return self._index.get(f"{prefix} {value}", parsed)

    # ----- helpers for bots: each only reads what the acting agent may know
    def own_value(self, agent: str) -> int:
        return self.task.terms[self.possible_agents.index(agent)]

    def say_action(self, value: int) -> int:
        return self._index[f"say {value}"]

    def answer_action(self, value: int) -> int:
        return self._index[f"answer {value}"]


@register_bot("split_arithmetic", "optimal")
class OptimalBot:
    """Speakers say their own operand; the last agent evaluates the expression."""

    def __init__(self, seed: int | None = None) -> None:
        """Deterministic: ``seed`` is accepted for the common bot signature only."""

    def act(self, env: SplitArithmetic, agent: str) -> int:
        if agent != env.answerer:
            return env.say_action(env.own_value(agent))
        terms = (*env.messages, env.own_value(agent))
        return env.answer_action(evaluate(terms, env.task.ops))
