"""Name -> game class registry, so configs and the CLI pick games by name, not import path.

Turn-based (AEC) games and the simultaneous-move (``ParallelEnv``) forms some of them also
offer live in separate tables with the same interface.

A config's game section reaches a game three ways, all resolved by :func:`factory_of` (so every
process that reads the config, a Ray worker included, builds the same game by import alone):

- ``name``: a registered game, or one an installed package declares in the entry-point group
  :data:`ENTRY_POINT_GROUP` (``[project.entry-points."marl_teams.games"] my_game =
  "pkg.module:factory"``), imported when first asked for;
- ``entry_point: "pkg.module:factory"``: any factory of a PettingZoo AEC or Parallel env;
- ``source`` (:data:`SOURCES`): a game suite of another package, e.g. TextArena, by its name.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from pettingzoo import AECEnv, ParallelEnv

from marl.config.schema import CALL_TIMEOUT_S
from marl.games import guard
from marl.games.guard import GameError

if TYPE_CHECKING:
    from marl.config import GameConfig

ENTRY_POINT_GROUP = "marl_teams.games"
# source -> the module whose make(name, **kwargs) and names() serve it
SOURCES = {"textarena": "marl.games.textarena"}
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
        raise KeyError(
            f"unknown {kind} {name!r}; known {kind}s: {', '.join(sorted(table))}"
        ) from None
    return factory(**kwargs)


def register(name: str) -> Callable[[T], T]:
    """Class decorator: ``@register("kuhn_poker")`` makes ``marl.games.make("kuhn_poker")`` work."""
    return register_in(_GAMES, "game", name)


def load_object(spec: str, timeout: float = CALL_TIMEOUT_S) -> Any:
    """``"pkg.module:attr"`` imported (within ``timeout`` seconds; a module that raises, even
    ``SystemExit``, raises :class:`~marl.games.guard.GameError`).  The working folder is
    searched last, as ``uvicorn main:app`` does, so a module next to the team file works from
    the ``marl`` command."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{spec!r} is not of the form 'pkg.module:factory'")
    if module.split(".")[0] in sys.stdlib_module_names:
        raise ValueError(
            f"{spec!r} names Python's standard library, not a game factory: name a factory "
            "of a package you installed or of a module beside the team file"
        )
    try:
        mod = guard.call(spec, "import", timeout, _import, module)
    except guard.GameError as exc:
        if isinstance(exc.__cause__, ModuleNotFoundError):
            raise exc.__cause__ from None  # "No module named ...": says it all
        raise
    obj: Any = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"module {module!r} has no {attr!r}") from None
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        raise ValueError(
            f"{spec!r} is a {type(obj).__name__}, not a game factory (a class or a function "
            "written in Python); nothing was called"
        )
    return obj


def _import(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module.split(".")[0]:
            raise
        return import_from_cwd(module, exc)


def import_from_cwd(module: str, missing: ModuleNotFoundError) -> ModuleType:
    """``module`` found in the working folder, ``sys.path`` untouched: its top-level module or
    package is loaded from there by its spec and entered in ``sys.modules``, so the package's
    submodules import through the package's own ``__path__``.  Raises ``missing`` when the
    working folder does not hold it either."""
    top = module.split(".")[0]
    spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
    if spec is None or spec.loader is None:
        raise missing
    mod = importlib.util.module_from_spec(spec)
    sys.modules[top] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[top]
        raise
    return importlib.import_module(module)


@functools.cache
def installed_plugins() -> dict[str, EntryPoint]:
    """The games installed packages declare in :data:`ENTRY_POINT_GROUP` (not yet imported)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def text_factory(factory: Callable[..., Any], name: str, **options: Any) -> Callable[..., AECEnv]:
    """``factory``, called through :mod:`marl.games.guard` (its errors name ``name``), with
    whatever it builds turned into a TextGame with the adapter's ``options``
    (``call_timeout_s``, ``turn_limit``); its signature kept, so ``marl validate`` can check
    keyword arguments against it."""
    timeout = options.get("call_timeout_s", CALL_TIMEOUT_S)

    @functools.wraps(factory)
    def build(**kwargs: Any) -> AECEnv:
        from marl.games.external import as_text_game  # external registers through this module

        return as_text_game(
            guard.call(name, "factory", timeout, factory, **kwargs), name, **options
        )

    return build


def _plugin(name: str, timeout: float = CALL_TIMEOUT_S) -> Callable[..., Any]:
    """The factory installed plugin ``name`` declares, imported."""
    return guard.call(name, "import", timeout, installed_plugins()[name].load)


def _load_plugin(name: str) -> None:
    if name not in _GAMES and name in installed_plugins():
        _GAMES[name] = text_factory(_plugin(name), name)


def names() -> list[str]:
    """The registered games and the installed packages' plugin games."""
    return sorted(set(_GAMES) | set(installed_plugins()))


def check_name(name: str, *, tasks: bool = False) -> str | None:
    """What is wrong with ``name`` as a game, or None: it is registered (or, with ``tasks``,
    a cooperative task of :mod:`marl.games.tasks`, which a team answers in free text).  The one
    name check behind config validation, the trainer and tournaments."""
    from marl.games.tasks import task_names  # games.tasks builds its table from this module

    known = names()
    if name in known or (tasks and name in task_names()):
        return None
    if name in task_names():
        return f"{name!r} is a cooperative task, not a game; known games: {', '.join(known)}"
    return f"unknown game {name!r}; known: {', '.join(known)}"


def parameters(factory: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], bool]:
    """The keyword parameters ``factory`` takes, following ``**kwargs`` up a class's bases (a
    game passes them on to :class:`~marl.games.base.TextGame`), and whether anything else goes."""
    owners = (
        [c for c in inspect.getmro(factory) if "__init__" in vars(c)]
        if isinstance(factory, type)
        else [factory]
    )
    found: dict[str, inspect.Parameter] = {}
    for owner in owners:
        params = inspect.signature(owner).parameters.values()
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                found.setdefault(p.name, p)
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return found, False
    return found, True


