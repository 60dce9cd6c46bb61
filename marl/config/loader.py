"""Load and validate config YAML files (teams, tournaments), reporting every problem as
``FILE:LINE:COL: path: message``, all in one pass: the fields that fail are reported and
dropped (their defaults standing in) so that the rules spanning sections and the checks that
need the game still run on the rest.

The YAML is parsed with :class:`MarkedLoader`, a ``yaml.SafeLoader`` that remembers where every
mapping key and value starts, so a pydantic error at ``roles.1.decoding.temperature`` can be
reported at the line the user has to edit.  ``${VAR}`` / ``${VAR:-default}`` references in string
values are expanded before validation: that is the only way secrets should enter a config.
"""

from __future__ import annotations

import datetime
import difflib
import os
import re
import types
import typing
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from yaml.composer import ComposerError
from yaml.error import Mark, MarkedYAMLError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.reader import ReaderError

from marl.config.schema import (
    CROSS_CHECK_ERROR,
    DEFER_RULES,
    SCHEMA_ID,
    PathProblem,
    TeamConfig,
    dotted,
)
from marl.config.tournament import TOURNAMENT_SCHEMA_ID, TournamentConfig

M = TypeVar("M", bound=BaseModel)
YamlPath = tuple[Any, ...]
#: An extra check run on a validated config, e.g. "is the game registered?".
Check = Callable[[Any], Sequence[PathProblem]]

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
# "$${" escapes a literal "${"; "${...}" is a reference; a lone "${" is unterminated.
_ENV_REF = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_ENV_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)
#: YAML 1.2 floats that YAML 1.1 reads as strings: ``1e-4``, ``2E6`` (no dot).
_EXP_FLOAT = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")
#: Nesting deeper than this is refused (a config needs about six levels).
MAX_DEPTH = 64
#: The most values a file may hold once its aliases are expanded (a few hundred is usual), so
#: an alias bomb is refused at the alias that crosses it instead of eating all memory.
MAX_VALUES = 20_000


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config file, located for editors and humans."""

    file: str
    line: int
    col: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ConfigError(Exception):
    """A config that failed to load; ``problems`` holds every problem, not just the first."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class MarkedLoader(yaml.SafeLoader):
    """A SafeLoader that records the start mark of every mapping key and value by path.

    ``key_marks[path]`` is where the key of ``path`` starts, ``value_marks[path]`` where its
    value starts (``value_marks[()]`` is the document).  Interpolation and duplicate-key
    problems are collected in ``problems`` instead of aborting, so all are reported together.
    Nesting beyond :data:`MAX_DEPTH` and expansion beyond :data:`MAX_VALUES` are syntax errors
    at the node or alias that crosses them.
    """

    def __init__(self, stream: str, env: Mapping[str, str] | None = None) -> None:
        super().__init__(stream)
        self.env: Mapping[str, str] = os.environ if env is None else env
        self.key_marks: dict[YamlPath, Mark] = {}
        self.value_marks: dict[YamlPath, Mark] = {}
        self.problems: list[tuple[YamlPath, Mark, str]] = []
        self._active: set[int] = set()
        self._depth = 0
        self._values = 0
        self._sizes: dict[int, int] = {}  # id(node) -> values in it, aliases expanded

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        mark = self.peek_event().start_mark
        if self.check_event(AliasEvent):
            node = super().compose_node(parent, index)
            self._count(self._sizes.get(id(node), 1), mark, "aliases expand the file to")
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise ComposerError(None, None, f"nesting deeper than {MAX_DEPTH} levels", mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        self._sizes[id(node)] = 1 + sum(self._sizes.get(id(c), 1) for c in children)
        self._count(1, mark, "the file holds")
        return node

    def _count(self, values: int, mark: Mark, what: str) -> None:
        self._values += values
        if self._values > MAX_VALUES:
            raise ComposerError(
                None,
                None,
                f"{what} more than {MAX_VALUES} values; write "
                "the repeated parts out or use fewer aliases",
                mark,
            )

    def load_marked(self) -> tuple[bool, Any]:
        """Parse the single document; returns (is_empty, data)."""
        try:
            node = self.get_single_node()
            if node is None:
                return True, None
            return False, self._build(node, ())
        finally:
            self.dispose()

    def _build(self, node: Node, path: YamlPath) -> Any:
        self.value_marks[path] = node.start_mark
        if id(node) in self._active:
            raise yaml.constructor.ConstructorError(
                None, None, "recursive alias is not supported in a config", node.start_mark
            )
        if isinstance(node, MappingNode) and node.tag == _MAP_TAG:
            self._active.add(id(node))
            try:
                return self._build_mapping(node, path)
            finally:
                self._active.discard(id(node))
        if isinstance(node, SequenceNode) and node.tag == _SEQ_TAG:
            self._active.add(id(node))
            try:
                return [self._build(item, (*path, i)) for i, item in enumerate(node.value)]
            finally:
                self._active.discard(id(node))
        value = self._construct(node)
        if isinstance(node, ScalarNode) and isinstance(value, str):
            value = self._interpolate(value, node.start_mark, path)
        return value

    def _construct(self, node: Node) -> Any:
        try:
            return self.construct_object(node, deep=True)
        except ValueError as exc:  # e.g. the date 2024-02-30, or an int of 5000 digits
            raise yaml.constructor.ConstructorError(None, None, str(exc), node.start_mark) from None

    def _build_mapping(self, node: MappingNode, path: YamlPath) -> dict[Any, Any]:
        seen: dict[Any, Mark] = {}
        for knode, _ in node.value:
            if knode.tag == _MERGE_TAG:
                continue
            key = self._construct(knode)
            if isinstance(key, Hashable) and key in seen:
                line = seen[key].line + 1
                self.problems.append(
                    (
                        (*path, key),
                        knode.start_mark,
                        f"duplicate key {key!r} (first at line {line})",
                    )
                )
            elif isinstance(key, Hashable):
                seen[key] = knode.start_mark
        self.flatten_mapping(node)  # resolves "<<" merge keys; explicit keys come last and win
        out: dict[Any, Any] = {}
        for knode, vnode in node.value:
            key = self._construct(knode)
            if not isinstance(key, Hashable):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    "found an unhashable key",
                    knode.start_mark,
                )
            self.key_marks[(*path, key)] = knode.start_mark
            out[key] = self._build(vnode, (*path, key))
        return out

    def _interpolate(self, text: str, mark: Mark, path: YamlPath) -> str:
        def sub(m: re.Match[str]) -> str:
            whole = m.group(0)
            if whole == "$${":
                return "${"
            if m.group(1) is None:
                self.problems.append(
                    (path, mark, "unterminated '${' (write '$${' for a literal '${')")
                )
                return whole
            body = _ENV_BODY.fullmatch(m.group(1))
            if body is None:
                self.problems.append(
                    (
                        path,
                        mark,
                        f"malformed reference {whole!r}; use ${{NAME}} or ${{NAME:-default}}",
                    )
                )
                return whole
            name, default = body.group(1), body.group(2)
            value = self.env.get(name)
            if default is not None:
                return value if value else default
            if value is None:
                self.problems.append((path, mark, f"environment variable {name} is not set"))
                return whole
            return value

        return _ENV_REF.sub(sub, text) if "${" in text else text


MarkedLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXP_FLOAT, list("-+0123456789."))


def _unwrap(ann: Any) -> Any:
    """Strip ``Optional``/``Annotated`` so the traversal sees the model or container inside."""
    while True:
        origin = typing.get_origin(ann)
        if origin is typing.Annotated:
            ann = typing.get_args(ann)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(ann) if a is not type(None)]
            if len(args) != 1:
                return ann
            ann = args[0]
        else:
            return ann


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    return {(f.alias or n): f for n, f in model.model_fields.items()}


def _model_at(root: type[BaseModel], path: YamlPath) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``path`` (for "did you mean" hints)."""
    ann: Any = root
    for part in path:
        ann = _unwrap(ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            field = _fields(ann).get(part)
            if field is None:
                return None
            ann = field.annotation
            continue
        origin, args = typing.get_origin(ann), typing.get_args(ann)
        if origin in (list, set, frozenset) and args:
            ann = args[0]
        elif origin is tuple and args:
            ann = args[0] if args[-1] is Ellipsis else args[min(int(part), len(args) - 1)]
        elif origin is dict and len(args) == 2:
            ann = args[1]
        else:
            return None
    ann = _unwrap(ann)
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _unknown_key_message(model: type[BaseModel], path: YamlPath) -> str:
    key = path[-1]
    parent = _model_at(model, path[:-1])
    names = list(_fields(parent)) if parent is not None else []
    close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
    if close:
        return f"unknown key {key!r}; did you mean {close[0]!r}?"
    if names:
        return f"unknown key {key!r}; allowed keys: {', '.join(names)}"
    return f"unknown key {key!r}"


def _schema_id(model: type[BaseModel]) -> str:
    """The ``schema:`` tag a root model requires (its ``Literal``), for messages."""
    field = _fields(model).get("schema")
    args = typing.get_args(field.annotation) if field is not None else ()
    return str(args[0]) if args else "marl-teams/v1"


def _pydantic_message(err: Mapping[str, Any], model: type[BaseModel]) -> str:
    kind, loc = err["type"], err["loc"]
    if kind == "missing":
        name = loc[-1] if loc else "?"
        if loc == ("schema",):
            return f"missing required field 'schema' (add 'schema: {_schema_id(model)}')"
        if isinstance(name, int):
            return f"missing item {name} (too few items)"
        return f"missing required field {name!r}"
    if kind == "value_error" and "error" in err.get("ctx", {}):
        return str(err["ctx"]["error"])
    msg = str(err["msg"])
    msg = msg[:1].lower() + msg[1:]
    value = err.get("input")
    if value is None or isinstance(value, str | int | float | bool):
        msg += f", got {value!r}"
    elif isinstance(value, datetime.date):  # YAML reads 2024-01-01 as a date, not a string
        msg += f", got the date {value} (quote it to make it a string)"
    return msg


class _Locator:
    """Turns a model path into a file position using the marks the loader recorded."""

    def __init__(self, file: str, loader: MarkedLoader | None) -> None:
        self.file = file
        self.keys = loader.key_marks if loader else {}
        self.values = loader.value_marks if loader else {}

    def problem(self, path: YamlPath, message: str, *, at_key: bool = False) -> Problem:
        mark = self.keys.get(path) if at_key else None
        p = path
        while mark is None:
            mark = self.values.get(p)
            if not p:
                break
            p = p[:-1]
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        return Problem(self.file, line, col, dotted(path), message)


def _validation_problems(errors: list[Any], model: type[BaseModel], at: _Locator) -> list[Problem]:
    out: list[Problem] = []
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == CROSS_CHECK_ERROR:
            for rel, msg in err["ctx"]["problems"]:
                out.append(at.problem((*loc, *rel), msg))
        elif err["type"] == "extra_forbidden":
            out.append(at.problem(loc, _unknown_key_message(model, loc), at_key=True))
        else:
            out.append(at.problem(loc, _pydantic_message(err, model)))
    return out


def _drop(data: Any, loc: YamlPath) -> YamlPath | None:
    """Remove the mapping key that holds the value at ``loc`` (the deepest one the data has),
    so the field's default stands in: the path removed, None where that would shift a list."""
    node, keys = data, []
    for part in loc:
        if (
            isinstance(node, dict)
            and part in node
            or isinstance(node, list)
            and (isinstance(part, int) and 0 <= part < len(node))
        ):
            keys.append(part)
            node = node[part]
        else:
            break
    parent = data
    for part in keys[:-1]:
        parent = parent[part]
    if not keys or not isinstance(parent, dict):
        return None
    del parent[keys[-1]]
    return tuple(keys)


