"""Non-model policies: the game layer's reference bots, and a person at the terminal."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.prompt import Prompt

from agents.policy import Request, Response, register_backend
from games.bots import make_bot


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


class HumanPolicy:
    """Asks a person for each move; any text the game can parse is accepted."""

    def __init__(self, ask: Callable[[str], str] | None = None) -> None:
        self.console = Console()
        self.ask = ask or (lambda prompt: Prompt.ask(prompt, console=self.console))

    def act(self, requests: list[Request]) -> list[Response]:
        out = []
        for r in requests:
            self.console.rule(f"your turn ({r.agent})")
            self.console.print(r.messages[-1]["content"], markup=False)
            out.append(Response(text=self.ask("your move")))
        return out


@register_backend("scripted")
def scripted_policy(game: str, bot: str = "random", seed: int | None = None) -> ScriptedPolicy:
    return ScriptedPolicy(game, bot, seed)


@register_backend("human")
def human_policy() -> HumanPolicy:
    return HumanPolicy()
