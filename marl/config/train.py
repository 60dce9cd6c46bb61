"""The ``train`` section: what ``marl train`` reads (GRPO settings, league, Ray, checkpoints)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from marl.config.base import Float, Int, Precision, StrictModel

#: The most steps of anything (training steps, intervals counted in steps).
MAX_STEPS = 10_000_000
#: The most games (or sequences) one batch setting may ask for.
MAX_BATCH = 4096


class LeagueConfig(StrictModel):
    """Who the trained roles play against (competitive games)."""

    opponents: Literal["self", "league"] = Field(
        "self",
        description="self: the latest policy in every seat; league: the trained role takes one "
        "seat and a pool member the others.",
    )
    snapshot_every: Int = Field(
        5, ge=1, le=MAX_STEPS, description="Add the policy to the pool every k steps."
    )
    pool_size: Int = Field(8, ge=1, le=1024, description="Most recent snapshots kept in the pool.")
    anchors: list[str] = Field(
        default_factory=list,
        description="Fixed opponents: bots of the game (random, and its own, e.g. heuristic or "
        "optimal), checkpoint folders, or untrained: the trained role's model without its "
        "adapter (its untrained self).",
    )
    latest_prob: Float = Field(
        0.3,
        ge=0.0,
        le=1.0,
        description="Chance that a league game is against the latest policy itself.",
    )
    sampling: Literal["uniform", "winrate"] = Field(
        "winrate", description="winrate: opponents that still win get picked more often."
    )
    learn_from_snapshots: bool = Field(
        True,
        description="Also learn from the moves the pool's snapshots make in league games, through "
        "the clipped ratio to their own log-probs (off-policy); false: only the latest policy's "
        "moves.",
    )


class RayConfig(StrictModel):
    """Where rollouts and learners run."""

    enabled: bool = Field(True, description="False runs everything in this process.")
    address: str | None = Field(
        None, description="An existing cluster (ray://... or auto); default: start a local Ray."
    )
    rollout_workers: Int = Field(1, ge=1, le=1024, description="Rollout worker actors.")
    cpus_per_worker: Float = Field(1.0, gt=0, le=1024, description="CPUs Ray reserves per worker.")
    gpus_per_worker: Float = Field(
        0.0, ge=0, le=64, description="May be fractional: workers share."
    )
    worker_placement: Literal["pack", "spread"] = Field(
        "pack",
        description="How Ray places the rollout workers (one placement group): pack (as few "
        "nodes as fit: workers share a node) or spread (over as many nodes as it can: a lost node "
        "costs a share of them).  A worker lost with its node is restarted where its bundle is "
        "rescheduled and its episodes replayed.",
    )
    cpus_per_learner: Float = Field(
        1.0, gt=0, le=1024, description="CPUs Ray reserves per learner rank."
    )
    gpus_per_learner: Float = Field(
        0.0, ge=0, le=64, description="GPUs Ray reserves per learner rank; one per GPU: 1."
    )


class LearnerConfig(StrictModel):
    """How the learners step: plain torch AdamW, or DeepSpeed ZeRO (the deepspeed extra)."""

    backend: Literal["torch", "deepspeed"] = Field(
        "torch", description="deepspeed needs the deepspeed extra."
    )
    zero_stage: Int = Field(
        1, ge=1, le=3, description="DeepSpeed ZeRO stage (no ZeRO: backend torch)."
    )
    micro_batch: Int = Field(16, ge=1, le=65536, description="Sequences per forward/backward.")
    forward_batch: Int = Field(
        64,
        ge=1,
        le=65536,
        description="Sequences per forward without gradients (the policy-target fits' "
        "evaluations of their loss, the magnet's reads): no activations are kept for a "
        "backward, so it can be larger than micro_batch.",
    )
    ranks: Int = Field(
        1,
        ge=1,
        le=1024,
        description="Processes per learner (a learner group, with Ray): each takes a share of "
        "the step's items and the gradients are summed over them, so the update equals one "
        "process's; with deepspeed, ZeRO shards over them (ZeRO-3 scores with one forward per "
        "micro-batch, no shared prompt heads, and no think roles).  Each rank reserves "
        "ray.cpus_per_learner and ray.gpus_per_learner.",
    )
    placement: Literal["pack", "spread"] = Field(
        "pack",
        description="How Ray places a learner's ranks: pack (as few nodes as fit) or spread "
        "(over as many nodes as it can).",
    )


class MismatchConfig(StrictModel):
    """Rollout/learner numerics (docs/algorithms.md): an engine other than the learner's
    (vLLM, bf16) samples with slightly different log-probs than the learner computes."""

    correction: Literal["auto", "recompute", "tis", "none"] = Field(
        "auto",
        description="recompute: the ratio's old log-probs are the learner's, computed before the "
        "update; tis: that, and each token weighted by min(pi_learner / pi_engine, cap) (truncated"
        " importance sampling); none: the engine's log-probs; auto: recompute for roles on vllm, "
        "else none.  Every correction logs learner.mismatch, the mean |log pi_engine - log "
        "pi_learner|.",
    )
    cap: Float = Field(2.0, ge=1.0, le=1e6, description="C of the truncated importance weights.")


class AsyncConfig(StrictModel):
    """Asynchronous rollouts (docs/architecture.md#asynchronous-rollouts): the workers play the
    next steps with the newest weights they have while the learner updates, so generation
    overlaps training; no sample is more than ``max_staleness`` updates old when learnt from."""

    max_staleness: Int = Field(
        0,
        ge=0,
        le=64,
        description="k: the most updates a sample's policy may lag the learner's when it is "
        "learnt from (the rollouts of step s + j start before the update of step s, j <= k); "
        "0: the synchronous loop (play, update, publish).",
    )
    correction: Literal["decoupled", "truncated_is"] = Field(
        "decoupled",
        description="With k > 0 (in place of train.mismatch.correction): the ratio's old "
        "log-probs are the learner's before the update (the proximal policy) and each token is "
        "weighted by pi_prox / pi_behav (decoupled PPO) or min(pi_prox / pi_behav, is_cap) "
        "(truncated_is).",
    )
    is_cap: Float = Field(
        2.0, ge=1.0, le=1e6, description="truncated_is: C of the truncated importance weights."
    )


class InvalidMovesConfig(StrictModel):
    """What training does with an answer that names no legal move (free text): the game's
    forfeit, another try with the error shown, or a random legal move plus a format penalty
    (docs/algorithms.md#unplayable-answers)."""

    handling: Literal["forfeit", "retry", "penalty"] = Field(
        "forfeit",
        description="forfeit: play it, the game forfeits the agent (its rules); retry: ask the "
        "agent again, its answer and the error shown, up to `retries` times, then forfeit; "
        "penalty: play a random legal move instead.",
    )
    penalty: Float = Field(
        0.5,
        ge=0.0,
        le=1e6,
        description="retry and penalty: every unplayable answer gets reward -penalty on top of the"
        " game's return (logged as format_penalties, apart from the game's rewards).",
    )
    retries: Int = Field(1, ge=1, le=64, description="retry: further tries per decision.")


class MagnetConfig(StrictModel):
    """Magnetic mirror descent: a KL pull towards a magnet policy that follows the policy, so
    the last iterate of self-play settles (docs/algorithms.md#magnet-schedule)."""

    alpha: Float = Field(
        0.0,
        ge=0,
        le=1e6,
        description="Weight of KL(pi || magnet) in the loss (exact over the legal actions in "
        "choice decoding); 0: off.",
    )
    every: Int = Field(
        50,
        ge=1,
        le=MAX_STEPS,
        description="Move the magnet every k steps; pick k so that by then the policy has settled "
        "near the current magnet's equilibrium.",
    )
    mix: Float = Field(
        1.0,
        gt=0,
        le=1,
        description="g: the magnet's adapter weights become (1 - g) magnet + g policy (1: a copy).",
    )
    start: Literal["policy", "uniform"] = Field(
        "policy",
        description="The magnet at the start: the initial policy, or uniform over the legal moves "
        "(policy targets only; each move then gives the policy a share g of the magnet, the rest "
        "staying uniform: log rho = share x log magnet).  A peaked initial policy (free text) "
        "held as the magnet keeps the policy peaked (docs/algorithms.md#magnet-schedule).",
    )


class PolicyTargetConfig(StrictModel):
    """Replace the GRPO step by magnetic mirror descent's closed-form step, fitted: per
    information state of the batch, pi_target from the policy, the magnet and the estimated
    action values, then ``fit_steps`` optimiser steps on KL(pi_target || pi)
    (docs/algorithms.md#policy-targets).  Choice or think decoding (think: the moves fitted
    through the mixture over the sampled reasonings, docs/algorithms.md#think-targets), or
    free text at temperature 1 with train.rollout states (the moves read through their own
    answers, docs/algorithms.md#free-text-targets); advantages grouped by state, in reward
    units."""

    eta: Float = Field(
        0.0,
        ge=0,
        le=1e6,
        description="Step size of the closed-form step (on action values in reward units); 0: off "
        "(the GRPO step).",
    )
    fit_steps: Int = Field(
        10, ge=1, le=10_000, description="Steps on KL(pi_target || pi) per training step."
    )
    solver: Literal["adam", "gauss_newton"] = Field(
        "adam",
        description="adam: the learner's optimizer at train.lr, halved after a step that does not "
        "lower the KL, ending on the best weights; gauss_newton: least-norm steps that move each "
        "state's logit differences to the targets' to first order, whatever the features share "
        "(the torch learner backend; think roles: the logit differences of the mixture over the "
        "sampled reasonings, then one optimizer step on the whole loss if reasoning_weight > 0).",
    )
    reasoning_weight: Float = Field(
        1.0,
        ge=0,
        le=1e6,
        description="think roles: weight of the clipped policy-gradient term that trains the "
        "reasoning tokens by the decision's advantage Q(s, a) - V(s) (the move after the "
        "reasoning is fitted to the target through the mixture over the sampled reasonings); "
        "0: the reasoning is not trained.",
    )
    think_fit: Literal["mixture", "each", "pooled"] = Field(
        "mixture",
        description="think roles: mixture: a state's move distribution, the mean over its "
        "sampled reasonings of the move's after each, is fitted to its target (the move may "
        "depend on the reasoning); each: the move after every reasoning is (the mean of their "
        "KLs; the Gauss-Newton rows are per reasoning, every context run in full); pooled: the "
        "mixture after reasonings drawn from every state with the same legal moves, the same "
        "ones for each of those states, so only what the prompts tell apart can separate them "
        "(needs reasoning_weight: 0).",
    )
    ridge: Float = Field(
        1e-6,
        gt=0,
        le=1e6,
        description="gauss_newton: the damping, relative to the mean squared gradient of a logit "
        "difference (which the directions the states share dominate: a large ridge damps the "
        "state-specific ones away).",
    )
    lengths: Int = Field(
        6,
        ge=1,
        le=30,
        description="gauss_newton: the step lengths each step tries, 1, 1/2, ..., "
        "2^-(lengths - 1) of the full step (one loss evaluation each; the lowest kept).",
    )
    search: Literal["all", "descent"] = Field(
        "all",
        description="gauss_newton: all: every one of the lengths; descent: 2, then the "
        "lengths in turn, stopping at the first loss above the one before once one is below "
        "the start (2-3 evaluations where the full step is well scaled).",
    )

    @model_validator(mode="after")
    def _pooled_reasonings(self) -> PolicyTargetConfig:
        if self.think_fit == "pooled" and self.reasoning_weight > 0:
            raise ValueError(
                "think_fit: pooled scores each state's move after other states' reasonings, "
                "which that state did not write: set reasoning_weight: 0"
            )
        return self


class TrainConfig(StrictModel):
    """Multi-agent GRPO settings."""

    rollout: Literal["auto", "game", "team", "states"] = Field(
        "auto",
        description="game: agents take the seats of game.name; team: the team answers game.name's "
        "cooperative tasks in free text along its topology (one sampled graph per episode when "
        "learnable); states: no games: group_size decisions at every information state of a game "
        "with an exact tree (Kuhn, Leduc), each action valued on the tree under the policy those "
        "decisions show (docs/algorithms.md#visiting-every-state; policy_target only); auto: team "
        "when the topology is learnable, else game.",
    )
    policies: Literal["train", "frozen"] = Field(
        "train", description="frozen: no GRPO update; only a learnable topology learns."
    )
    advantage: Literal["agent_wise", "global", "rae", "turn_level"] = Field(
        "agent_wise", description="Advantage estimator (docs/algorithms.md#advantage-estimators)."
    )
    advantage_scale: Literal["std", "none"] = Field(
        "std",
        description="What divides each cell's centred rewards (global, agent_wise, turn_level; rae"
        " never divides): std: the cell's std (GRPO); none: nothing, advantages in the rewards' "
        "units (Dr. GRPO), so every state's payoffs keep their size and the game trained on is the"
        " game played (a magnet's alpha is then in reward units).",
    )
    agent_key: Literal["seat", "role"] = Field(
        "seat", description="What 'agent' means for agent-wise statistics."
    )
    group_by: Literal["seed", "state"] = Field(
        "seed",
        description="seed: the G games of one deal; state: decisions taken in the identical "
        "observation (anchor states).",
    )
    common_mode: Float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Fraction of the advantages' projection on the card-blind score directions of "
        "each (public state, agent) to remove: 1 trains only what depends on the private cards, "
        "against card-blind drift in poker.",
    )
    reward: Literal["individual", "team", "relative"] = Field(
        "individual",
        description="individual: each agent its own return (on a team task that scores roles, its "
        "role's score); team: every agent gets the team's reward (MAGRPO); relative: its return "
        "less the mean of the other seats' returns (a general-sum game trained as zero-sum: "
        "getting more than the partner pays, not just getting more).",
    )
    reward_scales: dict[str, Annotated[Float, Field(ge=-1e6, le=1e6)]] = Field(
        default_factory=dict,
        description="Per-seat reward multipliers (e.g. {agent_1: 10}): agents with different "
        "reward scales, as in Dr. MAS.",
    )
    gamma: Float = Field(1.0, ge=0.0, le=1.0, description="Discount for turn_level credit.")
    branch: Int = Field(
        0,
        ge=0,
        le=64,
        description="K > 0: every trained choice decision is also branched, K copies of the game "
        "per legal action played out by the same seats, and policy_target steps on those action "
        "values (every action valued, also the ones not played); 0: action values from the batch's"
        " own games.",
    )
    branch_rollout: str = Field(
        "policy",
        min_length=1,
        description="Who plays the branched copies out: policy: the seats' own policies (Q of the "
        "policies as they are); a bot of the game (random, heuristic, ...): that bot in every seat"
        " of every copy, so a copy costs no model call (Q of the bot: one step of policy "
        "improvement over it).",
    )
    rae_decay: Float = Field(
        0.95,
        gt=0.0,
        lt=1.0,
        description="rae: the decay d of each role's running baseline b <- d b + (1 - d) mean "
        "reward; lower forgets faster.",
    )
    group_size: Int = Field(8, ge=2, le=MAX_BATCH, description="G: games per group.")
    groups_per_step: Int = Field(8, ge=1, le=MAX_BATCH, description="Groups per training step.")
    steps: Int = Field(
        20, ge=1, le=MAX_STEPS, description="Training steps of the run (`marl train --steps`)."
    )
    max_minutes: Float | None = Field(
        None,
        gt=0,
        le=1e6,
        description="Wall-clock budget: stop (and checkpoint) after the step that crosses it.",
    )
    lr: Float = Field(
        1e-4, gt=0, le=10.0, description="Learning rate of the adapters' optimizer (AdamW)."
    )
    lr_decay: Float = Field(
        0.0,
        ge=0,
        le=1000.0,
        description="Inverse-time decay: step t uses lr / (1 + lr_decay * (t - 1)). In self-play a"
        " constant step keeps the last iterate circling the equilibrium; a decaying one lets it "
        "settle.",
    )
    clip_low: Float = Field(
        0.2, ge=0, le=10.0, description="The ratio pi_theta / pi_old is clipped at 1 - clip_low."
    )
    clip_high: Float = Field(
        0.28,
        ge=0,
        le=10.0,
        description="... and at 1 + clip_high (above clip_low: DAPO's clip-higher, which keeps "
        "rare good moves learnable).",
    )
    dual_clip: Float | None = Field(
        None,
        gt=1,
        le=100.0,
        description="Dual clip c: a negative advantage's loss is at most -c * A whatever the ratio"
        " pi_theta / pi_old (off-policy moves, such as a league snapshot's, can have a large one)."
        " Off by default.",
    )
    kl: Float = Field(0.0, ge=0, le=1000.0, description="beta of the k3 KL to the base model.")
    entropy: Float = Field(0.0, ge=0, le=1000.0, description="Entropy bonus coefficient.")
    epochs: Int = Field(
        1,
        ge=1,
        le=1000,
        description="Optimizer steps per batch, each a pass over it against the sampling-time "
        "log-probs, so the clip bounds the later ones (PPO epochs, TRL num_iterations).",
    )
    max_grad_norm: Float = Field(
        1.0, gt=0, le=1e6, description="Gradients are clipped to this global norm."
    )
    precision: Precision = Field(
        "fp32",
        description="Compute precision of the learner's forward and backward passes: fp32, or "
        "bf16/fp16 autocast, or auto (bf16 where the hardware has bf16 matrix units, else fp32) "
        "(the frozen base is stored in bf16 when the roles' decoding.precision is bf16 too); LoRA "
        "weights and AdamW state stay fp32 (DeepSpeed on a GPU: its bf16/fp16 mode with fp32 "
        "master weights). fp16 needs a GPU learner (ray.gpus_per_learner > 0).",
    )
    seed: Int = Field(
        0, description="Run seed: every step's deals and samples derive from (seed, step)."
    )
    concurrency: Int = Field(64, ge=1, le=65536, description="Games played at once per worker.")
    checkpoint_every: Int = Field(
        5, ge=1, le=MAX_STEPS, description="Write a checkpoint every k steps (and after the last)."
    )
    max_bad_steps: Int = Field(
        3, ge=1, le=MAX_STEPS, description="Consecutive NaN/inf losses before stop."
    )
    eval_every: Int = Field(
        10,
        ge=0,
        le=MAX_STEPS,
        description="Exact evaluation (exploitability) at step 0, every k steps and at the last "
        "step, where the game has one (Kuhn, Leduc poker); `RUN/best` names the checkpoint of "
        "the lowest. 0: off.",
    )
    loggers: list[Literal["jsonl", "wandb"]] = Field(
        default_factory=lambda: ["jsonl"],
        description="Where step metrics go: jsonl (the run's metrics.jsonl) and wandb (the wandb "
        "extra).",
    )
    magnet: MagnetConfig = Field(default_factory=MagnetConfig)
    policy_target: PolicyTargetConfig = Field(default_factory=PolicyTargetConfig)
    league: LeagueConfig = Field(default_factory=LeagueConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    mismatch: MismatchConfig = Field(default_factory=MismatchConfig)
    invalid_moves: InvalidMovesConfig = Field(default_factory=InvalidMovesConfig)
    asynchrony: AsyncConfig = Field(default_factory=AsyncConfig, alias="async")

    @model_validator(mode="after")
    def _target_estimates(self) -> TrainConfig:
        want = {
            "advantage": ("agent_wise", "global"),
            "group_by": ("state",),
            "advantage_scale": ("none",),
            "common_mode": (0.0,),
        }
        bad = [k for k, ok in want.items() if getattr(self, k) not in ok]
        if self.branch_rollout != "policy" and not self.branch:
            raise ValueError(
                f"branch_rollout {self.branch_rollout!r} plays the branched copies "
                "out: set branch: K > 0 (or leave branch_rollout: policy)"
            )
        if self.branch and not self.policy_target.eta > 0:
            raise ValueError(
                "branch values the actions for policy_target's step: set "
                "policy_target.eta > 0 (or branch: 0)"
            )
        if self.policy_target.eta > 0 and bad and not self.branch and self.rollout != "states":
            raise ValueError(
                "policy_target reads each state's action values off the "
                "advantages (a return minus its state's mean, in reward units): "
                "it needs advantage agent_wise or global, group_by: state, "
                f"advantage_scale: none and common_mode: 0 (check {bad})"
            )
        return self

    @model_validator(mode="after")
    def _relative_reward(self) -> TrainConfig:
        if self.reward == "relative" and self.advantage == "turn_level":
            raise ValueError(
                "reward relative compares whole-game returns, and turn_level credits each "
                "turn with the rewards that arrive after it: use another advantage or reward "
                "individual"
            )
        return self

    @model_validator(mode="after")
    def _magnet_start(self) -> TrainConfig:
        read = self.magnet.alpha > 0 and self.policy_target.eta > 0
        if self.magnet.start == "uniform" and not read:
            raise ValueError(
                "magnet.start uniform is a distribution over the legal moves, which only "
                "policy targets read: set magnet.alpha > 0 and policy_target.eta > 0"
            )
        return self

    @model_validator(mode="after")
    def _ranks(self) -> TrainConfig:
        if self.learner.ranks > 1 and not self.ray.enabled:
            raise ValueError("learner.ranks > 1 runs the ranks as Ray actors: set ray.enabled")
        if self.learner.ranks > 1 and self.policy_target.eta > 0:
            raise ValueError("policy_target's fit runs on one process: set learner.ranks: 1")
        return self

    @model_validator(mode="after")
    def _one_correction(self) -> TrainConfig:
        if self.asynchrony.max_staleness > 0 and self.mismatch.correction != "auto":
            raise ValueError(
                "with async.max_staleness > 0 the ratio's old log-probs and the token weights "
                "are async.correction's (its weights cover the engine's numerics too): leave "
                f"mismatch.correction auto (now {self.mismatch.correction!r})"
            )
        return self

    @model_validator(mode="after")
    def _fp16_on_gpu(self) -> TrainConfig:
        if self.precision == "fp16" and not (self.ray.enabled and self.ray.gpus_per_learner > 0):
            raise ValueError(
                "precision fp16 needs a GPU learner (ray.enabled with "
                "ray.gpus_per_learner > 0); on a CPU use bf16"
            )
        return self

    def with_overrides(
        self, steps: int | None = None, max_minutes: float | None = None, address: str | None = None
    ) -> TrainConfig:
        """The settings a command line overrides, where given: the step count, the wall-clock
        budget, and a Ray cluster to join (which turns Ray on)."""
        update: dict[str, object] = {
            k: v for k, v in (("steps", steps), ("max_minutes", max_minutes)) if v is not None
        }
        if address is not None:
            update["ray"] = self.ray.replace(address=address, enabled=True)
        return self.replace(**update)

    def lr_at(self, step: int) -> float:
        """The learning rate of training step ``step`` (1-based)."""
        return self.lr / (1.0 + self.lr_decay * (step - 1))