def _overlaps(path: str, dropped: Sequence[str]) -> bool:
    """Whether ``path`` (dotted) is, holds or lies inside one of the ``dropped`` paths."""
    return any(path == d or path.startswith(f"{d}.") or d.startswith(f"{path}.") for d in dropped)


def _salvaged(
    data: dict[Any, Any], model: type[M], at: _Locator, dropped: list[str]
) -> tuple[M | None, list[Problem]]:
    """Validate ``data`` with the root's rules deferred: its field errors (those at a
    ``dropped`` path left out), and the config with every failed field dropped (its default
    standing in) where that validates, so the rules and checks still run on the rest."""
    context = {DEFER_RULES: True}
    try:
        return model.model_validate(data, context=context), []
    except ValidationError as exc:
        errors = exc.errors()
    problems = [
        p for p in _validation_problems(errors, model, at) if not _overlaps(p.path, dropped)
    ]
    removed = [_drop(data, tuple(e["loc"])) for e in errors]
    dropped += [dotted(tuple(e["loc"])) for e in errors]
    dropped += [dotted(path) for path in removed if path is not None]
    if None in removed:
        return None, problems
    try:
        return model.model_validate(data, context=context), problems
    except ValidationError:
        return None, problems  # what is left is no config: no rule or check can run


def _later_problems(
    cfg: BaseModel, checks: Sequence[Check], at: _Locator, dropped: list[str], earlier: bool
) -> list[Problem]:
    """The root's rules that span sections, then ``checks`` (those needing the game), except
    at ``dropped`` paths, and a check's at a section a rule already faults (the builder would
    say the same again).  A check that fails on a config with ``earlier`` problems (built from
    what was left of it) adds nothing: those problems are the ones to mend."""
    rules = [at.problem(tuple(p), msg) for p, msg in getattr(cfg, "cross_check", list)()]
    rules = [p for p in rules if not _overlaps(p.path, dropped)]
    found: list[Problem] = []
    for check in checks:
        try:
            found += [at.problem(tuple(p), msg) for p, msg in check(cfg)]
        except Exception:
            if not (earlier or rules):
                raise
    faulted = dropped + [p.path for p in rules]
    return rules + [p for p in found if not _overlaps(p.path, faulted)]


