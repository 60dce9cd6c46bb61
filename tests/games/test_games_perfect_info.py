"""Tic-tac-toe, Connect Four and Nim: rules, bots and exact values against known results."""

from __future__ import annotations

import functools
import itertools
import random

import pytest

from marl import games
from marl.games.bots import Bot, RandomBot, make_bot
from marl.games.connect_four import ConnectFour, geometry, solver
from marl.games.nim import Nim, nim_sum
from marl.games.perfect_info import best_response_value, minimax_value
from marl.games.tictactoe import TicTacToe


def play(env: games.TextGame, bots: dict[str, Bot], seed: int) -> dict[str, float]:
    """One game from ``reset(seed)``; each player's total reward."""
    env.reset(seed=seed)
    totals = dict.fromkeys(env.possible_agents, 0.0)
    while not all(env.terminations.values()):
        agent = env.agent_selection
        env.step(bots[agent].act(env, agent))
        for a, r in env.rewards.items():
            totals[a] += r
    return totals


def results_vs_random(env: games.TextGame, bot: Bot, games_per_seat: int) -> dict[float, int]:
    """How often ``bot`` wins (1), draws (0) and loses (-1) against uniform random play."""
    counts = {1.0: 0, 0.0: 0, -1.0: 0}
    for seat, seed in itertools.product(env.possible_agents, range(games_per_seat)):
        other = next(a for a in env.possible_agents if a != seat)
        totals = play(env, {seat: bot, other: RandomBot(seed=seed)}, seed)
        counts[totals[seat]] += 1
    return counts


# ----- tic-tac-toe


def test_tictactoe_has_5478_reachable_positions():
    """The known count, found by exploring the environment itself (not a separate model)."""
    env = TicTacToe()
    env.reset(seed=0)
    seen, frontier = {env.state_key()}, [env]
    while frontier:
        node = frontier.pop()
        for action in node.legal_actions():
            child = node.clone()
            child.step(action)
            if child.state_key() not in seen:
                seen.add(child.state_key())
                frontier.append(child)
    assert len({board for board, _, _ in seen}) == 5478


def test_tictactoe_text_shows_the_readers_mark_and_parses_brackets():
    env = TicTacToe()
    env.reset(seed=0)
    env.step(4)
    assert "You play X" in env.observe("player_0")["text"]
    text = env.observe("player_1")["text"]
    assert "You play O" in text and "It is your turn" in text and " X " in text
    assert "[4]" not in text.split("Legal moves:")[1]
    assert env.parse_action("player_1", "Centre is taken, so a corner: [0]") == 0
    assert env.parse_action("player_1", "\\boxed{8}") == 8


def test_tictactoe_win_and_draw_payoffs():
    env = TicTacToe()
    env.reset(seed=0)
    for cell in (0, 3, 1, 4, 2):  # X completes the top row
        env.step(cell)
    assert env.rewards == {"player_0": 1.0, "player_1": -1.0}
    env.reset(seed=0)
    for cell in (0, 1, 2, 4, 3, 5, 7, 6, 8):
        env.step(cell)
    assert all(env.terminations.values()) and env.rewards == {"player_0": 0.0, "player_1": 0.0}


def test_tictactoe_minimax_never_loses_to_random():
    counts = results_vs_random(TicTacToe(), make_bot("tic_tac_toe", "optimal", seed=0), 1000)
    assert counts[-1.0] == 0
    assert counts[1.0] >= 1700  # about 90%: random play blunders, and minimax punishes it


@pytest.mark.parametrize(
    "moves, expected",
    [
        ((0, 3, 1, 4), {2: 1.0}),  # X completes the top row
        ((0, 4, 1), {2: 1.0}),  # O blocks it
        ((0, 4, 8), {2: 0.5, 6: 0.5}),  # nothing to win or block, centre taken: a free corner
    ],
)
def test_tictactoe_heuristic_wins_blocks_then_prefers_corners(moves, expected):
    env = TicTacToe()
    env.reset(seed=0)
    for cell in moves:
        env.step(cell)
    assert make_bot("tic_tac_toe", "heuristic").action_probs(env, env.agent_selection) == expected


