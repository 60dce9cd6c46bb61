"""Which values of a player's private information a text names: does a reasoning name the
card it was written with?

A game exposes its private-information names (:meth:`~marl.games.TextGame.private_names`:
poker's ``{"J": ("Jack", "J"), "Q": ("Queen", "Q"), "K": ("King", "K")}``); this module
knows nothing of cards.  A name counts where it stands as a whole word (no letter or digit
right before or after it): a name of two characters or more in any case, and with a plural
``s`` (``king``, ``Kings``, ``KING's``), a one-character name in its own case only (``K``
and ``[K]`` name the King, ``k`` and ``OK`` do not).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

Names = Mapping[str, Sequence[str]]


@cache
def _pattern(name: str) -> re.Pattern[str]:
    if len(name) == 1:
        return re.compile(rf"(?<![^\W_]){re.escape(name)}(?![^\W_])")
    return re.compile(rf"(?<![^\W_]){re.escape(name)}s?(?![^\W_])", re.IGNORECASE)


def named(text: str, names: Names) -> set[str]:
    """The values of ``names`` (value -> the words naming it) that ``text`` names."""
    return {value for value, words in names.items() if any(_pattern(w).search(text) for w in words)}


@dataclass(frozen=True)
class NamingShares:
    """Over ``texts`` reasonings: the share naming the value held where each is scored
    (``own``) and the share naming any other value (``other``); one text may do both."""

    own: float
    other: float
    texts: int


def naming_shares(scored: Sequence[tuple[str, str]], names: Names) -> NamingShares | None:
    """Shares over ``(text, value held)`` pairs; None without pairs or names to match."""
    if not scored or not names:
        return None
    own = other = 0
    for text, held in scored:
        found = named(text, names)
        own += held in found
        other += bool(found - {held})
    return NamingShares(own / len(scored), other / len(scored), len(scored))
