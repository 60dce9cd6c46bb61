"""Play a team's game for N episodes: self-play, against a bot or checkpoint, or a person.

Seats rotate between episodes so every participant plays every seat equally often.  Results
are counted per participant and seat (win/draw/loss and the mean return, with its 95% interval),
with the parse-error and illegal-move rates of model turns, and every episode can be written as
one JSON line (the transcript).  The first participant's *margin*, its return minus the mean of
the others' in each game, is what a general-sum game's win/draw/loss cannot say: whether a
trained negotiator gets more out of its untrained self than the other way round.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.table import Table

from marl import games
from marl.agents.agent import Agent
from marl.agents.builder import Roster
from marl.agents.rollout import Episode, RolloutEngine
from marl.config import GameConfig


def mean_interval(values: list[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95% normal interval (0 under two values)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    half = 1.96 * statistics.stdev(values) / math.sqrt(n) if n > 1 else 0.0
    return statistics.fmean(values), half


@dataclass
class SeatRecord:
    wins: int = 0
    draws: int = 0
    losses: int = 0
    returns: list[float] = field(default_factory=list)

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses


@dataclass
class PlayReport:
    """Outcomes keyed by (participant name, seat), plus model-turn error rates."""

    records: dict[tuple[str, str], SeatRecord] = field(default_factory=dict)
    model_turns: int = 0
    parse_errors: int = 0
    illegal_moves: int = 0
    forfeits: int = 0
    episodes: int = 0
    first: str = ""  # the participant whose margin is kept: the team's first agent
    margins: list[float] = field(default_factory=list)  # its return minus the others' mean

    @property
    def parse_error_rate(self) -> float:
        return self.parse_errors / self.model_turns if self.model_turns else 0.0

    def add(self, ep: Episode, model_names: set[str]) -> None:
        self.episodes += 1
        best = max(ep.returns.values())
        n_best = sum(1 for r in ep.returns.values() if r == best)
        for seat, name in ep.seats.items():
            rec = self.records.setdefault((name, seat), SeatRecord())
            rec.returns.append(ep.returns[seat])
            if ep.returns[seat] < best:
                rec.losses += 1
            elif n_best == 1:
                rec.wins += 1
            else:
                rec.draws += 1
        for t in ep.turns:
            if t.name in model_names:
                self.model_turns += 1
                self.parse_errors += not t.parsed
                self.illegal_moves += t.parsed and not t.legal
        self.forfeits += len(ep.forfeits)
        mine = [s for s, n in ep.seats.items() if n == self.first]
        if len(mine) == 1 and len(ep.seats) > 1:
            self.margins.append(ep.relative_return(mine[0]))

    def margin_text(self) -> str:
        """The first participant's margin over the others, for a caption ('' without one)."""
        if not self.margins:
            return ""
        mean, half = mean_interval(self.margins)
        return f"{self.first}'s margin {mean:+.3f} ± {half:.3f} (95%, {len(self.margins)} games)"


def rotating_seating(participants: list[Agent], seats: list[str]) -> Callable[[int], dict]:
    """Episode ``i`` shifts the participants by ``i`` seats, so each plays every seat."""
    if len(participants) != len(seats):
        raise ValueError(
            f"{len(participants)} participants for {len(seats)} seats "
            f"({', '.join(seats)}); a two-seat game needs two agents"
        )

    def seating(i: int) -> dict[str, Agent]:
        k = i % len(seats)
        order = participants[k:] + participants[:k]
        return dict(zip(seats, order, strict=True))

    return seating


def episode_json(ep: Episode) -> str:
    d = asdict(ep)
    for t in d["turns"]:  # token ids are for training, not for reading
        for key in (
            "prompt_ids",
            "completion_ids",
            "candidate_ids",
            "choice_prompt_ids",
            "logprobs",
        ):
            t.pop(key, None)
    return json.dumps(d)


def play(
    roster: Roster,
    game: GameConfig | str,
    game_kwargs: dict | None,
    episodes: int,
    opponents: list[Agent] | None = None,
    seed: int = 0,
    concurrency: int = 16,
    transcripts: Path | None = None,
    on_episode: Callable[[Episode], None] | None = None,
) -> PlayReport:
    """Play ``episodes`` games of a config's game section (or a registered game's name with
    ``game_kwargs``); ``opponents`` fill the seats after the team's first agent."""
    if isinstance(game, str):
        game = GameConfig(name=game, kwargs=game_kwargs or {})
    env0 = games.make_from_config(game)
    seats = list(env0.possible_agents)
    participants = roster.agents[:1] + opponents if opponents else list(roster.agents)
    seating = rotating_seating(participants, seats)
    model_names = {a.name for a in roster.agents}
    report = PlayReport(first=participants[0].name)
    sink = transcripts.open("w") if transcripts else None

    def done(ep: Episode) -> None:
        report.add(ep, model_names)
        if sink:
            sink.write(episode_json(ep) + "\n")
            sink.flush()
        if on_episode:
            on_episode(ep)

    try:
        engine = RolloutEngine(lambda: games.make_from_config(game), seating, concurrency)
        engine.play(episodes, seed=seed, on_episode=done)
    finally:
        if sink:
            sink.close()
    return report


def report_table(report: PlayReport, title: str) -> Table:
    """Wins/draws/losses per participant and seat, then the model-turn error rates."""
    table = Table(title=title)
    cols = ("participant", "seat", "games", "wins", "draws", "losses", "win rate", "mean return")
    for col in cols:
        table.add_column(
            col, justify="left" if col in ("participant", "seat") else "right", no_wrap=True
        )
    for (name, seat), rec in sorted(report.records.items()):
        table.add_row(
            name,
            seat,
            str(rec.games),
            str(rec.wins),
            str(rec.draws),
            str(rec.losses),
            f"{rec.wins / rec.games:.2f}" if rec.games else "-",
            "{:+.3f} ± {:.3f}".format(*mean_interval(rec.returns)),
        )
    table.caption = (
        f"model turns {report.model_turns}, parse errors {report.parse_errors} "
        f"({report.parse_error_rate:.1%}), illegal moves {report.illegal_moves}, "
        f"forfeits {report.forfeits}"
    )
    if report.margins:
        table.caption += f"; {report.margin_text()}"
    return table
