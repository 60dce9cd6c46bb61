"""Running teams outside training: the team runtime, play, tournaments, evaluation, export, serving.

- ``Team`` (``Team.from_yaml``, ``Team.load`` for a run, checkpoint or export): answers tasks
  along its topology, in batches; ``team.to_langgraph()`` embeds it in a LangGraph app;
- ``play`` (episodes of a game with seat rotation) and ``ParticipantLoader`` (bots, team files,
  runs, checkpoints, exports and HTTP models as seat-takers);
- ``run_tournament`` / ``Tournament`` (schedules, durable match log, ratings and report);
- ``exploitability_report`` (a player's exact exploitability where the game has a tree);
- ``solve_population`` (a run's snapshots as the least exploitable mixture, which
  ``RUN/population.json`` then seats as one participant);
- ``export_run`` (a self-contained team folder) and ``serve`` (an OpenAI-compatible server).
"""

from marl.orchestrator.evaluation import exploitability_report
from marl.orchestrator.export import ExportError, export_run
from marl.orchestrator.participants import ParticipantId, ParticipantLoader
from marl.orchestrator.play import play
from marl.orchestrator.population import solve_population
from marl.orchestrator.serve import serve
from marl.orchestrator.team import NodeMessage, Team, TeamError, TeamResult
from marl.orchestrator.tournament import (
    Tournament,
    TournamentError,
    TournamentResult,
    run_tournament,
)

__all__ = [
    "ExportError",
    "NodeMessage",
    "ParticipantId",
    "ParticipantLoader",
    "Team",
    "TeamError",
    "TeamResult",
    "Tournament",
    "TournamentError",
    "TournamentResult",
    "exploitability_report",
    "export_run",
    "play",
    "run_tournament",
    "serve",
    "solve_population",
]
