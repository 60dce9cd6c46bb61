"""A run's snapshots as one population: the least exploitable mixture.

Each member (:func:`marl.agents.population.run_members`) has its table policy read off the
model exactly as ``marl eval exploitability`` does; :func:`marl.games.least_exploitable_mixture`
picks the weights, and ``RUN/population.json`` records them, which a participant source then
seats as one mixture (:func:`marl.agents.population.load_population`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from marl.agents.participants import ParticipantLoader
from marl.agents.population import Member, load_member, run_members
from marl.agents.tables import agent_probs, table_policy
from marl.config import load_config
from marl.games.analysis import exploitability
from marl.games.population import least_exploitable_mixture
from marl.infra.atomic import atomic_write
from marl.infra.layout import CHECKPOINTS, POPULATION_FILE, TEAM_FILE


@dataclass(frozen=True)
class PopulationReport:
    game: str
    members: list[Member]
    weights: list[float]
    member_exploitability: list[float]
    exploitability: float  # of the mixture, exact
    lower_bound: float  # no mixture of these members is less exploitable

    @property
    def best_member(self) -> int:
        return min(range(len(self.members)), key=self.member_exploitability.__getitem__)

    def to_json(self) -> dict:
        best = self.best_member
        return {
            "game": self.game,
            "exploitability": self.exploitability,
            "lower_bound": self.lower_bound,
            "best_member": {
                "name": self.members[best].name,
                "exploitability": self.member_exploitability[best],
            },
            "members": [
                {**dataclasses.asdict(m), "weight": w, "exploitability": e}
                for m, w, e in zip(
                    self.members, self.weights, self.member_exploitability, strict=True
                )
            ],
        }


def solve_population(run: Path, out: Path | None = None, tol: float = 1e-4) -> PopulationReport:
    """Read every member's table policy, find the least exploitable mixture and write it to
    ``out`` (default ``RUN/population.json``) atomically."""
    members = run_members(run)
    game = load_config(run / CHECKPOINTS / members[0].checkpoint / TEAM_FILE).game.name
    loader = ParticipantLoader(game)
    tables = [table_policy(agent_probs(load_member(loader, run, m, m.name)), game) for m in members]
    solution = least_exploitable_mixture(game, tables, tol=tol)
    report = PopulationReport(
        game,
        members,
        solution.weights,
        [exploitability(game, t) for t in tables],
        solution.exploitability,
        solution.lower_bound,
    )
    with atomic_write(out or run / POPULATION_FILE, folder=False) as tmp:
        tmp.write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return report