@pytest.mark.parametrize("seat", [0, 1])
def test_best_response_value_of_tictactoe_policies(seat):
    """Minimax guarantees the draw from either seat (so the game's value is 0); random play
    is beaten by a best responder."""
    optimal = make_bot("tic_tac_toe", "optimal").action_probs
    assert best_response_value("tic_tac_toe", optimal, seat) == 0.0
    assert best_response_value("tic_tac_toe", RandomBot().action_probs, seat) < -0.5


def test_best_response_value_refuses_hidden_information_and_illegal_policies():
    with pytest.raises(ValueError, match="perfect-information"):
        best_response_value("rps", lambda env, agent: {0: 1.0}, 0)
    with pytest.raises(ValueError, match="illegal"):
        best_response_value("tic_tac_toe", lambda env, agent: {9: 1.0}, 0)
    with pytest.raises(ValueError, match="sum"):
        best_response_value("tic_tac_toe", lambda env, agent: {4: 0.5}, 0)


# ----- Nim


NIM_POSITIONS = [(1, 3, 5, 7), (1, 2, 3), (2, 2), (3, 4, 5), (1, 1, 1), (4,), (0, 6, 7)]


@pytest.mark.parametrize("piles", NIM_POSITIONS)
def test_nim_exact_value_follows_the_xor_rule(piles):
    value = minimax_value(functools.partial(Nim, piles=piles), 0)
    assert value == (1.0 if nim_sum(piles) else -1.0)


@pytest.mark.parametrize("piles", [p for p in NIM_POSITIONS if nim_sum(p)])
@pytest.mark.parametrize("opponent", ["random", "heuristic", "optimal"])
def test_optimal_nim_wins_from_a_nonzero_xor(piles, opponent):
    env = Nim(piles=piles)
    for seed in range(20):
        bots = {
            "player_0": make_bot("nim", "optimal", seed=seed),
            "player_1": make_bot("nim", opponent, seed=seed),
        }
        assert play(env, bots, seed)["player_0"] == 1.0


def test_optimal_nim_wins_as_second_player_from_a_zero_xor():
    env = Nim(piles=(1, 3, 5, 7))
    for seed in range(20):
        bots = {
            "player_0": make_bot("nim", "heuristic", seed=seed),
            "player_1": make_bot("nim", "optimal", seed=seed),
        }
        assert play(env, bots, seed)["player_1"] == 1.0


def test_nim_actions_in_both_text_formats():
    env = Nim(piles=(1, 3, 5, 7))
    env.reset(seed=0)
    take_three = env.encode_action(1, 3)
    assert env.parse_action("player_0", "[pile 2 take 3]") == take_three
    assert env.parse_action("player_0", "I'll do [2:3].") == take_three
    assert env.decode_action(take_three) == (1, 3)
    assert isinstance(env.parse_action("player_0", "[5:1]"), games.InvalidAction)
    env.step(env.encode_action(0, 2))  # pile 1 holds only one object
    assert env.infos["player_0"]["forfeit"] and env.rewards["player_0"] == -1.0
    env.reset(seed=0)
    env.step(take_three)
    assert env.piles == [1, 0, 5, 7] and "pile 2: 0" in env.observe("player_1")["text"]


# ----- Connect Four


def test_connect_four_detects_lines_in_every_direction():
    for moves, winner in [
        ((0, 1, 0, 1, 0, 1, 0), "player_0"),  # vertical
        ((0, 0, 1, 1, 2, 2, 3), "player_0"),  # horizontal
        ((0, 1, 1, 2, 2, 3, 2, 3, 3, 6, 3), "player_0"),  # rising diagonal
        ((6, 5, 5, 4, 4, 3, 4, 3, 3, 0, 3), "player_0"),  # falling diagonal
    ]:
        env = ConnectFour()
        env.reset(seed=0)
        for col in moves:
            env.step(col)
        assert env.winner == winner and all(env.terminations.values()), moves


