"""Limit poker shared by Kuhn and Leduc: pure rules, one environment class, a heuristic bot.

The rules live in one immutable :class:`PokerState`.  The PettingZoo environment steps it, and
the exact-analysis tree (``marl.games.game_tree``) enumerates it, so the environment and the solver
can never disagree about legal moves, info states or payoffs.

A game is a :class:`PokerRules`: a deck of ranks (``copies`` of each), one ante, one betting
round per entry of ``raise_sizes`` (a public card is revealed before every round after the
first), at most ``max_raises`` wagers per round.  Player 0 opens every round.

Betting histories use ACPC-style letters, one string per round joined by ``/``:
``c`` check or call, ``b`` bet (first wager of a round), ``r`` raise, ``f`` fold.  A round is
over exactly when it has at least two actions and ends with ``c``.  The info-state key of a
player is ``<card>[|<public cards>]:<history>``, e.g. ``K:cb`` (Kuhn) or ``Q|K:cbc/b`` (Leduc).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from marl.games.base import TextGame

ACTIONS = ("Check", "Bet", "Call", "Fold", "Raise")
CHECK, BET, CALL, FOLD, RAISE = range(len(ACTIONS))
_LETTER = {CHECK: "c", BET: "b", CALL: "c", FOLD: "f", RAISE: "r"}
PLAYERS = ("player_0", "player_1")
#: A rank's name in words (a rank with none is named by its letter only).
RANK_WORDS = {"T": "Ten", "J": "Jack", "Q": "Queen", "K": "King", "A": "Ace"}


@dataclass(frozen=True)
class PokerRules:
    """The parameters that distinguish one limit-poker game from another."""

    ranks: tuple[str, ...]  # lowest first
    copies: int  # cards of each rank in the deck
    raise_sizes: tuple[int, ...]  # wager size of each betting round
    max_raises: int  # wagers (bet + raises) allowed per round
    ante: int = 1

    @property
    def rounds(self) -> int:
        return len(self.raise_sizes)

    @property
    def actions(self) -> tuple[str, ...]:
        """Fixed action set: Raise only exists where a round allows a re-raise."""
        return ACTIONS if self.max_raises > 1 else ACTIONS[:RAISE]

    @property
    def max_contribution(self) -> int:
        return self.ante + self.max_raises * sum(self.raise_sizes)

    @property
    def round_length(self) -> int:
        """Longest action sequence in one round: check, every wager, then a call."""
        return self.max_raises + 2

    @property
    def obs_size(self) -> int:
        n_ranks = len(self.ranks)
        return (
            2
            + n_ranks * self.rounds  # seat, private card, one public card per later round
            + self.rounds * self.round_length * len(self.actions)
            + 2
        )


@dataclass(frozen=True)
class PokerState:
    """One node of the game: chance (a card to deal), a player to act, or terminal.

    ``apply`` takes a rank index at chance nodes and an action index at player nodes and
    returns a new state; nothing mutates.
    """

    rules: PokerRules
    private: tuple[int, ...] = ()  # rank index of each player's card, dealt in seat order
    public: tuple[int, ...] = ()  # public card ranks, one per round after the first
    history: tuple[str, ...] = ("",)  # betting letters, one string per round started
    contrib: tuple[int, int] = (0, 0)  # chips each player has put in the pot
    folded: int | None = None  # the player who folded, if any

    num_players: ClassVar[int] = 2

    @classmethod
    def initial(cls, rules: PokerRules) -> PokerState:
        return cls(rules, contrib=(rules.ante, rules.ante))

    # ----- node kind
    @property
    def round(self) -> int:
        return len(self.history) - 1

    @property
    def is_chance(self) -> bool:
        return len(self.private) < 2 or len(self.public) < self.round

    @property
    def is_terminal(self) -> bool:
        return self.folded is not None or (
            self.round == self.rules.rounds - 1 and _round_over(self.history[-1])
        )

    @property
    def current_player(self) -> int:
        """Player 0 opens every round; players alternate within it."""
        return len(self.history[-1]) % 2

    @property
    def facing_wager(self) -> bool:
        return self.contrib[0] != self.contrib[1]

    @property
    def wagers_this_round(self) -> int:
        return sum(ch in "br" for ch in self.history[-1])

    # ----- moves
    def legal(self) -> list[int]:
        if self.is_terminal or self.is_chance:
            return []
        can_raise = self.wagers_this_round < self.rules.max_raises
        if self.facing_wager:
            return [CALL, FOLD] + ([RAISE] if can_raise else [])
        return [CHECK] + ([BET] if can_raise else [])

    def chance_outcomes(self) -> list[tuple[int, float]]:
        """Ranks still in the deck with their probability of being dealt next."""
        dealt = self.private + self.public
        left = [self.rules.copies - dealt.count(r) for r in range(len(self.rules.ranks))]
        total = sum(left)
        return [(r, n / total) for r, n in enumerate(left) if n > 0]

    def apply(self, action: int) -> PokerState:
        if self.is_chance:
            if action not in dict(self.chance_outcomes()):
                raise ValueError(f"rank {action} is not left in the deck")
            if len(self.private) < 2:
                return replace(self, private=self.private + (action,))
            return replace(self, public=self.public + (action,))
        if action not in self.legal():
            raise ValueError(f"action {action} is not legal in {self.history}")
        p = self.current_player
        contrib = list(self.contrib)
        if action in (BET, RAISE):
            contrib[p] = contrib[1 - p] + self.rules.raise_sizes[self.round]
        elif action == CALL:
            contrib[p] = contrib[1 - p]
        history = self.history[:-1] + (self.history[-1] + _LETTER[action],)
        if _round_over(history[-1]) and len(history) < self.rules.rounds:
            history += ("",)
        return replace(
            self,
            history=history,
            contrib=(contrib[0], contrib[1]),
            folded=p if action == FOLD else None,
        )

    # ----- outcome and views
    def hand_strength(self, player: int) -> tuple[bool, int]:
        """Pairing a public card beats any unpaired hand; otherwise the higher rank wins."""
        card = self.private[player]
        return card in self.public, card

    def returns(self) -> tuple[float, float]:
        """Chips won by each player (zero-sum): the loser loses what they put in."""
        if self.folded is not None:
            loser = self.folded
        else:
            s0, s1 = self.hand_strength(0), self.hand_strength(1)
            if s0 == s1:
                return 0.0, 0.0
            loser = 0 if s0 < s1 else 1
        won = float(self.contrib[loser])
        return (-won, won) if loser == 0 else (won, -won)

    def info_key(self, player: int) -> str:
        """What ``player`` knows: their card, the public cards and the betting, e.g. ``K:cb``."""
        ranks = self.rules.ranks
        cards = ranks[self.private[player]] if len(self.private) > player else "?"
        if self.public:
            cards += "|" + "".join(ranks[r] for r in self.public)
        return cards + ":" + "/".join(self.history)


def _round_over(letters: str) -> bool:
    return len(letters) >= 2 and letters[-1] == "c"


# ----- the environment ------------------------------------------------------------------------


class PokerGame(TextGame):
    """PettingZoo environment over :class:`PokerState`; subclasses only set ``poker`` and text.

    Cards are dealt from ``self.np_random`` in ``_setup`` (private cards) and after a betting
    round that reveals a public card.
    """

    poker: ClassVar[PokerRules]
    possible_agents: ClassVar[list[str]] = list(PLAYERS)

    @classmethod
    def root_state(cls) -> PokerState:
        """The chance node before any card is dealt: the root of the exact game tree."""
        return PokerState.initial(cls.poker)

    def information_state(self, agent: str) -> str:
        return self.state.info_key(self.possible_agents.index(agent))

    def public_state(self, agent: str) -> str:
        """The information state with the agent's own card hidden: ``?:cb`` for ``K:cb``."""
        key = self.information_state(agent)
        return "?" + key[1:]

    def private_names(self) -> dict[str, tuple[str, ...]]:
        """Each rank by its word and its letter: ``{"J": ("Jack", "J"), ...}``."""
        return {r: (*([RANK_WORDS[r]] if r in RANK_WORDS else []), r) for r in self.poker.ranks}

    def private_value(self, agent: str) -> str | None:
        """The rank of ``agent``'s own card (None before it is dealt)."""
        private, me = self.state.private, self.possible_agents.index(agent)
        return self.poker.ranks[private[me]] if len(private) > me else None

    def set_tree_state(self, state: PokerState) -> None:
        """Jump to a decision node of the exact tree (to show a policy every info state)."""
        if state.is_chance or state.is_terminal:
            raise ValueError("set_tree_state needs a decision node")
        self.state = state
        self.agent_selection = self.possible_agents[state.current_player]

    # ----- TextGame hooks
    def _setup(self, rng: np.random.Generator) -> None:
        self.state = self._deal(self.root_state(), rng)

    def _deal(self, state: PokerState, rng: np.random.Generator) -> PokerState:
        while state.is_chance:
            ranks, probs = zip(*state.chance_outcomes(), strict=True)
            state = state.apply(int(ranks[rng.choice(len(ranks), p=probs)]))
        return state

    def _legal(self, agent: str) -> list[int]:
        if self.possible_agents.index(agent) != self.state.current_player:
            return []
        return self.state.legal()

    def _apply(self, agent: str, action: int) -> None:
        self.state = self._deal(self.state.apply(action), self.np_random)
        if self.state.is_terminal:
            self._end(dict(zip(self.possible_agents, self.state.returns(), strict=True)))

    def _next_agent(self, agent: str) -> str:
        return self.possible_agents[self.state.current_player]

    def _encode(self, agent: str) -> np.ndarray:
        """Seat, own card, public cards, one-hot action per history slot, chips in / max."""
        s, rules, me = self.state, self.poker, self.possible_agents.index(agent)
        n_ranks, n_act = len(rules.ranks), len(rules.actions)
        vec = np.zeros(rules.obs_size, dtype=np.float32)
        vec[me] = 1.0
        vec[2 + s.private[me]] = 1.0
        for i, card in enumerate(s.public):
            vec[2 + n_ranks * (i + 1) + card] = 1.0
        base = 2 + n_ranks * rules.rounds
        for rnd, actions in enumerate(_round_actions(s)):
            for j, action in enumerate(actions):
                vec[base + (rnd * rules.round_length + j) * n_act + action] = 1.0
        vec[-2] = s.contrib[me] / rules.max_contribution
        vec[-1] = s.contrib[1 - me] / rules.max_contribution
        return vec

    def _describe(self, agent: str) -> str:
        s, me = self.state, self.possible_agents.index(agent)
        ranks = self.poker.ranks
        lines = [
            f"You are {agent}; you act {'first' if me == 0 else 'second'} in every betting round.",
            f"Your card: {ranks[s.private[me]]} ({_rank_phrase(self.poker, s.private[me])}).",
        ]
        if self.poker.rounds > 1:
            lines.append(self._describe_public(me))
        for rnd, actions in enumerate(_round_actions(s)):
            said = [
                ("you" if j % 2 == me else "opponent") + " " + _PAST[a]
                for j, a in enumerate(actions)
            ]
            label = f"Round {rnd + 1} betting" if self.poker.rounds > 1 else "Betting"
            lines.append(f"{label}: {', '.join(said) if said else 'no actions yet'}.")
        pot = sum(s.contrib)
        lines.append(
            f"Pot: {pot} chips (you put in {s.contrib[me]}, your opponent {s.contrib[1 - me]})."
        )
        if s.is_terminal:
            lines.append(self._describe_result(me))
        elif s.current_player == me and s.facing_wager:
            lines.append(f"To call you must add {_chips(s.contrib[1 - me] - s.contrib[me])}.")
        return "\n".join(lines)

    def final_view(self, agent: str) -> str:
        """The end of the hand with every card face up (after a fold too)."""
        me = self.possible_agents.index(agent)
        other = self.poker.ranks[self.state.private[1 - me]]
        return f"{self._describe(agent)}\nYour opponent held {other}."

    def _describe_public(self, me: int) -> str:
        s, ranks = self.state, self.poker.ranks
        if not s.public:
            return "Public card: not revealed yet (it is shown after the first betting round)."
        shown = ", ".join(ranks[r] for r in s.public)
        if s.hand_strength(me)[0]:
            return (
                f"Public card: {shown}. You have a PAIR of {ranks[s.private[me]]}: "
                "it beats every unpaired hand."
            )
        return f"Public card: {shown}. No pair for you: your {ranks[s.private[me]]} plays high."

    def _describe_result(self, me: int) -> str:
        s, ranks = self.state, self.poker.ranks
        won = s.returns()[me]
        outcome = (
            f"you win {_chips(won)}"
            if won > 0
            else f"you lose {_chips(-won)}"
            if won < 0
            else "the pot is split"
        )
        if s.folded is not None:
            who = "You" if s.folded == me else "Your opponent"
            return f"Hand over: {who} folded; {outcome}."
        return (
            f"Showdown: your {ranks[s.private[me]]} against your opponent's "
            f"{ranks[s.private[1 - me]]}; {outcome}."
        )


