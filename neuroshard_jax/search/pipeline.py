"""The search stage: check the task, build the cost model, run a searcher, validate and score the plan."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import NamedTuple

import jax
import numpy as np

from neuroshard_jax.core.constraints import constraints_used, unhonoured
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.paths import cache_folder
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.records import CalibrationRecord, Candidate, PortfolioRecord
from neuroshard_jax.core.task import Task, check_feasible
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.costs.scoring import score_plans, with_costs
from neuroshard_jax.search.ways import Run, Ways, search_runs
from searchers import Searcher, registered
from searchers.registry import Member

logger = logging.getLogger(__name__)

# JAX keeps only kernels that took at least this long to compile: all (the search's take well under a second each)
MIN_COMPILE_S = 0.0


def keep_compiled_kernels() -> None:
    """Keep the search's compiled kernels in JAX's persistent compilation cache, in ``$NEUROSHARD_CACHE_DIR/jax``
    (default ``~/.cache/neuroshard_jax/jax``): a later process tracing the same shapes reads XLA's executables
    there instead of compiling them. A cache folder the process already set (``jax_compilation_cache_dir``, or the
    ``JAX_COMPILATION_CACHE_DIR`` variable) is kept, with its settings; one that cannot be made (a read-only home)
    is said in one warning, and the search compiles as it would without it. Calling it again does nothing."""
    if jax.config.jax_compilation_cache_dir:
        return
    folder = cache_folder("jax", "compiled search kernels")  # executables are code: the user's folder alone
    if folder is not None:
        jax.config.update("jax_compilation_cache_dir", str(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)


def search_plan(task: Task, searcher: Searcher, model: CostModel, seed: int, row_split: str = "fit") -> Plan:
    """``search_candidates(...)``'s plan: the one the search keeps (an infeasible task refused first)."""
    check_feasible(task)
    return search_candidates(task, searcher, model, seed, row_split)[0]


def search_candidates(
    task: Task, searcher: Searcher, model: CostModel, seed: int, row_split: str = "fit"
) -> tuple[Plan, dict[str, Plan]]:
    """Search a plan for ``task`` (a feasible one: ``search_plan`` and ``Planner.run`` check it first): validated,
    with its costs predicted by ``model`` (built for ``task``, and serving every part of it the search plans: the
    tables around replicas or row blocks keep its devices) and its provenance. ``row_split``: which tables row blocks
    are tried for (``ways.py``: fit | hot | off).

    The stage tries several runs of the searcher (its hot small tables data-parallel or not, tables cut into row
    blocks or not) and keeps the plan the search's own score ranks first. A portfolio (``searcher.members()``) is its
    members' runs together: a run two members share (beam's plain run is also ``beam:hot``'s) is searched once, a
    searcher's work bound is shared by all its runs, each member's plan is the cheapest of its own runs', and the plan
    records every member's (``PortfolioRecord``). Returns the plan and each member's own (a portfolio's, by member
    name, with its costs; empty for a plain searcher): what ``autotune`` measures."""
    if not isinstance(model, CostModel):
        raise UserError(
            f"cost_model: got {type(model).__name__}, expected a CostModel (CostModelSpec(name).for_task(task))"
        )
    start = time.perf_counter()
    expected = model.expected  # the reported costs and the stages' estimates: no risk term
    portfolio = bool(searcher.members())
    ways = Ways(task, expected)
    tried = []
    for member in searcher.members() or (Member(searcher.name, searcher),):
        mode = member.row_split or row_split
        try:
            check_constraints(task, member.searcher)
            runs, refusal = ways.runs(member.searcher, mode)
        except (InfeasibleError, UserError) as err:  # in a portfolio, this member makes no plan; others may
            if not portfolio:
                raise
            runs, refusal = [], err
        tried.append(_Tried(member, mode, runs, refusal))
    distinct = list(dict.fromkeys(run for t in tried for run in t.runs))
    plans, errors, seconds = search_runs(task, distinct, model, expected, seed, start, portfolio)
    outcomes = [
        _Outcome(
            t.member,
            t.mode,
            [run for run in t.runs if run in plans],
            t.refusal or next((errors[run] for run in t.runs if run in errors), None),
            sum(seconds.get(run, 0.0) for run in t.runs),
        )
        for t in tried
    ]
    weighed = list(dict.fromkeys(run for o in outcomes for run in o.made))
    if not weighed:
        raise next(o.why for o in outcomes if o.why is not None)
    # every distinct plan scored once (an ensemble's risk term included): a member's is the cheapest of its runs',
    # the portfolio's the cheapest member's; the first on a tie
    scores = dict(zip(weighed, map(float, score_plans(model, [plans[r] for r in weighed])))) if len(weighed) > 1 else {}
    picks = [o.made[int(np.argmin([scores.get(r, 0.0) for r in o.made]))] if o.made else None for o in outcomes]
    picked = [p for p in picks if p is not None]
    best = picked[int(np.argmin([scores.get(r, 0.0) for r in picked]))]
    elapsed_s = time.perf_counter() - start
    # the reported costs are expectations: the search's risk term (an ensemble's spread) is not part of them
    scored = with_costs(expected, plans[best])
    factor = model.calibration
    given = CalibrationRecord.of_factor(factor) if factor != 1.0 else None  # calibrate=measured replaces it
    record = _portfolio_record(outcomes, picks, best, plans, scores, expected) if portfolio else None
    chosen = dataclasses.replace(scored, searcher=searcher.name, seed=seed, search_time_s=elapsed_s)
    chosen = chosen.with_record(CalibrationRecord, given).with_record(PortfolioRecord, record)
    members = {
        member.name: dataclasses.replace(
            with_costs(expected, plans[pick]), searcher=member.searcher.name, seed=seed, search_time_s=took
        ).with_record(CalibrationRecord, given)
        for (member, _, _, _, took), pick in zip(outcomes, picks)
        if portfolio and pick is not None
    }
    return chosen, members