def _reader_problem(exc: ReaderError, text: str, file: str) -> Problem:
    """A character YAML does not allow (NUL, most control characters), at its position."""
    pos = exc.position
    line = text.count("\n", 0, pos) + 1
    col = pos - text.rfind("\n", 0, pos)
    char = exc.character if isinstance(exc.character, int) else ord(exc.character)
    return Problem(
        file,
        line,
        col,
        "",
        f"YAML syntax error: character U+{char:04X} is not "
        "allowed in YAML (no NUL or control characters, not "
        "even in comments or quotes)",
    )


def _check_text(
    text: str,
    file: str,
    model: type[M] | None,
    checks: Sequence[Check],
    env: Mapping[str, str] | None,
) -> tuple[M | None, list[Problem]]:
    """Parse, validate (against ``model``, or the root the ``schema:`` tag names) and run
    ``checks``: the config, or every problem found."""
    try:
        loader = MarkedLoader(text, env=env)
        empty, data = loader.load_marked()
    except ReaderError as exc:
        return None, [_reader_problem(exc, text, file)]
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        what = " ".join(s for s in (exc.context, exc.problem) if s) or "invalid YAML"
        return None, [Problem(file, line, col, "", f"YAML syntax error: {what}")]
    except yaml.YAMLError as exc:
        return None, [Problem(file, 1, 1, "", f"YAML error: {exc}".replace("\n", " "))]
    at = _Locator(file, loader)
    if model is None:
        model = root_model(data)
    if empty:
        kind = getattr(model, "file_kind", "team")  # TeamConfig and the roots extending it
        return None, [
            Problem(
                file,
                1,
                1,
                "",
                f"the file is empty; a {kind} file is a mapping "
                f"that starts with 'schema: {_schema_id(model)}'",
            )
        ]
    if not isinstance(data, dict):
        got = "a list" if isinstance(data, list) else f"a {type(data).__name__}"
        return None, [at.problem((), f"the top level must be a mapping of keys, got {got}")]
    problems = [
        Problem(file, m.line + 1, m.column + 1, dotted(p), msg) for p, m, msg in loader.problems
    ]
    dropped = [dotted(p) for p, _, _ in loader.problems]  # "${UNSET}" is validated no further
    for p, _, _ in loader.problems:
        if (path := _drop(data, p)) is not None:
            dropped.append(dotted(path))
    cfg, found = _salvaged(data, model, at, dropped)
    problems += found
    if cfg is not None:
        problems += _later_problems(cfg, checks, at, dropped, bool(problems))
    if problems:
        return None, sorted(problems, key=lambda p: (p.line, p.col))
    return cfg, []


