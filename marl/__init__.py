"""marl-teams: teams of LLM agents that learn together.

One import namespace; each concern is a sub-package, and importing ``marl`` itself loads none
of them (no torch, no Ray), so ``python -c "import marl"`` stays instant:

- :mod:`marl.config`: the team and tournament schemas and their loader (YAML in, typed
  models out, problems located as FILE:LINE:COL);
- :mod:`marl.games`: games and cooperative tasks (PettingZoo-style, knows nothing of LLMs);
- :mod:`marl.topologies`: communication graphs (networkx), learnable edges;
- :mod:`marl.agents`: models, per-role policies, decoding and the rollout engine;
- :mod:`marl.orchestrator`: the team runtime, the arena (play, tournaments, ratings) and
  serving (export, the OpenAI-compatible server);
- :mod:`marl.train`: multi-agent GRPO (estimators, losses, the learner, the trainer);
- :mod:`marl.infra`: run folders, seeds, atomic writes, Ray actor pools;
- :mod:`marl.cli`: the ``marl`` command.
"""

__version__ = "0.1.0"