def _portfolio_record(outcomes, picks, best, plans, scores, expected: CostModel) -> PortfolioRecord:
    """Each member's candidate (its plan's predicted costs and score, or why it made none; an earlier member's
    identical plan named), which one was chosen, and its margin over the next distinct plan."""
    candidates, seen, chosen = [], {}, None
    for (member, mode, _, why, took), pick in zip(outcomes, picks):
        made = dict(member=member.name, searcher=member.searcher.name, row_split=mode, search_time_s=took)
        if pick is None:
            error = (str(why).splitlines() or [type(why).__name__])[0]
            logger.info(f"portfolio: {member.name} made no plan: {error}")
            candidates.append(Candidate(**made, error=error))
            continue
        plan = plans[pick]
        key = (frozenset(plan.shards), plan.data_parallel)
        costs = with_costs(expected, plan).costs
        score = scores.get(pick, costs.cost_ms)
        made.update(cost_ms=costs.cost_ms, compute_ms=max(costs.compute_ms), score_ms=score, same_as=seen.get(key))
        candidates.append(Candidate(**made))
        seen.setdefault(key, member.name)
        if pick == best and chosen is None:
            chosen = member.name
    top = scores.get(best, 0.0)
    others = [c.score_ms for c in candidates if c.same_as is None and c.score_ms is not None and c.member != chosen]
    margin = None if not others else (min(others) - top) / min(others) if min(others) > 0 else 0.0
    return PortfolioRecord(candidates=tuple(candidates), chosen=chosen, margin=margin)


class _Tried(NamedTuple):
    """A member's runs before the search: its row-split mode, its runs, and why it may make no plan."""

    member: Member
    mode: str
    runs: list[Run]
    refusal: Exception | None


class _Outcome(NamedTuple):
    """A member's runs after the search: those that made a plan, why it made none, the seconds its runs took (a run
    it shares with another member counted for both)."""

    member: Member
    mode: str
    made: list[Run]
    why: Exception | None
    seconds: float


def check_constraints(task: Task, searcher: Searcher) -> None:
    """A constrained task: its constraints must leave a placement (else InfeasibleError naming the smallest
    conflicting part found, ``constraints.unhonoured``) and the searcher must honour them (else a UserError naming
    those that do)."""
    missing = unhonoured(task, searcher.constraints)
    if missing:
        used = constraints_used(task.tables)
        able = [name for name, cls in registered().items() if set(used) <= set(cls.constraints)]
        raise UserError(
            f"searcher {searcher.name}: does not take the constraint {missing[0]} (it takes "
            f"{', '.join(searcher.constraints) or 'none'}); expected one of {', '.join(able)}"
        )
