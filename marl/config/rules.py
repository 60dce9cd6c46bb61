"""The rules of a team file that span its sections: each a function of the whole file that
returns ``(path, message)`` problems, so ``marl validate`` reports every one at its own line.

Only the file is read here.  Rules that need the game built (its seats, bots, tasks) or the
models loaded live with the builder (:mod:`marl.agents.checks`).
"""

from __future__ import annotations

from collections.abc import Callable

from marl.config.schema import TEXT_BACKENDS, PathProblem, TeamConfig

Rule = Callable[[TeamConfig], list[PathProblem]]

#: Topology fields that may name an agent instance (``solver_1``) as well as a role.
AGENT_REFS = ("edges", "temporal_edges", "final")


def unique_role_names(cfg: TeamConfig) -> list[PathProblem]:
    problems: list[PathProblem] = []
    first: dict[str, int] = {}
    for i, r in enumerate(cfg.roles):
        if r.name in first:
            problems.append(
                (
                    ("roles", i, "name"),
                    f"duplicate role name {r.name!r} (also roles.{first[r.name]})",
                )
            )
        else:
            first[r.name] = i
    return problems


def share_base_refs(cfg: TeamConfig) -> list[PathProblem]:
    """share_base_with names another role on the same model and backend."""
    by_name = {r.name: r for r in cfg.roles}
    problems: list[PathProblem] = []
    for i, r in enumerate(cfg.roles):
        ref = r.share_base_with
        if ref is None:
            continue
        other = by_name.get(ref)
        if other is None:
            problem = f"unknown role {ref!r}; known roles: {cfg.known_roles()}"
        elif ref == r.name:
            problem = "a role cannot share its base with itself"
        elif other.model != r.model:
            problem = (
                f"role {ref!r} uses model {other.model!r} but this role uses {r.model!r}; "
                "sharing base weights needs the same model"
            )
        elif other.backend != r.backend:
            problem = (
                f"role {ref!r} uses backend {other.backend!r} but this role uses "
                f"{r.backend!r}; shared weights live in one backend"
            )
        else:
            continue
        problems.append((("roles", i, "share_base_with"), problem))
    return problems


def share_cycles(cfg: TeamConfig) -> list[PathProblem]:
    """share_base_with chains must end at a role that owns its weights."""
    by_name = {r.name: r for r in cfg.roles}
    problems: list[PathProblem] = []
    for i, r in enumerate(cfg.roles):
        chain = [r.name]
        ref = r.share_base_with
        while ref is not None and ref in by_name and ref not in chain:
            chain.append(ref)
            ref = by_name[ref].share_base_with
        if ref == r.name and len(chain) > 1:
            problems.append(
                (
                    ("roles", i, "share_base_with"),
                    "share_base_with forms a cycle: " + " -> ".join(chain + [ref]),
                )
            )
    return problems


def topology_refs(cfg: TeamConfig) -> list[PathProblem]:
    """The topology names roles of the team (edges and final: agent instances too)."""
    roles = {r.name for r in cfg.roles}
    agents = {a for r in cfg.roles for a in r.instance_names()}
    return [
        (("topology", *rel), f"unknown role {ref!r}; known roles: {cfg.known_roles()}")
        for rel, ref in cfg.topology.role_refs()
        if ref not in roles and not (rel[0] in AGENT_REFS and ref in agents)
    ]


def one_final_agent(cfg: TeamConfig) -> list[PathProblem]:
    final = next((r for r in cfg.roles if r.name == cfg.topology.final), None)
    if final is None or final.count == 1:
        return []
    return [
        (
            ("topology", "final"),
            f"role {final.name!r} has {final.count} agents and one decides; name one of them "
            f"({', '.join(final.instance_names())})",
        )
    ]


def layers_once(cfg: TeamConfig) -> list[PathProblem]:
    problems: list[PathProblem] = []
    seen: dict[str, int] = {}
    for i, layer in enumerate(cfg.topology.layers or []):
        for j, ref in enumerate(layer):
            if ref in seen:
                problems.append(
                    (("topology", "layers", i, j), f"role {ref!r} is already in layer {seen[ref]}")
                )
            else:
                seen[ref] = i
    return problems


def defer_needs_team_task(cfg: TeamConfig) -> list[PathProblem]:
    if cfg.train is None or cfg.rollout_kind() == "team":
        return []
    return [
        (
            ("roles", i, "defer"),
            f"role {r.name!r} defers to an expert, which only a team task can do: "
            "set train.rollout team",
        )
        for i, r in enumerate(cfg.roles)
        if r.defer is not None
    ]


def team_task_roles(cfg: TeamConfig) -> list[PathProblem]:
    """A team answers its tasks in free text, all of it: no opponents, text backends."""
    if cfg.train is None or cfg.rollout_kind() != "team":
        return []
    problems: list[PathProblem] = [
        (
            ("roles", i),
            f"role {r.name!r}: a team answers tasks in free text; use decoding mode free "
            f"and a backend of {', '.join(TEXT_BACKENDS)}",
        )
        for i, r in enumerate(cfg.roles)
        if r.backend not in TEXT_BACKENDS or r.decoding.mode != "free"
    ]
    if cfg.train.league.opponents != "self":
        problems.append(
            (
                ("train", "league", "opponents"),
                "a team task has no opponents: use train.league.opponents self",
            )
        )
    return problems


