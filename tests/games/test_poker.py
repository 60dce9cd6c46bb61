"""Kuhn and Leduc poker: rules, text interface, exact analysis and CFR against known values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from marl import games
from marl.games import analysis, cfr
from marl.games.base import InvalidAction
from marl.games.bots import bot_names, make_bot
from marl.games.game_tree import CHANCE, TERMINAL
from marl.games.poker import BET, CALL, CHECK, FOLD, RAISE

POKER = ["kuhn_poker", "leduc_poker"]
LEDUC_NASH_VALUE = -0.085606424078


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Keep CFR cache files out of the user's home."""
    monkeypatch.setenv("MARL_HOME", str(tmp_path))


def always_pass(key: str, legal: list[int]) -> dict[int, float]:
    return {CHECK if CHECK in legal else FOLD: 1.0}


# ----- known values of the games (uniform-policy NashConv, Leduc's game value) -----------------


def test_kuhn_uniform_nash_conv():
    assert analysis.nash_conv("kuhn_poker", analysis.uniform_policy) == pytest.approx(
        11 / 12, abs=1e-9
    )
    assert analysis.exploitability("kuhn_poker", analysis.uniform_policy) == pytest.approx(
        11 / 24, abs=1e-9
    )


def test_kuhn_always_pass_nash_conv_as_callable_and_table():
    table = analysis.to_table("kuhn_poker", always_pass)
    assert analysis.nash_conv("kuhn_poker", always_pass) == pytest.approx(2.0, abs=1e-9)
    assert analysis.nash_conv("kuhn_poker", table) == pytest.approx(2.0, abs=1e-9)


def test_leduc_uniform_nash_conv():
    assert analysis.nash_conv("leduc_poker", analysis.uniform_policy) == pytest.approx(
        4.7472222, abs=1e-6
    )


def test_kuhn_has_twelve_info_states():
    states = analysis.info_states("kuhn_poker")
    assert len(states) == 12
    assert {k for k, _, _ in states} == {f"{c}:{h}" for c in "JQK" for h in ("", "c", "b", "cb")}
    by_key = {k: (p, legal) for k, p, legal in states}
    assert by_key["K:"] == (0, [CHECK, BET])
    assert by_key["K:b"] == (1, [CALL, FOLD])
    assert by_key["J:cb"] == (0, [CALL, FOLD])


def test_policy_value_is_zero_sum_and_symmetric_cards():
    v0, v1 = analysis.policy_value("kuhn_poker", analysis.uniform_policy, always_pass)
    assert v0 + v1 == pytest.approx(0.0, abs=1e-12)
    # always-pass player_1 folds to every bet (+1 for player_0, who bets half the time) and
    # checks behind otherwise: a showdown between random cards, worth 0 on average
    assert v0 == pytest.approx(0.5, abs=1e-12)


def test_policy_validation():
    with pytest.raises(ValueError, match="illegal"):
        analysis.nash_conv("kuhn_poker", lambda k, legal: {RAISE: 1.0})
    with pytest.raises(ValueError, match="distribution"):
        analysis.nash_conv("kuhn_poker", lambda k, legal: {legal[0]: 0.7})
    with pytest.raises(KeyError):
        analysis.nash_conv("kuhn_poker", {"K:": {CHECK: 1.0}})
    with pytest.raises(KeyError, match="unknown game"):
        analysis.info_states("no_such_game")


# ----- CFR -------------------------------------------------------------------------------------


def test_cfr_kuhn_reaches_nash_and_caches_json(tmp_path):
    policy = cfr.solve("kuhn_poker", 200)
    assert analysis.exploitability("kuhn_poker", policy) <= 1e-3
    v0, _ = analysis.policy_value("kuhn_poker", policy, policy)
    assert v0 == pytest.approx(-1 / 18, abs=1e-3)
    path = tmp_path / "cache" / "kuhn_poker_cfr+_200.json"
    data = json.loads(path.read_text())
    assert data["game"] == "kuhn_poker" and data["iterations"] == 200
    assert not list(path.parent.glob("*.tmp"))
    assert cfr.solve("kuhn_poker", 200) == policy  # read back from the cache


