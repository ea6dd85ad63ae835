"""The search stage: check the task, build the cost model, run a searcher, validate and score the plan."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
import time
from typing import NamedTuple

import jax
import numpy as np

from neuroshard_jax.core.constraints import conflicts, constraints_used, has_constraints
from neuroshard_jax.core.devices import Device
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.paths import CACHE_HINT, cache_dir
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.records import CalibrationRecord, Candidate, PortfolioRecord
from neuroshard_jax.core.sharding import merge_colocated
from neuroshard_jax.core.task import Task, check_feasible
from neuroshard_jax.costs.cost_model import CostModel, compute_scale, expected_cost_model
from neuroshard_jax.costs.scoring import score_plan, score_plans, shards_alone, with_costs
from neuroshard_jax.search.replicas import replica_choices, replica_rest, replicas_fit, with_replicas
from neuroshard_jax.search.row_split import (
    cut_rows,
    hot_tables,
    join,
    row_split_choices,
    settle,
)
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
    folder = str(cache_dir() / "jax")
    if _made(folder):
        jax.config.update("jax_compilation_cache_dir", folder)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)


@functools.cache  # a folder is tried once a process: one that cannot be made is said once, not on every plan
def _made(folder: str) -> bool:
    """Whether ``folder`` is (now) a folder this user can write, made ``0700`` if missing; else one warning."""
    try:
        pathlib.Path(folder).mkdir(mode=0o700, parents=True, exist_ok=True)  # executables are code: the user's alone
        writable = os.access(folder, os.W_OK | os.X_OK)
    except OSError as err:
        writable, cause = False, getattr(err, "strerror", None) or str(err)
    else:
        cause = "no permission"
    if not writable:
        logger.warning(f"compiled search kernels are not kept: {folder!r} cannot be made ({cause}); {CACHE_HINT}")
    return writable


def search_plan(task: Task, searcher: Searcher, model: CostModel, seed: int, row_split: str = "fit") -> Plan:
    """``search_candidates(...)``'s plan: the one the search keeps."""
    return search_candidates(task, searcher, model, seed, row_split)[0]


def search_candidates(
    task: Task, searcher: Searcher, model: CostModel, seed: int, row_split: str = "fit"
) -> tuple[Plan, dict[str, Plan]]:
    """Search a plan for ``task``: validated, with its costs predicted by ``model`` (built for ``task``, and serving
    every part of it the search plans: the tables around replicas or row blocks keep its devices) and its
    provenance. ``row_split``: which tables row blocks are tried for (``row_split.py``: fit | hot | off).

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
    check_feasible(task)
    start = time.perf_counter()
    expected = expected_cost_model(model)  # the reported costs and the stages' estimates: no risk term
    portfolio = bool(searcher.members())
    ways = _Ways(task, expected)
    tried = []
    for member in searcher.members() or (Member(searcher.name, searcher),):
        mode = member.row_split or row_split
        try:
            if has_constraints(task.tables):
                check_constraints(task, member.searcher)
            runs, refusal = ways.runs(member.searcher, mode)
        except (InfeasibleError, UserError) as err:  # in a portfolio, this member makes no plan; others may
            if not portfolio:
                raise
            runs, refusal = [], err
        tried.append(_Tried(member, mode, runs, refusal))
    distinct = list(dict.fromkeys(run for t in tried for run in t.runs))
    plans, errors, seconds = _search_runs(task, distinct, model, expected, seed, start, portfolio)
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
    factor = compute_scale(model)
    given = CalibrationRecord.of_factor(factor) if factor != 1.0 else None  # calibrate=measured replaces it
    record = _portfolio_record(outcomes, picks, best, plans, scores, expected) if portfolio else None
    chosen = dataclasses.replace(
        scored, searcher=searcher.name, seed=seed, search_time_s=elapsed_s, calibration=given, portfolio=record
    )
    members = {
        member.name: dataclasses.replace(
            with_costs(expected, plans[pick]),
            searcher=member.searcher.name,
            seed=seed,
            search_time_s=took,
            calibration=given,
        )
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


@dataclasses.dataclass(frozen=True, eq=False)
class _Run:
    """One search of the stage: ``searcher`` on the task around its ``replicated`` tables, with the tables ``split``
    cut into row blocks first (``within_host``: over one host's devices). Runs of equal searchers (the same class
    and options: their repr, since an option may be a list) with the same choices are one search."""

    searcher: Searcher
    replicated: tuple[int, ...]
    split: tuple[int, ...]
    within_host: bool
    searched: bool = True  # False: every table data-parallel, a plan made without searching

    def _key(self) -> tuple:
        return repr(self.searcher), tuple(self.replicated), tuple(self.split), self.within_host, self.searched

    def __eq__(self, other) -> bool:
        return isinstance(other, _Run) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


class _Tried(NamedTuple):
    """A member's runs before the search: its row-split mode, its runs, and why it may make no plan."""

    member: Member
    mode: str
    runs: list[_Run]
    refusal: Exception | None


