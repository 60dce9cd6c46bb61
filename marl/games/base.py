"""The text-game base class shared by every game in this package.

A game here is a PettingZoo AEC environment whose observation is a Dict with three entries:

- ``observation``: a numeric ``Box`` encoding of the state (for conformance and non-LLM agents),
- ``action_mask``: an int8 ``Box`` with 1 for every legal action,
- ``text``: the rules, the state from the observing agent's point of view and the legal moves in
  bracket format (``[Bet]``), for LLM agents.

Actions are integer indices into ``action_names``.  ``parse_action`` maps free model text to an
index (or an explicit :class:`InvalidAction`).  Illegal moves are never exceptions: the offender
gets ``max_retries`` warned retries, then forfeits; both are counted in ``infos``.

Subclasses implement the game through a handful of small hooks (``_setup``, ``_legal``,
``_apply``, ``_encode``, ``_describe``) and keep the AEC book-keeping here.
"""

from __future__ import annotations

import copy
import re
import string
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv

TEXT_CHARSET = frozenset(string.printable)
TEXT_MAX_LENGTH = 8192


@dataclass(frozen=True)
class InvalidAction:
    """What ``parse_action`` returns when the text names no action."""

    text: str
    reason: str


# No \s* around the lazy group: that ambiguity made matching cubic on an unclosed "[" followed by
# long whitespace (seconds for a few thousand characters).  Callers strip the group instead.
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def _shown(value: Any, limit: int = 40) -> str:
    """A short printable-ASCII rendering of any object, safe inside the text observation."""
    try:
        text = ascii(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().strip("*_`'\".,:;!").strip()).lower()


