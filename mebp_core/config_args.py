"""Command-line options derived from a config model's fields, so a field added to the model
appears in ``--help`` with its description, type, choices and default, with no other edit.

Each field ``some_name`` becomes ``--some-name``. The option's parser follows the field's
type: a ``Literal`` is a choice; a bool (or ``bool | Literal["auto"]``) is ``--x/--no-x``;
``int | Literal[...]`` takes a number or one of the words; a field named ``*_bytes`` takes a
size (``64K``, ``300M``); a tuple takes ``a,b,c``; numbers are numbers. Values are checked by
the model itself (its bounds and validators), so the messages are the model's.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo


def add_model_arguments(group, model: type[BaseModel], *, exclude: tuple[str, ...] = (),
                        include: tuple[str, ...] | None = None) -> None:
    for name, field in model.model_fields.items():
        if name not in exclude and (include is None or name in include):
            group.add_argument("--" + name.replace("_", "-"), dest=name,
                               help=field.description, **_argument_for(name, field))


def model_values(args: argparse.Namespace, model: type[BaseModel], *,
                 exclude: tuple[str, ...] = (),
                 include: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The parsed values of ``model``'s options, ready for ``model(**values)``."""
    return {name: getattr(args, name) for name in model.model_fields
            if name not in exclude and (include is None or name in include)}


def parse_size(text: str) -> int:
    """``123``, ``64K``, ``300M``, ``1.5G`` -> bytes (binary multiples)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    scale = units.get(text[-1:].upper(), 1)
    number = text[:-1] if scale != 1 else text
    try:
        value = float(number)
        nbytes = int(value * scale)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (e.g. 4096, 64K, 300M, 1G)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"size must not be negative: {text!r}")
    return nbytes


def _argument_for(name: str, field: FieldInfo) -> dict[str, Any]:
    default = field.default
    kinds, words = value_kinds(field.annotation)
    if name.endswith("_bytes"):
        return {"type": parse_size, "metavar": "SIZE", "default": default}
    if typing.get_origin(field.annotation) is tuple:  # the model parses "a,b,c" itself
        return {"type": str, "metavar": "A,B,..", "default": default}
    if kinds == {bool}:
        return {"action": argparse.BooleanOptionalAction, "default": default}
    if not kinds:
        return {"choices": words, "default": default}
    if kinds == {int} and words:
        return {"type": _number_or(words), "metavar": "N|" + "|".join(words),
                "default": default}
    if kinds == {int}:
        return {"type": int, "metavar": "N", "default": default}
    if kinds == {float}:
        return {"type": float, "metavar": "X", "default": default}
    raise TypeError(f"{name}: no command-line form for {field.annotation!r}")


def value_kinds(annotation) -> tuple[set[type], list[str]]:
    """The plain types (bool, int, float) and the literal words a field's type admits."""
    kinds: set[type] = set()
    words: list[str] = []
    for part in _union_parts(annotation):
        if typing.get_origin(part) is Literal:
            words += [str(value) for value in typing.get_args(part)]
        elif typing.get_origin(part) is typing.Annotated:
            kinds.add(typing.get_args(part)[0])
        elif part is not type(None):
            kinds.add(part)
    return kinds, words


def _union_parts(annotation) -> tuple:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _number_or(words: list[str]):
    def parse(text: str) -> int | str:
        if text in words:
            return text
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number or {' or '.join(map(repr, words))}, got {text!r}") from None
    return parse
