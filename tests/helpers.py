"""Team files for tests: one role on the tiny randomly initialised model (no download); a
cooperative test task whose score varies with the sampled text; a policy that always says the
same thing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from marl.agents.policy import Request, Response

#: The repository root, and its recipes folder (team and tournament YAML files).
REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "configs"
PLUGINS = REPO / "tests" / "plugins"  # games the project does not register, named by entry point


def recipes() -> list[Path]:
    """The shipped recipe files (``configs/*.yaml``: teams and tournaments), sorted by name."""
    return sorted(RECIPES.glob("*.yaml"))


def build_tiny_host(*adapters: str, dtype=None, seed: int = 0, perturb: bool = False, **adapter_kw):
    """The tiny random model (base in ``dtype``, default fp32) in a ``ModelHost`` with one
    LoRA adapter per name (r 4, alpha 8 unless ``adapter_kw`` says otherwise; the i-th seeded
    ``seed + i``).  ``perturb`` makes every adapter differ from the base (B drawn at 0.05 from
    a generator seeded ``seed``), so that checks run through the adapter's path."""
    import torch

    from marl.agents.host import ModelHost
    from marl.agents.models import load_model

    host = ModelHost(*load_model("tiny-random", dtype=dtype or torch.float32))
    kw = {"r": 4, "alpha": 8, **adapter_kw}
    for i, name in enumerate(adapters):
        host.add_adapter(name, seed=seed + i, **kw)
    if perturb:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in host.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return host


def tiny_team(game: str, train: str, count: int = 2, extra: str = "") -> str:
    """A team YAML whose ``train`` section is ``train`` (indented lines); ``extra`` adds roles."""
    return f"""\
schema: marl-teams/v1
name: t
roles:
  - name: player
    count: {count}
    model: tiny-random
    adapter: {{r: 4, alpha: 8}}
    decoding: {{mode: choice}}
{extra}game: {{name: {game}}}
train:
{train}"""


def team_train(checkpoint_every: int = 1) -> str:
    """The ``train`` section of a two-step tiny team run: the team reward, per role, in this
    process."""
    return f"""\
train:
  rollout: team
  reward: team
  agent_key: role
  group_size: 2
  groups_per_step: 2
  steps: 2
  lr: 0.05
  checkpoint_every: {checkpoint_every}
  ray: {{enabled: false}}
"""


def tiny_smoke(path: str, steps: int = 2):
    """A shipped team file on the tiny model: ``steps`` small steps, in this process."""
    from marl.config import load_config

    cfg = load_config(REPO / path)
    roles = [
        r.replace(model="tiny-random", adapter=r.adapter.replace(r=4, alpha=8)) for r in cfg.roles
    ]
    train = cfg.train.replace(
        steps=steps,
        group_size=2,
        groups_per_step=2,
        max_minutes=None,
        ray=cfg.train.ray.replace(enabled=False),
    )
    return cfg.replace(roles=roles, train=train)


@dataclass(frozen=True)
class ParityTask:
    """Scores 1 when the answer's code points sum to an even number: a reward that varies with
    the sampled text (noisy under sampling), so GRPO and the edge updates get a signal."""

    seed: int
    difficulty: int = 0
    game: str = "text_parity"
    question: str = "Say a few words."
    private_views: dict[str, str] = field(default_factory=dict)
    answer: int = 0
    answerer: str = ""

    def score(self, text: str) -> float:
        return float(sum(map(ord, text)) % 2 == 0)


def register_parity_task(name: str, first: str, answerer: str, view: str = "You start.") -> None:
    """Register a :class:`ParityTask` as the task ``name``: ``first`` alone reads ``view``."""
    from marl.games.tasks import register_task

    @register_task(name)
    def parity_task(seed: int, difficulty: int = 0) -> ParityTask:
        return ParityTask(
            seed, difficulty, game=name, private_views={first: view}, answerer=answerer
        )


class Saying:
    """A policy answering every request with one text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def act(self, requests: list[Request]) -> list[Response]:
        return [Response(text=self.text) for _ in requests]


def train_config(**fields):
    """A ``TrainConfig`` with ``fields`` set, a section's as a dict (``magnet={"alpha": 0.5}``),
    unvalidated: tests reach settings no recipe asks for (lr 0: a learner that keeps its
    weights; epochs 0: what the learner refuses itself)."""
    from marl.config.train import TrainConfig

    cfg = TrainConfig()
    sections = {
        k: getattr(cfg, k).model_copy(update=v) for k, v in fields.items() if isinstance(v, dict)
    }
    return cfg.model_copy(update={**fields, **sections})


def marl(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """The installed ``marl`` command (``python -m cli`` without one), with the plugin folder
    on PYTHONPATH as a user's own package would be installed."""
    script = Path(sys.executable).with_name("marl")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "marl"]
    path = os.pathsep.join([str(REPO), str(PLUGINS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run(
        [*cmd, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def tiny(cfg, max_new_tokens: int = 6):
    """The same team on the tiny random model, greedy and short (fast, deterministic)."""
    return cfg.model_copy(
        update={
            "roles": [
                r.model_copy(
                    update={
                        "model": "tiny-random",
                        "decoding": r.decoding.model_copy(
                            update={"max_new_tokens": max_new_tokens, "temperature": 0.0}
                        ),
                    }
                )
                for r in cfg.roles
            ]
        }
    )


def tiny_chain():
    """The solver-critic-judge recipe on the tiny model, greedy, 12 tokens a turn."""
    from marl.config import load_config

    return tiny(load_config(RECIPES / "solver_critic_judge.yaml"), max_new_tokens=12)


class Gate:
    """A policy that holds its calls until released, and records each batch's questions."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.batches: list[list[str]] = []

    def act(self, requests: list[Request]) -> list[Response]:
        self.entered.set()
        self.release.wait(30)
        self.batches.append([r.messages[-1]["content"].split("\n", 1)[0] for r in requests])
        return [Response(text=f"answer {len(self.batches)}") for _ in requests]


#: the parts of a step's metrics that vary from run to run on the same seed
TIMINGS = ("seconds", "tokens_per_s", "games_per_min")


def timeless(row: dict) -> dict:
    """A metrics row without its timings (what a replayed or resumed step must reproduce)."""
    return {k: v for k, v in row.items() if k not in TIMINGS}


def metrics_rows(run: Path) -> list[dict]:
    """A run's ``metrics.jsonl`` lines, each :func:`timeless`."""
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [timeless(json.loads(ln)) for ln in lines]
