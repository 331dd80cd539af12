"""How a value travels between tasks: its kind (text, bool, int, float, JSON), read off a field's annotation.

The bottom of the authoring layer: config.py reads it to type `--set` values, pipeline.py to check each wire.
"""

from __future__ import annotations

import typing
from pathlib import Path
from types import UnionType
from typing import Any, Literal

from pydantic import BaseModel

Kind = Literal["text", "bool", "int", "float", "json", "any"]


def kind_of(annotation: Any) -> Kind:
    """How a field's value travels: text, bool, int, float or JSON (containers and models)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return kind_of(typing.get_args(annotation)[0])
    if origin in (typing.Union, UnionType):
        kinds = {kind_of(a) for a in typing.get_args(annotation) if a is not type(None)}
        return kinds.pop() if len(kinds) == 1 else "any"
    if origin is Literal:  # the kind its values share: `Literal[8, 16]` takes `--set ...=16` as a number
        kinds = {kind_of(type(v)) for v in typing.get_args(annotation)}
        return kinds.pop() if len(kinds) == 1 else "any"
    if origin in (list, tuple, dict, set, frozenset):
        return "json"
    if annotation is bool:
        return "bool"
    if annotation is int:
        return "int"
    if annotation is float:
        return "float"
    if isinstance(annotation, type) and issubclass(annotation, (str, Path)):
        return "text"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "json"
    return "any"


def accepts(target: Kind, source: Kind) -> bool:
    """Whether a value of kind `source` may fill a field of kind `target` (an int fills a float field)."""
    return "any" in (target, source) or target == source or (target == "float" and source == "int")
