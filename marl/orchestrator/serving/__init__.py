"""A trained team in service.

- :mod:`~marl.orchestrator.serving.export`: ``export_run`` (a self-contained team folder) with
  its model card (:mod:`~marl.orchestrator.serving.card`);
- :mod:`~marl.orchestrator.serving.serve`: ``serve`` (an OpenAI-compatible HTTP server over a
  :class:`~marl.orchestrator.team.Team`, under uvicorn), built from :mod:`.api` (the wire models,
  errors and limits), :mod:`.sampling` (a request's sampling parameters applied to the team),
  :mod:`.batcher` (the worker thread that batches requests), :mod:`.metrics` (Prometheus series
  through ``prometheus_client``), :mod:`.guard` (the middleware: API key, body size and time,
  requests at once) and :mod:`.app` (the FastAPI app: routes, server-sent events).
"""

from marl.orchestrator.serving.export import ExportError, export_run
from marl.orchestrator.serving.serve import serve

__all__ = ["ExportError", "export_run", "serve"]
