"""Turn a team config's roles into agents: one policy per role, one model in memory per base.

Roles that name the same model (or say ``share_base_with``) share one :class:`ModelHost`, each
with its own LoRA adapter, so four roles on one base cost one set of base weights.  Every
instance of a role (``count: 2``) shares that role's policy, so their decisions batch together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from marl.agents.agent import Agent
from marl.agents.hf_policy import HFPolicy
from marl.agents.host import ModelHost
from marl.agents.host.adapters import AdapterMismatch
from marl.agents.models import MODEL_REGISTRY, ensure_cached, load_model
from marl.agents.policy import Policy, make_policy
from marl.agents.precision import weights_dtype
from marl.config.schema import LOCAL_BACKENDS, TEXT_BACKENDS, RoleConfig, TeamConfig
from marl.infra.layout import adapter_folder


class RosterError(ValueError):
    """Roles that cannot be built as asked; the message says what to change."""


@dataclass
class Roster:
    """The built team: agents in role order, the policy of each role, the model hosts."""

    agents: list[Agent]
    policies: dict[str, Policy]
    hosts: dict[str, ModelHost] = field(default_factory=dict)

    def to(self, device: str) -> None:
        """Move every local model (e.g. to the GPU a Ray actor was given)."""
        for host in self.hosts.values():
            if isinstance(host, ModelHost):
                host.model.to(device)


def system_prompt_for(role: RoleConfig, team: str, game: str, name: str, index: int) -> str:
    values = {"role": role.name, "name": name, "game": game, "team": team, "index": index}
    goal = role.goal.format(**values)
    return role.system_prompt.format(goal=goal, **values).strip()


def host_key(cfg: TeamConfig, role: RoleConfig) -> str:
    """Roles that share weights map to the same key: the end of their share_base_with chain."""
    while role.share_base_with is not None:
        role = cfg.role(role.share_base_with)
    return role.model


def host_precisions(cfg: TeamConfig, key: str) -> list[str]:
    """The precision of every forward run on host ``key``: its roles' decoding, and the
    learner's when it trains one of their adapters."""
    roles = [r for r in cfg.roles if r.backend in LOCAL_BACKENDS and host_key(cfg, r) == key]
    out = [r.decoding.precision for r in roles]
    if cfg.train is not None and any(r.adapter is not None for r in roles):
        out.append(cfg.train.precision)
    return out


@dataclass
class BuildContext:
    """What role builders share: the team config, the model hosts built so far, a seed, and
    the trained PEFT folder of the role's adapter (else it starts from ``adapter.init``, or
    untrained)."""

    cfg: TeamConfig
    hosts: dict[str, ModelHost]
    seed: int
    trained: str | Path | None = None


def _host(role: RoleConfig, ctx: BuildContext) -> tuple[ModelHost, str | None]:
    """The role's model host (shared with the roles on its base) and its adapter there, with
    the trained weights when given (else untrained)."""
    key = host_key(ctx.cfg, role)
    if key not in ctx.hosts:
        dtype = weights_dtype(host_precisions(ctx.cfg, key))
        ctx.hosts[key] = ModelHost(*load_model(role.model, dtype=dtype))
    host = ctx.hosts[key]
    if role.adapter is None:
        return host, None
    a = role.adapter
    host.add_adapter(
        role.name, r=a.r, alpha=a.alpha, dropout=a.dropout, targets=a.targets, seed=ctx.seed
    )
    trained = ctx.trained if ctx.trained is not None else a.init
    if trained is not None:
        try:
            host.load_adapter(role.name, trained)
        except (AdapterMismatch, FileNotFoundError) as exc:
            where = "" if ctx.trained is not None else "adapter.init: "
            raise RosterError(f"role {role.name!r}: {where}{exc}") from exc
    return host, role.name


def load_trained_adapters(cfg: TeamConfig, adapters: Mapping[str, str | Path]) -> None:
    """Load each role's trained PEFT folder into its base model as a built team would (every
    tensor checked), building no policy: how an export checks what it copies."""
    hosts: dict[str, ModelHost] = {}
    for role in cfg.roles:
        if role.name in adapters:
            _host(role, BuildContext(cfg, hosts, 0, adapters[role.name]))


def _hf(role: RoleConfig, ctx: BuildContext) -> Policy:
    return hf_role_policy(*_host(role, ctx), role, ctx.seed)


def decoding_kwargs(role: RoleConfig) -> dict:
    """The role's decoding settings as the local policies (hf, vllm) take them."""
    dec = role.decoding
    return {
        "mode": dec.mode,
        "temperature": dec.temperature,
        "max_new_tokens": dec.max_new_tokens,
        "top_p": dec.top_p,
        "max_prompt_tokens": dec.max_prompt_tokens,
        "think_tokens": dec.think_tokens,
        "think_prompt": dec.think_prompt,
        "choice_score": dec.choice_score,
    }


def hf_role_policy(host: ModelHost, adapter: str | None, role: RoleConfig, seed: int) -> HFPolicy:
    return HFPolicy(
        host, adapter, precision=role.decoding.precision, seed=seed, **decoding_kwargs(role)
    )


def _openai(role: RoleConfig, ctx: BuildContext) -> Policy:
    ep = role.endpoint
    assert ep is not None  # the schema requires it for this backend
    return make_policy(
        "openai",
        base_url=ep.base_url,
        model=role.model,
        api_key_env=ep.api_key_env,
        temperature=role.decoding.temperature,
        max_new_tokens=role.decoding.max_new_tokens,
        seed=ctx.seed,
    )


