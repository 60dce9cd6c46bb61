"""A trained team in service: ``export_run`` (a self-contained team folder with its model card)
and ``serve`` (an OpenAI-compatible HTTP server over a :class:`~marl.orchestrator.team.Team`).
"""

from marl.orchestrator.serving.export import ExportError, export_run
from marl.orchestrator.serving.serve import serve

__all__ = ["ExportError", "export_run", "serve"]
