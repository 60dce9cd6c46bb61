"""Do the words matter?  A think-decoding policy's table read with the move scored after
three kinds of reasoning, and how often the reasonings name the player's private card.

``K`` reasonings are sampled at every information state, as :func:`~marl.agents.tables.agent_report`
samples them (same batches, same seeds: ``own`` is its figure).  The move's choice
distribution is then scored after ``prompt + reasoning + separator``
(:func:`~marl.agents.host.generation.think_contexts`) with the reasoning:

- ``own``: the one sampled at that state (the policy as it plays);
- ``empty``: none: the same think prompt followed directly by the separator, as if the
  model had ended its reasoning at once.  One context per state, so the table is exact;
- ``swap``: the one sampled, in the same draw, at another information state of the same
  player: draw ``j`` uses a seeded random derangement of each player's states (no state keeps
  its own reasoning, and the permutation changes from draw to draw).

Sampled tables get the bootstrap interval of :func:`~marl.agents.tables.draws_report`.  Where
the game exposes its private-information names, each mode also gives the share of the
reasonings scored that name the value held at the state scored at, and of those naming
another (:mod:`marl.agents.mentions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from marl.agents import Agent
from marl.agents.mentions import NamingShares, naming_shares
from marl.agents.policy import Request
from marl.agents.tables import ExploitabilityReport, draws_report
from marl.games.analysis import exploitability, info_state_envs

MODES = ("own", "empty", "swap")


@dataclass(frozen=True)
class Transcript:
    """One draw at a state: the reasoning's text, the state it was written at (``None`` for
    the empty one) and the choice distribution after it (action index -> probability)."""

    source: str | None
    text: str
    probs: dict[int, float]


@dataclass
class ReasoningReport:
    """One way of scoring the move: its exploitability report, the naming shares of the
    reasonings scored (None: empty mode, or a game with no names), every draw per state."""

    mode: str
    report: ExploitabilityReport
    shares: NamingShares | None
    transcripts: dict[str, list[Transcript]] = field(default_factory=dict)


@dataclass
class Reasonings:
    """``ids[i][j]``: the ``j``-th reasoning sampled at state ``keys[i]`` (``texts`` as
    transcripts show them); ``held``: the private value there, ``names``: the game's."""

    game: str
    keys: list[str]
    requests: list[Request]
    players: list[str]
    ids: list[list[list[int]]]
    texts: list[list[str]]
    held: list[str | None]
    names: dict[str, tuple[str, ...]]


def writes_reasoning(agent: Agent) -> bool:
    """Whether the agent reasons before it chooses and can score a move after a reasoning
    (think decoding with ``think_tokens > 0`` on the hf backend)."""
    policy = agent.policy
    return bool(getattr(policy, "reasons", False)) and hasattr(policy, "probabilities_after")


def think_policy(agent: Agent):
    """The agent's policy if it :func:`writes_reasoning`."""
    policy = agent.policy
    if not writes_reasoning(agent):
        raise TypeError(
            f"{agent.name!r} writes no reasoning before its move "
            "(only a think-mode policy with think_tokens > 0 on the hf backend does)"
        )
    return policy


