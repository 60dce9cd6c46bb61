"""Tournaments: schedule games between participants, play them, never lose a finished one.

- **Schedule.**  Round-robin plays every group of participants (a pair in a two-seat game) in
  every seat rotation, ``games_per_pairing / seats`` games each.  Swiss (two-seat games) plays
  ``rounds`` rounds; each pairs players of similar mean score, never twice when avoidable.
- **Seeds.**  Game ``index`` of a pairing (group) in round ``round`` is played with
  ``derive_seed(seed, round, group, index)`` in every seat order: the duplicate format of poker
  evaluation, where both players get the same deals from each seat, so the luck of the cards
  cancels out of the comparison.  Scripted bots draw their moves from a generator seeded by the
  game and seat, so a bot game is the same game whenever and wherever it is played.
- **Playing.**  A :class:`MatchPlayer` loads every participant once (model participants share
  one base model per :class:`~marl.agents.participants.ParticipantLoader`) and plays a list of
  games through the batched :class:`~marl.agents.rollout.RolloutEngine`; with ``ray.enabled`` the
  same class runs as a pool of Ray actors (:class:`~marl.infra.actors.ActorPool`), each given
  chunks of ``concurrency`` games.
- **Results never lost.**  Every finished game is one line of ``OUT/matches.jsonl``, written
  with flush + fsync as soon as the driver has it.  A rerun reads the file back (a torn last
  line, from a kill mid-write, is cut off) and plays only the games whose key is missing; a
  Swiss round's pairings depend only on earlier, complete rounds, so they come out the same.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marl import games
from marl.agents import Agent
from marl.agents.participants import ParticipantLoader, bot_name
from marl.agents.population import seat_member
from marl.agents.rollout import Episode, RolloutEngine
from marl.agents.scripted import ScriptedPolicy
from marl.config.schema import PathProblem
from marl.config.tournament import ParticipantConfig, TournamentConfig
from marl.games.bots import bot_names
from marl.infra.actors import ActorPool, ActorPoolError, start_ray
from marl.infra.jsonl import complete_lines
from marl.infra.layout import checkpoint_folder, has_history, why_missing
from marl.infra.seeds import derive_seed, reseed
from marl.orchestrator.arena.ratings import Outcome, Rating, RatingReport, pair_score, rate

MATCHES = "matches.jsonl"
IDENTITY = "tournament.json"
#: The config fields that define which games a tournament plays (a resume must match them).
_IDENTITY_FIELDS = ("game", "participants", "schedule", "games_per_pairing", "seed")


class TournamentError(Exception):
    """A tournament that cannot run as configured (bad participant, foreign OUT folder)."""


@dataclass(frozen=True)
class GameSpec:
    """One scheduled game: participants in seat order, its index in that order, its seed."""

    round: int
    order: tuple[str, ...]
    index: int
    seed: int

    @property
    def key(self) -> str:
        return f"r{self.round}:{'|'.join(self.order)}#{self.index}"


@dataclass
class MatchRecord:
    """One finished game as written to ``matches.jsonl``."""

    key: str
    round: int
    order: list[str]
    index: int
    seed: int
    seats: dict[str, str]  # seat -> participant
    returns: dict[str, float]  # seat -> return
    turns: int
    parse_errors: int
    illegal_moves: int
    seconds: float

    @classmethod
    def of(cls, spec: GameSpec, ep: Episode) -> MatchRecord:
        return cls(
            spec.key,
            spec.round,
            list(spec.order),
            spec.index,
            spec.seed,
            dict(ep.seats),
            {s: float(r) for s, r in ep.returns.items()},
            len(ep.turns),
            sum(not t.parsed for t in ep.turns),
            sum(ep.illegal_moves.values()),
            round(sum(t.seconds for t in ep.turns), 6),
        )

    def outcome(self) -> Outcome:
        seats = list(self.seats)
        return Outcome(
            tuple(self.seats[s] for s in seats),
            tuple(self.returns[s] for s in seats),
            deal=self.seed,
        )  # every seat order of a duplicate deal shares the seed


# ----- schedules


def rotations(group: Sequence[str]) -> list[tuple[str, ...]]:
    """Every seat rotation of a group: each member plays each seat once."""
    return [tuple(group[k:]) + tuple(group[:k]) for k in range(len(group))]


def round_specs(
    groups: Sequence[Sequence[str]], round_: int, games_per_pairing: int, seed: int
) -> list[GameSpec]:
    """The games of one round: every group in every rotation, an even share of the games;
    game ``i`` of every rotation of a group has the same seed (duplicate format)."""
    specs = []
    for group in groups:
        seeds = [
            derive_seed(seed, round_, tuple(group), i)
            for i in range(games_per_pairing // len(group))
        ]
        specs += [
            GameSpec(round_, order, i, s) for order in rotations(group) for i, s in enumerate(seeds)
        ]
    return specs


def swiss_pairs(
    ranked: Sequence[str], met: set[frozenset[str]], budget: int = 100_000
) -> list[tuple[str, str]]:
    """Pair an even list, best first: each player with the best-ranked opponent it has not met
    that still lets the rest be paired (depth-first).  Without any repeat-free pairing (or after
    ``budget`` steps), repeats are allowed and the same search pairs neighbours."""
    steps = [0]

    def solve(rest: list[str], allow_repeat: bool) -> list[tuple[str, str]] | None:
        if not rest:
            return []
        a = rest[0]
        for j in range(1, len(rest)):
            steps[0] += 1
            if steps[0] > budget and not allow_repeat:
                return None
            if allow_repeat or frozenset((a, rest[j])) not in met:
                sub = solve(rest[1:j] + rest[j + 1 :], allow_repeat)
                if sub is not None:
                    return [(a, rest[j]), *sub]
        return None

    pairs = solve(list(ranked), False)
    return pairs if pairs is not None else solve(list(ranked), True) or []


def swiss_round(
    names: Sequence[str], finished: Sequence[MatchRecord], round_: int
) -> tuple[list[tuple[str, str]], str | None]:
    """Pairs of Swiss round ``round_`` from the games of earlier rounds, and who sits out.

    Standing: mean score per game (0.5 before any game), ties broken by config order.  With an
    odd count the lowest-standing player that has not sat out yet gets the bye.
    """
    total = dict.fromkeys(names, 0.0)
    count = dict.fromkeys(names, 0)
    met: set[frozenset[str]] = set()
    earlier = [rec for rec in finished if rec.round < round_]
    for rec in earlier:
        o = rec.outcome()
        (a, b), (ra, rb) = o.players, o.returns
        total[a] += pair_score(ra, rb)
        total[b] += pair_score(rb, ra)
        count[a] += 1
        count[b] += 1
        met.add(frozenset((a, b)))
    order = {n: i for i, n in enumerate(names)}
    ranked = sorted(names, key=lambda n: (-(total[n] / count[n] if count[n] else 0.5), order[n]))
    bye = None
    if len(ranked) % 2:
        rounds = {rec.round for rec in earlier}
        had_bye = {n for n in names if rounds - {rec.round for rec in earlier if n in rec.order}}
        bye = next((n for n in reversed(ranked) if n not in had_bye), ranked[-1])
        ranked.remove(bye)
    return swiss_pairs(ranked, met), bye


def planned_games(cfg: TournamentConfig, seats: int) -> int:
    n = len(cfg.participants)
    if cfg.schedule.kind == "swiss":
        return (cfg.schedule.rounds or 0) * (n // 2) * cfg.games_per_pairing
    return len(list(itertools.combinations(range(n), seats))) * cfg.games_per_pairing


# ----- participants


def resolve_source(source: str, game: str, base: Path) -> str:
    """A bot name as it is; a relative path relative to ``base`` (the tournament file's
    folder)."""
    if bot_name(source, game) is not None or Path(source).is_absolute():
        return source
    return str(base / source)


def source_problems(cfg: TournamentConfig, base: Path) -> list[PathProblem]:
    """Checks the schema cannot make: the game exists, sources exist, seats fit the game (a
    loader check)."""
    problem = games.check_config(cfg.game)  # tournaments play games, not tasks
    if problem is not None:
        return [(("game", problem[0]), problem[1])]
    seats = len(games.make_from_config(cfg.game).possible_agents)
    problems: list[PathProblem] = []
    if cfg.games_per_pairing % seats:
        problems.append(
            (
                ("games_per_pairing",),
                f"{cfg.game.name} has {seats} seats; use a "
                f"multiple of {seats} (every seat order plays "
                "as often)",
            )
        )
    if cfg.schedule.kind == "swiss" and seats != 2:
        problems.append(
            (
                ("schedule", "kind"),
                f"swiss pairs two players; {cfg.game.name} has {seats} seats (use round_robin)",
            )
        )
    if len(cfg.participants) < seats:
        problems.append((("participants",), f"{cfg.game.name} needs {seats} participants"))
    for i, p in enumerate(cfg.participants):
        if p.source is None:
            continue
        path = resolve_source(p.source, cfg.game.name, base)
        if path == p.source and not Path(path).is_absolute():
            continue
        if not Path(path).exists() and has_history(Path(path).parent):
            problems.append((("participants", i, "source"), why_missing(path)))
        elif not Path(path).exists():
            problems.append(
                (
                    ("participants", i, "source"),
                    f"neither a bot of {cfg.game.name} "
                    f"({', '.join(bot_names(cfg.game.name))}) nor an existing file or "
                    f"folder ({path})",
                )
            )
    return problems


def resolution_notes(cfg: TournamentConfig, base: Path) -> list[str]:
    """Which checkpoint each run participant played, e.g. ``trained = RUN/best ->
    step_000027``: a run's ``best`` and ``latest`` move as training goes on."""
    notes = []
    for p in cfg.participants:
        if p.source is None or bot_name(p.source, cfg.game.name) is not None:
            continue
        path = Path(resolve_source(p.source, cfg.game.name, base))
        folder = checkpoint_folder(path)
        if folder != path:
            notes.append(f"{p.name} = {p.source} -> {folder.name}")
    return notes


