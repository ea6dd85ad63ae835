"""Typed configs: every config group and entry point maps a plain dict (a resolved Hydra config, a user's
options) to its frozen dataclass in one way, ``typed``, which checks every field's type before any work
starts and names the key, the value and what was expected in a one-line ``UserError``.

Types understood: int, float, bool, str, ``X | None``, ``tuple[X, ...]``, ``dict``, ``Any`` and nested
dataclasses. A number's bounds are part of its type where a field declares them (``bounded``: ``at_least`` for an
integer or a number, ``above`` for a number), and are checked and described with it. Value checks beyond those
(choices, rules across fields) stay in each dataclass's ``__post_init__``, the schema's hooks. Numpy scalars and
arrays are taken where Python numbers and lists are (``plain``). The same ``typed`` parses configs, task files and
plan files (``core/schema.py``): one mechanism, one kind of message.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

import numpy as np

from neuroshard_jax.core.errors import UserError


@functools.cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def bounded(
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    **field_options,
):
    """A dataclass field whose number ``typed`` checks against its bounds (``at_least``: >=, ``above``: >,
    ``at_most``: <=, ``below``: <) and describes with them (``an integer >= 1``, ``a finite number > 0 and <=
    1048576``); ``field_options``: ``dataclasses.field``'s."""
    bounds = {"at_least": at_least, "above": above, "at_most": at_most, "below": below}
    return dataclasses.field(metadata=bounds, **field_options)


def _bounds_text(bounds: dict | None) -> str:
    if not bounds:
        return ""
    upper = f" and <= {_number(bounds['at_most'])}" if bounds.get("at_most") is not None else ""
    if bounds.get("below") is not None:
        upper = f" and < {_number(bounds['below'])}"
    if bounds.get("above") is not None:
        return f" > {_number(bounds['above'])}{upper}"
    return (f" >= {_number(bounds['at_least'])}" if bounds.get("at_least") is not None else "") + upper


def _number(x: float) -> str:
    """A bound as a reader writes it: a whole number exactly (4096, 1099511627776), else the shortest form."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 2**63 else f"{x:g}"


def _within(value, bounds: dict | None) -> bool:
    if not bounds:
        return True
    low, above, high, below = (bounds.get(k) for k in ("at_least", "above", "at_most", "below"))
    within = (low is None or value >= low) and (above is None or value > above)
    return within and (high is None or value <= high) and (below is None or value < below)


def _plural(description: str) -> str:
    """``a finite number >= 0`` -> ``finite numbers >= 0``: the noun (before any bound) made plural."""
    noun, sep, rest = description.removeprefix("an ").removeprefix("a ").partition(" >")
    noun, sep2, rest2 = noun.partition(" and")
    return f"{noun}s{sep2}{rest2}{sep}{rest}"


def _describe(tp, bounds: dict | None = None) -> str:
    """What a value of type ``tp`` (a number within ``bounds``) looks like, for error messages."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer" + _bounds_text(bounds)
    if tp is float:
        return f"a finite number{_bounds_text(bounds)}" if bounds else "a number"
    if tp is str:
        return "a string"
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(_describe(a, bounds) for a in inner) + (" or null" if len(inner) < len(args) else "")
    if origin is tuple:
        return f"a list of {_plural(_describe(args[0], bounds))}"
    if dataclasses.is_dataclass(tp):
        return f"an object with keys {', '.join(f.name for f in dataclasses.fields(tp))}"
    if tp is dict or origin is dict:
        return "an object"
    return "a value"


class _Mismatch(Exception):
    pass


def _convert(value, tp, where: str, bounds: dict | None = None):
    """``value`` as type ``tp`` (lists to tuples, dicts to dataclasses; a number within ``bounds``); raises
    _Mismatch or UserError."""
    if tp is Any:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(value, option, where, bounds)
            except _Mismatch:
                continue
        raise _Mismatch
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool) and _within(value, bounds):
            return value
        raise _Mismatch
    if tp is float:
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if number and _within(value, bounds):
            return float(value)
        raise _Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        out = []
        for i, v in enumerate(value):
            try:
                out.append(_convert(v, args[0], f"{where}[{i}]", bounds))
            except _Mismatch:  # the element named, not the whole list
                raise UserError(f"{where}[{i}]: got {v!r:.60}, expected {_describe(args[0], bounds)}") from None
        return tuple(out)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise _Mismatch
        return typed(tp, value, where)
    if tp is dict or origin is dict:
        if isinstance(value, dict):
            return value
        raise _Mismatch
    return value


