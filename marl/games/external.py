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
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import parallel_to_aec

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
        raise ValueError(f"every agent must have the same {what}; got {values}")
    return values[0]


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
        **kwargs: Any,
    ) -> None:
        self.inner = env
        self.possible_agents = list(env.possible_agents)
        obs_spaces = [env.observation_space(a) for a in self.possible_agents]
        act_spaces = [env.action_space(a) for a in self.possible_agents]
        if not all(isinstance(s, spaces.Discrete) and s.start == 0 for s in act_spaces):
            raise ValueError("the env needs Discrete action spaces starting at 0")
        n = _uniform([int(s.n) for s in act_spaces], "number of actions")
        self.masked = all(
            isinstance(s, spaces.Dict) and {"observation", "action_mask"} <= set(s.spaces)
            for s in obs_spaces
        )
        # a masked env's observation array as it is; any other observation space flattened
        self._obs_space = None if self.masked else obs_spaces[0]
        box = obs_spaces[0]["observation"] if self.masked else spaces.flatten_space(obs_spaces[0])
        self.obs_shape = _uniform(
            [s["observation"].shape if self.masked else (spaces.flatdim(s),) for s in obs_spaces],
            "observation shape",
        )
        self.obs_low, self.obs_high = float(np.min(box.low)), float(np.max(box.high))
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
        self.inner.reset(seed=self._inner_seed)
        if list(self.inner.agents) != self.agents:
            raise ValueError("the wrapped env must start with all of its possible_agents")
        self._sync()

    def _legal(self, agent: str) -> list[int]:
        if agent not in self.inner.agents:
            return []
        if not self.masked:
            return list(range(len(self.action_names)))
        return np.flatnonzero(self.inner.observe(agent)["action_mask"]).tolist()

    def _raw(self, agent: str) -> Any:
        obs = self.inner.observe(agent)
        return obs["observation"] if self.masked else obs

    def _apply(self, agent: str, action: int) -> None:
        self._inner_actions.append(action)
        self.inner.step(action)
        self._sync()

    def _next_agent(self, agent: str) -> str:
        return self.inner.agent_selection

    def _was_dead_step(self, action: Any) -> None:
        forward = not self._game_over()  # someone plays on: the wrapped env needs this step too
        if forward:
            self._inner_actions.append(action)
            self.inner.step(action)
        super()._was_dead_step(action)
        if forward and self.agents:
            self.agent_selection = self.inner.agent_selection

    def _encode(self, agent: str) -> np.ndarray:
        raw = self._raw(agent)
        flat = raw if self._obs_space is None else spaces.flatten(self._obs_space, raw)
        return np.asarray(flat, dtype=np.float32)

    def _describe(self, agent: str) -> str:
        if self._describe_fn is not None:
            return self._describe_fn(self.inner, agent)
        if callable(getattr(self.inner, "describe", None)):
            return self.inner.describe(agent)
        turn = "The game is over." if self._game_over() else f"It is {self.agent_selection}'s turn."
        raw = self._raw(agent)
        seen = summarize_array(raw) if np.ndim(raw) else _shown(raw, 1500)
        return f"You are {agent}. {turn}\nYour observation: {seen}"

    def close(self) -> None:
        self.inner.close()

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
        twin.inner = copy.deepcopy(self.inner)
        if hasattr(self, "_inner_seed"):
            twin.inner.reset(seed=self._inner_seed)
            for action in self._inner_actions:
                twin.inner.step(action)
        return twin


def from_pettingzoo(
    env_or_factory: AECEnv | ParallelEnv | Callable[[], AECEnv | ParallelEnv],
    name: str | None = None,
    **kwargs: Any,
) -> PettingZooTextGame:
    """Wrap an env instance, or build one from a zero-argument factory and wrap it.

    ``kwargs``: ``action_names``, ``rules``, ``describe(env, agent) -> str``, ``zero_sum``,
    and the TextGame options ``max_retries``, ``illegal_reward``, ``render_mode``.
    """
    env = env_or_factory if isinstance(env_or_factory, AECEnv | ParallelEnv) else env_or_factory()
    if isinstance(env, ParallelEnv):
        env = parallel_to_aec(env)
    return PettingZooTextGame(env, name=name, **kwargs)


def as_text_game(env: Any, name: str) -> TextGame:
    """What a config's factory returned, as a TextGame: one already is; a PettingZoo AEC or
    Parallel env is wrapped (and named ``name`` unless its metadata names it)."""
    if isinstance(env, TextGame):
        return env
    if isinstance(env, AECEnv | ParallelEnv):
        return from_pettingzoo(env, name=env.metadata.get("name") or name)
    raise TypeError(
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