def load_participant(loader: ParticipantLoader, p: ParticipantConfig, base: Path) -> Agent:
    if p.http is not None:
        return loader.load_http(p.http, p.name)
    assert p.source is not None  # the schema requires source or http
    return loader.load(resolve_source(p.source, loader.game, base), name=p.name)


class MatchPlayer:
    """Every participant loaded once, playing lists of games (in process or as a Ray actor)."""

    def __init__(self, cfg: dict[str, Any], base: str) -> None:
        self.cfg = TournamentConfig.model_validate(cfg)
        loader = ParticipantLoader(self.cfg.game.name, seed=self.cfg.seed)
        self.agents: dict[str, Agent] = {}
        for p in self.cfg.participants:
            try:
                self.agents[p.name] = load_participant(loader, p, Path(base))
            except (OSError, ValueError, KeyError) as exc:
                raise TournamentError(f"participant {p.name!r}: {exc}") from exc

    def ready(self) -> bool:
        """Lets the Ray driver wait until an actor has loaded every participant."""
        return True

    def _seat(self, name: str, seat: str, game_seed: int) -> Agent:
        """A bot gets a generator of its own per game (its moves depend on the game's seed
        and seat only); a population the member drawn for the game; model policies are
        shared, so their decisions batch across games."""
        agent = seat_member(self.agents[name], game_seed)
        seed = derive_seed(game_seed, seat)
        if isinstance(agent.policy, ScriptedPolicy):
            pol = agent.policy
            return dataclasses.replace(agent, policy=ScriptedPolicy(pol.game, pol.name, seed))
        return agent

    def play(
        self, specs: Sequence[GameSpec], on_record: Callable[[MatchRecord], None] | None = None
    ) -> list[MatchRecord]:
        game = self.cfg.game
        seats = list(games.make_from_config(game).possible_agents)
        if specs:
            reseed([agent.policy for agent in self.agents.values()], specs[0].seed)
        seatings = [
            {
                seat: self._seat(name, seat, spec.seed)
                for seat, name in zip(seats, spec.order, strict=True)
            }
            for spec in specs
        ]
        out: list[MatchRecord] = []

        def done(ep: Episode) -> None:
            out.append(MatchRecord.of(specs[ep.index], ep))
            if on_record is not None:
                on_record(out[-1])

        engine = RolloutEngine(
            lambda: games.make_from_config(game), lambda i: seatings[i], self.cfg.concurrency
        )
        engine.play(len(specs), seeds=[s.seed for s in specs], on_episode=done)
        return out

    def close(self) -> None:
        """Release what policies hold open (an HTTP participant's connection pool)."""
        for agent in self.agents.values():
            close = getattr(agent.policy, "close", None)
            if close is not None:
                close()