def test_connect_four_full_column_is_illegal_and_full_board_draws():
    env = ConnectFour(rows=3, cols=2, connect=3)  # only vertical lines fit
    env.reset(seed=0)
    for col in (0, 0, 1, 1, 0):
        env.step(col)
    assert env.legal_actions() == [1]
    env.step(1)
    assert env.winner is None and all(env.terminations.values())
    assert env.rewards == {"player_0": 0.0, "player_1": 0.0}
    assert "draw" in env.observe("player_0")["text"]


def test_connect_four_winning_cells_fast_path_matches_general():
    """On boards that obey gravity (stones never float), where the two may differ otherwise."""
    g = geometry(6, 7, 4)
    rng = random.Random(0)
    for _ in range(300):
        bits = mask = 0
        for col in range(g.cols):
            for row in range(rng.randint(0, g.rows)):
                cell = 1 << (col * g.height + row)
                mask |= cell
                bits |= cell if rng.random() < 0.5 else 0
        empty = g.board & ~mask
        assert g._winning_cells_4(bits) & empty == g._winning_cells_any(bits) & empty


@functools.cache
def brute_force(rows: int, cols: int, connect: int, cur: int, mask: int) -> int:
    """Plain negamax on the solver's score scale, no pruning: the oracle for the solver."""
    g = geometry(rows, cols, connect)
    moves, best = mask.bit_count(), None
    for col in range(cols):
        if not g.can_play(mask, col):
            continue
        stone = g.stone(mask, col)
        if g.has_line(cur | stone):
            value = g.size - moves
        elif moves + 1 == g.size:
            value = 0
        else:
            value = -brute_force(rows, cols, connect, cur ^ mask, mask | stone)
        best = value if best is None else max(best, value)
    return best


@pytest.mark.parametrize("rows, cols, connect", [(4, 4, 4), (3, 4, 3), (4, 3, 3)])
def test_connect_four_solver_matches_brute_force(rows, cols, connect):
    g = geometry(rows, cols, connect)
    rng = random.Random(rows * 100 + cols)
    checked = 0
    while checked < 150:
        cur = mask = 0
        for _ in range(rng.randint(g.size - 11, g.size - 1)):
            col = rng.choice([c for c in range(cols) if g.can_play(mask, c)])
            stone = g.stone(mask, col)
            if g.has_line(cur | stone):
                break
            cur, mask = cur ^ mask, mask | stone
        else:
            scores = solver(g).move_scores(cur, mask)
            for col, score in scores.items():
                stone = g.stone(mask, col)
                expected = (
                    g.size - mask.bit_count()
                    if g.has_line(cur | stone)
                    else 0
                    if mask.bit_count() + 1 == g.size
                    else -brute_force(rows, cols, connect, cur ^ mask, mask | stone)
                )
                assert score == expected
            best = max(scores.values())
            assert solver(g).best_moves(cur, mask) == sorted(
                c for c, score in scores.items() if score == best
            )
            checked += 1


