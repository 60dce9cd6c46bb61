"""A person against one agent at the terminal (``marl play --human``).

Seats alternate between games unless the person picks one.  The opponent's moves are
announced as they are made, every game ends with its final position (poker: both cards and
the chips won or lost), and the session ends with a summary: wins, draws and losses, and the
mean return with a 95% interval (in chips for poker).  The person stops at any prompt with
``quit`` or the end of input; the summary then covers the finished games.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from marl import games
from marl.agents import Agent
from marl.agents.policy import Policy, Request, Response
from marl.agents.rollout import Episode, RolloutEngine
from marl.agents.scripted import HumanPolicy, HumanQuit
from marl.config import GameConfig
from marl.games import InvalidAction, TextGame
from marl.games.poker import PokerGame
from marl.orchestrator.arena.play import episode_json

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

    def interval(self) -> float:
        """Half-width of the 95% normal interval of the mean return (0 under two games)."""
        n = len(self.returns)
        return 1.96 * statistics.stdev(self.returns) / math.sqrt(n) if n > 1 else 0.0

    def text(self) -> str:
        n = len(self.returns)
        line = f"{n} game(s): {self.wins} won, {self.draws} drawn, {self.losses} lost"
        if n:
            total, mean = sum(self.returns), statistics.fmean(self.returns)
            line += (
                f"; {self.unit}: total {total:+g}, mean {mean:+.3f} ± {self.interval():.3f} (95%)"
            )
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
    human = Agent(HUMAN, "human", HumanPolicy(ask=ask, console=console), mode="choice")
    rival = Agent(
        opponent.name,
        opponent.role,
        Announcing(opponent.policy, console, opponent.name),
        opponent.system_prompt,
        opponent.mode,
    )
    summary = HumanSummary("chips" if isinstance(env0, PokerGame) else "return")
    current: dict[str, TextGame] = {}

    def human_seat(i: int) -> str:
        return seat if seat is not None else seats[i % 2]

    def seating(i: int) -> dict[str, Agent]:
        mine = human_seat(i)
        console.rule(f"game {i + 1}: you are {mine}")
        return {s: human if s == mine else rival for s in seats}

    def make_env() -> TextGame:
        current["env"] = games.make_from_config(game)
        return current["env"]

    sink = transcripts.open("w") if transcripts else None

    def done(ep: Episode) -> None:
        mine = human_seat(ep.index)
        console.rule(f"game {ep.index + 1} over")
        console.print(current["env"].final_view(mine), markup=False)
        outcome = summary.add(ep, mine)
        console.print(
            f"you {outcome}: {ep.returns[mine]:+g} {summary.unit}; so far {summary.text()}",
            markup=False,
        )
        if sink:
            sink.write(episode_json(ep) + "\n")
            sink.flush()

    try:
        RolloutEngine(make_env, seating, concurrency=1).play(episodes, seed=seed, on_episode=done)
    except HumanQuit:
        console.print("stopped", markup=False)
    finally:
        if sink:
            sink.close()
    return summary
