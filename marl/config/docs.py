"""``docs/configuration.md`` written from the schema: every setting of a team file by its
dotted path, with its type, its default and its description, so the reference cannot drift
from the models.  ``marl schema --markdown [--out FILE]`` prints or writes it; a test keeps
the committed copy current."""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterator
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from marl.config.schema import TeamConfig

HEADER = """\
# Configuration reference

Every setting of a team file (`schema: marl-teams/v1`), by its dotted path: its type, its
default, and what it does.  Generated from the schema (`marl/config/`) by
`python -m marl schema --markdown --out docs/configuration.md`; do not edit by hand.
`marl validate FILE` checks a file against these rules and reports each problem as
`FILE:LINE:COL: path: message`; `docs/schema.json` is the same schema for editors.
"""


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The config models an annotation holds (``X``, ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models(arg)]


def type_name(annotation: Any) -> str:
    """A field's type as a reader writes it: ``int``, ``"a" | "b"``, ``list[str] | None``."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(map(type_name, args))}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def default_text(field: FieldInfo) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its defaults"
    if value is None:
        return "None"
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _intro(model: type[BaseModel]) -> str:
    """The first paragraph of the model's own docstring (not its base's)."""
    doc = inspect.cleandoc(vars(model).get("__doc__") or "")
    return " ".join(doc.split("\n\n")[0].split())


def sections(
    model: type[BaseModel], path: str = ""
) -> Iterator[tuple[str, type[BaseModel], list[tuple[str, str, str, str]]]]:
    """(section path, model, rows of (setting, type, default, description)), depth first."""
    rows, nested = [], []
    for name, field in model.model_fields.items():
        key = field.alias or name
        dotted = f"{path}.{key}" if path else key
        inner = _models(field.annotation)
        is_list = get_origin(field.annotation) is list
        sub = f"{dotted}[]" if is_list else dotted
        kind = type_name(field.annotation)
        text = field.description or ""
        if inner:
            link = f"[{sub}](#{_anchor(sub)})"
            kind = f"list of {link}" if is_list else kind.replace("section", link)
            nested += [(sub, m) for m in inner]
            text = text or _intro(inner[0]).split(". ")[0].removesuffix(".") + "."
        rows.append((dotted, kind, default_text(field), text))
    yield path, model, rows
    for sub, m in nested:
        yield from sections(m, sub)


def _anchor(path: str) -> str:
    """GitHub's heading anchor of ``## `path```."""
    return "".join(c for c in path.lower() if c.isalnum() or c in "-_")


def markdown(model: type[BaseModel] = TeamConfig) -> str:
    """The whole reference page."""
    out = [HEADER]
    for path, sub, rows in sections(model):
        out += ["", f"## `{path}`" if path else "## Top level", ""]
        if _intro(sub):
            out += [_intro(sub), ""]
        out += ["| Setting | Type | Default | Description |", "|---|---|---|---|"]
        out += [
            f"| `{key}` | {_cell(kind) if '](' in kind else f'`{_cell(kind)}`'} "
            f"| {_cell(default)} | {_cell(text)} |"
            for key, kind, default, text in rows
        ]
    return "\n".join(out) + "\n"
