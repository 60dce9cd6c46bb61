"""Running teams outside training, in three rooms:

- :mod:`~marl.orchestrator.team`: ``Team`` (``Team.from_yaml``, ``Team.load`` for a run,
  checkpoint or export) answers tasks along its topology, in batches; ``team.to_langgraph()``
  embeds it in a LangGraph app (the one part training uses);
- :mod:`~marl.orchestrator.arena`: ``play`` (episodes of a game with seat rotation),
  ``run_tournament`` / ``Tournament`` (schedules, durable match log, ratings and report),
  ``solve_population`` (a run's snapshots as the least exploitable mixture, which
  ``RUN/population.json`` then seats as one participant);
- :mod:`~marl.orchestrator.serving`: ``export_run`` (a self-contained team folder) and ``serve``
  (an OpenAI-compatible server).

Seat-takers (:class:`~marl.agents.participants.ParticipantLoader`) and exact table evaluation
(:mod:`marl.agents.tables`) live in :mod:`marl.agents`, below both arena and training.
"""

from marl.orchestrator.arena import (
    Tournament,
    TournamentError,
    TournamentResult,
    play,
    run_tournament,
    solve_population,
)
from marl.orchestrator.serving import ExportError, export_run, serve
from marl.orchestrator.team import NodeMessage, Team, TeamError, TeamResult

__all__ = [
    "ExportError",
    "NodeMessage",
    "Team",
    "TeamError",
    "TeamResult",
    "Tournament",
    "TournamentError",
    "TournamentResult",
    "export_run",
    "play",
    "run_tournament",
    "serve",
    "solve_population",
]