_PAST = {CHECK: "checked", BET: "bet", CALL: "called", FOLD: "folded", RAISE: "raised"}


def _round_actions(state: PokerState) -> list[list[int]]:
    """Decode the history letters back into action indices (``c`` is a call after a wager)."""
    decoded = []
    for letters in state.history:
        actions, wagered = [], False
        for ch in letters:
            if ch == "c":
                actions.append(CALL if wagered else CHECK)
            elif ch in "br":
                actions.append(RAISE if wagered else BET)
                wagered = True
            else:
                actions.append(FOLD)
        decoded.append(actions)
    return decoded


def _chips(n: float) -> str:
    return f"{n:g} chip" + ("" if n == 1 else "s")


def _rank_phrase(rules: PokerRules, rank: int) -> str:
    top = len(rules.ranks) - 1
    kind = "card" if rules.copies == 1 else "rank"
    if rank == top:
        return f"the highest {kind}"
    if rank == 0:
        return f"the lowest {kind}"
    return f"the middle {kind}" if top == 2 else f"rank {rank + 1} of {top + 1}"


# ----- reference bot ---------------------------------------------------------------------------


class HeuristicPokerBot:
    """Plays by hand strength only: strong hands wager, medium check/call, weak check/fold.

    Strong: a pair with the public card, or the top rank before any public card.  Weak: the
    lowest rank without a pair.  It reads only the info-state key, so ``policy`` is a tabular
    policy that ``marl.games.analysis`` can evaluate exactly; it is deterministic (one-hot).
    """

    def __init__(self, rules: PokerRules, seed: int | None = None) -> None:
        self.rules = rules
        self.seed = seed

    def policy(self, key: str, legal: list[int]) -> dict[int, float]:
        cards = key.split(":")[0].split("|")
        rank = self.rules.ranks.index(cards[0])
        public = cards[1] if len(cards) > 1 else ""
        paired = self.rules.ranks[rank] in public
        strong = paired or (not public and rank == len(self.rules.ranks) - 1)
        weak = not paired and rank == 0
        prefs = [RAISE, BET, CALL] if strong else [CHECK, FOLD] if weak else [CHECK, CALL]
        return {next(a for a in prefs if a in legal): 1.0}

    def action_probs(self, env: PokerGame, agent: str) -> dict[int, float]:
        return self.policy(env.information_state(agent), env.legal_actions(agent))

    def act(self, env: PokerGame, agent: str) -> int:
        return next(iter(self.action_probs(env, agent)))