def model_path(ref: str) -> str:
    """A path or hub id a foreign engine (vLLM) can load: registry models from their cache."""
    spec = MODEL_REGISTRY.get(ref)
    if spec is None:
        return ref
    if not spec.cache:
        raise ValueError(f"model {ref!r} is built in memory and has no folder for vLLM")
    return str(ensure_cached(spec))


def engine_scores(cfg: TeamConfig, key: str) -> bool:
    """Whether the vLLM engine ``key`` scores texts after prompts (prompt log-probs, which
    need merged weights): for a role in a scoring mode, or in free text where policy targets
    read the moves' own answers."""
    from marl.agents.vllm_backend import SCORING_MODES  # an extra, imported if asked

    reads = cfg.train is not None and cfg.train.policy_target.eta > 0
    return any(
        r.decoding.mode in SCORING_MODES or (reads and r.decoding.mode == "free")
        for r in cfg.roles
        if r.backend == "vllm" and "vllm:" + host_key(cfg, r) == key
    )


def _vllm(role: RoleConfig, ctx: BuildContext) -> Policy:
    """A vLLM engine per base model for decoding; the role's weights (and the adapter a
    learner trains) stay on its model host, from which the engine takes them."""
    from marl.agents.vllm_backend import VLLMEngine  # an extra, imported if asked

    host, adapter = _host(role, ctx)
    key = "vllm:" + host_key(ctx.cfg, role)
    if key not in ctx.hosts:
        ctx.hosts[key] = VLLMEngine(
            model_path(role.model),
            seed=ctx.seed,  # type: ignore
            precision=role.decoding.precision,
            weight_sync="merge" if engine_scores(ctx.cfg, key) else None,
        )
    return make_policy(
        "vllm",
        engine=ctx.hosts[key],
        host=host,
        adapter=adapter,
        seed=ctx.seed,
        **decoding_kwargs(role),
    )


ROLE_BUILDERS: dict[str, Callable[[RoleConfig, BuildContext], Policy]] = {
    "hf": _hf,
    "vllm": _vllm,
    "openai": _openai,
    "scripted": lambda role, ctx: make_policy(
        "scripted", game=ctx.cfg.game.name, bot=role.model, seed=ctx.seed
    ),
    "human": lambda role, ctx: make_policy("human"),
}


def build_roster(
    cfg: TeamConfig,
    seed: int = 0,
    hosts: dict[str, ModelHost] | None = None,
    *,
    policies: Mapping[str, Policy] | None = None,
    adapters: Mapping[str, str | Path] | None = None,
    free_text: bool = False,
) -> Roster:
    """One policy per role and the role's agents, in role order.

    ``hosts`` shares base models with other rosters; ``policies`` gives roles their policy
    (nothing is built for them); ``adapters`` maps roles to trained PEFT folders for their
    adapters; ``free_text`` makes every role decode free text (a team answering in words, with
    no action list), which only the :data:`TEXT_BACKENDS` do.
    """
    hosts = {} if hosts is None else hosts
    given = dict(policies or {})
    adapters = dict(adapters or {})
    unknown = sorted((set(given) | set(adapters)) - {r.name for r in cfg.roles})
    if unknown:
        raise RosterError(
            f"unknown roles {', '.join(unknown)}; the team's roles: "
            f"{', '.join(r.name for r in cfg.roles)}"
        )
    agents: list[Agent] = []
    built: dict[str, Policy] = {}
    for k, role in enumerate(cfg.roles):
        if free_text:
            role = role.model_copy(
                update={"decoding": role.decoding.model_copy(update={"mode": "free"})}
            )
        policy = given.get(role.name)
        if policy is None:
            _check_buildable(cfg, role, hosts, role.name in adapters, free_text)
            ctx = BuildContext(cfg, hosts, seed + 1000 * k, adapters.get(role.name))
            policy = ROLE_BUILDERS[role.backend](role, ctx)
        built[role.name] = policy
        for i, name in enumerate(role.instance_names()):
            agents.append(
                Agent(
                    name=name,
                    role=role.name,
                    policy=policy,
                    system_prompt=system_prompt_for(role, cfg.name, cfg.game.name, name, i),
                    mode=role.decoding.mode,
                )
            )
    return Roster(agents, built, hosts)


def _check_buildable(
    cfg: TeamConfig,
    role: RoleConfig,
    hosts: Mapping[str, ModelHost],
    trained: bool,
    free_text: bool,
) -> None:
    """Refuse what would fail late or silently: an adapter name a shared host already holds,
    a free-text role on a backend without text, a trained adapter with nowhere to go."""
    shared = hosts.get(host_key(cfg, role))
    if role.adapter is not None and role.name in getattr(shared, "adapters", ()):
        raise RosterError(
            f"role {role.name!r}: the shared model host already holds an "
            "adapter of that name (another team's role); give this team its own "
            "hosts"
        )
    if free_text and role.backend not in TEXT_BACKENDS:
        raise RosterError(
            f"role {role.name!r} uses backend {role.backend!r}: the team runtime "
            f"runs language models ({', '.join(TEXT_BACKENDS)}); use one of them "
            "or pass policies={role: policy}"
        )
    if trained and not role.trainable:
        raise RosterError(
            f"role {role.name!r}: trained adapters load into hf or vllm roles "
            "with an adapter section"
        )


def adapter_dir(path: str | Path, role: str) -> Path:
    """The PEFT folder inside ``path``: the folder itself or its ``adapters/<role>``."""
    path = Path(path)
    for cand in (path, adapter_folder(path, role)):
        if (cand / "adapter_config.json").is_file():
            return cand
    raise FileNotFoundError(
        f"{path} holds no adapter for role {role!r} (looked for "
        f"adapter_config.json in it and in adapters/{role}/)"
    )
