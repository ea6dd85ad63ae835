"""``searcher=portfolio``: several searchers (and row-split modes) on one task, the plan the model prices cheapest.

No single searcher wins every task: on fresh tasks beam lost one by 14% where grid won, and beam with
``row_split=hot`` was better still on average. The portfolio runs each member through the whole pipeline (replicas,
row splits, the search) with the one cost model the planner built, drops plans that repeat an earlier member's, and
keeps the one the search's own score ranks first (the first member on a tie); plan.json's ``portfolio`` lists every
candidate with its predicted cost (``core.records.PortfolioRecord``). A member is ``NAME`` or ``NAME:ROW_SPLIT``
(``beam:hot``: beam with ``row_split=hot``; without one, the planner's ``row_split``), with the searcher's default
options. Hot small tables are tried data-parallel inside each member that replicates (beam, grid). A member that
makes no plan (infeasible for it, TorchRec not installed) is recorded with why; the portfolio fails only when none
makes one.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from neuroshard_jax.core.config import nearest
from neuroshard_jax.core.constraints import KEYS as CONSTRAINT_KEYS
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import ROW_SPLIT_MODES, check_row_split
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.costs.scoring import score_plans
from searchers.registry import Member, Searcher, make_searcher, register, searcher_names

DEFAULT_MEMBERS = ("beam", "grid", "beam:hot")


@register("portfolio")
@dataclasses.dataclass(frozen=True)
class Portfolio(Searcher):
    """The members' plans of a task, the cheapest by the model. ``searchers``: the members, ``NAME`` or
    ``NAME:ROW_SPLIT`` (fit | hot | off), in the order a tie is broken."""

    searchers: tuple[str, ...] = DEFAULT_MEMBERS
    constraints: ClassVar[tuple[str, ...]] = CONSTRAINT_KEYS  # each member checks its own (one that cannot: skipped)

    def __post_init__(self):
        object.__setattr__(self, "searchers", tuple(self.searchers))
        if not self.searchers:
            raise UserError(f"searcher.searchers: got [], expected members such as {list(DEFAULT_MEMBERS)}")
        seen = set()
        for member in self.searchers:
            if member in seen:
                raise UserError(f"searcher.searchers: got {member!r} twice, expected each member once")
            seen.add(member)
            self._member(member)  # every name and mode checked when the portfolio is made

    @staticmethod
    def _member(member: str) -> Member:
        if not isinstance(member, str) or not member:
            raise UserError(f"searcher.searchers: got {member!r}, expected NAME or NAME:ROW_SPLIT")
        name, _, mode = member.partition(":")
        if name == "portfolio":
            raise UserError("searcher.searchers: got 'portfolio', expected searchers (a portfolio holds no portfolio)")
        if name not in searcher_names():
            raise UserError(f"searcher.searchers: got {name!r}, {nearest(name, searcher_names())}")
        if mode:
            try:
                check_row_split(mode)
            except UserError:
                raise UserError(
                    f"searcher.searchers: got {member!r}, expected NAME:ROW_SPLIT with ROW_SPLIT one of "
                    f"{', '.join(ROW_SPLIT_MODES)}"
                ) from None
        return Member(member, make_searcher(name), mode or None)

    def members(self) -> tuple[Member, ...]:
        return tuple(self._member(member) for member in self.searchers)

    def search(self, task: Task, cost_model: CostModel, seed: int) -> Plan:
        """The members' own searches of ``task`` alone (no replicas, no row splits: the pipeline, which runs each
        member through them, does not call this), the cheapest by ``cost_model``."""
        plans, refusal = [], None
        for member in self.members():
            try:
                plans.append(member.searcher.search(task, cost_model, seed))
            except InfeasibleError as err:
                refusal = refusal or err
        if not plans:
            raise refusal
        return plans[int(np.argmin(score_plans(cost_model, plans)))]
