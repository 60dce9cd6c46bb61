"""Adapter: any PettingZoo AEC or Parallel env with Discrete actions becomes a TextGame.

``from_pettingzoo(tictactoe_v3.env)`` gives an env the same interface as the native games: a
``"text"`` observation entry (rules, a view of the state, legal moves as ``[0] [1] ...`` or as
given ``action_names``), ``parse_action``, and the retry-then-forfeit handling of illegal moves
(the wrapped env never sees an illegal action).  Envs whose observations are Dicts with an
``"observation"`` and an ``"action_mask"`` (the PettingZoo classic convention) have their mask
obeyed; in any other env every action of the Discrete space is legal (``rps_v2``).  Parallel
envs are played turn by turn through PettingZoo's ``parallel_to_aec``.

The view comes from, in this order: a ``describe(env, agent)`` argument, the env's own
``describe(agent)`` method, or a readable default (whose turn it is and the observation).
``as_text_game`` is what the registry applies to every factory named in a config;
``register_external(name, factory)`` makes a factory available to ``marl.games.make``.

The wrapped env stays the source of truth: after each of its steps the adapter copies its
rewards, terminations, truncations and agent selection.  When the wrapped env ends some agents
while others play on, their dead steps are forwarded to it; once the game is over for everyone
(or an agent forfeited), dead steps are handled by the adapter alone.

Every call into the wrapped env goes through :mod:`marl.games.guard`: one that raises or
outlasts ``call_timeout_s`` stops the command with one line naming the env and the call.  A
game still running after ``turn_limit`` moves (``game.max_turns``) is cut short: every seat
truncated.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import parallel_to_aec

from marl.config.schema import CALL_TIMEOUT_S, MAX_TURNS
from marl.games import guard
from marl.games.base import TextGame
from marl.games.registry import register

_RESERVED_INFO = ("illegal_moves", "forfeit", "warning")


def summarize_array(arr: Any, max_chars: int = 1500) -> str:
    """An observation array as text: every entry when short, else its non-zero entries."""
    arr = np.asarray(arr)
    shape = "x".join(map(str, arr.shape)) or "scalar"
    full = np.array2string(arr, separator=",", threshold=arr.size + 1, max_line_width=10**9)
    full = " ".join(full.split())
    if len(full) <= max_chars:
        return f"array of shape {shape}: {full}"
    nonzero = np.argwhere(arr != 0)
    items, length = [], 0
    for idx in nonzero:
        item = f"{tuple(int(i) for i in idx)}={arr[tuple(idx)]:g}"
        length += len(item) + 1
        if length > max_chars:
            items.append(f"... ({len(nonzero) - len(items)} more)")
            break
        items.append(item)
    return f"array of shape {shape} with {len(nonzero)} non-zero entries: {' '.join(items)}"


def _shown(value: Any, limit: int) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _uniform(values: list[Any], what: str) -> Any:
    if any(v != values[0] for v in values[1:]):
        raise UnsupportedEnv(f"every agent must have the same {what}; got {values}")
    return values[0]


class UnsupportedEnv(ValueError):
    """An env this adapter cannot play; the message says why."""


@dataclass(frozen=True)
class Encoder:
    """How an observation space becomes the numeric ``observation`` entry: a masked env's
    ``Box`` as it is, any other space flattened (``Discrete`` one-hot, ``Dict`` and ``Tuple``
    concatenated), and a space without a flat form (``Sequence``, ``Graph``) as one zero (the
    text view still shows the observation)."""

    space: spaces.Space
    how: str  # "as is", "flatten" or "none"
    shape: tuple[int, ...]
    low: float = 0.0
    high: float = 1.0

    @classmethod
    def of(cls, space: spaces.Space, masked: bool) -> Encoder:
        if masked and isinstance(space, spaces.Box):
            return cls(
                space, "as is", space.shape, float(np.min(space.low)), float(np.max(space.high))
            )
        try:
            flat = spaces.flatten_space(space)
        except NotImplementedError:
            flat = None
        if not isinstance(flat, spaces.Box):
            return cls(space, "none", (1,))
        return cls(space, "flatten", flat.shape, float(np.min(flat.low)), float(np.max(flat.high)))

    def encode(self, raw: Any) -> np.ndarray:
        if self.how == "none":
            return np.zeros(1, dtype=np.float32)
        flat = raw if self.how == "as is" else spaces.flatten(self.space, raw)
        return np.asarray(flat, dtype=np.float32)


class PettingZooTextGame(TextGame):
    """A wrapped PettingZoo AEC env with the TextGame text interface and illegal-move policy."""

    def __init__(
        self,
        env: AECEnv,
        name: str | None = None,
        action_names: Sequence[str] | None = None,
        rules: str | None = None,
        describe: Callable[[AECEnv, str], str] | None = None,
        zero_sum: bool = True,
        call_timeout_s: float = CALL_TIMEOUT_S,
        turn_limit: int = MAX_TURNS,
        label: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.inner = env
        self.label = label or name or env.metadata.get("name", "pettingzoo_env")
        self.call_timeout_s, self.turn_limit = call_timeout_s, turn_limit
        self.possible_agents = list(env.possible_agents)
        obs_spaces = [
            self._call("observation_space", env.observation_space, a) for a in self.possible_agents
        ]
        act_spaces = [self._call("action_space", env.action_space, a) for a in self.possible_agents]
        if not all(isinstance(s, spaces.Discrete) and s.start == 0 for s in act_spaces):
            raise UnsupportedEnv(
                f"{self.label} cannot be played: its action spaces are "
                f"{act_spaces[0]}; it needs Discrete action spaces starting at 0"
            )
        n = _uniform([int(s.n) for s in act_spaces], "number of actions")
        self.masked = all(
            isinstance(s, spaces.Dict) and {"observation", "action_mask"} <= set(s.spaces)
            for s in obs_spaces
        )
        encoders = [
            Encoder.of(s["observation"] if self.masked else s, self.masked) for s in obs_spaces
        ]
        self._encoder = encoders[0]
        self.obs_shape = _uniform([e.shape for e in encoders], "observation shape")
        self.obs_low, self.obs_high = self._encoder.low, self._encoder.high
        self.action_names = list(action_names) if action_names else [str(i) for i in range(n)]
        if len(self.action_names) != n or len(set(self.action_names)) != n:
            raise ValueError(f"action_names must be {n} distinct names")
        name = name or env.metadata.get("name", "pettingzoo_env")
        self.metadata = {"name": name, "render_modes": ["ansi"], "is_parallelizable": False}
        self.zero_sum = zero_sum
        self.rules = rules or (
            f"{name}: a PettingZoo game for players "
            f"{', '.join(self.possible_agents)}. Pick one legal move."
        )
        self._describe_fn = describe
        super().__init__(**kwargs)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A call into the wrapped env, bounded and reported by :mod:`marl.games.guard`."""
        return guard.call(self.label, what, self.call_timeout_s, fn, *args)

    # ----- mirror the wrapped env
    def _sync(self) -> None:
        inner = self.inner
        for a in self.agents:
            self.rewards[a] = float(inner.rewards.get(a, 0.0))
            self.terminations[a] = bool(inner.terminations.get(a, False))
            self.truncations[a] = bool(inner.truncations.get(a, False))
            extra = {k: v for k, v in inner.infos.get(a, {}).items() if k not in _RESERVED_INFO}
            self.infos[a].update(extra)
        self.agent_selection = inner.agent_selection

    def _game_over(self) -> bool:
        return all(self.terminations[a] or self.truncations[a] for a in self.agents)

    def _setup(self, rng: np.random.Generator) -> None:
        self._inner_seed = int(rng.integers(0, 2**31 - 1))
        self._inner_actions: list[int | None] = []  # everything the wrapped env was stepped with
        self._call("reset", self.inner.reset, self._inner_seed)
        if list(self.inner.agents) != self.agents:
            raise UnsupportedEnv(
                f"{self.label} cannot be played: after reset its agents are "
                f"{list(self.inner.agents)}, not all of its possible_agents {self.agents}"
            )
        self._sync()

    def _legal(self, agent: str) -> list[int]:
        if agent not in self.inner.agents:
            return []
        if not self.masked:
            return list(range(len(self.action_names)))
        return np.flatnonzero(
            self._call("observe", self.inner.observe, agent)["action_mask"]
        ).tolist()

    def _raw(self, agent: str) -> Any:
        obs = self._call("observe", self.inner.observe, agent)
        return obs["observation"] if self.masked else obs

    def _apply(self, agent: str, action: int) -> None:
        self._inner_actions.append(action)
        self._call("step", self.inner.step, action)
        self._sync()
        if len(self._inner_actions) >= self.turn_limit and not self._game_over():
            for a in self.agents:  # game.max_turns: a game that does not end is cut short
                self.truncations[a] = True
                self.infos[a]["truncated"] = f"game.max_turns ({self.turn_limit}) reached"

    def _next_agent(self, agent: str) -> str:
        return self.inner.agent_selection

    def _was_dead_step(self, action: Any) -> None:
        forward = not self._game_over()  # someone plays on: the wrapped env needs this step too
        if forward:
            self._inner_actions.append(action)
            self._call("step", self.inner.step, action)
        super()._was_dead_step(action)
        if forward and self.agents:
            self.agent_selection = self.inner.agent_selection

    def _encode(self, agent: str) -> np.ndarray:
        return self._encoder.encode(self._raw(agent))

    def _describe(self, agent: str) -> str:
        if self._describe_fn is not None:
            return self._call("describe", self._describe_fn, self.inner, agent)
        if callable(getattr(self.inner, "describe", None)):
            return self._call("describe", self.inner.describe, agent)
        turn = "The game is over." if self._game_over() else f"It is {self.agent_selection}'s turn."
        raw = self._raw(agent)
        seen = (
            summarize_array(raw) if isinstance(raw, np.ndarray) and raw.ndim else _shown(raw, 1500)
        )
        return f"You are {agent}. {turn}\nYour observation: {seen}"

    def close(self) -> None:
        self._call("close", self.inner.close)

    def __deepcopy__(self, memo: dict) -> PettingZooTextGame:
        """Copy the adapter state; rebuild the wrapped env by replaying this game's moves.

        Deep copies of PettingZoo envs are unreliable: EzPickle envs (all classic ones) come
        back freshly constructed, without their state.  So the copy's env is reset with the same
        seed and stepped through the same actions (this assumes the env is deterministic given
        its seed, as ``seed_test`` demands).  ``clone()`` relies on this.
        """
        twin = type(self).__new__(type(self))
        memo[id(self)] = twin
        for key, value in self.__dict__.items():
            if key != "inner":
                setattr(twin, key, copy.deepcopy(value, memo))
        twin.inner = self._call("copy", self._replayed)
        return twin

    def _replayed(self) -> AECEnv:
        """A copy of the wrapped env, reset with this game's seed and replayed to here."""
        inner = copy.deepcopy(self.inner)
        if hasattr(self, "_inner_seed"):
            inner.reset(seed=self._inner_seed)
            for action in self._inner_actions:
                inner.step(action)
        return inner