def _read(path: str | os.PathLike[str]) -> tuple[str | None, list[Problem]]:
    file = os.fspath(path)
    try:
        return Path(file).read_text(encoding="utf-8-sig"), []
    except FileNotFoundError:
        return None, [Problem(file, 1, 1, "", "no such file")]
    except IsADirectoryError:
        return None, [Problem(file, 1, 1, "", "is a directory, not a YAML file")]
    except UnicodeDecodeError as exc:
        return None, [Problem(file, 1, 1, "", f"not UTF-8 text (bad byte at offset {exc.start})")]
    except OSError as exc:
        return None, [Problem(file, 1, 1, "", f"cannot read: {exc.strerror or exc}")]


#: The root model of each ``schema:`` tag, so one ``marl validate`` checks every kind of file.
ROOTS: dict[str, type[BaseModel]] = {SCHEMA_ID: TeamConfig, TOURNAMENT_SCHEMA_ID: TournamentConfig}


def root_model(data: Any) -> type[BaseModel]:
    """The model the parsed file's ``schema:`` tag names; TeamConfig for anything else, whose
    errors then say what a team file needs."""
    tag = data.get("schema") if isinstance(data, dict) else None
    return ROOTS.get(tag, TeamConfig) if isinstance(tag, str) else TeamConfig


def validate_file(
    path: str | os.PathLike[str],
    model: type[BaseModel] | None = None,
    checks: Sequence[Check] = (),
    *,
    env: Mapping[str, str] | None = None,
) -> list[Problem]:
    """Every problem in the file (empty list: valid).  Never raises for a bad file.

    ``model`` defaults to the root model the file's ``schema:`` tag names (:data:`ROOTS`).
    """
    text, problems = _read(path)
    if text is None:
        return problems
    return _check_text(text, os.fspath(path), model, checks, env)[1]


def load_config(
    path: str | os.PathLike[str],
    model: type[M] = TeamConfig,  # type: ignore[assignment]
    checks: Sequence[Check] = (),
    *,
    env: Mapping[str, str] | None = None,
) -> M:
    """Load a validated config; raises :class:`ConfigError` listing every problem.

    ``model`` lets a caller validate against an extended root (a subclass of TeamConfig);
    ``checks`` are extra rules returning ``(path, message)`` problems; ``env`` replaces
    ``os.environ`` for ``${VAR}`` references.
    """
    text, problems = _read(path)
    if text is None:
        raise ConfigError(problems)
    cfg, problems = _check_text(text, os.fspath(path), model, checks, env)
    if cfg is None:
        raise ConfigError(problems)
    return cfg


def load_config_text(
    text: str,
    model: type[M] = TeamConfig,  # type: ignore[assignment]
    checks: Sequence[Check] = (),
    *,
    source: str = "<string>",
    env: Mapping[str, str] | None = None,
) -> M:
    """Like :func:`load_config` for YAML already in memory (tests, notebooks, the web)."""
    cfg, problems = _check_text(text, source, model, checks, env)
    if cfg is None:
        raise ConfigError(problems)
    return cfg
