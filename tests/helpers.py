"""Team files for tests: one role on the tiny randomly initialised model (no download)."""


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
