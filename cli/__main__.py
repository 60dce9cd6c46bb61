"""``python -m cli ...``: the ``marl`` command without the console script."""

from cli import app

app()
