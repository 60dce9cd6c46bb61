"""Referential (Lewis signalling) game: a sender names a target, a receiver must pick it out.

Both players see the same K candidate objects (attribute combinations such as "small red striped
circle"), each in its own independently shuffled order, so "the third one" means nothing to the
partner.  The sender alone knows the target and sends one symbol from a vocabulary of size V; the
receiver picks a candidate.  The team scores 1 if it is the target, else 0.  Once V >= K the
optimum is 1: agree on a canonical order of the candidates (e.g. sorted descriptions) and send
the target's rank.  ``difficulty`` raises K and the number of attributes; ``vocab_size`` defaults
to K.

Instances are :class:`ReferentialTask` values (``generate(seed, difficulty)``); the receiver's
answer is its candidate number, so a free-text runtime grades it with ``task.score(text)``.
"""

from __future__ import annotations

import itertools
import string
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from marl.games.bots import register_bot
from marl.games.registry import register
from marl.games.tasks import CooperativeGame, final_integer, register_task, task_seed

# Attribute values in natural word order of a description: size, color, pattern, shape.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "size": ("tiny", "small", "large", "huge"),
    "color": ("red", "green", "blue", "yellow", "purple", "orange", "black", "white"),
    "pattern": ("plain", "striped", "dotted", "checked"),
    "shape": ("circle", "square", "triangle", "star", "hexagon", "heart"),
}
# difficulty -> (number of candidates K, attributes in play); color and shape always vary.
LEVELS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (2, ("color", "shape")),
    (3, ("color", "shape")),
    (4, ("size", "color", "shape")),
    (6, ("size", "color", "shape")),
    (8, ("size", "color", "pattern", "shape")),
    (12, ("size", "color", "pattern", "shape")),
    (16, ("size", "color", "pattern", "shape")),
)
SENDER, RECEIVER = "sender_0", "receiver_0"  # PettingZoo naming, as MPE's speaker_0
Obj = tuple[str, ...]


def level(difficulty: int) -> tuple[int, tuple[str, ...]]:
    if not 0 <= difficulty < len(LEVELS):
        raise ValueError(f"difficulty must be in [0, {len(LEVELS) - 1}], got {difficulty}")
    return LEVELS[difficulty]


def symbols(n: int) -> tuple[str, ...]:
    """Message symbols A, B, ..., Z, AA, AB, ...: arbitrary on purpose, the meaning is learned."""
    if n < 1:
        raise ValueError(f"the vocabulary needs at least one symbol, got {n}")
    out: list[str] = []
    for width in itertools.count(1):
        for letters in itertools.product(string.ascii_uppercase, repeat=width):
            if len(out) == n:
                return tuple(out)
            out.append("".join(letters))
    raise AssertionError("unreachable")


def describe(obj: Obj) -> str:
    return " ".join(obj)


def _numbered(objs: list[Obj]) -> str:
    return "\n".join(f"  {i + 1}. {describe(o)}" for i, o in enumerate(objs))


@dataclass(frozen=True)
class ReferentialTask:
    """One instance: candidates in the sender's order, the target, and the receiver's order."""

    seed: int
    difficulty: int
    attributes: tuple[str, ...]
    candidates: tuple[Obj, ...]
    target: int  # index into ``candidates``
    receiver_order: tuple[int, ...]  # receiver's slot j shows candidates[receiver_order[j]]
    vocab: tuple[str, ...]
    game: str = "referential"
    answerer: str = RECEIVER

    def view(self, agent: str) -> list[Obj]:
        """The candidates in ``agent``'s own order."""
        if agent == SENDER:
            return list(self.candidates)
        return [self.candidates[i] for i in self.receiver_order]

    @property
    def answer(self) -> int:
        """The target's 1-based number in the receiver's list."""
        return self.receiver_order.index(self.target) + 1

    @property
    def question(self) -> str:
        k = len(self.candidates)
        return (
            f"Referential game for a team of two. Both players see the same {k} objects, "
            f"each in its own shuffled order. The sender knows which object is the target "
            f"and sends exactly one symbol from {{{', '.join(self.vocab)}}}; the receiver "
            f"reads the symbol and answers with the number (1-{k}) of the object it thinks "
            f"is the target, e.g. \\boxed{{2}}. The team scores 1 if it is the target."
        )

    @property
    def private_views(self) -> dict[str, str]:
        sender = self.view(SENDER)
        return {
            SENDER: (
                f"You are the sender. Objects (your order):\n{_numbered(sender)}\n"
                f"The target is object {self.target + 1}: {describe(sender[self.target])}."
            ),
            RECEIVER: f"You are the receiver. Objects (your order):\n"
            f"{_numbered(self.view(RECEIVER))}",
        }

    def score(self, text: str) -> float:
        """1.0 if the receiver's text names the target, by number or by description."""
        number = final_integer(text)
        if number is None and isinstance(text, str):
            number = _last_described(text, self.view(RECEIVER))
        return float(number == self.answer)


def _last_described(text: str, objs: list[Obj]) -> int | None:
    """The 1-based number of the object whose full description occurs last in ``text``."""
    lowered = text.lower()
    hits = [(lowered.rfind(describe(o)), i + 1) for i, o in enumerate(objs)]
    pos, number = max(hits)
    return number if pos >= 0 else None


