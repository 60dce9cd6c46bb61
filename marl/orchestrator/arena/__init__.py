"""The arena: agents meet in games and are compared.

- :mod:`~marl.orchestrator.arena.play`: ``play`` (episodes of a game with seat rotation);
- :mod:`~marl.orchestrator.arena.human`: ``play_human`` (a person at the terminal takes a seat);
- :mod:`~marl.orchestrator.arena.tournament`: ``run_tournament`` / ``Tournament`` (schedules,
  durable match log, ratings and report), seats taken through
  :class:`~marl.agents.participants.ParticipantLoader`;
- :mod:`~marl.orchestrator.arena.ratings` and :mod:`~marl.orchestrator.arena.report`: ratings
  from outcomes (Bradley-Terry, Elo, OpenSkill, Nash averaging) and their tables and plots;
- :mod:`~marl.orchestrator.arena.population`: ``solve_population`` (a run's snapshots as the
  least exploitable mixture);
- :mod:`~marl.orchestrator.arena.credit`: ``credit_report`` (which role or edge a trained team's
  accuracy owes to, by ablation).
"""

from marl.orchestrator.arena.credit import credit_report
from marl.orchestrator.arena.human import play_human
from marl.orchestrator.arena.play import play
from marl.orchestrator.arena.population import solve_population
from marl.orchestrator.arena.tournament import (
    Tournament,
    TournamentError,
    TournamentResult,
    run_tournament,
)

__all__ = [
    "Tournament",
    "TournamentError",
    "TournamentResult",
    "credit_report",
    "play",
    "play_human",
    "run_tournament",
    "solve_population",
]