def test_cfr_kuhn_policy_is_in_the_known_nash_family():
    """Kuhn's equilibria: player_0 bluffs J with alpha in [0, 1/3] and bets K with 3 alpha;
    player_1 calls a bet with Q 1/3 of the time and bluffs J after a check 1/3 of the time."""
    p = cfr.solve("kuhn_poker", 1000)
    alpha = p["J:"][BET]
    assert -1e-3 <= alpha <= 1 / 3 + 1e-3
    assert p["K:"][BET] == pytest.approx(3 * alpha, abs=0.02)
    assert p["Q:cb"][CALL] == pytest.approx(alpha + 1 / 3, abs=0.02)
    assert p["Q:b"][CALL] == pytest.approx(1 / 3, abs=0.02)
    assert p["J:c"][BET] == pytest.approx(1 / 3, abs=0.02)
    assert p["K:b"][CALL] == pytest.approx(1.0, abs=1e-3)
    assert p["J:b"][FOLD] == pytest.approx(1.0, abs=1e-3)


def test_vanilla_cfr_kuhn_converges():
    early = analysis.exploitability("kuhn_poker", cfr.solve("kuhn_poker", 20, plus=False))
    late = analysis.exploitability("kuhn_poker", cfr.solve("kuhn_poker", 400, plus=False))
    assert late < early / 3 and late < 0.02


def test_cfr_leduc_exploitability_drops():
    uniform = analysis.exploitability("leduc_poker", analysis.uniform_policy)
    policy = cfr.solve("leduc_poker", 200)
    expl = analysis.exploitability("leduc_poker", policy)
    assert expl < 0.01 and expl < uniform / 100
    v0, v1 = analysis.policy_value("leduc_poker", policy, policy)
    assert v0 == pytest.approx(LEDUC_NASH_VALUE, abs=2e-3)
    assert v0 + v1 == pytest.approx(0.0, abs=1e-12)


# ----- env and tree agree ----------------------------------------------------------------------


@pytest.mark.parametrize("game", POKER)
def test_env_matches_tree(game):
    """Random env games walk the exact tree: same player, info state, moves and payoffs."""
    tree = analysis.game_tree(game)
    env = games.make(game)
    rng = np.random.default_rng(0)
    for seed in range(150):
        env.reset(seed=seed)
        node, dealt = 0, 0
        for agent in env.agent_iter():
            while tree.player[node] == CHANCE:  # follow the cards the env has dealt so far
                node = tree.children[node][(env.state.private + env.state.public)[dealt]]
                dealt += 1
            obs, _, term, trunc, _ = env.last()
            if term or trunc:
                assert tree.player[node] == TERMINAL
                payoff = tree.utility[node][env.possible_agents.index(agent)]
                assert env._cumulative_rewards[agent] == pytest.approx(payoff)
                env.step(None)
                continue
            info = tree.infoset[node]
            assert env.possible_agents.index(agent) == tree.player[node]
            assert env.information_state(agent) == tree.infoset_keys[info]
            assert env.legal_actions(agent) == tree.infoset_actions[info]
            assert list(np.flatnonzero(obs["action_mask"])) == tree.infoset_actions[info]
            action = int(rng.choice(env.legal_actions(agent)))
            env.step(action)
            node = tree.children[node][action]


@pytest.mark.parametrize("game", POKER)
def test_tree_probabilities_sum_to_one(game):
    tree = analysis.game_tree(game)
    probs = tree.edge_probs(tree.uniform())
    reach = tree.reach(probs).prod(axis=1)
    assert reach[tree.player == TERMINAL].sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(tree.utility.sum(axis=1) == 0)


def play(env, bots: dict, seed: int) -> dict[str, float]:
    """One game; returns each agent's final payoff."""
    env.reset(seed=seed)
    final = {}
    for agent in env.agent_iter():
        _, reward, term, trunc, _ = env.last()
        if term or trunc:
            final[agent] = reward
        env.step(None if term or trunc else bots[agent].act(env, agent))
    return final


