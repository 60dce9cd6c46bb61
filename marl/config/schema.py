"""The team config schema (``schema: marl-teams/v1``), as pydantic v2 models.

This module is a leaf: it imports only pydantic and the standard library, so every package of
the project can read configs without import cycles.  Checks that need other packages (is the
game registered? is the model known?) are plugged in by the loader's ``checks`` argument.

Cross-field problems are raised with :func:`raise_problems`, which keeps the relative path of
each problem so the loader can point at the exact YAML line; a plain ``model_validate`` still
gets a readable message.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from marl.config.base import Float, Int, Precision, StrictModel
from marl.config.train import MAX_STEPS, TrainConfig

SCHEMA_ID = "marl-teams/v1"
#: The most agents a role (and the most roles a team) may have.
MAX_COUNT = 64

#: Names that ``system_prompt`` and ``goal`` may reference as ``{placeholder}``.
PLACEHOLDERS: dict[str, str] = {
    "role": "the role's name (e.g. 'player')",
    "name": "the agent instance's name (the role name, plus '_<index>' when count > 1)",
    "game": "the game's registry name",
    "goal": "the role's rendered goal (not usable inside goal itself)",
    "team": "the team's name",
    "index": "the instance index within the role, 0-based",
}

#: A problem found by a cross-field check: (path relative to the model, message).
PathProblem = tuple[tuple[str | int, ...], str]
#: game.call_timeout_s and game.max_turns by default (the game adapters default to them too)
CALL_TIMEOUT_S = 60.0
MAX_TURNS = 10_000

CROSS_CHECK_ERROR = "cross_check"
#: The validation context key under which a root's cross-section rules wait: the loader runs
#: them itself, so that they are reported beside the same file's field errors.
DEFER_RULES = "defer_rules"


def dotted(path: Iterable[str | int]) -> str:
    """``('roles', 1, 'name')`` -> ``'roles.1.name'``: the path format used in every message."""
    return ".".join(str(p) for p in path)


def raise_problems(problems: Sequence[PathProblem]) -> None:
    """Raise every problem at once as one pydantic error that keeps each problem's path.

    pydantic lets a validator raise a single error located at the model itself; the paths in the
    error context let the loader report each problem at its own field and line.
    """
    if not problems:
        return
    summary = "; ".join(f"{dotted(p)}: {m}" if p else m for p, m in problems)
    raise PydanticCustomError(
        CROSS_CHECK_ERROR, "{summary}", {"summary": summary, "problems": list(problems)}
    )


def check_template(text: str, allowed: Iterable[str]) -> str:
    """Validate ``{placeholder}`` use in a prompt string; return it unchanged.

    Done at load time so a typo such as ``{gaem}`` fails in ``marl validate``, not in the middle
    of a training run when the prompt is first rendered.
    """
    allowed = sorted(allowed)
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(
            f"malformed placeholder: {exc} (write '{{{{' or '}}}}' for a literal brace)"
        ) from None
    for _literal, field, spec, _conv in parsed:
        if field is None:
            continue
        if field == "" or field.isdigit():
            raise ValueError(
                f"positional placeholder '{{{field}}}' is not allowed; "
                f"use a name: {', '.join(allowed)}"
            )
        base = field.split(".", 1)[0].split("[", 1)[0]
        if base not in allowed:
            raise ValueError(f"unknown placeholder '{{{field}}}'; allowed: {', '.join(allowed)}")
        if base != field:  # values are plain strings and ints: nothing to index or look up
            raise ValueError(
                f"placeholder '{{{field}}}' uses attribute or index access; write '{{{base}}}'"
            )
        if spec and "{" in spec:
            raise ValueError(
                f"nested placeholder in the format spec of '{{{field}}}' is not allowed"
            )
    return text


class AdapterConfig(StrictModel):
    """A LoRA adapter: the trainable part of a role.  No adapter means the role is frozen."""

    r: Int = Field(8, ge=1, le=1024, description="LoRA rank.")
    alpha: Int = Field(16, ge=1, le=65536, description="LoRA alpha (scale = alpha / r).")
    dropout: Float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "v_proj"],
        min_length=1,
        description="Names of the linear modules that get an adapter.",
    )
    init: str | None = Field(
        None,
        min_length=1,
        description="A PEFT adapter folder to start from instead of an untrained adapter (a run's "
        "checkpoints/step_N/adapters/ROLE, or an export's adapter): training warm-starts from it."
        "  Its rank, alpha and targets must be these.",
    )


class DecodingConfig(StrictModel):
    """How a role turns the model into actions."""

    mode: Literal["free", "choice", "think"] = Field(
        "free",
        description="free: sample text and parse it; choice: score each legal action and pick from"
        " that distribution (no parse failures); think: sample up to think_tokens of reasoning, "
        "then choose as choice does after it (docs/algorithms.md#think-then-act).",
    )
    temperature: Float = Field(
        1.0, ge=0.0, le=100.0, description="Sampling temperature; 0 is greedy."
    )
    max_new_tokens: Int = Field(64, ge=1, le=4096, description="Token budget per turn (free).")
    top_p: Float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    think_tokens: Int = Field(
        48,
        ge=0,
        le=4096,
        description="think: most reasoning tokens before the choice; 0 reasons not at all (the "
        "choice mode's prompt and distribution).",
    )
    think_prompt: str = Field(
        "Think briefly about your move, in a sentence or two.",
        description="think: appended to the last user message, asking for the reasoning.",
    )
    choice_score: Literal["sum", "mean"] = Field(
        "sum",
        description="choice and think: a legal move's score, from its text's token log-probs. sum: "
        "the text's log-prob (a long move is unlikely however well its tokens fit: an untrained "
        "model prefers the shortest); mean: the mean token log-prob, so moves of different "
        "lengths compete on fit (docs/algorithms.md#choice-decoding).",
    )
    max_prompt_tokens: Int = Field(
        1024,
        ge=16,
        le=1_048_576,
        description="Longer prompts keep their first and last tokens, half each (the rules; the "
        "current state and the legal moves), lose the middle, and a warning is printed.",
    )
    precision: Precision = Field(
        "fp32",
        description="Compute precision of this role's forward passes (backends hf and vllm; roles "
        "sharing a vLLM engine share the first one's): fp32, or bf16/fp16 autocast; auto is bf16 "
        "where the hardware has bf16 matrix units (AMX, AVX512-BF16, a GPU) and fp32 elsewhere, "
        "where bf16 is emulated and slow. When every role on a base and its learner "
        "(train.precision) compute in the same half precision, the frozen base is stored in it "
        "(LoRA weights stay fp32); mixed, it stays fp32 and is cast at each forward, which is "
        "slower. fp16 needs a GPU.",
    )


class EndpointConfig(StrictModel):
    """An OpenAI-compatible server for the ``openai`` backend; the key only via an env var."""

    base_url: str = Field(min_length=1, description="e.g. http://127.0.0.1:8000/v1")
    api_key_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the environment variable holding the API key (never the key itself).",
    )


class DeferConfig(StrictModel):
    """Let a role hand a task to a frozen expert instead of answering, at a cost to the team
    reward (docs/algorithms.md#deferring-to-an-expert).  The expert sits outside the team and
    its topology: it is asked only when the role's answer contains ``token``."""

    expert: Literal["oracle", "human", "openai"] = Field(
        description="Who answers a deferred task: oracle (the task's reference answer, a simulated"
        " expert), human (a person at the terminal) or openai (a hosted model at `endpoint`)."
    )
    cost: Float = Field(
        ge=0.0, le=100.0, description="Subtracted from the team reward for each deferral."
    )
    token: str = Field(
        "DEFER",
        pattern=r"^\S{1,32}$",
        description="A role's answer that contains this text defers the task.",
    )
    model: str | None = Field(None, min_length=1, description="openai only: the served model name.")
    endpoint: EndpointConfig | None = Field(None, description="openai only: its server.")

    @model_validator(mode="after")
    def _expert_fields(self) -> DeferConfig:
        hosted = self.expert == "openai"
        problems: list[PathProblem] = [
            (
                (name,),
                "required when expert is 'openai'"
                if hosted
                else f"only allowed when expert is 'openai' (expert is {self.expert!r})",
            )
            for name in ("model", "endpoint")
            if (getattr(self, name) is None) == hosted
        ]
        raise_problems(problems)
        return self


Backend = Literal["hf", "vllm", "openai", "scripted", "human"]
_WEIGHTLESS_BACKENDS = ("openai", "scripted", "human")
#: The backends that decode a model here, so their decoding settings can be overridden.
LOCAL_BACKENDS = ("hf", "vllm")
#: The backends that answer in free text (a team task, the team runtime).
TEXT_BACKENDS = ("hf", "vllm", "openai")


class RoleConfig(StrictModel):
    """One role of the team; ``count`` agents play it with one shared policy."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_-]+$", description="Role identifier (letters, digits, '_' and '-')."
    )
    count: Int = Field(1, ge=1, le=MAX_COUNT, description="How many agents play this role.")
    model: str = Field(
        "smollm2-135m-instruct",
        min_length=1,
        description="Model registry name (e.g. smollm2-135m-instruct, tiny-random), a Hugging Face"
        " id or a local path; for backend scripted, a bot of the game (random, and its own, e.g. "
        "heuristic or optimal); for backend openai, the served model name.",
    )
    backend: Backend = Field("hf", description="What runs the model.")
    adapter: AdapterConfig | None = Field(
        None, description="LoRA adapter to train; null or absent: the role is frozen."
    )
    share_base_with: str | None = Field(
        None, description="Another role whose base weights this role shares (same model)."
    )
    system_prompt: str = Field(
        "You are {name}, playing {game} in team {team}. {goal}",
        description="System prompt template; placeholders: " + ", ".join(PLACEHOLDERS) + ".",
    )
    goal: str = Field(
        "Play as well as you can.",
        description="Goal template; placeholders as system_prompt except goal.",
    )
    decoding: DecodingConfig = Field(default_factory=DecodingConfig)
    endpoint: EndpointConfig | None = Field(
        None, description="Server of the openai backend; required for it, else forbidden."
    )
    defer: DeferConfig | None = Field(
        None,
        description="Allow this role to defer a task to an expert at a cost; it needs backend hf "
        "or vllm (a trained decision).",
    )

    def instance_names(self) -> list[str]:
        """Agent names of this role: ``role`` if count == 1 else ``role_0 .. role_{n-1}``."""
        if self.count == 1:
            return [self.name]
        return [f"{self.name}_{i}" for i in range(self.count)]

    @property
    def trainable(self) -> bool:
        """A run trains this role: it has an adapter on a model decoded here."""
        return self.adapter is not None and self.backend in LOCAL_BACKENDS

    @field_validator("system_prompt")
    @classmethod
    def _system_prompt_placeholders(cls, v: str) -> str:
        return check_template(v, PLACEHOLDERS)

    @field_validator("goal")
    @classmethod
    def _goal_placeholders(cls, v: str) -> str:
        return check_template(v, set(PLACEHOLDERS) - {"goal"})

    @model_validator(mode="after")
    def _backend_fields(self) -> RoleConfig:
        problems: list[PathProblem] = []
        if self.backend == "openai" and self.endpoint is None:
            problems.append((("endpoint",), "required when backend is 'openai'"))
        if self.backend != "openai" and self.endpoint is not None:
            problems.append(
                (("endpoint",), f"only allowed with backend 'openai' (backend is {self.backend!r})")
            )
        if self.backend == "openai" and self.decoding.mode != "free":
            problems.append(
                (
                    ("decoding", "mode"),
                    "the openai backend samples text and cannot score candidates; use mode 'free'",
                )
            )
        if self.defer is not None and self.backend not in LOCAL_BACKENDS:
            problems.append(
                (
                    ("defer",),
                    f"backend {self.backend!r} cannot learn when to defer; use backend hf or vllm",
                )
            )
        if self.adapter is not None and self.backend in _WEIGHTLESS_BACKENDS:
            problems.append(
                (
                    ("adapter",),
                    f"backend {self.backend!r} has no local weights to "
                    "train; remove the adapter or use backend 'hf'",
                )
            )
        raise_problems(problems)
        return self


TopologyKind = Literal["chain", "star", "complete", "debate", "layered", "explicit"]


class TopologyLearningConfig(StrictModel):
    """How a learnable topology learns (docs/algorithms.md, learnable topology): the settings
    ``topologies.LearnableTopology`` keeps and saves with its logits."""

    lr: Float = Field(0.1, gt=0, le=100.0, description="Adam step size on the edge logits.")
    tau: Float = Field(
        1.0, gt=0, le=1000.0, description="Temperature: p_e = sigmoid(theta_e / tau)."
    )
    cost: Literal["messages", "tokens"] = Field(
        "messages",
        description="What an episode costs: edges used, or prompt + completion tokens of every "
        "turn.",
    )
    cost_weight: Float = Field(
        0.0, ge=0, le=1e6, description="lambda in utility = score - lambda x cost."
    )
    baseline: Literal["none", "mean", "loo"] = Field(
        "loo", description="REINFORCE baseline: none, batch mean, or leave-one-out mean."
    )
    init_logit: Float = Field(
        0.0, ge=-100.0, le=100.0, description="theta_e at start (0: every edge at p = 0.5)."
    )
    temporal: bool | None = Field(
        None, description="Also learn round-to-round edges; default: when rounds > 1."
    )
    prune_every: Int = Field(
        0, ge=0, le=MAX_STEPS, description="Prune after every k-th update (0: never)."
    )
    prune_fraction: Float = Field(
        0.0, ge=0.0, lt=1.0, description="... the lowest-probability fraction of candidates."
    )
    prune_threshold: Float = Field(
        0.0, ge=0.0, le=1.0, description="... and every candidate with p_e below this."
    )


class TopologyConfig(StrictModel):
    """Who talks to whom inside a round, between role names, and who decides.

    ``explicit`` edges may also name agent instances (``solver_1``), and ``temporal_edges``
    lists round-to-round edges exactly: that is how a learned graph is written back as YAML.
    """

    kind: TopologyKind = Field("chain", description="Communication graph shape.")
    rounds: Int = Field(1, ge=1, le=64, description="Communication rounds per turn.")
    learnable: bool = Field(False, description="Learn edge probabilities (REINFORCE).")
    learning: TopologyLearningConfig | None = Field(
        None, description="learnable only: how the edges learn (default settings if absent)."
    )
    hub: str | None = Field(None, description="Centre role; required for star, else forbidden.")
    layers: list[list[str]] | None = Field(
        None, min_length=1, description="Role names per layer; required for layered only."
    )
    edges: list[tuple[str, str]] | None = Field(
        None,
        description="[src, dst] pairs of roles or agents, within a round; required for explicit "
        "only.",
    )
    temporal_edges: list[tuple[str, str]] | None = Field(
        None,
        description="explicit only: [src, dst] pairs of roles or agents from round t-1 to round t "
        "(self-loops allowed); default: from the sinks of `edges` back to their sources.",
    )
    final: str | None = Field(
        None,
        description="The role (with one agent) or agent whose last answer is the team's (decision "
        "'final'); default: the last to speak in the last round.",
    )
    decision: Literal["final", "vote"] = Field(
        "final",
        description="final: the final agent decides; vote: majority vote over every agent's "
        "last-round answer.",
    )
    prune: bool = Field(
        False,
        description="Drop agents that never reach the decision instead of rejecting the topology "
        "(learned graphs do).",
    )

    @model_validator(mode="after")
    def _kind_fields(self) -> TopologyConfig:
        problems: list[PathProblem] = []
        for field, kind in (
            ("hub", "star"),
            ("layers", "layered"),
            ("edges", "explicit"),
            ("temporal_edges", "explicit"),
        ):
            given = getattr(self, field) is not None
            if self.kind == kind and not given and field != "temporal_edges":
                problems.append(((field,), f"required when kind is {kind!r}"))
            elif self.kind != kind and given:
                problems.append(
                    ((field,), f"only allowed when kind is {kind!r} (kind is {self.kind!r})")
                )
        if self.learning is not None and not self.learnable:
            problems.append((("learning",), "only allowed when learnable is true"))
        if self.learning is not None and self.learning.temporal and self.rounds < 2:
            problems.append((("learning", "temporal"), "temporal edges need rounds >= 2"))
        for i, layer in enumerate(self.layers or []):
            if not layer:
                problems.append((("layers", i), "empty layer"))
        for i, (src, dst) in enumerate(self.edges or []):
            if src == dst:
                problems.append((("edges", i), f"self-loop {src!r} -> {dst!r}"))
        if self.decision == "vote" and self.final is not None:
            problems.append(
                (("final",), "only allowed when decision is 'final' (a vote has no final agent)")
            )
        raise_problems(problems)
        return self

    def role_refs(self) -> list[PathProblem]:
        """Every role name this topology mentions, as (path, name) pairs, for cross-checks."""
        refs: list[PathProblem] = []
        if self.hub is not None:
            refs.append((("hub",), self.hub))
        for i, layer in enumerate(self.layers or []):
            refs += [(("layers", i, j), name) for j, name in enumerate(layer)]
        for i, edge in enumerate(self.edges or []):
            refs += [(("edges", i, j), name) for j, name in enumerate(edge)]
        for i, edge in enumerate(self.temporal_edges or []):
            refs += [(("temporal_edges", i, j), name) for j, name in enumerate(edge)]
        if self.final is not None:
            refs.append((("final",), self.final))
        return refs


class GameConfig(StrictModel):
    """The game the team plays: a registry name, an env factory by import path, or a game of
    another suite (``source``).  Whether it exists is checked outside the schema."""

    name: str = Field(
        min_length=1,
        description=(
            "Game registry name, e.g. kuhn_poker; with source, the suite's own id (KuhnPoker-v0); "
            "with entry_point, a label (default: the entry point)."
        ),
    )
    entry_point: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
        description=(
            "'pkg.module:factory' building a PettingZoo AEC or Parallel env (masked or not), "
            "imported by every process that plays it."
        ),
    )
    source: Literal["registry", "textarena"] = Field(
        "registry", description="Where name is looked up: the registry, or TextArena."
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the game's factory."
    )
    call_timeout_s: Float = Field(
        CALL_TIMEOUT_S,
        gt=0,
        le=86_400,
        description=(
            "Seconds one call into a game the project did not write (an entry point, a plugin, "
            "TextArena: its import, factory, reset, step, observe, ...) may take; a call that "
            "takes longer stops the command with an error naming the game and the call."
        ),
    )
    max_turns: Int = Field(
        MAX_TURNS,
        ge=1,
        description=(
            "Moves after which a game of an entry point, a plugin or TextArena that has not "
            "ended is cut short (truncated, with the rewards paid so far)."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _label_entry_point(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("entry_point") and not data.get("name"):
            return {**data, "name": data["entry_point"]}
        return data

    @model_validator(mode="after")
    def _one_route(self) -> GameConfig:
        if self.entry_point is not None and self.source != "registry":
            raise_problems([(("entry_point",), "give entry_point or source, not both")])
        return self


class TeamConfig(StrictModel):
    """The root of a team file.

    Later sections are added as optional fields (``train: TrainConfig | None = None``); their
    cross-section rules go in :mod:`marl.config.rules` so every problem keeps its own path.
    """

    schema_version: Literal["marl-teams/v1"] = Field(
        alias="schema", description="Schema id; must be 'marl-teams/v1'."
    )
    name: str = Field(min_length=1, description="Team name.")
    description: str | None = Field(None, description="Free text.")
    roles: list[RoleConfig] = Field(
        min_length=1, max_length=MAX_COUNT, description="The team's roles."
    )
    topology: TopologyConfig = Field(default_factory=TopologyConfig)
    game: GameConfig
    train: TrainConfig | None = Field(None, description="Read by `marl train`.")

    def role(self, name: str) -> RoleConfig:
        """The role called ``name`` (KeyError lists the known ones)."""
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(f"unknown role {name!r}; known roles: {self.known_roles()}")

    def with_game(self, name: str) -> TeamConfig:
        """The team on another game, with that game's default arguments."""
        return self.replace(game=GameConfig(name=name))

    def with_decoding(
        self, mode: str | None = None, temperature: float | None = None
    ) -> TeamConfig:
        """Every role decoding locally (:data:`LOCAL_BACKENDS`) with this mode and temperature
        where given; other roles (bots, endpoints, people) keep theirs."""
        update = {k: v for k, v in (("mode", mode), ("temperature", temperature)) if v is not None}
        return self.replace(
            roles=[
                r.replace(decoding=r.decoding.replace(**update))
                if r.backend in LOCAL_BACKENDS
                else r
                for r in self.roles
            ]
        )

    def rollout_kind(self) -> Literal["game", "team"]:
        """``game``: agents take the game's seats; ``team``: the team answers a cooperative
        task along its topology (``train.rollout``; auto: team when the topology learns)."""
        kind = self.train.rollout if self.train is not None else "auto"
        if kind == "auto":
            return "team" if self.topology.learnable else "game"
        return kind

    def known_roles(self) -> str:
        return ", ".join(r.name for r in self.roles)

    def cross_check(self) -> list[PathProblem]:
        """The problems of :data:`marl.config.rules.TEAM_RULES`, the rules that span sections;
        subclasses extend with ``super().cross_check() + [...]``."""
        from marl.config.rules import TEAM_RULES  # the rules read these models

        return [problem for rule in TEAM_RULES for problem in rule(self)]

    @model_validator(mode="after")
    def _cross_check(self, info: ValidationInfo) -> TeamConfig:
        if not (info.context or {}).get(DEFER_RULES):
            raise_problems(self.cross_check())
        return self


def json_schema(model: type[BaseModel] = TeamConfig) -> dict[str, Any]:
    """The JSON Schema of a team file, for editors (yaml-language-server) and docs."""
    out: dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    out.update(model.model_json_schema(by_alias=True))
    return out
