"""The ``marl`` command line: flags in, library calls, results printed.

One module per command group, registered here in the order ``marl --help`` lists them:

- :mod:`marl.cli.configs`: ``validate`` team and tournament files, print their JSON ``schema``;
- :mod:`marl.cli.models`: ``models list`` (the registry), ``chat`` (ask a model once);
- :mod:`marl.cli.games`: ``games list`` (every game: seats, kind, bots, exact evaluations,
  arguments);
- :mod:`marl.cli.play`: ``play`` a team's game against itself, a bot, a checkpoint or you;
- :mod:`marl.cli.train`: ``train`` with multi-agent GRPO, ``plot`` a run;
- :mod:`marl.cli.evaluate`: ``eval exploitability``, ``eval against``, ``eval population``,
  ``eval team`` (credit and specialisation);
- :mod:`marl.cli.run`: ``run`` a team on a prompt or on cooperative tasks;
- :mod:`marl.cli.tournament`: ``tournament`` (play, resume, rate, report);
- :mod:`marl.cli.team`: ``export`` a run as a team, ``serve`` it (OpenAI API), ``topology show``;
- :mod:`marl.cli.targets`: what a target names and the game it carries, checked before any
  model loads; :mod:`marl.cli.output`: ``--json`` and tables that never cut a figure;
- :mod:`marl.cli.errors`: an ``OSError`` (full disk, read-only folder) in any of them ends it
  with one ``error:`` line and exit code 2.
"""

from __future__ import annotations

import os

# Before torch loads libgomp: spinning OpenMP workers collapse when the 2 cores are shared
# (SmolLM2 greedy answer 15 s spinning vs 0.8 s passive on a loaded 2-core box).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer  # noqa: E402

from marl.cli import configs, evaluate, games, models, play, run, team, tournament, train  # noqa: E402
from marl.cli.errors import guard  # noqa: E402

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="marl-teams: teams of LLM agents that learn together.",
)
for group in (configs, models, games, play, train, evaluate, run, tournament, team):
    group.register(app)
guard(app)  # a full disk or a read-only folder: one `error:` line, exit 2

__all__ = ["app"]
