"""Name -> game class registry, so configs and the CLI pick games by name, not import path."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pettingzoo import AECEnv

_GAMES: dict[str, Callable[..., AECEnv]] = {}
T = TypeVar("T")


def register(name: str) -> Callable[[T], T]:
    """Class decorator: ``@register("kuhn_poker")`` makes ``games.make("kuhn_poker")`` work."""

    def deco(factory: T) -> T:
        if name in _GAMES and _GAMES[name] is not factory:
            raise ValueError(f"game {name!r} is already registered")
        _GAMES[name] = factory  # type: ignore[assignment]
        return factory

    return deco


def names() -> list[str]:
    return sorted(_GAMES)


def make(name: str, **kwargs) -> AECEnv:
    """Build a registered game; an unknown name lists the known ones."""
    try:
        factory = _GAMES[name]
    except KeyError:
        raise KeyError(f"unknown game {name!r}; known games: {', '.join(names())}") from None
    return factory(**kwargs)