class TextGame(AECEnv):
    """Base class of every turn-based text game.

    Subclass contract (class attributes): ``metadata["name"]``, ``possible_agents`` (fixed seat
    order), ``action_names`` (text of each action index), ``rules`` (one paragraph), ``obs_shape``
    and optionally ``zero_sum`` (a forfeit then pays the other players).  Hooks: ``_setup(rng)``,
    ``_legal(agent) -> list[int]``, ``_apply(agent, action)`` (must call ``_end`` when the game
    is over), ``_encode(agent) -> np.ndarray``, ``_describe(agent) -> str``.
    """

    metadata: ClassVar[dict[str, Any]] = {
        "name": "text_game",
        "render_modes": ["ansi"],
        "is_parallelizable": False,
    }
    action_names: ClassVar[list[str]] = []
    rules: ClassVar[str] = ""
    obs_shape: ClassVar[tuple[int, ...]] = (1,)
    obs_low: ClassVar[float] = 0.0
    obs_high: ClassVar[float] = 1.0
    zero_sum: ClassVar[bool] = True
    perfect_information: ClassVar[bool] = False

    def __init__(
        self, max_retries: int = 0, illegal_reward: float = -1.0, render_mode: str | None = None
    ) -> None:
        super().__init__()
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.max_retries = max_retries
        self.illegal_reward = illegal_reward
        self.render_mode = render_mode
        self.agents = list(self.possible_agents)
        self._build_spaces()
        self.np_random = np.random.default_rng()
        self._seeded = False

    # ----- spaces: built once so observation_space(agent) returns the same object every call
    def _build_spaces(self) -> None:
        n = len(self.action_names)
        obs = spaces.Dict(
            {
                "observation": spaces.Box(self.obs_low, self.obs_high, self.obs_shape, np.float32),
                "action_mask": spaces.Box(0, 1, (n,), np.int8),
                "text": spaces.Text(max_length=TEXT_MAX_LENGTH, min_length=0, charset=TEXT_CHARSET),
            }
        )
        self.observation_spaces = {a: obs for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(n) for a in self.possible_agents}

    def observation_space(self, agent: str) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.action_spaces[agent]

    # ----- hooks for subclasses
    def _setup(self, rng: np.random.Generator) -> None:
        raise NotImplementedError

    def _legal(self, agent: str) -> list[int]:
        raise NotImplementedError

    def _apply(self, agent: str, action: int) -> None:
        raise NotImplementedError

    def _encode(self, agent: str) -> np.ndarray:
        raise NotImplementedError

    def _describe(self, agent: str) -> str:
        raise NotImplementedError

    def _next_agent(self, agent: str) -> str:
        """Seat order after ``agent`` moves; games with other turn orders override this."""
        i = self.possible_agents.index(agent)
        return self.possible_agents[(i + 1) % len(self.possible_agents)]

    # ----- public helpers used by agents, bots and analysis
    def public_state(self, agent: str) -> Hashable | None:
        """What ``agent`` knows minus its private information (poker: the betting and the
        board, not its own card); ``None`` where the game hides nothing from anyone.

        Decisions that share it differ only by private information, which lets a trainer
        separate "this action is good here" from "this action is good with this card".
        """
        return None

    def private_names(self) -> dict[str, tuple[str, ...]]:
        """Every value a player's private information can take, with the words that name it
        (poker: ``{"K": ("King", "K"), ...}``), so text can be checked for naming it; empty
        where the game exposes none."""
        return {}

    def private_value(self, agent: str) -> str | None:
        """The key of :meth:`private_names` that ``agent`` holds now (poker: its card);
        ``None`` where the game exposes none."""
        return None

    def state_key(self) -> Hashable | None:
        """A hashable key of the position (equal keys => same future under legal play).

        Exact solvers memoise on it; ``None`` (the default) means the game offers no key.
        """
        return None

    def clone(self) -> TextGame:
        """An independent copy of the current state, for search and analysis.

        The (immutable) spaces are shared instead of copied: they dominate deepcopy's cost.
        """
        memo = {
            id(self.observation_spaces): self.observation_spaces,
            id(self.action_spaces): self.action_spaces,
        }
        return copy.deepcopy(self, memo)

    def legal_actions(self, agent: str | None = None) -> list[int]:
        agent = agent or self.agent_selection
        if agent not in self.agents or self.terminations[agent] or self.truncations[agent]:
            return []
        return self._legal(agent)

    def action_text(self, action: int) -> str:
        return f"[{self.action_names[action]}]"

    def parse_action(self, agent: str, text: str) -> int | InvalidAction:
        """Map model text to an action index.

        Accepts ``[Bet]``, ``\\boxed{bet}`` and a bare ``bet`` (case-insensitive).  When the text
        names several actions the last bracketed/boxed one wins (models reason first, then
        answer).  Legality is not checked here: ``step`` handles illegal moves.
        """
        if not isinstance(text, str):
            return InvalidAction(_shown(text), "not a string")
        lookup = {_norm(name): i for i, name in enumerate(self.action_names)}
        found = sorted(
            (m.start(), m.group(1).strip())
            for pat in (_BOXED, _BRACKET)
            for m in pat.finditer(text)
        )
        for _, cand in reversed(found):
            if _norm(cand) in lookup:
                return lookup[_norm(cand)]
        if _norm(text) in lookup:
            return lookup[_norm(text)]
        if found:
            return InvalidAction(text, f"no action name in {found[-1][1]!r}")
        return InvalidAction(text, "no action found; answer like " + self.action_text(0))

    def legal_text(self, agent: str) -> str:
        """The legal moves as ``agent`` (who has some) is told them, in its prompt and when
        an answer cannot be played: each move's text; a game whose moves form a large
        family states its rule instead (thousands of ``[answer N]`` would crowd the prompt
        out)."""
        return " ".join(self.action_text(a) for a in self.legal_actions(agent))

    def text_observation(self, agent: str) -> str:
        legal = self.legal_text(agent) if self.legal_actions(agent) else ""
        parts = [self.rules, self._describe(agent)]
        warning = self.infos.get(agent, {}).get("warning")
        if warning:
            parts.append(f"Warning: {warning}")
        parts.append(f"Legal moves: {legal}" if legal else "No moves left for you.")
        return "\n".join(p for p in parts if p)[:TEXT_MAX_LENGTH]

    def final_view(self, agent: str) -> str:
        """What ``agent`` is shown once the game is over (the end position; games with hidden
        information reveal it here)."""
        return self._describe(agent)

    # ----- AEC API
    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if seed is not None or not self._seeded:
            self.np_random = np.random.default_rng(seed)
            self._seeded = True
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {"illegal_moves": 0, "forfeit": False} for a in self.agents}
        self.agent_selection = self.possible_agents[0]
        self._setup(self.np_random)

    def observe(self, agent: str) -> dict[str, np.ndarray | str]:
        mask = np.zeros(len(self.action_names), dtype=np.int8)
        mask[self.legal_actions(agent)] = 1
        obs = np.asarray(self._encode(agent), dtype=np.float32).reshape(self.obs_shape)
        return {"observation": obs, "action_mask": mask, "text": self.text_observation(agent)}

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        self.infos[agent].pop("warning", None)
        if not self._is_legal(agent, action):
            self._illegal(agent, action)
        else:
            self._apply(agent, int(action))
            if not self.terminations[agent]:
                self.agent_selection = self._next_agent(agent)
        self._accumulate_rewards()

    def _is_legal(self, agent: str, action: Any) -> bool:
        # Arbitrary caller objects may raise anything from __int__/__eq__: all are illegal moves.
        try:
            a = int(action)
            return bool(a == action) and a in self._legal(agent)
        except Exception:
            return False

    def _illegal(self, agent: str, action: Any) -> None:
        info = self.infos[agent]
        info["illegal_moves"] += 1
        if info["illegal_moves"] <= self.max_retries:
            info["warning"] = (
                f"{_shown(action)} is not a legal move; "
                f"{self.max_retries - info['illegal_moves']} retries left."
            )
            return
        info["forfeit"] = True
        others = [a for a in self.agents if a != agent]
        payoff = {
            a: (-self.illegal_reward / len(others) if self.zero_sum and others else 0.0)
            for a in others
        }
        payoff[agent] = self.illegal_reward
        self._end(payoff)

    def _end(self, payoff: dict[str, float]) -> None:
        """Finish the game: pay everyone and mark every agent terminated."""
        for a in self.agents:
            self.rewards[a] = float(payoff.get(a, 0.0))
            self.terminations[a] = True

    def render(self) -> str:
        """The ``ansi`` render: the text the player to move sees (returned, as Gymnasium's
        ``ansi`` mode asks; the caller prints it)."""
        return self._describe(self.agent_selection) if self.agents else "game over"

    def close(self) -> None:
        pass