def trained_roles(cfg: TeamConfig) -> list[str]:
    """The roles a run trains: an adapter on a model decoded here."""
    return [r.name for r in cfg.roles if r.trainable]


def something_to_train(cfg: TeamConfig) -> list[PathProblem]:
    if cfg.train is None or (cfg.rollout_kind() == "team" and cfg.topology.learnable):
        return []
    if cfg.train.policies == "frozen":
        return [
            (
                ("train", "policies"),
                "train.policies is frozen and no topology is learned: nothing to train "
                "(set topology.learnable on a team task)",
            )
        ]
    if not trained_roles(cfg):
        return [(("roles",), "no trainable role: give a role with backend hf an `adapter`")]
    return []


def learner_fits(cfg: TeamConfig) -> list[PathProblem]:
    """What the magnet, the Gauss-Newton solver and ZeRO-3 over several ranks need of the
    learner backend and the roles."""
    tc = cfg.train
    if tc is None:
        return []
    problems: list[PathProblem] = []
    if tc.magnet.alpha > 0 and tc.learner.backend == "deepspeed" and tc.learner.zero_stage == 3:
        problems.append(
            (
                ("train", "magnet", "alpha"),
                "train.magnet needs the magnet's adapter whole on the learner: use ZeRO "
                "stage 1 or 2, or the torch backend",
            )
        )
    zero3 = tc.learner.backend == "deepspeed" and tc.learner.zero_stage == 3
    think = [r.name for r in cfg.roles if r.adapter is not None and r.decoding.mode == "think"]
    if zero3 and tc.learner.ranks > 1 and think:
        problems.append(
            (
                ("train", "learner", "zero_stage"),
                f"learner.zero_stage 3 on {tc.learner.ranks} ranks gathers the parameters in "
                "every forward, so the ranks must make the same forwards: choice and free "
                f"decisions take one per micro-batch, the think passes of {', '.join(think)} "
                "do not; use zero_stage 1 or 2, or learner.ranks 1",
            )
        )
    target = tc.policy_target
    if target.eta > 0 and target.solver == "gauss_newton" and tc.learner.backend != "torch":
        problems.append(
            (
                ("train", "policy_target", "solver"),
                "train.policy_target.solver gauss_newton steps the adapters' own tensors: "
                "use train.learner.backend torch",
            )
        )
    return problems


def branch_needs_game(cfg: TeamConfig) -> list[PathProblem]:
    if cfg.train is None or not cfg.train.branch or cfg.rollout_kind() != "team":
        return []
    return [
        (
            ("train", "branch"),
            "train.branch copies a game mid-play: it needs a game rollout, not a team task",
        )
    ]


def states_need_targets(cfg: TeamConfig) -> list[PathProblem]:
    """A states rollout values every action of every information state for policy targets,
    with every seat played by the team's own policy."""
    tc = cfg.train
    if tc is None or tc.rollout != "states":
        return []
    needs = {
        "policy_target.eta > 0": tc.policy_target.eta > 0,
        "policies: train": tc.policies == "train",
        "league.opponents: self": tc.league.opponents == "self" and not tc.league.anchors,
        "branch: 0": not tc.branch,
    }
    missing = [k for k, ok in needs.items() if not ok]
    if not missing:
        return []
    return [
        (
            ("train", "rollout"),
            "train.rollout states values the actions for policy targets in self-play: it "
            f"needs {', '.join(missing)}",
        )
    ]


def targets_need_scored_moves(cfg: TeamConfig) -> list[PathProblem]:
    """Policy targets are distributions over the legal actions: the trained roles score them
    (choice decoding, or think: after a reasoning) or, writing free text at temperature 1 in
    a states rollout, are read through the answers that name one move each; all one way
    (either solver, adam or gauss_newton, fits each)."""
    if cfg.train is None or not cfg.train.policy_target.eta > 0:
        return []
    trained = [r for r in cfg.roles if r.name in set(trained_roles(cfg))]
    modes = {r.decoding.mode for r in trained}
    path = ("train", "policy_target", "eta")
    if len(modes) > 1:
        return [
            (
                path,
                "train.policy_target fits choice, think and free roles apart: train roles of "
                "one decoding.mode in a run",
            )
        ]
    free = [r for r in trained if r.decoding.mode == "free"]
    if free and cfg.train.rollout != "states":
        return [
            (
                path,
                f"train.policy_target fits free-text roles ({free[0].name}) at the game's "
                "information states: set train.rollout: states",
            )
        ]
    hot = [r.name for r in free if r.decoding.temperature != 1]
    if hot:
        return [
            (
                path,
                f"train.policy_target reads free-text roles {hot} through their answers' "
                "probabilities, what sampling draws only at decoding.temperature 1",
            )
        ]
    return []


#: Every cross-section rule of a team file, in the order its problems are reported.
TEAM_RULES: tuple[Rule, ...] = (
    unique_role_names,
    share_base_refs,
    topology_refs,
    one_final_agent,
    layers_once,
    share_cycles,
    defer_needs_team_task,
    team_task_roles,
    learner_fits,
    branch_needs_game,
    states_need_targets,
    targets_need_scored_moves,
)
