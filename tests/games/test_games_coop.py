"""Cooperative tasks, negotiation and the PettingZoo adapter: optima, generators, grading."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.test import api_test, seed_test

from marl import games
from marl.games import registry
from marl.games.base import InvalidAction
from marl.games.bots import make_bot
from marl.games.external import from_pettingzoo, register_external, summarize_array
from marl.games.negotiation import Negotiation, compatible
from marl.games.referential import LEVELS as REF_LEVELS
from marl.games.referential import Referential
from marl.games.referential import generate as referential_task
from marl.games.split_arithmetic import LEVELS as ARITH_LEVELS
from marl.games.split_arithmetic import SplitArithmetic, answer_bounds, evaluate
from marl.games.split_arithmetic import generate as arithmetic_task
from marl.games.tasks import Task, final_integer, make_task, task_names
from marl.games.tiny_hanabi import (
    N_ACTIONS,
    N_CARDS,
    TinyHanabi,
    expected_payoff,
    optimal_policy,
    payoff_table,
)


def play(env, bots, seed=None, options=None) -> dict[str, float]:
    """Run one game; ``bots`` maps agent -> bot.  Returns each agent's total reward."""
    env.reset(seed=seed, options=options)
    total = dict.fromkeys(env.possible_agents, 0.0)
    for agent in env.agent_iter(max_iter=1000):
        _, reward, term, trunc, _ = env.last()
        total[agent] += reward
        env.step(None if term or trunc else bots[agent].act(env, agent))
    return total


def team(game: str, bot: str, env) -> dict:
    return {a: make_bot(game, bot, seed=i) for i, a in enumerate(env.possible_agents)}


# ----- referential
@pytest.mark.parametrize("difficulty", range(len(REF_LEVELS)))
def test_referential_optimal_protocol_always_wins_when_vocab_covers_candidates(difficulty):
    env = Referential(difficulty=difficulty)
    bots = team("referential", "optimal", env)
    for seed in range(40):
        assert play(env, bots, seed) == dict.fromkeys(env.possible_agents, 1.0)


def test_referential_short_vocab_and_colour_heuristic_fall_short_of_the_optimum():
    def mean_reward(env, bot):
        bots = team("referential", bot, env)
        return np.mean([play(env, bots, s)["receiver_0"] for s in range(200)])

    # K = 8 candidates but 4 symbols: the optimum is below 1, the protocol still beats chance.
    assert 1 / 8 < mean_reward(Referential(difficulty=4, vocab_size=4), "optimal") < 1.0
    assert 1 / 8 < mean_reward(Referential(difficulty=4), "heuristic") < 1.0


def test_referential_generator_is_deterministic_and_difficulty_grows_the_scene():
    assert referential_task(7, 3) == referential_task(7, 3)
    assert referential_task(7, 3) != referential_task(8, 3)
    sizes = [
        (len(referential_task(0, d).candidates), len(referential_task(0, d).attributes))
        for d in range(len(REF_LEVELS))
    ]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    task = referential_task(3, 6)
    assert len(set(task.candidates)) == len(task.candidates) == 16
    assert sorted(task.receiver_order) == list(range(16))


def test_referential_task_scores_free_text_by_number_or_description():
    task = referential_task(11, 2)
    right = task.answer
    wrong = right % len(task.candidates) + 1
    target = " ".join(task.candidates[task.target])
    assert task.score(f"I pick \\boxed{{{right}}}") == 1.0
    assert task.score(f"Object {wrong}? No: {right}") == 1.0
    assert task.score(f"It must be the {target}.") == 1.0
    assert task.score(f"\\boxed{{{wrong}}}") == 0.0
    assert task.score("no idea") == 0.0
    assert target in task.private_views["sender_0"]
    assert target in task.private_views["receiver_0"]
    assert "target" not in task.private_views["receiver_0"].lower()


def test_referential_env_replays_a_given_task_and_hides_the_target_from_the_receiver():
    env = Referential(difficulty=2)
    task = referential_task(5, 2)
    env.reset(options={"task": task})
    assert env.task is task
    receiver_text = env.observe("receiver_0")["text"]
    assert "The target is" not in receiver_text and "not sent yet" in receiver_text
    assert env.observe("sender_0")["action_mask"].sum() == len(env.vocab)
    assert env.observe("receiver_0")["action_mask"].sum() == 0


# ----- tiny hanabi
def exact_team_value(bot_name: str) -> float:
    """Expected payoff with chance enumerated through the env's ``cards`` option."""
    env = TinyHanabi()
    bots = team("tiny_hanabi", bot_name, env)
    returns = [
        play(env, bots, options={"cards": cards})
        for cards in itertools.product(range(N_CARDS), repeat=2)
    ]
    assert all(r["player_0"] == r["player_1"] for r in returns)
    return float(np.mean([r["player_0"] for r in returns]))


