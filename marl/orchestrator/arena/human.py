"""A person against one agent at the terminal (``marl play --human``).

Seats alternate between games unless the person picks one.  The opponent's moves are
announced as they are made, every game ends with its final position (poker: both cards and
the chips won or lost), and the session ends with a summary: wins, draws and losses, and the
mean return with a 95% interval (in chips for poker).  The person stops at any prompt with
``quit`` or the end of input; the summary then covers the finished games.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from rich.console import Console

from marl import games
from marl.agents import Agent
from marl.agents.policy import Policy, Request, Response
from marl.agents.rollout import Episode, RolloutEngine
from marl.agents.scripted import HumanPolicy, HumanQuit
from marl.config import GameConfig
from marl.games import InvalidAction, TextGame
from marl.games.poker import PokerGame
from marl.orchestrator.arena.play import episode_json, mean_interval

HUMAN = "you"


def move_text(request: Request, response: Response) -> str:
    """The move a response makes, as the game writes it (or why it is none)."""
    if response.choice is not None:
        return request.action_texts[response.choice]
    action = request.env.parse_action(request.agent, response.text)
    if isinstance(action, InvalidAction):
        return f"nothing legal ({response.text[:60]!r} names no move)"
    text = request.env.action_text(action)
    return text if action in request.legal else f"{text}, an illegal move"


@dataclass
class Announcing:
    """A policy whose every move is printed as it is made."""

    policy: Policy
    console: Console
    name: str

    def act(self, requests: list[Request]) -> list[Response]:
        responses = self.policy.act(requests)
        for req, resp in zip(requests, responses, strict=True):
            self.console.print(f"opponent ({self.name}) plays {move_text(req, resp)}", markup=False)
        return responses


@dataclass
class HumanSummary:
    """The person's results: one return per finished game."""

    unit: str
    returns: list[float] = field(default_factory=list)
    wins: int = 0
    draws: int = 0
    losses: int = 0

    def add(self, ep: Episode, seat: str) -> str:
        """Count the game; the word for its outcome."""
        mine, best = ep.returns[seat], max(ep.returns.values())
        self.returns.append(mine)
        if mine < best:
            self.losses += 1
            return "lost"
        if sum(r == best for r in ep.returns.values()) == 1:
            self.wins += 1
            return "won"
        self.draws += 1
        return "drew"

    def text(self) -> str:
        n = len(self.returns)
        line = f"{n} game(s): {self.wins} won, {self.draws} drawn, {self.losses} lost"
        if n:
            mean, half = mean_interval(self.returns)
            total = sum(self.returns)
            line += f"; {self.unit}: total {total:+g}, mean {mean:+.3f} ± {half:.3f} (95%)"
        return line


def play_human(
    opponent: Agent,
    game: GameConfig,
    episodes: int,
    *,
    seed: int = 0,
    seat: str | None = None,
    console: Console | None = None,
    ask: Callable[[str], str] | None = None,
    transcripts: Path | None = None,
) -> HumanSummary:
    """Up to ``episodes`` games of a person against ``opponent`` in a two-seat ``game``;
    the person takes ``seat`` every game, or the seats alternate (``seat`` None)."""
    console = console or Console()
    env0 = games.make_from_config(game)
    seats = list(env0.possible_agents)
    if len(seats) != 2:
        raise ValueError(f"playing {game.name} by hand needs a two-seat game; it has {len(seats)}")
    if seat is not None and seat not in seats:
        raise ValueError(f"--seat {seat!r} is not a seat of {game.name} ({', '.join(seats)})")
    session = HumanSession(
        game,
        seats,
        seat,
        console,
        Agent(HUMAN, "human", HumanPolicy(ask=ask, console=console), mode="choice"),
        Agent(
            opponent.name,
            opponent.role,
            Announcing(opponent.policy, console, opponent.name),
            opponent.system_prompt,
            opponent.mode,
        ),
        HumanSummary("chips" if isinstance(env0, PokerGame) else "return"),
        transcripts.open("w") if transcripts else None,
    )
    engine = RolloutEngine(session.make_env, session.seating, concurrency=1)
    try:
        engine.play(episodes, seed=seed, on_episode=session.done)
    except HumanQuit:
        console.print("stopped", markup=False)
    finally:
        if session.sink:
            session.sink.close()
    return session.summary


@dataclass
class HumanSession:
    """The games of one :func:`play_human` call: who sits where, what the person is shown
    after each game, and the transcripts written."""

    game: GameConfig
    seats: list[str]
    seat: str | None  # the person's seat every game; None alternates
    console: Console
    human: Agent
    rival: Agent
    summary: HumanSummary
    sink: IO[str] | None
    env: TextGame | None = None  # the game being played

    def human_seat(self, i: int) -> str:
        return self.seat if self.seat is not None else self.seats[i % 2]

    def seating(self, i: int) -> dict[str, Agent]:
        mine = self.human_seat(i)
        self.console.rule(f"game {i + 1}: you are {mine}")
        return {s: self.human if s == mine else self.rival for s in self.seats}

    def make_env(self) -> TextGame:
        self.env = games.make_from_config(self.game)
        return self.env

    def done(self, ep: Episode) -> None:
        mine = self.human_seat(ep.index)
        self.console.rule(f"game {ep.index + 1} over")
        self.console.print(self.env.final_view(mine), markup=False)
        outcome = self.summary.add(ep, mine)
        self.console.print(
            f"you {outcome}: {ep.returns[mine]:+g} {self.summary.unit}; so far "
            f"{self.summary.text()}",
            markup=False,
        )
        if self.sink:
            self.sink.write(episode_json(ep) + "\n")
            self.sink.flush()
