"""``python -m marl ...``: the ``marl`` command without the console script."""

from marl.cli import app

app()