def test_env_monte_carlo_matches_policy_value():
    env = games.make("kuhn_poker")
    bots = {a: make_bot("kuhn_poker", "random", seed=i) for i, a in enumerate(env.agents)}
    payoffs = [play(env, bots, seed)["player_0"] for seed in range(1000)]
    exact, _ = analysis.policy_value("kuhn_poker", analysis.uniform_policy, analysis.uniform_policy)
    assert abs(np.mean(payoffs) - exact) < 4 * np.std(payoffs) / np.sqrt(len(payoffs))


def reference_action_values(game: str, table: dict) -> dict[str, dict[int, float]]:
    """Q(I, a) by plain recursion over the game: each history's weight is chance's and the
    opponent's reach, its value after a the mean payoff below it."""

    def value(st) -> np.ndarray:
        if st.is_terminal:
            return np.asarray(st.returns(), dtype=float)
        if st.is_chance:
            return sum(p * value(st.apply(a)) for a, p in st.chance_outcomes())
        row = table[st.info_key(st.current_player)]
        return sum(row[a] * value(st.apply(a)) for a in st.legal())

    num: dict = {}
    den: dict = {}

    def walk(st, weights: tuple[float, float]) -> None:
        if st.is_terminal:
            return
        if st.is_chance:
            for a, p in st.chance_outcomes():
                walk(st.apply(a), (weights[0] * p, weights[1] * p))
            return
        i = st.current_player
        key, row = st.info_key(i), table[st.info_key(i)]
        for a in st.legal():
            num.setdefault(key, {}).setdefault(a, 0.0)
            num[key][a] += weights[i] * value(st.apply(a))[i]
            den.setdefault(key, {}).setdefault(a, 0.0)
            den[key][a] += weights[i]
            # the mover's own probability weighs the other player's view only
            nxt = list(weights)
            nxt[1 - i] *= row[a]
            walk(st.apply(a), (nxt[0], nxt[1]))

    walk(games.make(game).root_state(), (1.0, 1.0))
    return {k: {a: num[k][a] / den[k][a] for a in num[k]} for k in num}


@pytest.mark.parametrize("game", POKER)
def test_state_action_values_match_a_plain_recursion(game):
    rng = np.random.default_rng(3)
    table = {}
    for key, _, legal in analysis.info_states(game):
        p = rng.dirichlet(np.ones(len(legal)))
        table[key] = {a: float(x) for a, x in zip(legal, p, strict=True)}
    q = analysis.state_action_values(game, table)
    want = reference_action_values(game, table)
    assert q.keys() == want.keys()
    for key in q:
        assert q[key] == pytest.approx(want[key], abs=1e-9), key


def test_kuhn_action_values_by_hand():
    q = analysis.state_action_values("kuhn_poker", analysis.uniform_policy)
    assert q["K:b"] == pytest.approx({CALL: 2.0, FOLD: -1.0})  # K wins every showdown
    assert q["J:b"] == pytest.approx({CALL: -2.0, FOLD: -1.0})
    # Q at K:cb: calling wins 2 against the J or Q that bet
    assert q["K:cb"][CALL] == pytest.approx(2.0)


# ----- text interface --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[Bet]", BET),
        ("bet", BET),
        ("\\boxed{bet}", BET),
        ("  BET. ", BET),
        ("I could check, but I choose [Bet]", BET),
        ("[Check] ... final answer: [Fold]", FOLD),
    ],
)
def test_parse_action_accepts(text, expected):
    assert games.make("kuhn_poker").parse_action("player_0", text) == expected


@pytest.mark.parametrize("text", ["I will BET", "[Raise]", "[Allin]", ""])
def test_parse_action_rejects_free_text_and_unknown_moves(text):
    """Free prose is refused rather than guessed ('I will not bet' would read as a bet)."""
    assert isinstance(games.make("kuhn_poker").parse_action("player_0", text), InvalidAction)


def test_leduc_parses_raise():
    assert games.make("leduc_poker").parse_action("player_1", "\\boxed{Raise}") == RAISE


