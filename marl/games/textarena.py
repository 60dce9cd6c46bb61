"""TextArena's two-player games (PyPI ``textarena``, the suite SPIRAL trains on) as TextGames.

``game: {source: textarena, name: KuhnPoker-v0}`` in a team file builds :class:`TextArenaGame`.
TextArena observations are one text (rules, state, history) with no structured move list, and
its env judges every move by its own rules.  So each game has a move table (:data:`MOVES`): the
bracket moves it knows, in a fixed order (the action indices), and whether any other text is a
move too (negotiation talk and offers).  The legal moves of a turn are the table's moves the
observation lists as available (all of them where it lists none); a free-text game adds one
"free" action whose text is whatever the model wrote, for the env to judge.

A move outside the listed ones is an illegal move of this package (warned retries, then a
forfeit); a free-text move the env rejects ends the game for the mover as TextArena decides
(its ``invalid_move``).  The env's final rewards are the returns.  Games without a table play
in free text only.  The package is imported on first use: ``pip install 'marl-teams[textarena]'``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from marl.config.schema import CALL_TIMEOUT_S, MAX_TURNS
from marl.games import guard
from marl.games.base import InvalidAction, TextGame

T = TypeVar("T")

FREE = "say"  # the free-text action's name


@dataclass(frozen=True)
class Moves:
    """A TextArena game's bracket moves and whether free text is a move as well."""

    names: tuple[str, ...]
    free_text: bool = False
    example: str = ""  # shown as the free action's text, e.g. an offer
    note: str = ""  # what a player should know that TextArena's own rules do not say


MOVES: dict[str, Moves] = {
    "KuhnPoker": Moves(
        ("check", "bet", "call", "fold"),
        note=(
            "Note: this Kuhn poker never adds bets to the pot: whoever wins a hand wins the "
            "2-chip pot of antes, so every hand is worth 1 chip, bet or not."
        ),
    ),
    "TicTacToe": Moves(tuple(str(i) for i in range(9))),
    "SimpleNegotiation": Moves(
        ("Accept", "Deny"), free_text=True, example="Offer: 2 Wheat -> 1 Ore"
    ),
}
_AVAILABLE = re.compile(r"available (?:actions|moves)[^\n]*", re.IGNORECASE)
_BRACKETED = re.compile(r"\[([^\[\]]+)\]")


def _textarena() -> Any:
    try:
        import textarena
    except ImportError:
        raise ImportError(
            "TextArena is not installed: pip install 'marl-teams[textarena]'"
        ) from None
    return textarena


def moves_of(name: str) -> Moves:
    """The move table of env id ``name`` (``KuhnPoker-v0-long`` -> KuhnPoker); free text for
    a game without one."""
    return MOVES.get(name.split("-v")[0], Moves((), free_text=True))


def names() -> list[str]:
    """The TextArena games with a move table (every other id plays in free text)."""
    return [f"{base}-v0" for base in MOVES]


def default_kwargs(name: str) -> dict[str, Any]:
    """The arguments TextArena registered env ``name`` with (``max_rounds=3`` for Kuhn)."""
    return dict(_textarena().envs.registration.ENV_REGISTRY[name].kwargs)


def check_name(name: str) -> str | None:
    """What is wrong with ``name`` as a TextArena env id, or None."""
    registry = _textarena().envs.registration.ENV_REGISTRY
    if name in registry:
        return None
    return f"unknown TextArena game {name!r}; with move tables: {', '.join(names())}"


