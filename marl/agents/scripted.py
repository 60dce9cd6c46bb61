"""Non-model policies: the game layer's reference bots, and a person at the terminal."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.prompt import Prompt

from marl.agents.policy import Request, Response, register_backend
from marl.games.bots import make_bot


class ScriptedPolicy:
    """Wraps a game bot (``random``, ``heuristic``, ``optimal``) as a policy."""

    def __init__(self, game: str, bot: str = "random", seed: int | None = None) -> None:
        self.game, self.name = game, bot
        self.bot = make_bot(game, bot, seed=seed)

    def reseed(self, seed: int) -> None:
        self.bot = make_bot(self.game, self.name, seed=seed)

    def act(self, requests: list[Request]) -> list[Response]:
        out = []
        for r in requests:
            action = self.bot.act(r.env, r.agent)
            i = r.legal.index(action)
            out.append(Response(text=r.action_texts[i], choice=i))
        return out


class HumanQuit(Exception):  # noqa: N818 - a stop, not a fault
    """The person stopped playing (end of input, ``quit`` or Ctrl-C)."""


def _numbered(texts: list[str]) -> bool:
    """Moves are offered by number unless their names are numbers themselves (board cells)."""
    return not any(t.strip("[]").isdigit() for t in texts)


class HumanPolicy:
    """Asks a person for each move: shows the position and the legal moves, takes a move's
    number or any text the game parses, and asks again until the move is legal (a typo does
    not forfeit the game).  A request without moves (a free-text team task) takes any
    answer."""

    def __init__(
        self, ask: Callable[[str], str] | None = None, console: Console | None = None
    ) -> None:
        self.console = console or Console()
        self.ask = ask or self._prompt

    def _prompt(self, prompt: str) -> str:
        try:
            return Prompt.ask(prompt, console=self.console)
        except (EOFError, KeyboardInterrupt):
            raise HumanQuit from None

    def act(self, requests: list[Request]) -> list[Response]:
        out = []
        for r in requests:
            self.console.rule(f"your turn ({r.agent})")
            self.console.print(r.messages[-1]["content"], markup=False)
            if not r.action_texts:  # a free-text request (a team task): any answer goes
                out.append(Response(text=self._answer()))
                continue
            numbered = _numbered(r.action_texts)
            moves = (
                (f"{i}: {t}" for i, t in enumerate(r.action_texts, 1))
                if numbered
                else iter(r.action_texts)
            )
            self.console.print("your moves  " + "  ".join(moves), markup=False)
            out.append(self._move(r, numbered))
        return out

    def _answer(self) -> str:
        text = self.ask("your answer (quit to stop)").strip()
        if text.lower() in ("quit", "exit"):
            raise HumanQuit
        return text

    def _move(self, r: Request, numbered: bool) -> Response:
        while True:
            text = self.ask("your move (quit to stop)").strip()
            if text.lower() in ("quit", "exit"):
                raise HumanQuit
            i = self._legal_index(r, text, numbered)
            if i is not None:
                return Response(text=r.action_texts[i], choice=i)
            self.console.print(
                f"{text!r} is not one of your moves: {' '.join(r.action_texts)}; try again.",
                markup=False,
            )

    @staticmethod
    def _legal_index(r: Request, text: str, numbered: bool) -> int | None:
        """The index into ``r.legal`` that ``text`` names: the game's reading of it, else
        (where moves are numbered) its number."""
        action = r.env.parse_action(r.agent, text)
        if action in r.legal:
            return r.legal.index(action)
        if numbered and text.isdecimal() and 1 <= int(text) <= len(r.legal):  # not "²"
            return int(text) - 1
        return None


@register_backend("scripted")
def scripted_policy(game: str, bot: str = "random", seed: int | None = None) -> ScriptedPolicy:
    return ScriptedPolicy(game, bot, seed)


@register_backend("human")
def human_policy() -> HumanPolicy:
    return HumanPolicy()