def accepted_kwargs(factory: Callable[..., Any]) -> set[str] | None:
    """The keyword arguments ``factory`` takes; None when anything goes."""
    found, open_ended = parameters(factory)
    return None if open_ended else set(found)


def check_kwargs(
    name: str, kwargs: Mapping[str, Any], factory: Callable[..., Any] | None = None
) -> str | None:
    """What is wrong with ``kwargs`` for game ``name`` (built by ``factory``, by default the
    registered one) by its signature, or None: the check behind ``marl validate``, so an
    unknown argument fails there and not at run time."""
    _load_plugin(name)
    allowed = accepted_kwargs(_GAMES[name] if factory is None else factory)
    if allowed is None:
        return None
    for key in kwargs:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = (
                f"did you mean {close[0]!r}?"
                if close
                else f"it takes: {', '.join(sorted(allowed)) or 'none'}"
            )
            return f"game {name!r} takes no argument {key!r}; {hint}"
    return None


def make(name: str, **kwargs) -> AECEnv:
    """Build a registered game; an unknown name lists the known ones."""
    _load_plugin(name)
    return make_from(_GAMES, "game", name, kwargs)


def factory_of(game: GameConfig) -> Callable[..., AECEnv]:
    """The factory a config's game section names; ``make_from_config`` calls it with the
    section's ``kwargs``.  Raises ImportError/AttributeError/ValueError for an entry point or
    source that does not import, :class:`~marl.games.guard.GameError` for one that fails while
    it imports, KeyError for an unknown name."""
    options = {"call_timeout_s": game.call_timeout_s, "turn_limit": game.max_turns}
    if game.entry_point is not None:
        return text_factory(
            load_object(game.entry_point, game.call_timeout_s), game.name, **options
        )
    if game.source != "registry":
        make = importlib.import_module(SOURCES[game.source]).make
        return functools.partial(make, game.name, **options)
    if game.name in installed_plugins():
        return text_factory(_plugin(game.name, game.call_timeout_s), game.name, **options)
    if game.name not in _GAMES:
        raise KeyError(check_name(game.name))
    return _GAMES[game.name]


def make_from_config(game: GameConfig) -> AECEnv:
    """The game of a config's game section: the one way trainer, workers, tournaments and
    ``marl play`` build games, so a plugin game needs no registration in any process."""
    return factory_of(game)(**game.kwargs)


def check_config(game: GameConfig, *, tasks: bool = False) -> tuple[str, str] | None:
    """What is wrong with a game section before anything is built, or None, as (field,
    message): the name (a cooperative task is fine with ``tasks``), the entry point or source
    imports, the kwargs fit the factory's signature."""
    if game.entry_point is None and game.source == "registry":
        problem = check_name(game.name, tasks=tasks)
        if problem is not None:
            return "name", problem
        if game.name not in names():
            return None  # a task: games.tasks checks its own arguments
    field = "entry_point" if game.entry_point is not None else "source"
    try:
        if game.source != "registry":
            problem = importlib.import_module(SOURCES[game.source]).check_name(game.name)
            if problem is not None:
                return "name", problem
        factory = factory_of(game)
    except GameError as exc:
        return field, str(exc)
    except (ImportError, AttributeError, ValueError) as exc:
        return field, f"{game.entry_point or game.source} does not import: {exc}"
    problem = check_kwargs(game.name, game.kwargs, factory)
    return None if problem is None else ("kwargs", problem)


def register_parallel(name: str) -> Callable[[T], T]:
    """``@register_parallel("rps")``: the simultaneous-move (``ParallelEnv``) form of a game."""
    return register_in(_PARALLEL, "parallel game", name)


def parallel_names() -> list[str]:
    return sorted(_PARALLEL)


def make_parallel(name: str, **kwargs) -> ParallelEnv:
    """Build a registered parallel form; an unknown name lists the known ones."""
    return make_from(_PARALLEL, "parallel game", name, kwargs)
