"""The searcher interface and the name registry (a duplicate name is a programming error).

Every searcher is a frozen dataclass (its fields: its options) deriving from ``Searcher``, which declares the whole
interface the search stage uses: ``search``, and what the pipeline around it may do (``constraints`` it honours,
whether its hot small tables are tried data-parallel, whether it picks its own row splits, its time budget). Names
are turned into searchers here, once, at the edge (``make_searcher``); below that code receives a ``Searcher``.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

from neuroshard_jax.core.config import typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import CostModel


class Searcher(abc.ABC):
    """Turns a task into a plan; the same seed gives the same plan.

    Capabilities (class attributes, declared by each searcher that has them; the defaults here are the plainest):
    ``name`` (its registry key, set by ``register``); ``constraints``: the table constraints it honours
    (``core.constraints.KEYS``); ``replicates``: the pipeline tries its hot small tables data-parallel first
    (``search/ways.py``); ``own_row_splits``: it picks its own sharding types, so the pipeline's row-split stage
    is not applied; ``budget_s``: seconds the whole search may take (None: no limit; a searcher with a budget
    declares it as an option field, and ``with_budget`` gives it a share); ``max_work``: likewise a bound on the
    work of the whole search in the searcher's own units, which leaves the plan a function of the task (not of the
    machine's speed), shared by ``share``. ``members``: the searchers a portfolio runs in its place (the
    pipeline plans with each and keeps the cheapest, ``search.pipeline.search_plan``); none for a plain searcher."""

    name: ClassVar[str] = ""
    constraints: ClassVar[tuple[str, ...]] = ()
    replicates: ClassVar[bool] = False
    own_row_splits: ClassVar[bool] = False
    budget_s: ClassVar[float | None] = None
    max_work: ClassVar[float | None] = None

    @abc.abstractmethod
    def search(self, task: Task, cost_model: CostModel, seed: int) -> Plan: ...

    def members(self) -> tuple[Member, ...]:
        """The searchers the pipeline runs in this one's place, each through the whole pipeline (a portfolio's);
        empty: this searcher searches itself."""
        return ()

    def with_budget(self, budget_s: float) -> Searcher:
        """This searcher with ``budget_s`` seconds, where it has a budget (the pipeline shares one budget among the
        searches of one plan); itself where it has none."""
        return self if self.budget_s is None else dataclasses.replace(self, budget_s=budget_s)

    def share(self, parts: int) -> Searcher:
        """This searcher with a ``parts``-th of its work bound, where it has one (the pipeline's runs share it)."""
        return self if self.max_work is None else dataclasses.replace(self, max_work=self.max_work / parts)


@dataclasses.dataclass(frozen=True)
class Member:
    """One member of a portfolio: its ``name`` as the user wrote it (``beam``, ``beam:hot``), the searcher, and the
    row-split mode it plans with (None: the planner's ``row_split``)."""

    name: str
    searcher: Searcher
    row_split: str | None = None


_REGISTRY: dict[str, type[Searcher]] = {}


def register(name: str):
    """Class decorator: make a searcher constructible by ``name`` (its conf/searcher/<name>.yaml)."""

    def wrap(cls):
        if name in _REGISTRY:
            raise ValueError(f"searcher {name!r} is registered twice ({_REGISTRY[name]} and {cls})")
        if not (isinstance(cls, type) and issubclass(cls, Searcher) and dataclasses.is_dataclass(cls)):
            raise TypeError(f"searcher {name!r}: expected a dataclass deriving from Searcher, got {cls}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def searcher_names() -> list[str]:
    return sorted(_REGISTRY)


def registered() -> dict[str, type[Searcher]]:
    """Every registered searcher's class (its fields: the searcher's options and their defaults), by name."""
    return dict(sorted(_REGISTRY.items()))


def searcher_options(name: str) -> tuple[str, ...]:
    """The option names of registered searcher ``name`` (its config fields); none for a name not registered."""
    cls = _REGISTRY.get(name)
    return tuple(f.name for f in dataclasses.fields(cls) if f.init) if cls is not None else ()


def make_searcher(name: str, options: dict | None = None) -> Searcher:
    """Construct a registered searcher with ``options`` (its config fields); unknown names or options raise."""
    if name not in _REGISTRY:
        raise UserError(f"searcher: got {name!r}, expected one of {', '.join(searcher_names())}")
    return typed(_REGISTRY[name], options, "searcher")  # every option type-checked, one-line errors
