"""Mutated copies of every shipped config: validate never raises or hangs, locates every
problem, and whatever it accepts builds its game and its team's structure.

A seeded generator (same cases every run) mutates types, keys, syntax, anchors and aliases,
nesting, unicode, control characters and sizes; each case must finish well under a second.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import recipes
from marl import config as configs
from marl import games
from marl.cli.common import config_problems
from marl.config import TeamConfig, load_config
from marl.config.tournament import TournamentConfig

CASES_PER_FILE = 40
SECONDS_PER_CASE = 2.0
SHIPPED = recipes()

VALUES: list[Any] = [
    True,
    False,
    None,
    0,
    -1,
    1,
    2,
    10**9,
    10**30,
    1.5,
    -0.0,
    1e30,
    float("inf"),
    float("nan"),
    "",
    "x",
    "1e9",
    "${UNSET_FUZZ_VAR}",
    "$${x}",
    "{gaem}",
    "ünï©ødé ✓",
    [],
    [1, "a"],
    {},
    {"k": 1},
    "2024-02-30",
]
TEXT_VALUES = [
    "1e30",
    "1e-4",
    ".inf",
    ".nan",
    "true",
    "~",
    "[",
    "]",
    "{",
    "}",
    "&a x",
    "*a",
    "*undefined",
    "!!python/object:os.system",
    "!!binary x",
    "2024-02-30",
    "'unterminated",
    '"\\x"',
    "- a",
    "? [a, b]",
    "\x00",
    "\x07",
    "\ufeff",
    "\u202e",
    "1" * 5000,
    "|",
    ">-",
]


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(data, dict):
        for k, v in data.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += _paths(v, (*prefix, i))
    return out


def _set(data: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    data[path[0]] = _set(data[path[0]], path[1:], value)
    return data


def _data_mutation(rng: random.Random, text: str) -> str:
    data = yaml.safe_load(text)
    path = rng.choice(_paths(data))
    kind = rng.randrange(4)
    target = data
    for part in path[:-1]:
        target = target[part]
    if kind == 0 or not path:
        data = _set(data, path, rng.choice(VALUES))
    elif kind == 1 and isinstance(target, dict):
        del target[path[-1]]
    elif kind == 2 and isinstance(target, dict):
        target[rng.choice(["count", "typo", "kwargs", "final", "r", "n_agents", 7])] = rng.choice(
            VALUES
        )
    else:
        nested: Any = rng.choice(VALUES)
        for _ in range(rng.choice([2, 70, 700])):
            nested = [nested]
        data = _set(data, path, nested)
    try:
        return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
    except RecursionError:  # the dumper's own limit: send the bare brackets instead
        return text + "deep: " + "[" * 700 + "]" * 700 + "\n"


def _text_mutation(rng: random.Random, text: str) -> str:
    lines = text.splitlines()
    i = rng.randrange(len(lines))
    kind = rng.randrange(6)
    if kind == 0:
        del lines[i]
    elif kind == 1:
        lines.insert(i, lines[rng.randrange(len(lines))])
    elif kind == 2:
        cut = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:cut] + rng.choice(TEXT_VALUES) + lines[i][cut:]
    elif kind == 3:
        lines = lines[:i]
    elif kind == 4:
        lines.append(f"bomb0: &b0 [{', '.join(['x'] * 9)}]")
        lines += [f"bomb{k}: &b{k} [{', '.join([f'*b{k - 1}'] * 9)}]" for k in range(1, 9)]
    else:
        lines[i] = lines[i].replace(":", rng.choice([" :", "::", ": &a", ": *a", ":\t", "="]), 1)
    return "\n".join(lines) + rng.choice(["\n", "", "\n\n\x00"])


MUTATIONS: list[Callable[[random.Random, str], str]] = [_data_mutation, _text_mutation]


def _builds(cfg: TeamConfig | TournamentConfig) -> None:
    """What running needs and validate promised: the game builds; a team's roster has one
    name per agent and its topology builds over them."""
    if cfg.game.name in games.names():
        games.make(cfg.game.name, **cfg.game.kwargs)
    if isinstance(cfg, TeamConfig):
        from marl.topologies import build_topology

        names = [a for r in cfg.roles for a in r.instance_names()]
        assert len(names) == len(set(names)) == sum(r.count for r in cfg.roles)
        build_topology(cfg)


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """Import what the checks import lazily, so no case pays for it."""
    import marl.orchestrator.arena.tournament  # noqa: F401
    from marl import topologies  # noqa: F401


@pytest.mark.parametrize("shipped", SHIPPED, ids=lambda p: p.name)
def test_mutated_configs_never_crash_and_are_located(shipped: Path, tmp_path: Path) -> None:
    rng = random.Random(shipped.name)
    original = shipped.read_text(encoding="utf-8")
    accepted = 0
    path = tmp_path / shipped.name  # next to nothing: relative sources are missing
    checks = [lambda c: config_problems(c, str(path))]
    for case in range(CASES_PER_FILE):
        text = rng.choice(MUTATIONS)(rng, original)
        path.write_text(text, encoding="utf-8")
        start = time.perf_counter()
        problems = configs.validate_file(path, checks=checks)
        took = time.perf_counter() - start
        assert took < SECONDS_PER_CASE, (case, took, text[:300])
        for p in problems:
            assert p.file == str(path) and p.line >= 1 and p.col >= 1 and p.message, (case, p)
        if not problems:
            accepted += 1
            model = TournamentConfig if "tournament/v1" in text else TeamConfig
            _builds(load_config(path, model))
    assert accepted < CASES_PER_FILE  # the mutations do break things


@pytest.mark.parametrize("shipped", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_builds(shipped: Path) -> None:
    problems = configs.validate_file(shipped, checks=[lambda c: config_problems(c, str(shipped))])
    assert problems == []
    model = TournamentConfig if "tournament" in shipped.name else TeamConfig
    _builds(load_config(shipped, model))
