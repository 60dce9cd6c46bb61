"""How commands print a result: a rich table that never cuts a number short, or with
``--json`` one JSON document on stdout and nothing else there (spinners go to stderr).

Rich lays a table out for the console's width (80 columns when stdout is no terminal) and
cuts what does not fit with ``…``.  Piped, a table is printed at its natural width instead;
on a terminal too narrow for every cell's longest word, at that minimum width (the terminal
then wraps lines, but no figure loses a digit)."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

Json = Annotated[
    bool,
    typer.Option(
        "--json", help="Print the result as one JSON document on stdout (and nothing else there)."
    ),
]

#: A width no table reaches: its natural width is measured against it.
_UNBOUNDED = 100_000


def console(json_out: bool = False) -> Console:
    """The console a command prints on: stderr when stdout carries a JSON document."""
    from rich.console import Console

    return Console(stderr=json_out)


def table(title: str, columns: dict[str, str]) -> Table:
    """A table whose columns (name -> ``left`` or ``right``) are laid out so that figures
    survive: right-aligned (number) columns never wrap, text columns fold instead of cutting."""
    from rich.table import Table

    out = Table(title=title)
    for name, justify in columns.items():
        out.add_column(name, justify=justify, no_wrap=justify == "right", overflow="fold")
    return out


def show(out: Console, shown: Table) -> None:
    """Print ``shown`` whole: at its natural width when piped; on a terminal at least as wide
    as its unwrapped (number) columns whole and its text columns' longest words need."""
    from rich.measure import Measurement

    natural = Measurement.get(out, out.options.update_width(_UNBOUNDED), shown)
    if out.is_terminal:
        floor = natural.minimum + sum(_unsplit(col.cells) for col in shown.columns if col.no_wrap)
        width = max(out.width, min(floor, natural.maximum))
    else:
        width = natural.maximum
    size = out.size
    out.width = max(width, size.width)  # print clamps its width to the console's
    try:
        out.print(shown, width=width, crop=False)
    finally:
        out.size = size


def _unsplit(cells: Any) -> int:
    """How much wider a column's longest cell is than its longest word (what keeping the cell
    on one line adds to the table's minimum width)."""
    texts = [str(c) for c in cells] or [""]
    return max(len(t) for t in texts) - max(len(w) for t in texts for w in [*t.split(), ""])


def emit(data: Any) -> None:
    """Print ``data`` as one JSON document on stdout: a figure that is no number (NaN, an
    interval with too few games) as ``null``, a value JSON has no type for (a game argument's
    default object) as its ``repr``."""
    typer.echo(json.dumps(_finite(data), indent=1, default=repr, allow_nan=False))


def _finite(data: Any) -> Any:
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(v) for v in data]
    return data
