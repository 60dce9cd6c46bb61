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
