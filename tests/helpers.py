"""Team files for tests: one role on the tiny randomly initialised model (no download); a
cooperative test task whose score varies with the sampled text; a policy that always says the
same thing."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.policy import Request, Response


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
    from pathlib import Path

    from configs import load_config

    cfg = load_config(Path(__file__).resolve().parents[1] / path)
    roles = [r.replace(model="tiny-random", adapter=r.adapter.replace(r=4, alpha=8))
             for r in cfg.roles]
    train = cfg.train.replace(steps=steps, group_size=2, groups_per_step=2, max_minutes=None,
                              ray=cfg.train.ray.replace(enabled=False))
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
    from games.tasks import register_task

    @register_task(name)
    def parity_task(seed: int, difficulty: int = 0) -> ParityTask:
        return ParityTask(seed, difficulty, game=name, private_views={first: view},
                          answerer=answerer)


class Saying:
    """A policy answering every request with one text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def act(self, requests: list[Request]) -> list[Response]:
        return [Response(text=self.text) for _ in requests]
