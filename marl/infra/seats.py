"""Who sits in a training game's seat: one small value, written ``<kind>:<arg>``.

The written form is what checkpoints store (the league's snapshots and anchors) and what the
agent in the seat is named, so it must stay stable across versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Kind = Literal["team", "bot", "ckpt", "snap", "base"]
UNTRAINED = "untrained"  # the league anchor that is the trained role's model without its adapter


@dataclass(frozen=True)
class ParticipantId:
    """Who sits in a training game's seat, written ``<kind>:<arg>``: ``team:<i>`` (the i-th
    agent of the team), ``bot:<name>``, ``ckpt:<folder>`` (a run, checkpoint or exported
    team), ``snap:<step>`` (a league snapshot of the trained role) or ``base:untrained`` (the
    trained role's model without its adapter: its untrained self).  The written form is
    what checkpoints store and what the agent in the seat is named."""

    kind: Kind
    arg: str

    def __post_init__(self) -> None:
        if self.kind not in get_args(Kind):
            raise ValueError(
                f"participant kind {self.kind!r} is none of {', '.join(get_args(Kind))}"
            )

    @classmethod
    def parse(cls, text: str) -> ParticipantId:
        kind, sep, arg = text.partition(":")
        if not sep:
            raise ValueError(f"participant id {text!r} is not <kind>:<arg>")
        return cls(kind, arg)  # type: ignore[arg-type]  # checked in __post_init__

    @classmethod
    def team(cls, index: int) -> ParticipantId:
        return cls("team", str(index))

    @property
    def index(self) -> int:
        """The agent index of a ``team:<i>`` id."""
        assert self.kind == "team", self
        return int(self.arg)

    def __str__(self) -> str:
        return f"{self.kind}:{self.arg}"
