"""Tic-tac-toe: the smallest perfect-information game with a known value (a draw).

Cells are numbered 0-8 row by row and an action is a cell (``[4]`` is the centre).  The text
observation says which mark the reader plays, so one prompt works for either seat.  The game is
solved once per process (5,478 positions) for the ``optimal`` bot.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import ClassVar

import numpy as np

from marl.games.base import TextGame
from marl.games.bots import PolicyBot, register_bot
from marl.games.registry import register

EMPTY, CROSS, NOUGHT = 0, 1, 2
MARK_TEXT = {EMPTY: " ", CROSS: "X", NOUGHT: "O"}
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
LINES_THROUGH = tuple(tuple(line for line in LINES if cell in line) for cell in range(9))
CENTRE, CORNERS = 4, (0, 2, 6, 8)


def wins(board: tuple[int, ...] | list[int], cell: int) -> bool:
    """Whether the mark on ``cell`` completes a line (only lines through the last move count)."""
    mark = board[cell]
    return any(all(board[i] == mark for i in line) for line in LINES_THROUGH[cell])


def completing(board: tuple[int, ...] | list[int], mark: int) -> list[int]:
    """The empty cells, in order, where ``mark`` would complete a line."""
    return [
        c
        for c in range(9)
        if board[c] == EMPTY
        and any(all(board[i] == mark for i in line if i != c) for line in LINES_THROUGH[c])
    ]


@register("tic_tac_toe")
class TicTacToe(TextGame):
    """Two players alternate placing X (player_0, first) and O on a 3x3 grid."""

    metadata: ClassVar[dict] = {
        "name": "tic_tac_toe",
        "render_modes": ["ansi"],
        "is_parallelizable": False,
    }
    possible_agents: ClassVar[list[str]] = ["player_0", "player_1"]
    action_names: ClassVar[list[str]] = [str(i) for i in range(9)]
    rules: ClassVar[str] = (
        "Tic-tac-toe. Players take turns marking an empty cell of a 3x3 grid; X moves first. "
        "Three of your marks in a row, column or diagonal wins (+1, the loser gets -1); a full "
        "grid without a line is a draw (0). Cells are numbered 0-8 row by row. Answer with the "
        "number of an empty cell in brackets, e.g. [4]."
    )
    obs_shape: ClassVar[tuple[int, ...]] = (3, 3, 2)
    perfect_information: ClassVar[bool] = True

    def _setup(self, rng: np.random.Generator) -> None:
        self.board = [EMPTY] * 9
        self.winner: str | None = None

    def mark_of(self, agent: str) -> int:
        return CROSS if agent == self.possible_agents[0] else NOUGHT

    def _legal(self, agent: str) -> list[int]:
        return [i for i, v in enumerate(self.board) if v == EMPTY]

    def _apply(self, agent: str, action: int) -> None:
        self.board[action] = self.mark_of(agent)
        other = self._next_agent(agent)
        if wins(self.board, action):
            self.winner = agent
            self._end({agent: 1.0, other: -1.0})
        elif EMPTY not in self.board:
            self._end({})

    def _encode(self, agent: str) -> np.ndarray:
        board = np.array(self.board).reshape(3, 3)
        mine = self.mark_of(agent)
        return np.stack((board == mine, board == CROSS + NOUGHT - mine), axis=-1)

    def _describe(self, agent: str) -> str:
        mine = MARK_TEXT[self.mark_of(agent)]
        theirs = MARK_TEXT[CROSS + NOUGHT - self.mark_of(agent)]
        cells = [MARK_TEXT[v] if v else str(i) for i, v in enumerate(self.board)]
        rows = [" " + " | ".join(cells[r : r + 3]) for r in (0, 3, 6)]
        if self.winner is not None:
            status = "Game over: you won." if self.winner == agent else "Game over: you lost."
        elif all(self.terminations.values()):
            status = "Game over: draw." if EMPTY not in self.board else "Game over: forfeit."
        else:
            status = "It is your turn." if agent == self.agent_selection else "Opponent's turn."
        board = "\n---+---+---\n".join(rows)
        return (
            f"You play {mine}; your opponent plays {theirs}. {status}\n"
            f"Board (empty cells show their number):\n{board}"
        )

    def state_key(self) -> Hashable:
        return tuple(self.board), self.agent_selection, all(self.terminations.values())


@functools.cache
def _value(board: tuple[int, ...], mark: int) -> int:
    """Negamax score for ``mark`` to move: >0 win (larger = sooner), 0 draw, <0 loss."""
    return max(move_scores(board, mark).values())


def move_scores(board: tuple[int, ...], mark: int) -> dict[int, int]:
    """Exact score of every legal move for ``mark``; fast wins and slow losses score higher."""
    scores = {}
    for cell in range(9):
        if board[cell] != EMPTY:
            continue
        child = board[:cell] + (mark,) + board[cell + 1 :]
        if wins(child, cell):
            scores[cell] = child.count(EMPTY) + 1
        elif EMPTY not in child:
            scores[cell] = 0
        else:
            scores[cell] = -_value(child, CROSS + NOUGHT - mark)
    return scores


@register_bot("tic_tac_toe", "optimal")
class OptimalTicTacToe(PolicyBot):
    """Minimax (memoised for the whole process): uniform over the moves of best exact score."""

    def action_probs(self, env: TicTacToe, agent: str) -> dict[int, float]:
        scores = move_scores(tuple(env.board), env.mark_of(agent))
        best = max(scores.values())
        top = [a for a, s in scores.items() if s == best]
        return {a: 1.0 / len(top) for a in top}


@register_bot("tic_tac_toe", "heuristic")
class HeuristicTicTacToe(PolicyBot):
    """Win if possible, else block, else centre, else a corner, else any cell."""

    def action_probs(self, env: TicTacToe, agent: str) -> dict[int, float]:
        legal = env.legal_actions(agent)
        mine = env.mark_of(agent)
        for choice in (
            completing(env.board, mine),
            completing(env.board, CROSS + NOUGHT - mine),
            [c for c in legal if c == CENTRE],
            [c for c in legal if c in CORNERS],
            legal,
        ):
            if choice:
                return {a: 1.0 / len(choice) for a in choice}
        return {}
