"""The rollout engine: many games at once, one batched model call per policy per step.

At every step the engine collects the pending decision of each running game, groups them by
policy object (a policy is one model + adapter + decoding), and answers each group with a
single ``act`` call across all games.  Finished games are replaced by new ones until the
requested number of episodes is reached, so batches stay full (continuous batching over turns).

Every decision becomes a :class:`Turn`, recording what training needs (token ids, log-probs)
and what evaluation needs (parse outcome, legality, timing).  Rewards from the game are
credited to each agent's latest turn as they arrive (turn-level credit), and episode returns
are the agents' cumulative rewards.

An answer that names no legal move is handled as ``invalid`` says (``train.invalid_moves``):
played, so the game forfeits the agent (its own rules); asked again with the answer and the
error in the chat; or replaced by a random legal move.  The last two stamp the turn with a
format reward, ``-penalty``, kept apart from the game's rewards.

With ``branch = K > 0`` every choice decision of a role in ``branch_roles`` is also *branched*
(VinePPO's Monte Carlo values, for every action rather than one): the game is copied once per
legal action and K times over, each copy plays that action and is played out by the same
seats, batched with the main games.  The turn's ``action_values[j]`` is the mean return the
deciding agent earned from the decision on after playing action j: an estimate of
``Q(s, a_j)`` under the policies as they are, for the actions it did not sample too.
Branches are not episodes; they do not branch again.  With ``branch_agent`` set, that agent
(a bot) plays every seat of every copy instead: the values are then those of the bot's play
after the decision (Tesauro and Galperin's rollouts), at no model call.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from marl.agents.agent import Agent
from marl.agents.policy import Request, Response
from marl.config.train import InvalidMovesConfig
from marl.games import InvalidAction, TextGame

ILLEGAL = -1  # what the engine plays when text names no action; the game counts it as illegal


@dataclass
class Turn:
    """One decision of one agent in one game.

    ``parsed`` and ``legal`` judge the answer (it named a move; that move was legal now);
    ``action`` is what the game was given, a random legal move when ``penalty`` handling
    replaced an unplayable answer.
    """

    episode: int
    agent: str
    name: str
    role: str
    text: str
    action: int | None
    parsed: bool
    legal: bool
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    candidate_ids: list[list[int]] | None = None
    choice: int | None = None  # index into candidate_ids (choice decoding)
    action_probs: list[float] | None = None  # the distribution ``choice`` was drawn from
    choice_prompt_ids: list[int] | None = None  # think decoding: what the choice followed
    answer_ids: list[list[int]] | None = None  # free decoding: the legal moves' own answers
    public: Hashable | None = None  # the game's public_state at the decision, if it has one
    action_values: list[float] | None = None  # branched: mean return after each legal action
    temperature: float = 1.0  # the response's sampling temperature (0: greedy)
    choice_score: str = "sum"  # choice and think: how the moves were scored
    reward: float = 0.0
    format_reward: float = 0.0  # -penalty for an unplayable answer (retry, penalty handling)
    seconds: float = 0.0


@dataclass
class Episode:
    """A finished game: who sat where, every turn, and the returns."""

    index: int
    game: str
    seed: int
    seats: dict[str, str]
    turns: list[Turn] = field(default_factory=list)
    returns: dict[str, float] = field(default_factory=dict)
    illegal_moves: dict[str, int] = field(default_factory=dict)
    forfeits: list[str] = field(default_factory=list)
    policy_version: int = 0  # training: the weights that played it (the step that made them)

    def team_return(self) -> float:
        """What the team as a whole earned (MAGRPO's shared reward): the mean return."""
        return statistics.fmean(self.returns.values())

    def relative_return(self, agent: str) -> float:
        """``agent``'s return less the mean of the others': a general-sum game played as
        zero-sum, where getting more than the others is what pays."""
        others = [r for a, r in self.returns.items() if a != agent]
        return self.returns[agent] - (statistics.fmean(others) if others else 0.0)


@dataclass
class _Running:
    episode: Episode
    env: TextGame
    seats: dict[str, Agent]
    rng: random.Random  # penalty handling's replacement moves
    last_turn: dict[str, Turn] = field(default_factory=dict)
    errors: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # retry: text,
    # error and tries so far of the agent's pending decision
    parent: tuple[Turn, int] | None = None  # a branch: the decision and the action it values


def decision_turn(
    episode: int,
    agent_id: str,
    agent: Agent,
    legal: list[int],
    resp: Response,
    action: int | None,
    public: Hashable | None,
    seconds: float,
) -> Turn:
    """The :class:`Turn` of ``agent``'s answer ``resp`` in seat ``agent_id``, read as
    ``action`` (None: it named no move)."""
    return Turn(
        episode=episode,
        agent=agent_id,
        name=agent.name,
        role=agent.role,
        text=resp.text,
        action=action,
        parsed=action is not None,
        legal=action in legal,
        prompt_ids=resp.prompt_ids,
        completion_ids=resp.completion_ids,
        logprobs=resp.logprobs,
        candidate_ids=resp.candidate_ids,
        choice=resp.choice,
        action_probs=resp.action_probs,
        choice_prompt_ids=resp.choice_prompt_ids,
        answer_ids=resp.answer_ids,
        public=public,
        temperature=resp.temperature,
        choice_score=resp.choice_score,
        seconds=seconds,
    )


def read_action(
    env: TextGame, agent_id: str, legal: list[int], resp: Response
) -> tuple[int | None, str | None]:
    """The move ``resp`` names (its choice, or its text parsed by the game; None: no move)
    and, when that cannot be played, why."""
    if resp.choice is not None:
        return legal[resp.choice], None
    parsed = env.parse_action(agent_id, resp.text)
    if isinstance(parsed, InvalidAction):
        return None, parsed.reason
    if parsed not in legal:
        return parsed, f"{env.action_text(parsed)} is not a legal move now"
    return parsed, None


def move_read(legal: list[int], action: int | None) -> list[float]:
    """One free-text answer as a draw of its policy over ``legal``: the move it named, or for
    an unplayable answer (``action`` None or not legal) a uniformly random legal move, what
    ``invalid_moves: penalty`` plays in its place."""
    if action in legal:
        return [float(a == action) for a in legal]
    return [1 / len(legal)] * len(legal)


def answer_read(
    masses: list[float], resp: Response, legal: list[int], action: int | None
) -> list[float]:
    """A free-text policy's move distribution at a state, read without bias from one sampled
    answer and the exact probabilities ``masses`` of the legal moves' own answers
    (``resp.answer_ids``): those masses, plus the sampled answer's :func:`move_read` when it
    is none of those answers.  Its mean is the policy's distribution (an unplayable answer
    counted as a random legal move); once nearly every answer is one of them, nearly exact."""
    if resp.completion_ids in (resp.answer_ids or []):
        return list(masses)
    return [m + r for m, r in zip(masses, move_read(legal, action), strict=True)]


def retry_request(request: Request, answer: str, error: str) -> Request:
    """``request`` with the unplayable ``answer`` and the error appended to the chat."""
    moves = request.env.legal_text(request.agent)  # as the prompt states them
    messages = [
        *request.messages,
        {"role": "assistant", "content": answer},
        {
            "role": "user",
            "content": f"That answer cannot be played: {error}. Answer "
            f"again, ending with one of: {moves}",
        },
    ]
    return Request(
        messages=messages,
        legal=request.legal,
        action_texts=request.action_texts,
        env=request.env,
        agent=request.agent,
    )


class RolloutEngine:
    """Plays ``n`` episodes of ``make_env()`` with ``seating(i)`` choosing each episode's agents.

    ``seating(i)`` returns ``{agent_id: Agent}`` for episode ``i`` (so callers rotate seats,
    sample league opponents, etc.).  ``invalid`` says what an unplayable answer does (default:
    the game's forfeit); ``branch`` and ``branch_roles`` whose decisions are valued by
    branching, ``branch_agent`` who plays the copies out if not their seats (module
    docstring).
    """

    def __init__(
        self,
        make_env: Callable[[], TextGame],
        seating: Callable[[int], dict[str, Agent]],
        concurrency: int = 32,
        invalid: InvalidMovesConfig | None = None,
        branch: int = 0,
        branch_roles: Collection[str] = (),
        branch_agent: Agent | None = None,
    ) -> None:
        self.make_env = make_env
        self.seating = seating
        self.concurrency = max(1, concurrency)
        self.invalid = invalid or InvalidMovesConfig()
        self.branch = branch
        self.branch_roles = frozenset(branch_roles)
        self.branch_agent = branch_agent
        self._forks: list[_Running] = []

    def play(
        self,
        n: int,
        seed: int = 0,
        seeds: Sequence[int] | None = None,
        on_episode: Callable[[Episode], None] | None = None,
    ) -> list[Episode]:
        """Play ``n`` episodes; episode ``i`` uses ``seeds[i]`` if given, else ``seed + i``."""
        if seeds is not None and len(seeds) != n:
            raise ValueError(f"{len(seeds)} seeds for {n} episodes")
        done: list[Episode] = []
        running: list[_Running] = []
        started = 0
        while len(done) < n or running:  # branches may outlive their game
            while started < n and sum(r.parent is None for r in running) < self.concurrency:
                running.append(
                    self._start(started, seeds[started] if seeds is not None else seed + started)
                )
                started += 1
            self._step(running)
            running.extend(self._forks)
            self._forks.clear()
            ended = [r for r in running if not r.env.agents]
            running[:] = [r for r in running if r.env.agents]
            for r in ended:
                if r.parent is not None:
                    turn, j = r.parent
                    assert turn.action_values is not None
                    turn.action_values[j] += r.episode.returns[turn.agent] / self.branch
                    continue
                done.append(r.episode)
                if on_episode:
                    on_episode(r.episode)
        return sorted(done, key=lambda e: e.index)

    def _fork(self, r: _Running, turn: Turn, legal: list[int]) -> None:
        """Queue ``branch`` copies of the game for each legal action, before ``turn``'s own
        is played; each copy draws its chance events afresh."""
        turn.action_values = [0.0] * len(legal)
        seats = r.seats if self.branch_agent is None else dict.fromkeys(r.seats, self.branch_agent)
        for j, action in enumerate(legal):
            for _ in range(self.branch):
                env = r.env.clone()
                if hasattr(env, "np_random"):
                    env.np_random = np.random.default_rng(r.rng.randrange(2**63))
                ep = Episode(
                    index=r.episode.index,
                    game=r.episode.game,
                    seed=r.episode.seed,
                    seats=r.episode.seats,
                )
                b = _Running(ep, env, seats, random.Random(r.rng.random()), parent=(turn, j))
                self._advance(b, action)
                self._forks.append(b)

    def _start(self, i: int, seed: int) -> _Running:
        env = self.make_env()
        env.reset(seed=seed)
        seats = self.seating(i)
        missing = set(env.possible_agents) - set(seats)
        if missing:
            raise ValueError(f"seating for episode {i} leaves seats empty: {sorted(missing)}")
        ep = Episode(
            index=i,
            game=env.metadata["name"],
            seed=seed,
            seats={a: seats[a].name for a in env.possible_agents},
        )
        return _Running(ep, env, seats, random.Random(seed))

    def _step(self, running: Sequence[_Running]) -> None:
        """Answer one pending decision in every running game, batched per policy."""
        groups: dict[int, list[tuple[_Running, str]]] = {}
        for r in running:
            agent_id = r.env.agent_selection
            groups.setdefault(id(r.seats[agent_id].policy), []).append((r, agent_id))
        for items in groups.values():
            policy = items[0][0].seats[items[0][1]].policy
            requests = [self._request(r, a) for r, a in items]
            t0 = time.perf_counter()
            responses = policy.act(requests)
            per = (time.perf_counter() - t0) / len(items)
            for (r, agent_id), req, resp in zip(items, requests, responses, strict=True):
                self._apply(r, agent_id, req.legal, resp, per)

    @staticmethod
    def _request(r: _Running, agent_id: str) -> Request:
        request = r.seats[agent_id].request(r.env, agent_id)
        if agent_id in r.errors:
            answer, error, _ = r.errors[agent_id]
            request = retry_request(request, answer, error)
        return request

    def _apply(
        self, r: _Running, agent_id: str, legal: list[int], resp: Response, seconds: float
    ) -> None:
        env, agent = r.env, r.seats[agent_id]
        public = env.public_state(agent_id)
        action, error = read_action(env, agent_id, legal, resp)
        turn = decision_turn(r.episode.index, agent_id, agent, legal, resp, action, public, seconds)
        r.episode.turns.append(turn)
        r.last_turn[agent_id] = turn
        if (
            self.branch
            and r.parent is None
            and resp.choice is not None
            and agent.role in self.branch_roles
        ):
            self._fork(r, turn, legal)
        handling = self.invalid.handling
        if error is None or handling == "forfeit":
            r.errors.pop(agent_id, None)
        else:
            turn.format_reward = -self.invalid.penalty
            tries = r.errors.pop(agent_id, ("", "", 0))[2] + 1
            if handling == "retry" and tries <= self.invalid.retries:
                r.errors[agent_id] = (resp.text, error, tries)
                return  # the game waits: the agent is asked again
            if handling == "penalty":
                action = r.rng.choice(legal)
                turn.action = action
        self._advance(r, ILLEGAL if action is None else action)

    def _advance(self, r: _Running, action: int) -> None:
        """Play ``action`` in ``r``'s game, credit its rewards, and close the game if it ended."""
        r.env.step(action)
        self._credit(r)
        if all(r.env.terminations[a] or r.env.truncations[a] for a in r.env.agents):
            self._finish(r)

    @staticmethod
    def _credit(r: _Running) -> None:
        returns = r.episode.returns
        for a, rew in r.env.rewards.items():
            returns[a] = returns.get(a, 0.0) + float(rew)
            if rew and a in r.last_turn:
                r.last_turn[a].reward += float(rew)

    @staticmethod
    def _finish(r: _Running) -> None:
        env, ep = r.env, r.episode
        ep.returns = {a: ep.returns.get(a, 0.0) for a in env.possible_agents}
        ep.illegal_moves = {
            a: int(env.infos[a].get("illegal_moves", 0)) for a in env.possible_agents
        }
        ep.forfeits = [a for a in env.possible_agents if env.infos[a].get("forfeit")]
        while env.agents:  # AEC dead steps: every finished agent is stepped once with None
            env.step(None)
