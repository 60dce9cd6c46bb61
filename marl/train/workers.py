"""Rollout workers: build the team from its config and play the episodes they are given.

A worker is a plain class; the Ray runtime wraps it as an actor, the local runtime calls it in
process.  It plays episodes one of three ways, chosen once from the config (``train.rollout``):
games (agents take the seats of ``game.name``, through the rollout engine), team tasks
(:class:`TeamPlayer`: the team answers a task of ``game.name`` in free text along a topology,
through the team runtime) or states (one decision at an information state of the game's exact
tree: :mod:`marl.train.states`); all return :class:`Episode` values the trainer treats alike.
Everything it receives is data (the config as a dict, episode specs, adapter weights), so a
replacement worker rebuilt from the same inputs plays the same games.
Randomness is re-seeded from (run seed, step, episode) at every call, so results do not depend
on which worker played what or on a resume in between.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

from marl import games
from marl.agents import Agent
from marl.agents.builder import Roster, build_roster, hf_role_policy, host_key
from marl.agents.participants import ParticipantLoader
from marl.agents.policy import Request, Response
from marl.agents.rollout import (
    Episode,
    RolloutEngine,
    Turn,
    answer_read,
    decision_turn,
    read_action,
)
from marl.agents.tables import agent_probs, exploitability_report
from marl.config import TeamConfig
from marl.games.analysis import info_state_envs, info_states
from marl.games.tasks import make_task
from marl.infra.seats import ParticipantId
from marl.infra.seeds import derive_seed, reseed
from marl.orchestrator.team import Team, TeamResult
from marl.topologies import Topology
from marl.train.league import Weights


@dataclass(frozen=True)
class EpisodeSpec:
    """One game to play: its seed, its GRPO group, and who sits where.

    ``seating`` maps each seat to its participant; ``opponent`` is the league opponent the
    trained agent meets (None: self-play, every seat taken by the team).
    """

    index: int
    seed: int
    group: int
    seating: tuple[tuple[str, ParticipantId], ...]
    opponent: ParticipantId | None = None
    edge_mask: tuple[bool, ...] | None = None  # team tasks: the sampled graph (candidate mask)


@dataclass
class TeamEpisode(Episode):
    """A team task answered in free text: its score, its reward (the score less the cost of
    deferring to an expert), its deferrals and what the graph it ran on cost."""

    score: float = 0.0
    messages: int = 0
    tokens: int = 0
    edge_mask: tuple[bool, ...] | None = None
    reward: float = 0.0
    deferrals: int = 0

    def team_return(self) -> float:
        return self.reward


class TeamPlayer:
    """Plays episode specs as team tasks: spec ``i`` is the task of ``game.name`` with the
    spec's seed, answered by the team along the spec's sampled graph (else the configured
    one).  Every turn is a decision to learn from (a defer token too).  An agent's return is
    its own score where the task scores roles (``role_scores``), else the team's; both less
    ``defer.cost`` per deferral.  The team reward stays the task score less that cost."""

    def __init__(self, cfg: TeamConfig, roster: Roster) -> None:
        self.game = cfg.game
        self.team = Team.from_config(cfg, policies=roster.policies)

    def topology(self, spec: EpisodeSpec) -> Topology:
        if spec.edge_mask is None:
            return self.team.topology
        assert self.team.learnable is not None, "an edge mask needs a learnable topology"
        return self.team.learnable.topology_of(torch.tensor(spec.edge_mask))

    def play(self, specs: list[EpisodeSpec]) -> list[Episode]:
        tasks = [make_task(self.game.name, s.seed, **self.game.kwargs) for s in specs]
        results = self.team.run_batch(tasks, topologies=[self.topology(s) for s in specs])
        return [self.episode(s, r) for s, r in zip(specs, results, strict=True)]

    def episode(self, spec: EpisodeSpec, result: TeamResult) -> TeamEpisode:
        score, reward = float(result.score or 0.0), result.reward
        turns = []
        for t in result.transcript:
            r = t.response or Response(t.text)  # no ids: nothing to learn from this turn
            turns.append(
                Turn(
                    episode=spec.index,
                    agent=t.agent,
                    name=t.agent,
                    role=t.role,
                    text=t.text,
                    action=None,
                    parsed=True,
                    legal=True,
                    prompt_ids=list(r.prompt_ids),
                    completion_ids=list(r.completion_ids),
                    logprobs=list(r.logprobs),
                    temperature=r.temperature,
                )
            )
        agents = list(self.team.agents)
        own = result.role_scores or {}
        returns = {a: own[a] - result.deferral_cost if a in own else reward for a in agents}
        last = {t.agent: t for t in turns}  # the reward arrives after each agent's last turn
        for t in last.values():
            t.reward = returns[t.agent]
        return TeamEpisode(
            spec.index,
            self.game.name,
            spec.seed,
            {a: a for a in agents},
            turns,
            returns,
            score=score,
            messages=result.messages,
            tokens=result.tokens,
            edge_mask=spec.edge_mask,
            reward=reward,
            deferrals=result.deferrals,
        )


def _opponent(pid: ParticipantId, agent: Agent) -> Agent:
    """``agent`` under the role label ``<id>@<role>``, never a role's name: the trainer neither
    learns from nor branches the turns of a role it does not train."""
    return dataclasses.replace(agent, role=f"{pid}@{agent.role}")


class RolloutWorker:
    def __init__(self, cfg: dict, roster: Roster | None = None) -> None:
        self.cfg = TeamConfig.model_validate(cfg)
        self.roster = roster or build_roster(self.cfg)
        # the role league snapshots copy (none in a topology-only team)
        self.trainee = next((r for r in self.cfg.roles if r.adapter is not None), None)
        self.host = (
            self.roster.hosts[host_key(self.cfg, self.trainee)]
            if self.trainee is not None
            else None
        )
        # league opponents (snapshots, checkpoints, bots) by id, made by _opponent
        self.extra: dict[ParticipantId, Agent] = {}
        self.version = 0  # of the weights it plays with: the training step that made them
        self._play: Callable[[list[EpisodeSpec]], list[Episode]] = {
            "team": lambda specs: TeamPlayer(self.cfg, self.roster).play(specs),
            "states": self._visit_states,
        }.get(self.cfg.rollout_kind(), self._play_games)

    # ----- weights
    def set_weights(self, weights: Weights) -> None:
        for adapter, sd in weights.items():
            self.host.set_adapter_weights(adapter, sd)

    def _snapshot_adapter(self, sid: ParticipantId) -> str:
        return f"{sid}@{self.trainee.name}"

    def sync_snapshots(self, snapshots: dict[ParticipantId, Weights]) -> None:
        """Load new league snapshots as extra adapters; drop evicted ones."""
        for sid in [s for s in self.extra if s.kind == "snap" and s not in snapshots]:
            self.host.delete_adapter(self._snapshot_adapter(sid))
            del self.extra[sid]
        tc = self.cfg.train
        learn = tc is not None and tc.league.learn_from_snapshots
        for sid, weights in snapshots.items():
            if sid in self.extra:
                continue
            adapter = self._snapshot_adapter(sid)
            a = self.trainee.adapter
            self.host.add_adapter(
                adapter, r=a.r, alpha=a.alpha, dropout=a.dropout, targets=a.targets
            )
            self.host.set_adapter_weights(adapter, weights[self.trainee.name])
            agent = self._trainee_agent(sid, adapter)
            self.extra[sid] = agent if learn else _opponent(sid, agent)

    def _trainee_agent(self, pid: ParticipantId, adapter: str | None) -> Agent:
        """The trained role's model under ``adapter`` (None: without one), prompted as in
        training."""
        assert self.host is not None and self.trainee is not None  # the config requires one
        policy = hf_role_policy(self.host, adapter, self.trainee, 0)
        prompt = self.roster.agents[0].system_prompt
        return Agent(str(pid), self.trainee.name, policy, prompt, self.trainee.decoding.mode)

    # ----- playing
    def _participant(self, pid: ParticipantId) -> Agent:
        if pid.kind == "team":
            return self.roster.agents[pid.index]
        if pid not in self.extra:
            if pid.kind == "snap":
                raise KeyError(f"unknown participant {str(pid)!r} (snapshots must be synced first)")
            self.extra[pid] = _opponent(pid, self._load(pid))
        return self.extra[pid]

    def _load(self, pid: ParticipantId) -> Agent:
        """A fixed opponent: the trained role's model without its adapter, or a loaded one."""
        if pid.kind == "base":
            return self._trainee_agent(pid, None)
        loader = ParticipantLoader(self.cfg.game.name, hosts=self.roster.hosts)
        return loader.load(pid.arg, name=str(pid))

    def play(self, specs: list[EpisodeSpec], step: int, run_seed: int) -> list[Episode]:
        """Play ``specs``; each batch of specs is re-seeded from its first episode index, and
        every episode stamped with the weights' version."""
        if not specs:
            return []
        reseed(
            [a.policy for a in [*self.roster.agents, *self.extra.values()]],
            derive_seed(run_seed, step, specs[0].index),
        )
        episodes = self._play(specs)
        for ep, spec in zip(episodes, specs, strict=True):
            ep.index, ep.policy_version = spec.index, self.version
        return episodes

    def _play_games(self, specs: list[EpisodeSpec]) -> list[Episode]:
        seatings = [{s: self._participant(p) for s, p in spec.seating} for spec in specs]
        game, tc = self.cfg.game, self.cfg.train
        branch = tc.branch if tc and tc.policies == "train" else 0
        engine = RolloutEngine(
            lambda: games.make_from_config(game),
            lambda i: seatings[i],
            concurrency=tc.concurrency if tc else 64,
            invalid=tc.invalid_moves if tc else None,
            branch=branch,
            branch_roles=[r.name for r in self.cfg.roles if r.adapter],
            branch_agent=(
                self._participant(ParticipantId("bot", tc.branch_rollout))
                if branch and tc.branch_rollout != "policy"
                else None
            ),
        )
        return engine.play(len(specs), seeds=[s.seed for s in specs])

    def _visit_states(self, specs: list[EpisodeSpec]) -> list[Episode]:
        """``train.rollout: states``: each spec is one decision at information state
        ``spec.group`` (in :func:`~marl.games.analysis.info_states` order), asked of the
        participant in that state's seat, batched per policy: an episode of that one turn,
        which the trainer values on the game tree."""
        asks = [self._state_request(spec) for spec in specs]
        by_policy: dict[int, list[int]] = {}
        for i, (_, _, agent, _) in enumerate(asks):
            by_policy.setdefault(id(agent.policy), []).append(i)
        size = self.cfg.train.concurrency if self.cfg.train else 64
        out: dict[int, Episode] = {}
        for rows in by_policy.values():
            for part in (rows[j : j + size] for j in range(0, len(rows), size)):
                t0 = time.perf_counter()
                policy = asks[part[0]][2].policy
                requests = [asks[i][3] for i in part]
                responses = policy.act(requests)
                masses = self._answer_masses(policy, responses)
                per = (time.perf_counter() - t0) / len(part)
                for k, (i, resp) in enumerate(zip(part, responses, strict=True)):
                    env, who, agent, req = asks[i]
                    action, _ = read_action(env, who, req.legal, resp)
                    public = env.public_state(who)
                    turn = decision_turn(
                        specs[i].index, who, agent, req.legal, resp, action, public, per
                    )
                    if masses is not None:
                        turn.action_probs = answer_read(masses[k], resp, req.legal, action)
                    seats = {who: agent.name}
                    out[i] = Episode(
                        specs[i].index, self.cfg.game.name, specs[i].seed, seats, [turn]
                    )
        return [out[i] for i in range(len(specs))]

    @staticmethod
    def _answer_masses(policy, responses: list[Response]) -> list[list[float]] | None:
        """Free text: the probabilities of the legal moves' own answers, from which each
        decision's read is made (:func:`~marl.agents.rollout.answer_read`), where the policy
        can score them; None for scored moves (their reads are their distributions)."""
        if not responses or responses[0].answer_ids is None:
            return None
        answer_probs = getattr(policy, "answer_probs", None)
        return None if answer_probs is None else answer_probs(responses)

    @cached_property
    def _states(self) -> tuple[list[tuple[str, int, list[int]]], dict]:
        """The game's information states and an env positioned at each (built once)."""
        return info_states(self.cfg.game.name), info_state_envs(self.cfg.game.name)

    def _state_request(self, spec: EpisodeSpec) -> tuple[games.TextGame, str, Agent, Request]:
        """The env positioned at ``spec``'s information state, its seat, the participant
        there and what it is asked."""
        states, positioned = self._states
        key, _, legal = states[spec.group]
        env, who = positioned[key]
        agent = self._participant(dict(spec.seating)[who])
        request = agent.request(env, who)
        if list(request.legal) != legal:
            raise ValueError(
                f"{self.cfg.game.name} at {key!r}: the game offers {request.legal}, "
                f"its tree {legal}"
            )
        return env, who, agent, request

    def exploitability(self) -> float:
        """Exact exploitability of the trained role's current policy (exact-tree games)."""
        read = agent_probs(self.roster.agents[0])
        return exploitability_report(read, self.cfg.game.name).exploitability