def test_tiny_hanabi_optimal_bot_reaches_exactly_10_and_the_greedy_one_8():
    assert exact_team_value("optimal") == 10.0
    assert exact_team_value("heuristic") == 8.0


def test_tiny_hanabi_optimum_is_10_over_every_joint_deterministic_policy():
    table = payoff_table()
    p0s = list(itertools.product(range(N_ACTIONS), repeat=N_CARDS))  # action per card
    replies = list(itertools.product(range(N_ACTIONS), repeat=N_ACTIONS))  # per action0
    p1s = list(itertools.product(replies, repeat=N_CARDS))  # per card1
    best = max(expected_payoff(table, (p0, p1)) for p0 in p0s for p1 in p1s)
    assert best == 10.0 == optimal_policy()[1]


def test_tiny_hanabi_players_see_only_their_own_card():
    env = TinyHanabi()
    env.reset(options={"cards": (0, 1)})
    obs0, obs1 = env.observe("player_0")["observation"], env.observe("player_1")["observation"]
    assert obs0[:N_CARDS].tolist() == [1, 0] and obs1[:N_CARDS].tolist() == [0, 1]
    assert "Your card is 1" in env.observe("player_0")["text"]
    env.step(2)
    assert "player_0 played C" in env.observe("player_1")["text"]


# ----- split arithmetic
@pytest.mark.parametrize("difficulty", range(len(ARITH_LEVELS)))
@pytest.mark.parametrize("n_agents", [2, 3, 5])
def test_split_arithmetic_optimal_team_is_always_correct(difficulty, n_agents):
    env = SplitArithmetic(difficulty=difficulty, n_agents=n_agents)
    bots = team("split_arithmetic", "optimal", env)
    lo, hi = answer_bounds(difficulty, n_agents)
    for seed in range(30):
        assert play(env, bots, seed) == dict.fromkeys(env.possible_agents, 1.0)
        assert lo <= env.task.answer <= hi


def test_split_arithmetic_generator_is_deterministic_and_varies_with_difficulty():
    assert arithmetic_task(3, 2, 4) == arithmetic_task(3, 2, 4)
    assert len({arithmetic_task(s, 1, 3) for s in range(20)}) == 20
    for difficulty, lv in enumerate(ARITH_LEVELS):
        tasks = [arithmetic_task(s, difficulty, 4) for s in range(200)]
        assert max(max(t.terms) for t in tasks) == lv.max_operand
        assert set(itertools.chain(*(t.ops for t in tasks))) == set(lv.ops)
        assert all(t.ops.count("*") <= lv.max_mul for t in tasks)
    assert evaluate((2, 3, 4), ("+", "*")) == 14 and evaluate((2, 3, 4), ("*", "-")) == 2
    assert evaluate((9, 2, 3, 1), ("-", "*", "+")) == 4


def test_split_arithmetic_task_views_and_free_text_score():
    task = arithmetic_task(0, 3, 3)
    for i, (agent, term) in enumerate(zip(task.agents, task.terms, strict=True)):
        assert f"x{i + 1} = {term}" in task.private_views[agent]
    assert task.answerer == "agent_2" and task.expression in task.question
    answer = task.answer
    assert task.score(f"So {answer - 1}? No: the answer is \\boxed{{{answer}}}") == 1.0
    assert task.score(str(answer)) == 1.0
    assert task.score("banana") == 0.0
    assert task.score(f"\\boxed{{{answer + 1}}}") == 0.0


def test_split_arithmetic_parses_bare_and_boxed_numbers_by_role():
    env = SplitArithmetic(difficulty=2)
    env.reset(seed=1)
    assert env.parse_action("agent_0", "I have 7") == env.say_action(7)
    assert env.parse_action("agent_2", "\\boxed{-12}") == env.answer_action(-12)
    assert env.parse_action("agent_2", "[answer 12]") == env.answer_action(12)
    assert isinstance(env.parse_action("agent_0", "[say 99]"), InvalidAction)


def test_split_arithmetic_answerer_sees_the_answer_range_not_a_list():
    env = SplitArithmetic(difficulty=3)
    env.reset(seed=0)
    env.step(env.say_action(1))
    env.step(env.say_action(2))
    text = env.observe("agent_2")["text"]
    assert text.endswith("[answer N] for an integer N from -400 to 420")
    assert "agent_0 said 1." in text and "agent_1 said 2." in text


@pytest.mark.parametrize(
    "text,value",
    [
        ("The answer is \\boxed{42}", 42),
        ("42", 42),
        ("x2 = 7, so -3", -3),
        ("1,234 apples", 1234),
        ("\\boxed{7} then 9", 7),
        ("it is 3.5", None),
        ("42.0", 42),
        ("10-3", 3),
        ("nothing", None),
        (None, None),
        ("agent_2", None),
    ],
)
def test_final_integer(text, value):
    assert final_integer(text) == value


