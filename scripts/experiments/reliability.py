"""Reliability probes: what a careless or hostile user can do to a team file, a run folder, a
user's own game or the server, and whether each ends in a clear error with nothing lost.

    .venv/bin/python -m scripts.experiments.reliability                  # every family, a table
    .venv/bin/python -m scripts.experiments.reliability --family runs --json

Every probe runs ``python -m marl ...`` in a folder of its own, on the tiny random model, and
counts in at most one column besides ``tried``:

- ``hung``: still running at its time limit (it is killed);
- ``traceback``: a Python traceback on the terminal;
- ``lost``: a file the user had changed or disappeared;
- ``wrong``: another exit code than the probe expects (2 for a refusal), an error of more than
  one line, or a side effect the team file asked for (a file it made a shell create).

The mutated-config family validates random edits of every recipe in ``configs/`` in this
process (a subprocess each would take an hour): an edit may be valid, so there only an exit
code other than 0 or 2, a traceback or a hang counts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from scripts.experiments.reliability_cases import FAMILIES
from scripts.experiments.reliability_core import Outcome


def table(outcomes: list[Outcome]) -> list[dict]:
    """Per family: tried and each failure column (0 everywhere is the goal)."""
    rows = []
    for family in dict.fromkeys(o.family for o in outcomes):
        mine = [o for o in outcomes if o.family == family]
        counts = Counter(o.verdict for o in mine)
        rows.append(
            {
                "family": family,
                "tried": len(mine),
                **{k: counts.get(k, 0) for k in ("wrong", "traceback", "hung", "lost")},
            }
        )
    return rows


def print_table(rows: list[dict], failures: list[Outcome]) -> None:
    cols = ("family", "tried", "wrong", "traceback", "hung", "lost")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    for o in failures:
        print(f"\n{o.family} / {o.case}: {o.verdict}\n  {o.detail}")


def run(families: list[str], mutations: int) -> Iterator[Outcome]:
    base = Path(tempfile.mkdtemp(prefix="marl-probes-"))
    try:
        for name in families:
            for outcome in FAMILIES[name](base / name, mutations):
                print(f"  {outcome.family} / {outcome.case}: {outcome.verdict}", file=sys.stderr)
                yield outcome
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None, run_probes: Callable = run) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", choices=list(FAMILIES), help="(repeatable)")
    ap.add_argument("--mutations", type=int, default=40, help="random edits per recipe")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args(argv)
    outcomes = list(run_probes(args.family or list(FAMILIES), args.mutations))
    rows = table(outcomes)
    failures = [o for o in outcomes if o.verdict != "ok"]
    if args.json:
        print(json.dumps({"table": rows, "failures": [o.__dict__ for o in failures]}, indent=1))
    else:
        print_table(rows, failures)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
