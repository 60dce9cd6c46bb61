"""Plan and execute: a planner turns a word problem into a calculation, an executor carries it out.

Only the ``planner`` reads the word problem (its private view); the ``executor`` never sees it.
The planner must send the calculation (``PLAN: 3 * 4 - 2``) without solving it, the executor
must compute what it receives (multiplication first) and give the team's answer as
``\\boxed{N}``.  The two jobs differ (reading a story into an expression vs. evaluating one),
so a team whose roles specialise can beat one where both do everything, and swapping their
policies should hurt: the benchmark of role-specialised training (docs/benchmarks.md).

Difficulty levels (``LEVELS``): 0 one operation on digits; 1 two operations on digits; 2 two
operations on numbers up to 12.

Instances are split in two disjoint sets by a hash of their content (template and numbers):
``split="train"`` only draws training instances, ``split="eval"`` only held-out ones, whatever
the seed, so an evaluation never scores a problem the team was trained on.  A free-text team
runtime scores the executor's message with ``score`` (its last ``\\boxed{}`` or last integer).

Each role also has a score of its own (``role_scores``), for training with per-role rewards:
the planner's is whether its plan computes the answer, the executor's whether it computed the
plan it received (the answer itself when no plan could be read from the planner).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from marl.games.split_arithmetic import evaluate
from marl.games.tasks import final_integer, register_task, score_integer

AGENTS = ("planner", "executor")
SPLITS = ("train", "eval")
EVAL_SHARE = 5  # one instance in five is held out


@dataclass(frozen=True)
class Level:
    lo: int
    hi: int
    ops: int  # operations per problem


LEVELS: tuple[Level, ...] = (Level(2, 9, 1), Level(2, 9, 2), Level(2, 12, 2))


@dataclass(frozen=True)
class Template:
    """A story with slots ``{a} {b} {c}`` and the operators joining them, in that order."""

    story: str
    ops: tuple[str, ...]

    def expression(self, numbers: Sequence[int]) -> str:
        """``(3, 4, 2)`` with ``('*', '-')`` -> ``3 * 4 - 2``."""
        parts = [str(numbers[0])]
        for op, x in zip(self.ops, numbers[1:], strict=True):
            parts += [op, str(x)]
        return " ".join(parts)


TEMPLATES: tuple[tuple[Template, ...], ...] = (
    (
        Template(
            "{name} has {a} {item}s and gets {b} more. How many {item}s does {name} have now?",
            ("+",),
        ),
        Template(
            "{name} has {a} {item}s and gives {b} of them away. How many {item}s are left?", ("-",)
        ),
        Template(
            "{name} buys {a} boxes with {b} {item}s in each box. How many {item}s is that?", ("*",)
        ),
    ),
    (
        Template(
            "{name} has {a} {item}s, gets {b} more, then gives {c} away. How many {item}s "
            "does {name} have now?",
            ("+", "-"),
        ),
        Template(
            "{name} buys {a} boxes with {b} {item}s in each box and already had {c}. How "
            "many {item}s does {name} have?",
            ("*", "+"),
        ),
        Template(
            "{name} buys {a} boxes with {b} {item}s in each box and gives {c} away. How many "
            "{item}s are left?",
            ("*", "-"),
        ),
        Template(
            "{name} has {a} {item}s, and {b} friends each give {name} {c} more. How many "
            "{item}s does {name} have now?",
            ("+", "*"),
        ),
    ),
)
# "PLAN:" then integers joined by + - * (x and the times sign read as *): never eval'd
_PLAN = re.compile(r"PLAN:\s*(\d+(?:\s*[-+*x\u00d7]\s*\d+)*)", re.IGNORECASE)
_TERM = re.compile(r"\d+|[-+*x\u00d7]")


def plan_value(text: str) -> int | None:
    """The value of the first ``PLAN:`` expression in ``text`` (multiplication first), or
    ``None`` when there is none."""
    m = _PLAN.search(text)
    if m is None:
        return None
    tokens = _TERM.findall(m.group(1))
    numbers = tuple(int(t) for t in tokens[0::2])
    ops = tuple("*" if t in "x\u00d7" else t for t in tokens[1::2])
    return evaluate(numbers, ops)


NAMES = ("Mia", "Tom", "Ana", "Ben", "Lea", "Sam", "Ivy", "Max")
ITEMS = ("apple", "pen", "card", "shell", "stamp", "marble", "book", "coin")


def level(difficulty: int) -> Level:
    if not 0 <= difficulty < len(LEVELS):
        raise ValueError(f"difficulty must be in [0, {len(LEVELS) - 1}], got {difficulty}")
    return LEVELS[difficulty]


def split_of(template: Template, numbers: tuple[int, ...]) -> str:
    """Which split an instance belongs to: a hash of its template and numbers (not of the
    names, which only vary the wording), so train and eval never share a calculation."""
    key = repr((template.story, numbers)).encode()
    bucket = int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little")
    return "eval" if bucket % EVAL_SHARE == 0 else "train"


@dataclass(frozen=True)
class PlanTask:
    """One instance: a story, its numbers and the expression the planner should send."""

    seed: int
    difficulty: int
    template: Template
    numbers: tuple[int, ...]
    name: str
    item: str
    split: str = "train"
    game: str = "plan_execute"
    answerer: str = "executor"

    @property
    def problem(self) -> str:
        """The story with its numbers, as the planner reads it."""
        return self.template.story.format(
            name=self.name, item=self.item, **dict(zip("abc", self.numbers, strict=False))
        )

    @property
    def plan(self) -> str:
        """The calculation the planner should send, e.g. ``3 * 4 - 2``."""
        return self.template.expression(self.numbers)

    @property
    def answer(self) -> int:
        return evaluate(self.numbers, self.template.ops)

    @property
    def question(self) -> str:
        return (
            "Team task for a planner and an executor. The planner alone reads a short word "
            "problem; the executor never sees it. The planner writes the calculation that "
            "solves the problem as one line, PLAN: followed by an expression with the "
            "problem's numbers (for example PLAN: 3 + 4 * 2), without solving it. The "
            "executor computes the planner's expression (multiplication first) and gives "
            "the result as the team's answer, e.g. \\boxed{11}."
        )

    @property
    def private_views(self) -> dict[str, str]:
        return {"planner": f"The story: {self.problem}"}

    def score(self, text: str) -> float:
        return score_integer(text, self.answer)

    def role_scores(self, said: Mapping[str, str]) -> dict[str, float]:
        """Per-role scores from each agent's last message: did the plan compute the answer,
        did the executor compute the plan it was sent."""
        planned = plan_value(said.get("planner", ""))
        target = self.answer if planned is None else planned
        return {
            "planner": float(planned == self.answer),
            "executor": float(final_integer(said.get("executor", "")) == target),
        }


@register_task("plan_execute")
def generate(seed: int, difficulty: int = 0, split: str = "train") -> PlanTask:
    """Draw a story and its numbers from ``seed``, redrawing until the instance is in
    ``split`` and its count is not negative (deterministic in its arguments)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    lv = level(difficulty)
    templates = TEMPLATES[lv.ops - 1]
    rng = np.random.default_rng(seed)
    while True:
        template = templates[int(rng.integers(len(templates)))]
        numbers = tuple(int(x) for x in rng.integers(lv.lo, lv.hi + 1, size=lv.ops + 1))
        if evaluate(numbers, template.ops) >= 0 and split_of(template, numbers) == split:
            break
    return PlanTask(
        seed=seed,
        difficulty=difficulty,
        template=template,
        numbers=numbers,
        name=NAMES[int(rng.integers(len(NAMES)))],
        item=ITEMS[int(rng.integers(len(ITEMS)))],
        split=split,
    )
