"""A run's snapshots as population members, and a mixture of them in one seat.

Members are the run's complete checkpoints (``RUN/checkpoints/step_*``) and the league
snapshots stored inside them (``snap:<step>``, skipped where a checkpoint of the same step
exists: the snapshot is that checkpoint's weights).  :mod:`marl.orchestrator.arena.population`
solves for the least exploitable mixture and records it in ``RUN/population.json``.

A participant source ``RUN/population.json`` seats the mixture: before every game it draws one
member with the recorded weights, seeded by the game's seed and the participant's name, so
both seat orders of a duplicate pair are played by the same member.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors.torch import load_file

from marl.agents import Agent
from marl.infra.layout import CHECKPOINTS, STATE_FILE, snapshot_file
from marl.infra.seats import ParticipantId
from marl.infra.seeds import derive_seed, reseed

if TYPE_CHECKING:
    from marl.agents.participants import ParticipantLoader  # it loads populations through us


@dataclass(frozen=True)
class Member:
    name: str  # the checkpoint folder, or snap_<step>
    checkpoint: str  # the checkpoint folder holding its weights
    snapshot: str | None = None  # the league snapshot id inside it


def run_members(run: Path) -> list[Member]:
    """The run's checkpoints in step order, then the league snapshots no checkpoint covers."""
    folders = sorted(p for p in (run / CHECKPOINTS).glob("step_*") if (p / STATE_FILE).is_file())
    if not folders:
        raise FileNotFoundError(f"{run} has no complete checkpoints ({run / CHECKPOINTS})")
    steps = {int(p.name.removeprefix("step_")) for p in folders}
    members = [Member(p.name, p.name) for p in folders]
    seen: set[str] = set()
    for folder in folders:
        state = json.loads((folder / STATE_FILE).read_text())
        for sid in state.get("league", {}).get("snapshots", []):
            pid = ParticipantId.parse(sid)
            if pid.kind == "snap" and int(pid.arg) not in steps and sid not in seen:
                seen.add(sid)
                members.append(Member(f"snap_{pid.arg}", folder.name, sid))
    return members


def load_member(loader: ParticipantLoader, run: Path, member: Member, name: str) -> Agent:
    """The member as an agent named ``name`` (a snapshot: its checkpoint's adapter, refilled
    with the snapshot's weights)."""
    folder = run / CHECKPOINTS / member.checkpoint
    agent = loader.load(str(folder), name=name)
    if member.snapshot is not None:
        prefix = f"{agent.role}::"
        weights = {
            k.removeprefix(prefix): v
            for k, v in load_file(str(snapshot_file(folder, member.snapshot))).items()
            if k.startswith(prefix)
        }
        agent.policy.host.set_adapter_weights(agent.policy.adapter, weights)
    return agent


class PopulationPolicy:
    """The members of a mixture and their weights; a game is played by one drawn member."""

    def __init__(self, members: list[Agent], weights: list[float]) -> None:
        self.members, self.weights = members, weights

    def draw(self, seed: int) -> Agent:
        return random.Random(seed).choices(self.members, weights=self.weights)[0]

    def reseed(self, seed: int) -> None:
        reseed([m.policy for m in self.members], seed)

    def act(self, requests: list) -> list:
        raise TypeError("a population plays whole games: seat the member draw(seed) returns")


def seat_member(agent: Agent, game_seed: int) -> Agent:
    """The agent that plays a game in ``agent``'s seat: itself, or for a population the member
    drawn for this game (named as the population)."""
    if not isinstance(agent.policy, PopulationPolicy):
        return agent
    member = agent.policy.draw(derive_seed(game_seed, "population", agent.name))
    return dataclasses.replace(member, name=agent.name)


def load_population(loader: ParticipantLoader, path: Path, name: str) -> Agent:
    """The mixture ``path`` (a ``population.json``) records, as one participant ``name``;
    members of weight 0 are not loaded."""
    data = json.loads(path.read_text())
    if data["game"] != loader.game:
        raise ValueError(f"{path} is a population for {data['game']}, not {loader.game}")
    run = path.parent
    drawn = [
        (Member(m["name"], m["checkpoint"], m["snapshot"]), m["weight"])
        for m in data["members"]
        if m["weight"] > 0
    ]
    members = [load_member(loader, run, m, f"{name}/{m.name}") for m, _ in drawn]
    return Agent(
        name,
        members[0].role,
        PopulationPolicy(members, [w for _, w in drawn]),
        mode=members[0].mode,
    )