class TextArenaGame(TextGame):
    """One TextArena env for two players, ``player_0`` and ``player_1``.

    TextArena's envs draw from Python's shared ``random`` module (Kuhn poker reseeds it at
    reset and shuffles the deck with it), so games played side by side would deal each other's
    cards.  Each game keeps its own state of that generator and swaps it in around every call
    into its env, and each reset builds the env afresh: a game replays from its seed however
    games interleave.  Every call goes through :mod:`marl.games.guard`."""

    possible_agents = ["player_0", "player_1"]

    def __init__(
        self,
        env_id: str,
        max_retries: int = 0,
        illegal_reward: float = -1.0,
        render_mode: str | None = None,
        call_timeout_s: float = CALL_TIMEOUT_S,
        turn_limit: int = MAX_TURNS,
        **env_kwargs: Any,
    ) -> None:
        self.env_id, self.env_kwargs = env_id, env_kwargs
        self.call_timeout_s, self.turn_limit = call_timeout_s, turn_limit
        self.moves = moves_of(env_id)
        self.action_names = [*self.moves.names, *([FREE] if self.moves.free_text else [])]
        self.metadata = {"name": env_id, "render_modes": ["ansi"], "is_parallelizable": False}
        self.rules = self.moves.note  # TextArena's observation carries its own rules
        self._random = random.Random(0).getstate()
        self.env = self._call("make", _textarena().make, env_id, **env_kwargs)
        super().__init__(
            max_retries=max_retries, illegal_reward=illegal_reward, render_mode=render_mode
        )

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn`` called with this game's state of ``random`` swapped in, within the guard."""
        shared = random.getstate()
        random.setstate(self._random)
        try:
            return guard.call(self.env_id, what, self.call_timeout_s, fn, *args, **kwargs)
        finally:
            self._random = random.getstate()
            random.setstate(shared)

    # ----- hooks
    def _setup(self, rng: np.random.Generator) -> None:
        self._random = random.Random(int(rng.integers(0, 2**63))).getstate()
        self.env = self._call("make", _textarena().make, self.env_id, **self.env_kwargs)
        self._call("reset", self.env.reset, num_players=2, seed=int(rng.integers(0, 2**31 - 1)))
        self._seen = {a: "" for a in self.possible_agents}
        self._said: dict[str, str] = {}
        self._turns = 0
        self.result = ""
        self._observe()

    def _observe(self) -> None:
        pid, text = self._call("get_observation", self.env.get_observation)
        self.agent_selection = self.possible_agents[pid]
        self._seen[self.agent_selection] = text

    def _legal(self, agent: str) -> list[int]:
        free = [len(self.moves.names)] if self.moves.free_text else []
        listed = _AVAILABLE.findall(self._seen[agent])
        lookup = {n.lower(): i for i, n in enumerate(self.moves.names)}
        shown = (
            [lookup[m.lower()] for m in _BRACKETED.findall(listed[-1]) if m.lower() in lookup]
            if listed
            else []
        )
        return sorted(set(shown)) + free if shown else [*range(len(self.moves.names)), *free]

    def _apply(self, agent: str, action: int) -> None:
        text = (
            self._said.pop(agent, "")
            if self.action_names[action] == FREE
            else f"[{self.action_names[action]}]"
        )
        done, _ = self._call("step", self.env.step, action=text)
        self._turns += 1
        if not done and self._turns >= self.turn_limit:
            self.result = f"Cut short: game.max_turns ({self.turn_limit}) reached."
            for a in self.agents:
                self.truncations[a] = True
            return
        if not done:
            self._observe()
            return
        rewards, info = self._call("close", self.env.close)
        for pid, a in enumerate(self.possible_agents):
            if info.get(pid, {}).get("invalid_move"):
                self.infos[a]["illegal_moves"] += 1
                self.infos[a]["forfeit"] = True
        self.result = str(info.get(0, {}).get("reason", ""))
        self._end({a: float(rewards.get(pid, 0.0)) for pid, a in enumerate(self.possible_agents)})

    def _next_agent(self, agent: str) -> str:
        return self.agent_selection  # _apply read it from the env

    def _encode(self, agent: str) -> np.ndarray:
        return np.zeros(1, dtype=np.float32)

    def _describe(self, agent: str) -> str:
        over = f"\nThe game is over. {self.result}" if self.result else ""
        return self._seen.get(agent, "").strip() + over

    def action_text(self, action: int) -> str:
        name = self.action_names[action]
        return f"[{self.moves.example or 'your message'}]" if name == FREE else f"[{name}]"

    def parse_action(self, agent: str, text: str) -> int | InvalidAction:
        """A listed move as the base class reads it; in a free-text game any other text is the
        free move, kept to be sent to the env as it is."""
        parsed = super().parse_action(agent, text)
        if isinstance(parsed, InvalidAction) and self.moves.free_text and isinstance(text, str):
            self._said[agent] = text
            return self.action_names.index(FREE)
        return parsed


def make(name: str, **kwargs: Any) -> TextArenaGame:
    """TextArena env ``name`` (e.g. ``KuhnPoker-v0``) built with ``kwargs``."""
    problem = check_name(name)
    if problem is not None:
        raise KeyError(problem)
    return TextArenaGame(name, **kwargs)
