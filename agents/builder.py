"""Turn a team config's roles into agents: one policy per role, one model in memory per base.

Roles that name the same model (or say ``share_base_with``) share one :class:`ModelHost`, each
with its own LoRA adapter, so four roles on one base cost one set of base weights.  Every
instance of a role (``count: 2``) shares that role's policy, so their decisions batch together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agents.agent import Agent
from agents.hf import HFPolicy, ModelHost
from agents.models import MODEL_REGISTRY, ensure_cached, load_model
from agents.policy import Policy, make_policy
from configs.schema import RoleConfig, TeamConfig


@dataclass
class Roster:
    """The built team: agents in role order, the policy of each role, the model hosts."""

    agents: list[Agent]
    policies: dict[str, Policy]
    hosts: dict[str, ModelHost] = field(default_factory=dict)

    def by_role(self, role: str) -> list[Agent]:
        return [a for a in self.agents if a.role == role]

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


@dataclass
class BuildContext:
    """What role builders share: the team config, the model hosts built so far, a seed."""

    cfg: TeamConfig
    hosts: dict[str, ModelHost]
    seed: int


def _hf(role: RoleConfig, ctx: BuildContext) -> Policy:
    key = host_key(ctx.cfg, role)
    if key not in ctx.hosts:
        ctx.hosts[key] = ModelHost(*load_model(role.model))
    host = ctx.hosts[key]
    adapter = None
    if role.adapter is not None:
        adapter = role.name
        a = role.adapter
        host.add_adapter(adapter, r=a.r, alpha=a.alpha, dropout=a.dropout, targets=a.targets,
                         seed=ctx.seed)
    return hf_role_policy(host, adapter, role, ctx.seed)


def hf_role_policy(host: ModelHost, adapter: str | None, role: RoleConfig,
                   seed: int) -> HFPolicy:
    dec = role.decoding
    return HFPolicy(host, adapter, mode=dec.mode, temperature=dec.temperature,
                    max_new_tokens=dec.max_new_tokens, top_p=dec.top_p,
                    max_prompt_tokens=dec.max_prompt_tokens, seed=seed)


def _openai(role: RoleConfig, ctx: BuildContext) -> Policy:
    ep = role.endpoint
    assert ep is not None  # the schema requires it for this backend
    return make_policy("openai", base_url=ep.base_url, model=role.model,
                       api_key_env=ep.api_key_env, temperature=role.decoding.temperature,
                       max_new_tokens=role.decoding.max_new_tokens, seed=ctx.seed)


def model_path(ref: str) -> str:
    """A path or hub id a foreign engine (vLLM) can load: registry models from their cache."""
    spec = MODEL_REGISTRY.get(ref)
    if spec is None:
        return ref
    if not spec.cache:
        raise ValueError(f"model {ref!r} is built in memory and has no folder for vLLM")
    return str(ensure_cached(spec))


def _vllm(role: RoleConfig, ctx: BuildContext) -> Policy:
    from agents.vllm_backend import VLLMEngine  # GPU extra, imported only when asked for

    key = "vllm:" + host_key(ctx.cfg, role)
    if key not in ctx.hosts:
        ctx.hosts[key] = VLLMEngine(model_path(role.model))  # type: ignore[assignment]
    dec = role.decoding
    return make_policy("vllm", engine=ctx.hosts[key], adapter=None, mode=dec.mode,
                       temperature=dec.temperature, max_new_tokens=dec.max_new_tokens,
                       top_p=dec.top_p, seed=ctx.seed)


ROLE_BUILDERS: dict[str, Callable[[RoleConfig, BuildContext], Policy]] = {
    "hf": _hf,
    "vllm": _vllm,
    "openai": _openai,
    "scripted": lambda role, ctx: make_policy("scripted", game=ctx.cfg.game.name,
                                              bot=role.model, seed=ctx.seed),
    "human": lambda role, ctx: make_policy("human"),
}


def build_roster(cfg: TeamConfig, seed: int = 0,
                 hosts: dict[str, ModelHost] | None = None) -> Roster:
    hosts = {} if hosts is None else hosts
    agents: list[Agent] = []
    policies: dict[str, Policy] = {}
    for k, role in enumerate(cfg.roles):
        policy = ROLE_BUILDERS[role.backend](role, BuildContext(cfg, hosts, seed + 1000 * k))
        policies[role.name] = policy
        for i, name in enumerate(role.instance_names()):
            agents.append(Agent(name=name, role=role.name, policy=policy,
                                system_prompt=system_prompt_for(role, cfg.name, cfg.game.name,
                                                            name, i),
                                mode=role.decoding.mode))
    return Roster(agents, policies, hosts)


def adapter_dir(path: str | Path, role: str) -> Path:
    """The PEFT folder inside ``path``: the folder itself or its ``adapters/<role>``."""
    path = Path(path)
    for cand in (path, path / "adapters" / role):
        if (cand / "adapter_config.json").is_file():
            return cand
    raise FileNotFoundError(f"{path} holds no adapter for role {role!r} (looked for "
                            f"adapter_config.json in it and in adapters/{role}/)")

