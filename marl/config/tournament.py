"""The tournament config schema (``schema: marl-teams/tournament/v1``), as pydantic v2 models.

A tournament file names a game, the participants (bots, team files, run/checkpoint/export
folders, HTTP models), how they are paired and how often, and how ratings are computed.
Loaded with the team loader (``load_config(path, TournamentConfig)``), so problems are reported
as ``FILE:LINE:COL: path: message`` like in team files.  Whether a participant's source exists
is checked outside this leaf package (``marl.orchestrator.arena.tournament.source_problems``).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, model_validator

from marl.config.base import Float, Int, StrictModel
from marl.config.schema import (
    DEFER_RULES,
    DecodingConfig,
    EndpointConfig,
    GameConfig,
    PathProblem,
    raise_problems,
)

TOURNAMENT_SCHEMA_ID = "marl-teams/tournament/v1"


class HttpSource(StrictModel):
    """A model behind an OpenAI-compatible ``/v1/chat/completions`` (the ``openai`` backend)."""

    model: str = Field(min_length=1, description="The served model's name.")
    endpoint: EndpointConfig
    decoding: DecodingConfig = Field(
        default_factory=DecodingConfig, description="Free decoding only (the API samples text)."
    )

    @model_validator(mode="after")
    def _free_only(self) -> HttpSource:
        if self.decoding.mode != "free":
            raise_problems(
                [
                    (
                        ("decoding", "mode"),
                        "an HTTP model samples text and cannot score candidates; use mode 'free'",
                    )
                ]
            )
        return self


class ParticipantConfig(StrictModel):
    """One seat-taker of the tournament: ``source`` or ``http``, exactly one."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_.@+-]+$",
        description="Unique name in tables and matches.jsonl (letters, digits, "
        "'_', '.', '@', '+', '-').",
    )
    source: str | None = Field(
        None,
        min_length=1,
        description="A bot name (random, heuristic, optimal, ...), a team YAML file (its "
        "untrained model), or a run, checkpoint or exported team folder (paths are "
        "relative to the tournament file).",
    )
    http: HttpSource | None = Field(
        None, description="A model behind an OpenAI-compatible endpoint, instead of source."
    )

    @model_validator(mode="after")
    def _one_source(self) -> ParticipantConfig:
        if (self.source is None) == (self.http is None):
            which = "both" if self.source is not None else "neither"
            raise_problems([((), f"give exactly one of 'source' and 'http' ({which} given)")])
        return self


class ScheduleConfig(StrictModel):
    """Who plays whom."""

    kind: Literal["round_robin", "swiss"] = Field(
        "round_robin",
        description="round_robin: every pair (every seat order); swiss: rounds "
        "pairing players of similar score, no repeats if possible.",
    )
    rounds: Int | None = Field(
        None, ge=1, le=1024, description="Swiss rounds; required for swiss only."
    )

    @model_validator(mode="after")
    def _rounds(self) -> ScheduleConfig:
        if self.kind == "swiss" and self.rounds is None:
            raise_problems([(("rounds",), "required when kind is 'swiss'")])
        if self.kind != "swiss" and self.rounds is not None:
            raise_problems([(("rounds",), "only allowed when kind is 'swiss'")])
        return self


class TournamentRayConfig(StrictModel):
    """Play games on Ray actors (each loads every participant once)."""

    enabled: bool = Field(False, description="false: play in this process.")
    workers: Int = Field(2, ge=1, le=1024, description="Match actors.")
    cpus_per_worker: Float = Field(1.0, gt=0.0, le=1024, description="CPUs Ray reserves per actor.")
    address: str | None = Field(None, description="An existing cluster; default: a local Ray.")


class TournamentConfig(StrictModel):
    """The root of a tournament file."""

    file_kind: ClassVar[str] = "tournament"

    schema_version: Literal["marl-teams/tournament/v1"] = Field(
        alias="schema", description=f"Schema id; must be '{TOURNAMENT_SCHEMA_ID}'."
    )
    name: str = Field(min_length=1, description="Tournament name.")
    description: str | None = Field(None, description="Free text.")
    game: GameConfig
    participants: list[ParticipantConfig] = Field(min_length=2, max_length=1024)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    games_per_pairing: Int = Field(
        20,
        ge=1,
        le=1_000_000,
        description="Games per pairing, split evenly over the seat orders (so a "
        "multiple of the game's number of seats).",
    )
    seed: Int = Field(
        0, description="Every game's seed derives from it, the pairing and the game index."
    )
    concurrency: Int = Field(
        32, ge=1, le=65536, description="Games in flight per worker (batching)."
    )
    anchor: str | None = Field(
        None, description="Participant whose rating is fixed (default: the first)."
    )
    anchor_rating: Float = Field(
        0.0, ge=-1e6, le=1e6, description="The anchor's rating in Elo-like points."
    )
    bootstrap: Int = Field(
        200,
        ge=0,
        le=100_000,
        description="Bootstrap resamples for the 95% intervals (0: no intervals).",
    )
    ray: TournamentRayConfig = Field(default_factory=TournamentRayConfig)

    def anchor_name(self) -> str:
        return self.anchor if self.anchor is not None else self.participants[0].name

    def names(self) -> list[str]:
        return [p.name for p in self.participants]

    def cross_check(self) -> list[PathProblem]:
        problems: list[PathProblem] = []
        first: dict[str, int] = {}
        for i, p in enumerate(self.participants):
            if p.name in first:
                problems.append(
                    (
                        ("participants", i, "name"),
                        f"duplicate participant name "
                        f"{p.name!r} (also participants.{first[p.name]})",
                    )
                )
            first.setdefault(p.name, i)
        if self.anchor is not None and self.anchor not in first:
            problems.append(
                (("anchor",), f"unknown participant {self.anchor!r}; known: {', '.join(first)}")
            )
        rounds = self.schedule.rounds
        if rounds is not None and rounds >= len(self.participants):
            problems.append(
                (
                    ("schedule", "rounds"),
                    f"{rounds} Swiss rounds for "
                    f"{len(self.participants)} participants would repeat pairings; "
                    "use round_robin or fewer rounds",
                )
            )
        return problems

    @model_validator(mode="after")
    def _cross_check(self, info: ValidationInfo) -> TournamentConfig:
        if not (info.context or {}).get(DEFER_RULES):
            raise_problems(self.cross_check())
        return self