def sample_reasonings(agent: Agent, game: str, samples: int, batch: int = 32) -> Reasonings:
    """``samples`` reasonings per information state (one where reasoning is greedy), in
    batches of ``batch`` over all the draws like :func:`~marl.agents.tables.sampled_report`."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    policy = think_policy(agent)
    positioned = info_state_envs(game)
    requests = [agent.request(env, who) for env, who in positioned.values()]
    n, draws = len(requests), samples if policy.sampled_table else 1
    todo = requests * draws
    flat = [r for i in range(0, len(todo), batch) for r in policy.reasonings(todo[i : i + batch])]
    ids = [[flat[j * n + i] for j in range(draws)] for i in range(n)]
    envs = [env for env, _ in positioned.values()]
    return Reasonings(
        game,
        list(positioned),
        requests,
        [who for _, who in positioned.values()],
        ids,
        [[policy.reasoning_text(r) for r in row] for row in ids],
        [env.private_value(who) for env, who in positioned.values()],
        envs[0].private_names() if envs else {},
    )


def derangements(players: list[str], count: int, seed: int = 0) -> list[list[int]]:
    """``count`` seeded maps ``state -> source state``, each a random derangement within
    every player's states (the source is another state of the same player)."""
    groups: dict[str, list[int]] = {}
    for i, player in enumerate(players):
        groups.setdefault(player, []).append(i)
    for player, group in groups.items():
        if len(group) < 2:
            raise ValueError(f"swap needs two information states per player; {player} has one")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        src = list(range(len(players)))
        for group in groups.values():
            perm = rng.permutation(len(group))
            while (perm == np.arange(len(group))).any():  # about e tries per derangement
                perm = rng.permutation(len(group))
            for k, i in enumerate(group):
                src[i] = group[perm[k]]
        out.append(src)
    return out


def _sources(reasonings: Reasonings, mode: str, samples: int, seed: int) -> list[list[int]]:
    """Per draw, the state whose reasoning each state is scored after (-1: the empty one)."""
    n = len(reasonings.keys)
    if mode == "empty":
        return [[-1] * n]
    if mode == "own":
        return [list(range(n))] * len(reasonings.ids[0])
    if mode == "swap":
        return derangements(reasonings.players, samples, seed)
    raise ValueError(f"reasoning mode must be one of {', '.join(MODES)}, got {mode!r}")


def mode_report(
    agent: Agent, reasonings: Reasonings, mode: str, samples: int, seed: int = 0, batch: int = 32
) -> ReasoningReport:
    """The table read with the move scored after ``mode``'s reasonings (module docstring)."""
    policy, r = think_policy(agent), reasonings
    sources = _sources(r, mode, samples, seed)
    n, draws = len(r.keys), len(r.ids[0])
    flat = [(j, i, src[i]) for j, src in enumerate(sources) for i in range(n)]
    probs = []
    for b in range(0, len(flat), batch):
        part = flat[b : b + batch]
        requests = [r.requests[i] for _, i, _ in part]
        given = [r.ids[s][j % draws] if s >= 0 else [] for j, _, s in part]
        read = policy.probabilities_after(requests, given)
        probs += [dict(zip(q.legal, p, strict=True)) for q, p in zip(requests, read, strict=True)]
    transcripts: dict[str, list[Transcript]] = {k: [] for k in r.keys}
    for (j, i, s), p in zip(flat, probs, strict=True):
        text = r.texts[s][j % draws] if s >= 0 else ""
        transcripts[r.keys[i]].append(Transcript(r.keys[s] if s >= 0 else None, text, p))
    rows = {k: [t.probs for t in ts] for k, ts in transcripts.items()}
    if mode == "empty" or mode == "own" and not policy.sampled_table:  # one context a state
        table = {k: d[0] for k, d in rows.items()}
        report = ExploitabilityReport(r.game, exploitability(r.game, table), table)
    else:
        report = draws_report(rows, r.game, seed=seed)
    return ReasoningReport(mode, report, _shares(r, flat), transcripts)


def _shares(r: Reasonings, flat: list[tuple[int, int, int]]) -> NamingShares | None:
    """Naming shares of the reasonings scored, against the value held where each is scored."""
    if any(h is None for h in r.held):
        return None
    draws = len(r.ids[0])
    scored = [(r.texts[s][j % draws], r.held[i]) for j, i, s in flat if s >= 0]
    return naming_shares(scored, r.names)  # type: ignore[arg-type]


def reasoning_reports(
    agent: Agent, game: str, modes: list[str], samples: int, seed: int = 0, batch: int = 32
) -> list[ReasoningReport]:
    """One report per mode of ``modes``, every mode scoring the same sampled reasonings."""
    reasonings = sample_reasonings(agent, game, samples, batch)
    return [mode_report(agent, reasonings, m, samples, seed, batch) for m in modes]
