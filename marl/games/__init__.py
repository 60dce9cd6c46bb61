"""PettingZoo text games for self-play and cooperation.  Knows nothing of LLMs or training.

``marl.games.make_from_config(game_section)`` builds the game a config names (registered, a plugin
by entry point, or TextArena's) and ``marl.games.check_config`` says what is wrong with it;
``marl.games.make(name, **kwargs)`` builds a registered game; ``marl.games.names()`` lists them and
``marl.games.check_name(name)`` / ``marl.games.check_kwargs(name, kwargs)`` say what is wrong with a
name or its arguments.  ``least_exploitable_mixture`` and ``mixture_exploitability``
treat a list of table policies as one population.
"""

from marl.games.base import InvalidAction, TextGame
from marl.games.population import least_exploitable_mixture, mixture_exploitability, mixture_policy
from marl.games.registry import (
    check_config,
    check_kwargs,
    check_name,
    make,
    make_from_config,
    make_parallel,
    names,
    parallel_names,
    register,
)

# Importing a game module registers it (one file per game).
# --- registered game modules (one import per line) ---
# isort: split
import marl.games.connect_four  # noqa: F401
import marl.games.kuhn_poker  # noqa: F401
import marl.games.leduc_poker  # noqa: F401
import marl.games.negotiation  # noqa: F401
import marl.games.nim  # noqa: F401
import marl.games.plan_execute  # noqa: F401
import marl.games.referential  # noqa: F401
import marl.games.rps  # noqa: F401
import marl.games.split_arithmetic  # noqa: F401
import marl.games.tictactoe  # noqa: F401
import marl.games.tiny_hanabi  # noqa: F401

# --- end of registered game modules ---

__all__ = [
    "InvalidAction",
    "TextGame",
    "check_config",
    "check_kwargs",
    "check_name",
    "least_exploitable_mixture",
    "make",
    "make_from_config",
    "make_parallel",
    "mixture_exploitability",
    "mixture_policy",
    "names",
    "parallel_names",
    "register",
]