@register_task("referential")
def generate(seed: int, difficulty: int = 2, vocab_size: int | None = None) -> ReferentialTask:
    """Draw K distinct objects, a target and the receiver's shuffle, all from ``seed``."""
    k, attributes = level(difficulty)
    rng = np.random.default_rng(seed)
    sizes = [len(ATTRIBUTES[a]) for a in attributes]
    codes = rng.choice(int(np.prod(sizes)), size=k, replace=False)
    candidates = tuple(
        tuple(
            ATTRIBUTES[a][i]
            for a, i in zip(attributes, np.unravel_index(int(c), sizes), strict=True)
        )
        for c in codes
    )
    return ReferentialTask(
        seed=seed,
        difficulty=difficulty,
        attributes=attributes,
        candidates=candidates,
        target=int(rng.integers(k)),
        receiver_order=tuple(int(i) for i in rng.permutation(k)),
        vocab=symbols(k if vocab_size is None else vocab_size),
    )


@register("referential")
class Referential(CooperativeGame):
    """Sender sends one symbol, receiver picks a candidate; shared reward 1 if correct."""

    metadata = {"name": "referential", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = [SENDER, RECEIVER]

    def __init__(self, difficulty: int = 2, vocab_size: int | None = None, **kwargs) -> None:
        self.k, self.attributes = level(difficulty)
        self.difficulty = difficulty
        self.vocab = symbols(self.k if vocab_size is None else vocab_size)
        # Sender actions are the symbols, receiver actions the candidate numbers "1".."K".
        self.action_names = [*self.vocab, *(str(i + 1) for i in range(self.k))]
        n_attr = len(self.attributes)
        self.obs_shape = (self.k * n_attr + self.k + len(self.vocab) + 2,)
        self.rules = (
            f"Referential game (cooperative): K={self.k} objects, a vocabulary of "
            f"{len(self.vocab)} symbols. The sender sends one symbol naming the "
            f"target; the receiver, whose objects are shuffled differently, picks the "
            f"target by its number. Both score 1 if it is right, else 0."
        )
        super().__init__(**kwargs)

    def _setup(self, rng: np.random.Generator) -> None:
        task = self.reset_options.get("task")
        self.task: ReferentialTask = (
            task if task is not None else generate(task_seed(rng), self.difficulty, len(self.vocab))
        )
        if len(self.task.candidates) != self.k or self.task.vocab != self.vocab:
            raise ValueError("the given task does not match this game's K and vocabulary")
        self.message: int | None = None
        self.choice: int | None = None

    def _legal(self, agent: str) -> list[int]:
        if agent != self.agent_selection:
            return []
        v = len(self.vocab)
        return list(range(v)) if agent == SENDER else list(range(v, v + self.k))

    def _apply(self, agent: str, action: int) -> None:
        if agent == SENDER:
            self.message = action
            return
        self.choice = action - len(self.vocab) + 1
        self._end_team(float(self.choice == self.task.answer))

    @cached_property
    def _attr_scale(self) -> np.ndarray:
        return np.array([max(1, len(ATTRIBUTES[a]) - 1) for a in self.attributes], dtype=float)

    def _encode(self, agent: str) -> np.ndarray:
        """Per slot the attribute indices scaled to [0, 1], the target flag, the message."""
        objs = self.task.view(agent)
        attrs = (
            np.array(
                [
                    [ATTRIBUTES[a].index(v) for a, v in zip(self.attributes, o, strict=True)]
                    for o in objs
                ]
            )
            / self._attr_scale
        )
        target = np.zeros(self.k)
        message = np.zeros(len(self.vocab))
        if agent == SENDER:
            target[self.task.target] = 1.0
        elif self.message is not None:
            message[self.message] = 1.0
        role = [float(agent == SENDER), float(agent == RECEIVER)]
        return np.concatenate([attrs.ravel(), target, message, role])

    def _describe(self, agent: str) -> str:
        parts = [self.task.private_views[agent]]
        if agent == RECEIVER:
            parts.append(
                "The sender's message: "
                + (self.vocab[self.message] if self.message is not None else "(not sent yet)")
            )
        if self.choice is not None:
            picked = self.task.view(RECEIVER)[self.choice - 1]
            target = self.task.candidates[self.task.target]
            parts.append(
                f"The receiver picked {describe(picked)}; the target was {describe(target)}."
            )
        return "\n".join(parts)

    # ----- helpers for bots: each only reads what the acting agent may know
    def sender_view(self) -> tuple[list[Obj], int]:
        return self.task.view(SENDER), self.task.target

    def receiver_view(self) -> tuple[list[Obj], int | None]:
        return self.task.view(RECEIVER), self.message


@register_bot("referential", "optimal")
class OptimalBot:
    """Canonical-order protocol: the symbol is the target's rank among the sorted candidates."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, env: Referential, agent: str) -> int:
        if agent == SENDER:
            objs, target = env.sender_view()
            return sorted(objs).index(objs[target]) % len(env.vocab)
        objs, message = env.receiver_view()
        ranked = sorted(objs)
        rank = message if message is not None and message < len(ranked) else 0
        return len(env.vocab) + objs.index(ranked[rank])


@register_bot("referential", "heuristic")
class HeuristicBot:
    """A 'name the colour' protocol: fails when several candidates share the target's colour.

    The sender sends the symbol of the target's colour; the receiver picks uniformly among the
    candidates of that colour (all candidates if none match).
    """

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    @staticmethod
    def _colour_symbol(obj: Obj, env: Referential) -> int:
        return ATTRIBUTES["color"].index(obj[env.attributes.index("color")]) % len(env.vocab)

    def act(self, env: Referential, agent: str) -> int:
        if agent == SENDER:
            objs, target = env.sender_view()
            return self._colour_symbol(objs[target], env)
        objs, message = env.receiver_view()
        matches = [i for i, o in enumerate(objs) if self._colour_symbol(o, env) == message]
        return len(env.vocab) + int(self.rng.choice(matches or list(range(len(objs)))))