def from_pettingzoo(
    env_or_factory: AECEnv | ParallelEnv | Callable[[], AECEnv | ParallelEnv],
    name: str | None = None,
    **kwargs: Any,
) -> PettingZooTextGame:
    """Wrap an env instance, or build one from a zero-argument factory and wrap it.

    ``kwargs``: ``action_names``, ``rules``, ``describe(env, agent) -> str``, ``zero_sum``,
    ``call_timeout_s``, ``turn_limit`` (:class:`PettingZooTextGame`), ``label`` (what its
    errors call it) and the TextGame options ``max_retries``, ``illegal_reward``, ``render_mode``.
    """
    env = env_or_factory if isinstance(env_or_factory, AECEnv | ParallelEnv) else env_or_factory()
    if isinstance(env, ParallelEnv):
        env = parallel_to_aec(env)
    return PettingZooTextGame(env, name=name, **kwargs)


def as_text_game(env: Any, name: str, **options: Any) -> TextGame:
    """What a config's factory returned, as a TextGame: one already is; a PettingZoo AEC or
    Parallel env is wrapped (named ``name`` unless its metadata names it; its errors name
    ``name``) with the adapter's ``options`` (``call_timeout_s``, ``turn_limit``)."""
    if isinstance(env, TextGame):
        return env
    if isinstance(env, AECEnv | ParallelEnv):
        return from_pettingzoo(env, name=env.metadata.get("name") or name, label=name, **options)
    raise UnsupportedEnv(
        f"{name} returned a {type(env).__name__}, not a PettingZoo AECEnv or ParallelEnv"
    )


def register_external(
    name: str, factory: Callable[[], AECEnv], **defaults: Any
) -> Callable[..., PettingZooTextGame]:
    """Register a PettingZoo env factory so ``marl.games.make(name, **overrides)`` wraps it."""

    def build(**overrides: Any) -> PettingZooTextGame:
        return from_pettingzoo(factory, name=name, **{**defaults, **overrides})

    register(name)(build)
    return build