def test_task_protocol_and_registry():
    assert {"referential", "split_arithmetic"} <= set(task_names())
    for name in ("referential", "split_arithmetic"):
        task = make_task(name, seed=4, difficulty=1)
        assert isinstance(task, Task) and task == make_task(name, seed=4, difficulty=1)
        assert set(task.private_views) >= {task.answerer}
        assert task.score(f"\\boxed{{{task.answer}}}") == 1.0


@pytest.mark.parametrize("name", ["referential", "split_arithmetic", "tiny_hanabi"])
def test_cooperative_forfeit_costs_the_whole_team(name):
    env = games.make(name, max_retries=1)
    env.reset(seed=0)
    first, illegal = env.agent_selection, len(env.action_names)
    env.step(illegal)
    assert not any(env.terminations.values()) and "Warning" in env.observe(first)["text"]
    env.step(illegal)
    assert all(env.terminations.values()) and env.infos[first]["forfeit"]
    assert set(env.rewards.values()) == {-1.0}


# ----- negotiation
def test_negotiation_rewards_are_the_normalised_values_of_a_partition():
    env = Negotiation()
    deals = 0
    for seed, (b0, b1) in zip(
        range(90), itertools.cycle(itertools.product(["random", "heuristic", "bayesian"], repeat=2))
    ):
        bots = {
            "player_0": make_bot("negotiation", b0, seed=seed),
            "player_1": make_bot("negotiation", b1, seed=seed),
        }
        totals = play(env, bots, seed)
        v0, v1 = env.values["player_0"], env.values["player_1"]
        assert env.counts @ v0 == env.counts @ v1 == 10 and compatible(v0, v1)
        assert len(env.history) <= env.max_proposals + 1
        if env.outcome is None:
            assert totals == {"player_0": 0.0, "player_1": 0.0}
            continue
        deals += 1
        got0, got1 = env.outcome["player_0"], env.outcome["player_1"]
        assert (got0 + got1 == env.counts).all() and (got0 >= 0).all() and (got1 >= 0).all()
        assert totals == pytest.approx({"player_0": got0 @ v0 / 10, "player_1": got1 @ v1 / 10})
    assert deals >= 45


def test_negotiation_generator_is_deterministic_per_seed():
    a, b = Negotiation(), Negotiation()
    a.reset(seed=3)
    b.reset(seed=3)
    assert (a.counts == b.counts).all() and a.observe("player_1")["text"] == b.observe("player_1")[
        "text"
    ]
    pools = set()
    for seed in range(30):
        a.reset(seed=seed)
        pools.add((tuple(a.counts), tuple(a.values["player_0"]), tuple(a.values["player_1"])))
    assert len(pools) > 25


def test_negotiation_bayesian_bot_out_earns_the_heuristic():
    """Decisively as second mover (it holds the final ultimatum), and over both seats."""
    env = Negotiation()
    seeds = range(60)

    def mean(b0, b1):
        bots = {"player_0": make_bot("negotiation", b0), "player_1": make_bot("negotiation", b1)}
        return np.mean([list(play(env, bots, s).values()) for s in seeds], axis=0)

    baseline = mean("heuristic", "heuristic")
    first, second = mean("bayesian", "heuristic")[0], mean("heuristic", "bayesian")[1]
    assert second > baseline[1] + 0.15
    assert first + second > baseline.sum()


def test_negotiation_text_hides_the_partner_values_and_offers_compact_moves():
    env = Negotiation()
    env.reset(seed=2)
    env.step(env.feasible[0])
    text = env.observe("player_1")["text"]
    own = ", ".join(
        f"{n} {v}" for n, v in zip(env.item_names, env.values["player_1"].tolist(), strict=True)
    )
    theirs = ", ".join(
        f"{n} {v}" for n, v in zip(env.item_names, env.values["player_0"].tolist(), strict=True)
    )
    assert own in text and (theirs == own or theirs not in text)
    assert "Offer on the table" in text and "[Accept] [No deal]" in text
    assert env.parse_action("player_1", "[propose 0 1 0]") == env.action_names.index(
        "propose 0 1 0"
    )


# ----- PettingZoo adapter
tictactoe_v3 = pytest.importorskip("pettingzoo.classic.tictactoe_v3")


def test_adapter_passes_pettingzoo_api_and_seed_tests_on_tictactoe():
    env = from_pettingzoo(tictactoe_v3.env, name="pz_tictactoe")
    api_test(env, num_cycles=200)
    seed_test(lambda: from_pettingzoo(tictactoe_v3.env()), num_cycles=200)
    env.reset(seed=0)
    obs = env.observe("player_1")
    assert obs["action_mask"].tolist() == [1] * 9
    assert "Legal moves: [0] [1] [2] [3] [4] [5] [6] [7] [8]" in obs["text"]
    assert env.parse_action("player_1", "I play [4]") == 4


