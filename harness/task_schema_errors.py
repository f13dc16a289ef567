"""A manifest that does not fit the schema (a pydantic ``ValidationError``), reworded as one
:class:`TaskError` naming the TOML field, the keys allowed there and the nearest one to a typo."""

from __future__ import annotations

import difflib
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from harness.csig import is_identifier
from harness.task_model import WHOLE_FILE, TaskError


_PLAIN_MESSAGES = {
    "missing": "missing required key",
    "model_type": "must be a table",
    "dict_type": "must be a table",
    "list_type": "must be an array",
    "tuple_type": "must be an array",
}


def schema_error(file: Path, err: ValidationError, schema: type[BaseModel]) -> TaskError:
    """The first of ``err``'s problems, validating ``file`` against ``schema``, in plain words."""
    first = err.errors(include_url=False)[0]
    kind, value = first["type"], first.get("input")
    message = _PLAIN_MESSAGES.get(kind) or first["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        message = _unknown_key_message(schema, first["loc"])
    if kind not in ("missing", "extra_forbidden", "value_error"):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        message += f" (got {type(value).__name__} {shown})"
    return TaskError(file, field_path(first["loc"]) or WHOLE_FILE, message)


def _unknown_key_message(schema: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    allowed = _keys_at(schema, loc[:-1])
    if not allowed:
        return "unknown key"
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key (allowed here: {', '.join(allowed)}){hint}"


def _keys_at(schema: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys ``schema`` accepts in the table at ``loc``."""
    node: Any = schema
    for part in loc:
        node = _unwrap(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            node = field.annotation if field else None
        elif get_origin(node) in (list, tuple, dict):
            args = [a for a in get_args(node) if a is not Ellipsis]
            node = args[-1] if args else None
        else:
            return []
    node = _unwrap(node)
    return list(node.model_fields) if isinstance(node, type) and issubclass(node, BaseModel) else []


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated[...] and the None of X | None."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
        elif get_origin(annotation) in (Union, UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def field_path(loc: tuple[int | str, ...]) -> str:
    """("params", 2, "shape", 0) -> "params[2].shape[0]"."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            key = part if is_identifier(part) else f'"{part}"'
            path += f".{key}" if path else key
    return path
