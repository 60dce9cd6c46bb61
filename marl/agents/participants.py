"""Turn a participant description into an agent that can take a seat.

A participant is named by one string:

- a bot name (``random``, ``heuristic``, ``optimal``) or ``bot:<name>``;
- a team YAML file: its first role, untrained (the initial model);
- a training run folder (its latest checkpoint), a run's ``RUN/best`` or ``RUN/latest``
  pointer, a checkpoint folder, or an exported team folder: the folder's ``team.yaml`` plus
  the adapter saved for its first trainable role;
- an HTTP model (:meth:`ParticipantLoader.load_http`): an OpenAI-compatible endpoint through the
  ``openai`` backend, as is a team file whose first role uses that backend;
- a run's ``RUN/population.json`` (``marl eval population``): its least exploitable mixture
  of snapshots, one member drawn per game (:mod:`marl.agents.population`).

Model participants on the same base model share one :class:`~marl.agents.host.ModelHost` (one copy
of the weights, one adapter each), so a tournament of ten checkpoints costs one model in memory.

Inside a training run a seat's occupant is named by a :class:`~marl.infra.seats.ParticipantId`
(``team:<i>``, ``bot:<name>``, ``ckpt:<folder>``, ``snap:<id>``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from marl.agents import Agent
from marl.agents.builder import (
    adapter_dir,
    build_roster,
    hf_role_policy,
    host_key,
    host_precisions,
    system_prompt_for,
)
from marl.agents.host import ModelHost
from marl.agents.models import load_model
from marl.agents.precision import weights_dtype
from marl.agents.scripted import ScriptedPolicy
from marl.config import SCHEMA_ID, RoleConfig, TeamConfig, load_config
from marl.config.tournament import HttpSource
from marl.games.bots import bot_names
from marl.infra.layout import (
    POPULATION_FILE,
    TEAM_FILE,
    checkpoint_folder,
    has_history,
    why_missing,
)


def bot_name(source: str, game: str) -> str | None:
    """The bot a participant source names (``<name>`` or ``bot:<name>``), if it is one of
    ``game``'s bots."""
    name = source.removeprefix("bot:")
    return name if name in bot_names(game) else None


def participant_role(cfg: TeamConfig) -> RoleConfig:
    """The role a team file or trained team is seated as: its first trained role (one with
    an adapter), else its first role."""
    return next((r for r in cfg.roles if r.adapter is not None), cfg.roles[0])


class ParticipantLoader:
    def __init__(self, game: str, seed: int = 0, hosts: dict[str, ModelHost] | None = None) -> None:
        """``hosts`` (model ref -> host) lets participants join an existing team's models."""
        self.game = game
        self.seed = seed
        self.hosts = {} if hosts is None else hosts

    def host(self, model: str, dtype: torch.dtype) -> ModelHost:
        """``model`` stored in ``dtype``, as the participant's own team builds it: a base
        stored in bf16 computes norms and the residual stream in bf16 too, so a participant
        read from a host in another dtype would not be the policy its run trained and logged.
        A host shared in with ``hosts`` serves when its dtype matches."""
        shared = self.hosts.get(model)
        if shared is not None and shared.dtype == dtype:
            return shared
        key = f"{model} ({str(dtype).removeprefix('torch.')})"
        if key not in self.hosts:
            self.hosts[key] = ModelHost(*load_model(model, dtype=dtype))
        return self.hosts[key]

    def load(self, spec: str, name: str | None = None) -> Agent:
        bot = bot_name(spec, self.game)
        if bot is not None:
            return Agent(
                name or bot, "bot", ScriptedPolicy(self.game, bot, seed=self.seed), mode="choice"
            )
        path = Path(spec)
        if path.name == POPULATION_FILE and path.is_file():
            from marl.agents.population import load_population  # it builds on this loader

            return load_population(self, path, name or f"{path.parent.name}/population")
        folder = checkpoint_folder(path)
        if folder == path and path.is_file():
            return self._model_agent(load_config(path), None, name or path.stem)
        if folder.is_dir() or folder != path:
            team_file = folder / TEAM_FILE
            if not team_file.is_file():
                raise FileNotFoundError(
                    f"{folder} has no team.yaml (expected a run, "
                    "checkpoint or exported team folder)"
                )
            run_name = path.parent.name if path.is_file() else path.name  # RUN/best: RUN
            return self._model_agent(load_config(team_file), folder, name or run_name)
        if has_history(path.parent):  # RUN/best before any evaluation, say
            raise FileNotFoundError(why_missing(path))
        raise ValueError(
            f"participant {spec!r} is neither a bot of {self.game} "
            f"({', '.join(bot_names(self.game))}) nor an existing file or folder"
        )

    def load_http(self, http: HttpSource, name: str) -> Agent:
        """A model behind an OpenAI-compatible endpoint, prompted like a one-role team."""
        cfg = TeamConfig.model_validate(
            {
                "schema": SCHEMA_ID,
                "name": name,
                "game": {"name": self.game},
                "roles": [
                    {
                        "name": "player",
                        "backend": "openai",
                        "model": http.model,
                        "endpoint": http.endpoint.model_dump(),
                        "decoding": http.decoding.model_dump(),
                    }
                ],
            }
        )
        return self._built_agent(cfg, name)

    def _built_agent(self, cfg: TeamConfig, name: str) -> Agent:
        """The first agent of ``cfg`` built by the roster builder, renamed ``name``."""
        agent = build_roster(cfg, seed=self.seed, hosts=self.hosts).agents[0]
        return dataclasses.replace(agent, name=name)

    def _model_agent(self, cfg: TeamConfig, folder: Path | None, name: str) -> Agent:
        role = participant_role(cfg)
        if role.backend == "openai" and folder is None:
            return self._built_agent(cfg.model_copy(update={"roles": [role]}), name)
        if role.backend != "hf":
            raise ValueError(
                f"{name}: role {role.name!r} uses backend {role.backend!r}; "
                "only hf and openai roles can be loaded as participants here"
            )
        host = self.host(role.model, weights_dtype(host_precisions(cfg, host_key(cfg, role))))
        adapter = None
        if folder is not None and role.adapter is not None:
            adapter = f"{name}@{role.name}"
            if adapter not in host.adapters:
                host.load_adapter(adapter, adapter_dir(folder, role.name))
        policy = hf_role_policy(host, adapter, role, self.seed)
        # the prompt of the role's first agent, as in training (and its exploitability log)
        prompt = system_prompt_for(role, cfg.name, self.game, role.instance_names()[0], 0)
        return Agent(name, role.name, policy, prompt, role.decoding.mode)
