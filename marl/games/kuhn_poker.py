"""Kuhn poker: J < Q < K, ante 1, one betting round with a single bet of 1.

Rules, info states and payoffs come from the shared limit-poker engine in ``marl.games.poker``.
Nash value for player_0 is -1/18 (see ``marl.games.cfr``).
"""

from __future__ import annotations

from functools import partial
from typing import ClassVar

from marl.games.bots import register_bot
from marl.games.cfr import CfrBot
from marl.games.poker import PLAYERS, HeuristicPokerBot, PokerGame, PokerRules
from marl.games.registry import register

KUHN = PokerRules(ranks=("J", "Q", "K"), copies=1, raise_sizes=(1,), max_raises=1)


@register("kuhn_poker")
class KuhnPoker(PokerGame):
    """Two players, three cards; the highest card wins unless somebody folds."""

    metadata: ClassVar[dict] = {
        "name": "kuhn_poker",
        "render_modes": ["ansi"],
        "is_parallelizable": False,
    }
    possible_agents: ClassVar[list[str]] = list(PLAYERS)
    poker = KUHN
    action_names: ClassVar[list[str]] = list(KUHN.actions)
    obs_shape: ClassVar[tuple[int, ...]] = (KUHN.obs_size,)
    rules: ClassVar[str] = (
        "Kuhn poker. The deck has three cards: J < Q < K. Each player antes 1 chip and gets one "
        "private card. There is one betting round and player_0 acts first: you may [Check] or "
        "[Bet] 1 chip; facing a bet you may [Call] or [Fold]. Only one bet is allowed. If nobody "
        "folds, the higher card wins the pot. Answer with one move in brackets, e.g. [Check]."
    )


register_bot("kuhn_poker", "heuristic")(partial(HeuristicPokerBot, KUHN))
register_bot("kuhn_poker", "optimal")(partial(CfrBot, "kuhn_poker"))