class _Outcome(NamedTuple):
    """A member's runs after the search: those that made a plan, why it made none, the seconds its runs took (a run
    it shares with another member counted for both)."""

    member: Member
    mode: str
    made: list[_Run]
    why: Exception | None
    seconds: float


class _Ways:
    """The runs the stage tries for a searcher and a row-split mode: its choices of data-parallel tables, and for
    each the sets of tables cut into row blocks; the tables' predicted compute worked out once, where asked for."""

    def __init__(self, task: Task, expected: CostModel):
        self.task, self.expected = task, expected
        self._table_ms = None

    def table_ms(self) -> np.ndarray:
        if self._table_ms is None:
            self._table_ms = whole_table_ms(self.expected, self.task)
        return self._table_ms

    def runs(self, searcher: Searcher, row_split: str) -> tuple[list[_Run], InfeasibleError | None]:
        """The runs (a plan made without searching first, as the stage has always weighed them) and the first
        refusal of a choice of replicas that leaves no plan."""
        task, refusal, direct, runs = self.task, None, [], []
        table_ms = self.table_ms() if searcher.replicates or row_split == "hot" else None
        for replicated in [()] if searcher.own_row_splits else replica_choices(task, table_ms, searcher.replicates):
            try:
                if len(replicated) == task.num_tables:  # every table on every device: nothing left to search
                    replicas_fit(task, replicated)
                    direct.append(_Run(searcher, replicated, (), False, searched=False))
                    continue
                base = replica_rest(task, replicated)[0] if replicated else task
                if searcher.own_row_splits:  # TorchRec's planner chooses its own sharding types
                    choices = [()]
                else:
                    # the hot tables need every table's predicted compute: worked out only where they are asked for
                    base_ms = None
                    if row_split == "hot":
                        base_ms = table_ms if not replicated else whole_table_ms(self.expected, base)
                    hot = hot_tables(base_ms, base.num_devices) if row_split == "hot" else ()
                    choices = row_split_choices(base, row_split, hot)
            except InfeasibleError as err:  # this choice of replicas leaves no plan; another may
                refusal = refusal or err
                continue
            # on several hosts a table's row blocks may also stay within one host (TorchRec's table_row_wise)
            ways = (False, True) if base.host_groups() is not None else (False,)
            runs += [
                _Run(searcher, replicated, split, within_host)
                for split in choices
                for within_host in (ways if split else (False,))
            ]
        return direct + runs, refusal


def _search_runs(
    task: Task, runs: list[_Run], model: CostModel, expected: CostModel, seed: int, start: float, portfolio: bool
):
    """Each run's plan and seconds, and the refusal of each run that leaves no plan, by run. A bound on a searcher's
    work is shared by all its runs; its time budget (the whole stage's, from ``start``, less what other searchers'
    runs took) by its runs left. In a ``portfolio`` a member's UserError (TorchRec not installed, a policy trained at
    another batch) is that run's refusal; for a plain searcher it is raised."""
    plans, errors, seconds = {}, {}, {}
    for i, run in enumerate(runs):
        if not run.searched:
            plans[run], seconds[run] = Plan(task, (), data_parallel=run.replicated).validate(), 0.0
            continue
        same = repr(run.searcher)
        own = [r for r in runs if r.searched and repr(r.searcher) == same]
        searcher = run.searcher.share(len(own))  # a bound on the search's work: the same share for every run
        if searcher.budget_s is not None:  # a searcher's time budget is the whole search's: shared by the runs left
            others = sum(t for r, t in seconds.items() if repr(r.searcher) != same)
            spent = time.perf_counter() - start - others
            left = sum(r in own for r in runs[i:])
            searcher = searcher.with_budget(max((run.searcher.budget_s - spent) / left, 1e-6))
        began = time.perf_counter()
        try:
            base, index = replica_rest(task, run.replicated) if run.replicated else (task, None)
            plan = _search_around(base, searcher, model, expected, seed, run.split, run.within_host)
            plans[run] = with_replicas(task, plan, index, run.replicated).validate() if run.replicated else plan
        except InfeasibleError as err:  # this way of cutting leaves no plan; another may
            errors[run] = err
        except UserError as err:
            if not portfolio:
                raise
            errors[run] = err
        seconds[run] = time.perf_counter() - began
    return plans, errors, seconds