def test_connect_four_solver_keeps_its_table_across_moves_and_starts_afresh_when_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The optimal bot's searches share one table per board size (a move's search reuses what
    the earlier ones proved); a table past its cap is cleared, not grown."""
    g = geometry(4, 5, 4)
    s = solver(g)
    assert solver(geometry(4, 5, 4)) is s
    s.table.clear()
    first = s.best_moves(0, 0)
    size = len(s.table)
    assert size > 0 and s.best_moves(0, 0) == first and len(s.table) == size
    monkeypatch.setattr(type(s), "MAX_ENTRIES", size - 1)
    stone = g.stone(0, first[0])
    s.best_moves(0, stone)  # O to move after X's stone: the search starts from an empty table
    assert 0 < len(s.table) < size


def test_connect_four_optimal_beats_random_on_4x5():
    env = ConnectFour(rows=4, cols=5)
    counts = results_vs_random(env, make_bot("connect_four", "optimal", seed=0), 15)
    assert counts[-1.0] == 0 and counts[1.0] >= 24


def test_connect_four_heuristic_wins_then_blocks():
    env = ConnectFour()
    env.reset(seed=0)
    for col in (3, 0, 3, 0, 3):  # X threatens the 4th stone on column 3
        env.step(col)
    heuristic = make_bot("connect_four", "heuristic")
    assert heuristic.action_probs(env, "player_1") == {3: 1.0}
    env.step(6)
    assert heuristic.action_probs(env, "player_0") == {3: 1.0}


def test_connect_four_optimal_plays_legal_moves_on_the_default_board():
    env = ConnectFour()
    bots = {
        a: make_bot("connect_four", "optimal", seed=i) for i, a in enumerate(env.possible_agents)
    }
    totals = play(env, bots, seed=0)
    assert sorted(totals.values()) in ([-1.0, 1.0], [0.0, 0.0])
    assert not any(env.infos[a]["illegal_moves"] for a in env.agents)


def test_outcomes_against_random_are_the_known_fractions() -> None:
    """Random against random tic-tac-toe: X wins 737/1260, draws 160/1260, loses 363/1260
    (the classic enumeration); a player who wins, blocks, then takes the centre and corners
    never loses as X; every decision position of X is reachable exactly once."""
    from marl.games.perfect_info import decision_positions, outcome_probabilities

    rand = make_bot("tic_tac_toe", "random").action_probs
    x = outcome_probabilities("tic_tac_toe", rand, "player_0", rand)
    o = outcome_probabilities("tic_tac_toe", rand, "player_1", rand)
    assert x == pytest.approx({"win": 737 / 1260, "draw": 160 / 1260, "loss": 363 / 1260})
    assert o == pytest.approx({"win": x["loss"], "draw": x["draw"], "loss": x["win"]})
    heur = make_bot("tic_tac_toe", "heuristic").action_probs
    assert outcome_probabilities("tic_tac_toe", heur, 0, rand)["loss"] == 0.0
    assert outcome_probabilities("tic_tac_toe", heur, 1, rand)["loss"] > 0  # forks beat it
    positions = decision_positions("tic_tac_toe", "player_0", rand)
    keys = [env.state_key() for env, _ in positions]
    assert len(keys) == len(set(keys)) and all(k[1] == "player_0" for k in keys)
    assert keys.count(((0,) * 9, "player_0", False)) == 1


def test_outcomes_follow_the_opponents_policy_worked_by_hand() -> None:
    """Nim (1, 2), player_0 moving at random: to (0, 2) it wins if the reply takes one (half
    the random replies, none of the optimal bot's), to (1, 1) it always wins, to (1, 0) it
    never does: 1/2 against random, 1/3 against optimal; playing optimally, always."""
    from marl.games.perfect_info import decision_positions, outcome_probabilities

    def small() -> Nim:
        return Nim(piles=(1, 2))

    opt = make_bot("nim", "optimal").action_probs
    rand = make_bot("nim", "random").action_probs
    assert outcome_probabilities(small, rand, 0, rand) == pytest.approx(
        {"win": 1 / 2, "draw": 0.0, "loss": 1 / 2}
    )
    assert outcome_probabilities(small, rand, 0, opt) == pytest.approx(
        {"win": 1 / 3, "draw": 0.0, "loss": 2 / 3}
    )
    assert outcome_probabilities(small, opt, 0, opt)["win"] == 1.0
    assert outcome_probabilities(small, rand, "player_1", rand)["win"] == pytest.approx(1 / 2)
    assert outcome_probabilities(small, opt, "player_1", opt)["win"] == 0.0  # a lost seat
    # player_0 moves at the start, then at (0, 1) and (1, 0) after random replies to (1, 1)
    # and to (0, 2); the optimal bot answers (1, 1) only with (0, 1) (Bouton's rule)
    assert len(decision_positions(small, 0, rand)) == 3
    assert len(decision_positions(small, 0, opt)) == 2