def test_illegal_move_retry_then_forfeit():
    env = games.make("kuhn_poker", max_retries=1)
    env.reset(seed=0)
    env.step(CALL)  # nothing to call at the start
    assert env.agent_selection == "player_0"
    assert env.infos["player_0"]["illegal_moves"] == 1
    assert "Warning" in env.observe("player_0")["text"]
    env.step(CALL)
    assert env.infos["player_0"]["forfeit"]
    assert all(env.terminations.values())
    assert env.rewards == {"player_0": -1.0, "player_1": 1.0}


def test_kuhn_text_makes_the_card_salient():
    env = games.make("kuhn_poker")
    env.reset(seed=1)
    card = "JQK"[env.state.private[0]]
    text = env.observe("player_0")["text"]
    phrase = {"J": "the lowest card", "Q": "the middle card", "K": "the highest card"}[card]
    assert f"Your card: {card} ({phrase})." in text
    assert "Legal moves: [Check] [Bet]" in text
    env.step(BET)
    text = env.observe("player_1")["text"]
    assert "Betting: opponent bet." in text and "To call you must add 1 chip." in text
    assert env.information_state("player_1") == "JQK"[env.state.private[1]] + ":b"
    env.step(FOLD)
    assert "Hand over: You folded; you lose 1 chip." in env.observe("player_1")["text"]


def test_leduc_round_two_shows_public_card_and_pair():
    env = games.make("leduc_poker")
    for seed in range(50):
        env.reset(seed=seed)
        env.step(CHECK)
        env.step(CHECK)
        s = env.state
        if s.private[0] == s.public[0]:
            break
    card = "JQK"[s.private[0]]
    text = env.observe("player_0")["text"]
    assert f"You have a PAIR of {card}" in text and "Round 2 betting: no actions yet." in text
    assert env.information_state("player_0") == f"{card}|{card}:cc/"
    env.step(BET)
    assert env.legal_actions("player_1") == [CALL, FOLD, RAISE]
    assert env.state.contrib == (5, 1)


# ----- bots ------------------------------------------------------------------------------------


@pytest.mark.parametrize("game", POKER)
def test_bots_registered(game):
    assert {"random", "heuristic", "optimal"} <= set(bot_names(game))


def test_optimal_bot_plays_the_cfr_policy():
    bot = make_bot("kuhn_poker", "optimal", seed=0, iterations=200)
    env = games.make("kuhn_poker")
    env.reset(seed=0)
    key = env.information_state("player_0")
    assert bot.action_probs(env, "player_0") == cfr.solve("kuhn_poker", 200)[key]
    assert bot.act(env, "player_0") in env.legal_actions("player_0")


@pytest.mark.parametrize("game", POKER)
def test_heuristic_beats_uniform_in_both_seats(game):
    heuristic = make_bot(game, "heuristic").policy
    as_first, _ = analysis.policy_value(game, heuristic, analysis.uniform_policy)
    _, as_second = analysis.policy_value(game, analysis.uniform_policy, heuristic)
    assert as_first > 0.1 and as_second > 0.1
    expl = analysis.exploitability(game, heuristic)
    assert 0 < expl < analysis.exploitability(game, analysis.uniform_policy)


@pytest.mark.parametrize("game", POKER)
def test_heuristic_bot_plays_its_table(game):
    env = games.make(game)
    bot = make_bot(game, "heuristic")
    bots = dict.fromkeys(env.possible_agents, bot)
    for seed in range(30):
        env.reset(seed=seed)
        for agent in env.agent_iter():
            _, _, term, trunc, _ = env.last()
            if term or trunc:
                env.step(None)
                continue
            probs = bot.action_probs(env, agent)
            assert probs == bot.policy(env.information_state(agent), env.legal_actions(agent))
            env.step(bots[agent].act(env, agent))


def test_poker_public_state_hides_only_the_own_card() -> None:
    env = games.make("kuhn_poker")
    env.reset(seed=3)
    env.step(env.legal_actions()[0])
    who = env.agent_selection
    info, public = env.information_state(who), env.public_state(who)
    assert public == "?" + info[1:] and info[0] in "JQK" and "?" not in info
    assert games.make("tic_tac_toe").public_state("player_0") is None