def search_with_rows(task: Task, searcher: Searcher, model: CostModel, seed: int, tables: tuple[int, ...]) -> Plan:
    """The searcher's plan of ``task`` with exactly ``tables`` (task indices) cut into row blocks over every device,
    whatever the model thinks of it (what ``row_split`` would weigh against the other ways), with its costs."""
    check_feasible(task)
    expected = expected_cost_model(model)
    plan = _search_around(task, searcher, model, expected, seed, tables, False)
    return dataclasses.replace(with_costs(expected, plan), searcher=searcher.name, seed=seed)


def whole_table_ms(expected: CostModel, task: Task) -> np.ndarray:
    """f64[T]: each table's predicted compute alone and whole by ``expected`` (a model's expectation,
    ``expected_cost_model``)."""
    return shards_alone(expected, task.features().astype(np.float32))[1].astype(np.float64)


def _search_around(
    task: Task, searcher: Searcher, model: CostModel, expected: CostModel, seed: int, split, within_host: bool
) -> Plan:
    """The searcher's plan of ``task`` with the tables ``split`` cut into row blocks first (none: the plain search),
    over every device or, ``within_host``, over one host's devices; validated."""
    if split:
        blocks, rest, index = cut_rows(task, settle(task, split, within_host), within_host)
        if not rest.num_tables:
            return join(task, None, index, blocks).validate()
        # blocks of tables with their own statistics may be far from alike: also planned around (loaded_rest)
        known = any(task.tables[s.table].row_blocks for s in blocks)
        arounds = [rest, *filter(None, [loaded_rest(task, rest, blocks, expected) if known else None])]
        if len(arounds) > 1:  # the run's budgets shared
            searcher = searcher.share(len(arounds))
            if searcher.budget_s is not None:
                searcher = searcher.with_budget(searcher.budget_s / len(arounds))
        plans = []
        for around in arounds:
            rest_plan = searcher.search(around, model, seed)
            rest_plan = Plan(rest, merge_colocated(rest_plan.shards))
            plans.append(join(task, rest_plan, index, blocks).validate())
        return plans[int(np.argmin(score_plans(model, plans)))] if len(plans) > 1 else plans[0]
    plan = searcher.search(task, model, seed)
    # slices of one table left on one device are one shard's work done in pieces: undo those halvings
    return dataclasses.replace(plan, shards=merge_colocated(plan.shards)).validate()


UNEVEN_BLOCKS = 0.05  # blocks whose predicted compute spreads more than this (of the mean) are planned around


def loaded_rest(task: Task, rest: Task, blocks: tuple, expected: CostModel) -> Task | None:
    """``rest`` (from ``row_split.cut_rows``) with each device's speed scaled to the room its row blocks leave, when
    their predicted compute is uneven (a block holding the table's hot rows, known from its own statistics:
    ``Table.row_blocks``), else None. The searcher then gives a device in proportion to what the balanced step
    leaves it after its blocks; ``_search_around`` keeps this plan only where the whole plan scores cheaper."""
    block_ms = score_plan(expected, Plan(task, blocks)).compute_ms
    mean = float(block_ms.mean())
    if mean <= 0 or float(block_ms.max() - block_ms.min()) <= UNEVEN_BLOCKS * mean:
        return None
    speeds = task.speeds()
    rest_ms = float(whole_table_ms(expected, rest).sum())  # on a device of speed 1
    # the balanced step: every device busy for it, the blocks' work (block_ms x speed at speed 1) included
    target = (rest_ms + float((block_ms * speeds).sum())) / float(speeds.sum())
    room = np.maximum(target - block_ms, 0.05 * target)  # a device its blocks fill still takes a little
    scale = room / room.mean()
    devices = [
        Device(cap, float(speed * f), host) for cap, speed, f, host in zip(rest.caps_gb(), speeds, scale, rest.hosts())
    ]
    return Task(devices, rest.batch_size, rest.tables, rest.precision, rest.pool, rest.links, rest.training)


def check_constraints(task: Task, searcher: Searcher) -> None:
    """A constrained task: its constraints must leave a placement (else InfeasibleError naming the smallest
    conflicting part found) and the searcher must honour them (else a UserError naming those that do)."""
    mem = [task.table_mem_bytes(i) for i in range(task.num_tables)]
    conflict = conflicts(task.tables, task.table_names(), mem, task.cap_bytes())
    if conflict:
        raise InfeasibleError(f"constraints cannot all hold: {conflict}")
    used = constraints_used(task.tables)
    missing = [k for k in used if k not in searcher.constraints]
    if missing:
        able = [name for name, cls in registered().items() if set(used) <= set(cls.constraints)]
        raise UserError(
            f"searcher {searcher.name}: does not take the constraint {missing[0]} (it takes "
            f"{', '.join(searcher.constraints) or 'none'}); expected one of {', '.join(able)}"
        )