def typed_value(tp, value, where: str, bounds: dict | None = None):
    """``value`` as type ``tp`` (``typed``'s conversion of one field), or one ``UserError`` naming ``where``."""
    try:
        return _convert(plain(value), tp, where, bounds)
    except _Mismatch:
        raise UserError(f"{where}: got {value!r:.60}, expected {_describe(tp, bounds)}") from None


def check_bounds(obj, prefix: str = "") -> None:
    """Every number field of dataclass ``obj`` declared with ``bounded`` is within its bounds (NaN is within none);
    else the configs' one-line error. For ``__post_init__``: a config built in Python is checked as ``typed``
    checks one from a file."""
    for field in dataclasses.fields(obj):
        if not field.metadata or "at_least" not in field.metadata:
            continue
        value = getattr(obj, field.name)
        values = value if isinstance(value, (tuple, list)) else (value,)
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if any(not (_within(v, field.metadata) and math.isfinite(v)) for v in numbers):
            kind = _hints(type(obj))[field.name]
            raise UserError(f"{prefix}{field.name}: got {value!r}, expected {_describe(kind, field.metadata)}")


def nearest(key: str, known: list[str]) -> str:
    """``did you mean 'x'? expected one of ...`` for an unknown ``key`` (the close match only if there is one)."""
    near = difflib.get_close_matches(str(key), known, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return f"{hint}expected one of {', '.join(known) or 'none'}"


def plain(value):
    """``value`` with numpy scalars and arrays made Python numbers and lists, in nested mappings, lists and tuples
    too: the checks downstream know Python's types only. A numpy bool becomes a bool, which no integer check takes;
    NaN stays NaN for the checks to refuse."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return plain(value.tolist()) if value.dtype == object else value.tolist()
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if type(value) in (list, tuple):  # not a NamedTuple: its fields are not a list
        return type(value)(plain(v) for v in value)
    return value


def typed(cls, options: dict | None, where: str = "", ignore: tuple[str, ...] = ()):
    """``cls(**options)`` with every field type-checked (and lists made tuples, objects made dataclasses).

    ``where`` prefixes key names in errors (``searcher`` -> ``searcher.k``); keys in ``ignore`` are skipped.
    Unknown keys and wrong types raise UserError; so do the class's own checks in ``__post_init__``.
    """
    options = plain(dict(options or {}))
    prefix = f"{where}." if where else ""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(k for k in options if k not in fields and k not in ignore)
    if unknown:
        raise UserError(f"{prefix}{unknown[0]}: unknown key, {nearest(unknown[0], sorted(fields))}")
    hints = _hints(cls)
    values = {}
    for name, field in fields.items():
        if name not in options:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise UserError(f"{prefix}{name}: missing, expected a value")
            continue
        value, bounds = options[name], field.metadata or None
        try:
            values[name] = _convert(value, hints[name], f"{prefix}{name}", bounds)
        except _Mismatch:
            raise UserError(f"{prefix}{name}: got {value!r:.60}, expected {_describe(hints[name], bounds)}") from None
    try:
        return cls(**values)
    except UserError as err:
        raise UserError(_located(str(err), where, fields)) from None


def _located(message: str, where: str, fields) -> str:
    """A class's own error message with the key's full path: ``pool.source`` under ``task.pool`` becomes
    ``task.pool.source``, ``workers`` under ``evaluator`` becomes ``evaluator.workers``."""
    if not where:
        return message
    first = message.split(":", 1)[0].split(".")[0]
    parent, _, leaf = where.rpartition(".")
    if first == leaf:
        return f"{parent}.{message}" if parent else message
    if first in fields:
        return f"{where}.{message}"
    return message


def check_seed(seed, where: str = "seed") -> int:
    """``seed`` as an int (numpy integers taken); UserError unless it is an integer >= 0 (not a bool)."""
    if hasattr(seed, "__index__") and not isinstance(seed, bool):
        seed = seed.__index__()
        if 0 <= seed < 2**63:
            return seed
    raise UserError(f"{where}: got {seed!r}, expected an integer in 0..2**63-1 (the same seed gives the same plan)")
