"""Leduc poker: two each of J, Q, K; two betting rounds (wagers of 2 then 4, at most two per
round); one public card before the second round; a pair with the public card beats any high card.

Rules, info states and payoffs come from the shared limit-poker engine in ``marl.games.poker``.
Nash value for player_0 is about -0.0856 (see ``marl.games.cfr``).
"""

from __future__ import annotations

from functools import partial
from typing import ClassVar

from marl.games.bots import register_bot
from marl.games.cfr import CfrBot
from marl.games.poker import PLAYERS, HeuristicPokerBot, PokerGame, PokerRules
from marl.games.registry import register

LEDUC = PokerRules(ranks=("J", "Q", "K"), copies=2, raise_sizes=(2, 4), max_raises=2)


@register("leduc_poker")
class LeducPoker(PokerGame):
    """Two players, six cards, two betting rounds around one public card."""

    metadata: ClassVar[dict] = {
        "name": "leduc_poker",
        "render_modes": ["ansi"],
        "is_parallelizable": False,
    }
    possible_agents: ClassVar[list[str]] = list(PLAYERS)
    poker = LEDUC
    action_names: ClassVar[list[str]] = list(LEDUC.actions)
    obs_shape: ClassVar[tuple[int, ...]] = (LEDUC.obs_size,)
    rules: ClassVar[str] = (
        "Leduc poker. The deck has two J, two Q and two K (J < Q < K). Each player antes 1 chip "
        "and gets one private card. There are two betting rounds and player_0 acts first in "
        "each. With no wager to match you may [Check] or [Bet]; facing a wager you may [Call], "
        "[Fold] or [Raise]. Bets and raises are 2 chips in round 1 and 4 chips in round 2, at "
        "most two wagers per round. After round 1 one public card is revealed. At the showdown a "
        "private card that pairs the public card wins; otherwise the higher card wins; equal "
        "cards split the pot. Answer with one move in brackets, e.g. [Check]."
    )


register_bot("leduc_poker", "heuristic")(partial(HeuristicPokerBot, LEDUC))
register_bot("leduc_poker", "optimal")(partial(CfrBot, "leduc_poker"))
