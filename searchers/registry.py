"""The searcher interface and the name registry (a duplicate name is a programming error)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from neuroshard_jax.core.config import typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.types import Plan, Task
from neuroshard_jax.costs.cost_model import CostModel


class Searcher(Protocol):
    """Turns a task into a plan; the same seed gives the same plan."""

    def search(self, task: Task, cost_model: CostModel, seed: int) -> Plan: ...


_REGISTRY: dict[str, Callable[..., Searcher]] = {}


def register(name: str):
    """Class decorator: make a searcher constructible by ``name`` (its conf/searcher/<name>.yaml)."""

    def wrap(cls):
        if name in _REGISTRY:
            raise ValueError(f"searcher {name!r} is registered twice ({_REGISTRY[name]} and {cls})")
        _REGISTRY[name] = cls
        return cls

    return wrap


def searcher_names() -> list[str]:
    return sorted(_REGISTRY)


def registered() -> dict[str, type]:
    """Every registered searcher's class (its fields: the searcher's options and their defaults), by name."""
    return dict(sorted(_REGISTRY.items()))


def make_searcher(name: str, options: dict | None = None) -> Searcher:
    """Construct a registered searcher with ``options`` (its config fields); unknown names or options raise."""
    if name not in _REGISTRY:
        raise UserError(f"searcher: got {name!r}, expected one of {', '.join(searcher_names())}")
    cls = _REGISTRY[name]
    if dataclasses.is_dataclass(cls):
        return typed(cls, options, "searcher")  # every option type-checked, one-line errors
    return cls(**(options or {}))
