"""Name -> game class registry, so configs and the CLI pick games by name, not import path.

Turn-based (AEC) games and the simultaneous-move (``ParallelEnv``) forms some of them also
offer live in separate tables with the same interface.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pettingzoo import AECEnv, ParallelEnv

_GAMES: dict[str, Callable[..., AECEnv]] = {}
_PARALLEL: dict[str, Callable[..., ParallelEnv]] = {}
T = TypeVar("T")


def register_in(table: dict[str, Any], kind: str, name: str) -> Callable[[T], T]:
    def deco(factory: T) -> T:
        if name in table and table[name] is not factory:
            raise ValueError(f"{kind} {name!r} is already registered")
        table[name] = factory
        return factory

    return deco


def make_from(table: dict[str, Callable[..., Any]], kind: str, name: str, kwargs: dict) -> Any:
    try:
        factory = table[name]
    except KeyError:
        raise KeyError(f"unknown {kind} {name!r}; known {kind}s: "
                       f"{', '.join(sorted(table))}") from None
    return factory(**kwargs)


def register(name: str) -> Callable[[T], T]:
    """Class decorator: ``@register("kuhn_poker")`` makes ``games.make("kuhn_poker")`` work."""
    return register_in(_GAMES, "game", name)


def names() -> list[str]:
    return sorted(_GAMES)


def check_name(name: str, *, tasks: bool = False) -> str | None:
    """What is wrong with ``name`` as a game, or None: it is registered (or, with ``tasks``,
    a cooperative task of :mod:`games.tasks`, which a team answers in free text).  The one
    name check behind config validation, the trainer and tournaments."""
    from games.tasks import task_names  # games.tasks builds its table from this module

    known = names()
    if name in known or (tasks and name in task_names()):
        return None
    if name in task_names():
        return f"{name!r} is a cooperative task, not a game; known games: {', '.join(known)}"
    return f"unknown game {name!r}; known: {', '.join(known)}"


def accepted_kwargs(factory: Callable[..., Any]) -> set[str] | None:
    """The keyword arguments ``factory`` takes, following ``**kwargs`` up a class's bases (a
    game passes them on to :class:`~games.base.TextGame`); None when anything goes."""
    owners = [c for c in inspect.getmro(factory) if "__init__" in vars(c)] \
        if isinstance(factory, type) else [factory]
    names: set[str] = set()
    for owner in owners:
        params = inspect.signature(owner).parameters.values()
        names |= {p.name for p in params
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return names
    return None


def check_kwargs(name: str, kwargs: Mapping[str, Any]) -> str | None:
    """What is wrong with ``kwargs`` for game ``name`` by its signature, or None: the check
    behind ``marl validate``, so an unknown argument fails there and not at run time."""
    allowed = accepted_kwargs(_GAMES[name])
    if allowed is None:
        return None
    for key in kwargs:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f"did you mean {close[0]!r}?" if close else \
                f"it takes: {', '.join(sorted(allowed)) or 'none'}"
            return f"game {name!r} takes no argument {key!r}; {hint}"
    return None


def make(name: str, **kwargs) -> AECEnv:
    """Build a registered game; an unknown name lists the known ones."""
    return make_from(_GAMES, "game", name, kwargs)


def register_parallel(name: str) -> Callable[[T], T]:
    """``@register_parallel("rps")``: the simultaneous-move (``ParallelEnv``) form of a game."""
    return register_in(_PARALLEL, "parallel game", name)


def parallel_names() -> list[str]:
    return sorted(_PARALLEL)


def make_parallel(name: str, **kwargs) -> ParallelEnv:
    """Build a registered parallel form; an unknown name lists the known ones."""
    return make_from(_PARALLEL, "parallel game", name, kwargs)