def test_adapter_plays_to_the_wrapped_result_and_names_actions():
    names = [f"{r}{c}" for r in "abc" for c in "123"]
    env = from_pettingzoo(tictactoe_v3.env, action_names=names)
    env.reset(seed=0)
    for move in ["a1", "b1", "a2", "b2", "a3"]:  # player_1 completes the top row
        env.step(env.parse_action(env.agent_selection, f"[{move}]"))
    assert all(env.terminations.values())
    assert env._cumulative_rewards == {"player_1": 1.0, "player_2": -1.0}
    assert "The game is over." in env.observe("player_1")["text"]


def test_adapter_retries_then_forfeits_illegal_moves_without_touching_the_wrapped_env():
    env = from_pettingzoo(tictactoe_v3.env, max_retries=1)
    env.reset(seed=0)
    env.step(4)
    env.step(4)  # occupied: warned
    assert "Warning" in env.observe("player_2")["text"] and not any(env.terminations.values())
    env.step(4)  # again: forfeit
    assert env.rewards == {"player_1": 1.0, "player_2": -1.0} and env.infos["player_2"]["forfeit"]
    assert env.inner.unwrapped.board.squares.count(0) == 8


def test_adapter_copies_replay_the_game_so_they_are_independent():
    env = from_pettingzoo(tictactoe_v3.env)
    env.reset(seed=0)
    env.step(4)
    twin = copy.deepcopy(env)
    twin.step(0)
    assert env.inner.unwrapped.board.squares == [0, 0, 0, 0, 1, 0, 0, 0, 0]
    assert twin.inner.unwrapped.board.squares == [2, 0, 0, 0, 1, 0, 0, 0, 0]
    assert env.agent_selection == "player_2" and twin.agent_selection == "player_1"
    assert twin.observe("player_1")["action_mask"].tolist() == [0, 1, 1, 1, 0, 1, 1, 1, 1]


def test_register_external_makes_games_make_work(monkeypatch):
    monkeypatch.setattr(registry, "_GAMES", dict(registry._GAMES))
    register_external("pz_tictactoe", tictactoe_v3.env, max_retries=2)
    env = games.make("pz_tictactoe")
    assert "pz_tictactoe" in games.names() and env.max_retries == 2
    assert env.metadata["name"] == "pz_tictactoe"


class _Relay(AECEnv):
    """A tiny masked env where player_0 leaves after one move and player_1 plays on twice."""

    metadata = {"name": "relay_v0", "is_parallelizable": False, "render_modes": []}

    def __init__(self):
        super().__init__()
        self.possible_agents = ["player_0", "player_1"]
        obs = spaces.Dict(
            {
                "observation": spaces.Box(0, 3, (1,), np.int8),
                "action_mask": spaces.Box(0, 1, (2,), np.int8),
            }
        )
        self._obs = {a: obs for a in self.possible_agents}
        self._act = {a: spaces.Discrete(2) for a in self.possible_agents}

    def observation_space(self, agent):
        return self._obs[agent]

    def action_space(self, agent):
        return self._act[agent]

    def observe(self, agent):
        mask = np.array([1, agent == "player_1"], dtype=np.int8)
        return {"observation": np.array([self.moves], dtype=np.int8), "action_mask": mask}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.moves = 0
        self.rewards = dict.fromkeys(self.agents, 0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = "player_0"

    def step(self, action):
        if self.terminations[self.agent_selection]:
            self._was_dead_step(action)
            return
        agent = self.agent_selection
        self.moves += 1
        self._clear_rewards()
        self.rewards[agent] = 1
        self.terminations[agent] = agent == "player_0" or self.moves == 3
        self.agent_selection = "player_1"
        self._accumulate_rewards()
        self._deads_step_first()


def test_adapter_forwards_dead_steps_when_an_agent_leaves_early():
    api_test(from_pettingzoo(_Relay), num_cycles=20)
    env = from_pettingzoo(_Relay)
    env.reset(seed=0)
    order = []
    for agent in env.agent_iter(max_iter=20):
        _, _, term, trunc, _ = env.last()
        order.append((agent, term))
        env.step(None if term or trunc else 0)
    assert order[0] == ("player_0", False) and order[-1] == ("player_1", True)
    assert not env.agents and env.inner.moves == 3


def test_summarize_array_switches_to_sparse_listing_for_big_arrays():
    assert summarize_array(np.eye(2)) == "array of shape 2x2: [[1.,0.], [0.,1.]]"
    big = np.zeros((50, 50))
    big[3, 4] = 2
    assert summarize_array(big) == "array of shape 50x50 with 1 non-zero entries: (3, 4)=2"
