"""Conformance and fuzzing of EVERY registered game, so a new game is covered by registering it.

- PettingZoo's own ``api_test``/``seed_test`` (and ``parallel_api_test``/``parallel_seed_test``
  for every registered parallel form);
- action text round trip, and ``parse_action`` on arbitrary input: an index or
  :class:`InvalidAction`, never an exception;
- ``step`` on arbitrary junk (numbers out of range, floats, strings, objects that raise): never
  an exception, never a corrupted state -- with retries left the position is untouched, without
  them the offender forfeits -- and the invariants below hold after every step;
- ``clone()`` is independent of its original.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pettingzoo.test import api_test, parallel_api_test, seed_test
from pettingzoo.test.seed_test import parallel_seed_test

from marl import games
from marl.games.base import InvalidAction, TextGame
from marl.games.bots import bot_names, make_bot

GAMES = games.names()
PARALLEL = games.parallel_names()
FUZZ = settings(
    max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # api_test's style advice


def fresh(name: str, seed: int = 0, max_retries: int | None = None) -> TextGame:
    env = games.make(name)
    if max_retries is not None:
        env.max_retries = max_retries
    env.reset(seed=seed)
    return env


def game_over(env: TextGame) -> bool:
    return all(env.terminations[a] or env.truncations[a] for a in env.agents)


def check_invariants(env: TextGame) -> None:
    """What must hold between any two steps, whatever was stepped."""
    agents = env.agents
    assert len(set(agents)) == len(agents) and set(agents) <= set(env.possible_agents)
    for table in (
        env.rewards,
        env._cumulative_rewards,
        env.terminations,
        env.truncations,
        env.infos,
    ):
        assert set(table) == set(agents)
    if agents:
        assert env.agent_selection in agents
    for a in agents:
        assert math.isfinite(env.rewards[a]) and math.isfinite(env._cumulative_rewards[a])
        obs = env.observe(a)
        assert env.observation_space(a).contains(obs), f"observation of {a} out of its space"
        legal = env.legal_actions(a)
        assert np.flatnonzero(obs["action_mask"]).tolist() == sorted(legal)
        if not (env.terminations[a] or env.truncations[a]) and a == env.agent_selection:
            assert legal, f"{a} is to move but has no legal action"


# ----- PettingZoo conformance


@pytest.mark.parametrize("name", GAMES)
def test_pettingzoo_api(name):
    api_test(games.make(name), num_cycles=60)


@pytest.mark.parametrize("name", GAMES)
def test_pettingzoo_seed(name):
    seed_test(lambda: games.make(name), num_cycles=60)


@pytest.mark.parametrize("name", PARALLEL)
def test_pettingzoo_parallel_api(name):
    parallel_api_test(games.make_parallel(name), num_cycles=60)


@pytest.mark.parametrize("name", PARALLEL)
def test_pettingzoo_parallel_seed(name):
    parallel_seed_test(lambda: games.make_parallel(name), num_cycles=60)


# ----- action text


@pytest.mark.parametrize("name", GAMES)
def test_every_action_text_parses_back(name):
    env = fresh(name)
    agent = env.agent_selection
    for action in range(len(env.action_names)):
        assert env.parse_action(agent, env.action_text(action)) == action


def text_with_actions(names: list[str]) -> st.SearchStrategy[str]:
    """Free text, bracket/boxed fragments and real action names mixed with noise."""
    noise = st.text(max_size=30)
    fragment = st.one_of(
        st.sampled_from(names),
        st.sampled_from(names).map(lambda n: f"[{n}]"),
        st.sampled_from(names).map(lambda n: f"\\boxed{{{n}}}"),
        st.sampled_from(["[", "]", "{", "}", "\\boxed{", ":", " ", "\n"]),
        noise,
    )
    return st.one_of(st.text(max_size=200), st.lists(fragment, max_size=8).map("".join))


@pytest.mark.parametrize("name", GAMES)
@FUZZ
@given(data=st.data())
def test_parse_action_never_raises(name, data):
    env = fresh(name)
    text = data.draw(
        st.one_of(
            text_with_actions(list(env.action_names)),
            st.none(),
            st.integers(),
            st.binary(max_size=10),
        )
    )
    parsed = env.parse_action(env.agent_selection, text)
    assert isinstance(parsed, InvalidAction) or (
        isinstance(parsed, int) and 0 <= parsed < len(env.action_names)
    )


# ----- stepping junk


class Exploding:
    """A caller object whose conversions and comparisons all raise."""

    def __int__(self) -> int:
        raise RuntimeError("no int")

    def __index__(self) -> int:
        raise RuntimeError("no index")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no eq")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def junk(env: TextGame, agent: str) -> st.SearchStrategy:
    """Values that are never a legal action of ``agent`` now."""
    n = len(env.action_names)
    legal = set(env.legal_actions(agent))
    illegal_in_range = [a for a in range(n) if a not in legal]
    options = [
        st.integers(max_value=-1),
        st.integers(min_value=n),
        st.integers(min_value=n, max_value=2**63 - 1).map(np.int64),
        st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: not f.is_integer()),
        st.none(),
        st.text(max_size=20),
        st.binary(max_size=8),
        st.complex_numbers(min_magnitude=1e-3),
        st.lists(st.integers(0, n), min_size=2, max_size=3).map(np.array),
        st.builds(Exploding),
        st.builds(object),
    ]
    if illegal_in_range:
        options.append(st.sampled_from(illegal_in_range))
    return st.one_of(options)


@pytest.mark.parametrize("name", GAMES)
@FUZZ
@given(data=st.data())
def test_junk_steps_never_raise_nor_corrupt(name, data):
    retries = data.draw(st.integers(0, 2), label="max_retries")
    env = fresh(name, seed=data.draw(st.integers(0, 1000), label="seed"), max_retries=retries)
    check_invariants(env)
    for _ in range(data.draw(st.integers(1, 25), label="steps")):
        if game_over(env):
            break
        agent = env.agent_selection
        if data.draw(st.booleans(), label="legal move"):
            action = data.draw(st.sampled_from(env.legal_actions(agent)), label="legal")
            env.step(data.draw(st.sampled_from([action, np.int64(action)]), label="as"))
        else:
            before = {a: env.observe(a)["observation"] for a in env.agents}
            count = env.infos[agent]["illegal_moves"]
            env.step(data.draw(junk(env, agent), label="junk"))
            assert env.infos[agent]["illegal_moves"] == count + 1
            if env.infos[agent]["forfeit"]:
                assert count + 1 > retries and (env.terminations[agent] or env.truncations[agent])
            else:
                assert env.agent_selection == agent and env.infos[agent].get("warning")
                for a, obs in before.items():
                    np.testing.assert_array_equal(env.observe(a)["observation"], obs)
        check_invariants(env)
    while env.agents and game_over(env):  # the dead steps that end every episode
        env.step(None)
        check_invariants(env)


# ----- bots


@pytest.mark.parametrize("name, bot", [(g, b) for g in GAMES for b in bot_names(g)])
def test_bots_play_legal_moves_in_reachable_states(name, bot):
    """Every registered bot, asked at every turn of random games, names a legal move."""
    rng = np.random.default_rng(0)
    for seed in range(3):
        env = fresh(name, seed=seed)
        player = make_bot(name, bot, seed=seed)
        while not game_over(env):
            agent = env.agent_selection
            legal = env.legal_actions(agent)
            assert player.act(env, agent) in legal
            env.step(int(rng.choice(legal)))


# ----- cloning


@pytest.mark.parametrize("name", GAMES)
def test_clone_is_independent(name):
    env = fresh(name, seed=3)
    agent, legal = env.agent_selection, env.legal_actions()
    before = env.observe(agent)
    twin = env.clone()
    assert twin.state_key() == env.state_key()
    twin.step(legal[0])
    after = env.observe(agent)
    assert env.agent_selection == agent and env.legal_actions() == legal
    np.testing.assert_array_equal(after["observation"], before["observation"])
    assert after["text"] == before["text"]