# ----- the match log


class MatchLog:
    """``matches.jsonl``: read back on open (a torn last line is cut off), appended durably."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[str, MatchRecord] = {}
        lines, self.torn = complete_lines(path)
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = MatchRecord(**json.loads(line))
            except (ValueError, TypeError) as exc:
                raise TournamentError(
                    f"{path}:{i + 1}: not a match record ({exc}); fix or remove that line"
                ) from None
            self.records[rec.key] = rec
        if self.torn:
            with path.open("r+b") as f:
                f.truncate(path.stat().st_size - self.torn)
        self._file = path.open("a", encoding="utf-8")

    def append(self, rec: MatchRecord) -> None:
        if rec.key in self.records:
            return
        self._file.write(json.dumps(dataclasses.asdict(rec)) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.records[rec.key] = rec

    def finished(self) -> list[MatchRecord]:
        """Every record in key order, not the order games were written, so a resumed
        tournament rates (and pairs) exactly as an uninterrupted one."""
        return [self.records[k] for k in sorted(self.records)]

    def close(self) -> None:
        self._file.close()


# ----- running


@dataclass
class TournamentResult:
    config: TournamentConfig
    records: list[MatchRecord]
    report: RatingReport
    resumed: int  # finished games read back from matches.jsonl
    played: int  # games played by this run

    @property
    def ratings(self) -> list[Rating]:
        return self.report.ratings


class Tournament:
    """One tournament writing into ``out``; ``base`` resolves relative participant paths."""

    def __init__(
        self, cfg: TournamentConfig, out: str | Path, base: str | Path | None = None
    ) -> None:
        self.cfg, self.out = cfg, Path(out)
        self.base = Path(base) if base is not None else Path.cwd()
        problems = source_problems(cfg, self.base)
        if problems:
            raise TournamentError("; ".join(f"{'.'.join(map(str, p))}: {m}" for p, m in problems))
        self.seats = len(games.make_from_config(cfg.game).possible_agents)
        self.total = planned_games(cfg, self.seats)
        self.out.mkdir(parents=True, exist_ok=True)
        self._check_identity()
        self.log = MatchLog(self.out / MATCHES)
        self.resumed = len(self.log.records)
        self.played = 0
        self._player: MatchPlayer | None = None

    def _check_identity(self) -> None:
        data = self.cfg.model_dump(mode="json", by_alias=True, include=set(_IDENTITY_FIELDS))
        path = self.out / IDENTITY
        if path.exists():
            old = json.loads(path.read_text())
            diff = [k for k in _IDENTITY_FIELDS if old.get(k) != data.get(k)]
            if diff:
                raise TournamentError(
                    f"{self.out} holds games of another tournament ("
                    f"{', '.join(diff)} differ); use another --out"
                )
        else:
            path.write_text(json.dumps(data, indent=1) + "\n")

    def rounds(self) -> Iterator[list[GameSpec]]:
        """The games of each round; a Swiss round is computed when the earlier ones are done."""
        names = self.cfg.names()
        if self.cfg.schedule.kind == "round_robin":
            groups = list(itertools.combinations(names, self.seats))
            yield round_specs(groups, 0, self.cfg.games_per_pairing, self.cfg.seed)
            return
        for r in range(self.cfg.schedule.rounds or 0):
            pairs, _bye = swiss_round(names, self.log.finished(), r)
            yield round_specs(pairs, r, self.cfg.games_per_pairing, self.cfg.seed)

    def run(self, on_game: Callable[[MatchRecord], None] | None = None) -> TournamentResult:
        """Play every missing game, then rate all of them."""
        try:
            for specs in self.rounds():
                pending = [s for s in specs if s.key not in self.log.records]
                if pending:
                    self._play(pending, on_game)
        finally:
            self.log.close()
            if self._player is not None:
                self._player.close()
        records = self.log.finished()
        report = rate(
            [r.outcome() for r in records],
            self.cfg.names(),
            self.cfg.anchor_name(),
            self.cfg.anchor_rating,
            self.cfg.bootstrap,
            self.cfg.seed,
        )
        report.notes += resolution_notes(self.cfg, self.base)
        return TournamentResult(self.cfg, records, report, self.resumed, self.played)

    def load(self) -> None:
        """Load the participants now (in-process play; Ray actors load their own)."""
        if self._player is None and not self.cfg.ray.enabled:
            self._player = MatchPlayer(self.cfg.model_dump(by_alias=True), str(self.base))

    def _record(self, rec: MatchRecord, on_game: Callable[[MatchRecord], None] | None) -> None:
        self.log.append(rec)
        self.played += 1
        if on_game is not None:
            on_game(rec)

    def _play(self, specs: list[GameSpec], on_game: Callable[[MatchRecord], None] | None) -> None:
        if self.cfg.ray.enabled:
            self._play_ray(specs, on_game)
            return
        self.load()
        assert self._player is not None
        self._player.play(specs, lambda rec: self._record(rec, on_game))

    def _play_ray(
        self, specs: list[GameSpec], on_game: Callable[[MatchRecord], None] | None
    ) -> None:
        """Chunks of ``concurrency`` games to a pool of ``ray.workers`` actors, recorded as
        they return."""
        import ray

        rc = self.cfg.ray
        start_ray(rc.address)
        actor_cls = ray.remote(num_cpus=rc.cpus_per_worker)(MatchPlayer)
        data = self.cfg.model_dump(by_alias=True)
        size = self.cfg.concurrency
        chunks = [specs[i : i + size] for i in range(0, len(specs), size)]

        def record(records: list[MatchRecord]) -> None:
            for rec in records:
                self._record(rec, on_game)

        pool = ActorPool(
            lambda: actor_cls.remote(data, str(self.base)), min(rc.workers, len(chunks))
        )
        try:
            _await_actors(pool.actors)
            pool.map("play", chunks, on_result=record)
        except ActorPoolError as exc:
            raise TournamentError(f"match {exc}") from None
        except ray.exceptions.RayTaskError as exc:
            raise TournamentError(str(exc.cause)) from None
        finally:
            pool.shutdown()


def _await_actors(actors: list[Any]) -> None:
    """Wait until every actor has loaded the participants; a load error ends the tournament
    with the error's own message (the last line of the actor's traceback)."""
    import ray

    try:
        ray.get([a.ready.remote() for a in actors])
    except ray.exceptions.RayActorError as exc:
        last = str(getattr(exc, "error_msg", exc)).strip().splitlines()[-1]
        raise TournamentError(last.split(": ", 1)[-1]) from None


def run_tournament(
    cfg: TournamentConfig,
    out: str | Path,
    base: str | Path | None = None,
    on_game: Callable[[MatchRecord], None] | None = None,
) -> TournamentResult:
    """Play (or finish) the tournament into ``out`` and write its report files there."""
    from marl.orchestrator.arena.report import write_report

    result = Tournament(cfg, out, base).run(on_game)
    write_report(result.report, Path(out), title=cfg.name)
    return result
