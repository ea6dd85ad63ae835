"""The ways the search stage runs a searcher over a task: with its hot small tables data-parallel or not (the
data-parallel stage), with tables cut into row blocks first or not (the row-split stage), each way one ``Run``, planned
by ``search_runs`` and scored by the pipeline (``search.pipeline.search_candidates`` keeps the cheapest). One module:
every run goes through both stages in turn (the replicas' rest is what rows are cut from), so the two stages and the
runs that join them are read together.

## The data-parallel stage
Which tables every device holds whole (TorchRec's data_parallel), tried before the search places the rest. A small
table looked up very often decides the step of every table-wise or column-wise plan: whichever device holds it does
all its lookups. Data-parallel, every device holds it and looks up its own slice of the batch (batch / N); the price
is its memory on every device and an all-reduce of its gradients (``scoring``: priced as a row group over every
device). The stage tries the tables that must be data-parallel (``sharding_types: [data_parallel]``) and, for a
searcher that chooses sharding types (``replicates``: beam, grid), those plus the hottest candidate, and those plus
every candidate: a table that may be data-parallel (``constraints.may_be_data_parallel``), fits every device whole,
and whose compute alone exceeds the mean device's share of the whole task's. The searcher plans the other tables
around them (``replica_rest``: the devices' caps less the replicas' memory) and the pipeline keeps the way its cost
model scores cheapest.

## The row-split stage
A table larger than the largest device's cap is either cut into narrow column slices (each slice does every
lookup of the table: on FBGEMM CPU 8 slices cost 2.7-10.5x the whole table) or into N row blocks, one per
device in order (``sharding.row_shards``, TorchRec's ``row_wise``), each doing only the lookups that land in its
rows. So is a table hotter than a device's fair share of the task (``hot_tables``), which no placement of whole
tables balances. With ``row_split=fit`` (the default) the first cuts, with ``hot`` also the hot tables, are tried
beside the plain search (``row_split_choices``):
for each, the searcher plans the other tables on what the blocks leave of each device's memory (``cut_rows``);
the plans are scored with the search's own cost model and the cheapest is kept. A table whose narrowest column
slice fits nowhere can only be cut into rows. ``row_split=off``: column splits only, as before row splits
existed. ``hot`` is not the default: it changes plans of tasks whose tables all fit, and has not been measured yet.

Sequence tables are also tried in row blocks, the wide ones first, then all (``wide_tables``, ``sequence_tables``):
their blocks reduce nothing and move what the table moves whole, spread over the devices.

On several hosts of equal size each cut is also tried with its blocks within one host (``table_row_wise``); tables
that no device holds once the blocks are placed are cut too (``settle``).

The searcher does not see the blocks' compute: over every device they add about 1/N of the table's work to every
device alike, which shifts every device and leaves the balance it seeks (within one host they do not: that choice
is kept only where the whole plan, scored with the blocks, comes out cheaper). Blocks of a table with its own block
statistics (``Table.row_blocks``) may be far from alike: ``loaded_rest`` then also plans the rest on the
room they leave each device. NumPy only.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.constraints import (
    has_constraints,
    may_be_data_parallel,
    may_split_rows,
    must_be_data_parallel,
)
from neuroshard_jax.core.devices import Device
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import (
    Shard,
    check_row_split,
    even_sequence_slices,
    merge_colocated,
    narrowest_dim,
    row_shards,
)
from neuroshard_jax.core.task import Task, check_feasible
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.costs.scoring import score_plan, score_plans, shards_alone, with_costs
from searchers import Searcher


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
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
        return isinstance(other, Run) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


class Ways:
    """The runs the stage tries for a searcher and a row-split mode: its choices of data-parallel tables, and for
    each the sets of tables cut into row blocks; the tables' predicted compute worked out once, where asked for."""

    def __init__(self, task: Task, expected: CostModel):
        self.task, self.expected = task, expected
        self._table_ms = None

    def table_ms(self) -> np.ndarray:
        if self._table_ms is None:
            self._table_ms = whole_table_ms(self.expected, self.task)
        return self._table_ms

    def runs(self, searcher: Searcher, row_split: str) -> tuple[list[Run], InfeasibleError | None]:
        """The runs (a plan made without searching first, as the stage has always weighed them) and the first
        refusal of a choice of replicas that leaves no plan."""
        task, refusal, direct, runs = self.task, None, [], []
        table_ms = self.table_ms() if searcher.replicates or row_split == "hot" else None
        for replicated in [()] if searcher.own_row_splits else replica_choices(task, table_ms, searcher.replicates):
            try:
                if len(replicated) == task.num_tables:  # every table on every device: nothing left to search
                    replicas_fit(task, replicated)
                    direct.append(Run(searcher, replicated, (), False, searched=False))
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
                Run(searcher, replicated, split, within_host)
                for split in choices
                for within_host in (ways if split else (False,))
            ]
        return direct + runs, refusal


def search_runs(
    task: Task, runs: list[Run], model: CostModel, expected: CostModel, seed: int, start: float, portfolio: bool
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
            plan = search_around(base, searcher, model, expected, seed, run.split, run.within_host)
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
    expected = model.expected
    plan = search_around(task, searcher, model, expected, seed, tables, False)
    return dataclasses.replace(with_costs(expected, plan), searcher=searcher.name, seed=seed)


def whole_table_ms(expected: CostModel, task: Task) -> np.ndarray:
    """f64[T]: each table's predicted compute alone and whole by ``expected`` (a model's expectation,
    ``CostModel.expected``)."""
    return shards_alone(expected, task.features().astype(np.float32))[1].astype(np.float64)


def search_around(
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
            shards = even_sequence_slices(rest.tables, merge_colocated(rest_plan.shards))
            rest_plan = Plan(rest, shards, merge_column_wise=rest_plan.merge_column_wise)
            plans.append(join(task, rest_plan, index, blocks).validate())
        return plans[int(np.argmin(score_plans(model, plans)))] if len(plans) > 1 else plans[0]
    plan = searcher.search(task, model, seed)
    # slices of one table left on one device are one shard's work done in pieces: undo those halvings
    shards = even_sequence_slices(plan.task.tables, merge_colocated(plan.shards))
    return dataclasses.replace(plan, shards=shards).validate()


UNEVEN_BLOCKS = 0.05  # blocks whose predicted compute spreads more than this (of the mean) are planned around


def loaded_rest(task: Task, rest: Task, blocks: tuple, expected: CostModel) -> Task | None:
    """``rest`` (from ``row_split.cut_rows``) with each device's speed scaled to the room its row blocks leave, when
    their predicted compute is uneven (a block holding the table's hot rows, known from its own statistics:
    ``Table.row_blocks``), else None. The searcher then gives a device in proportion to what the balanced step
    leaves it after its blocks; ``search_around`` keeps this plan only where the whole plan scores cheaper."""
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


# ---------------------------------------------------------------------------------------------
# The data-parallel stage


def replica_choices(task: Task, table_ms: np.ndarray | None, chooses: bool) -> list[tuple[int, ...]]:
    """The sets of data-parallel tables (task indices, ascending) the stage tries, the plain one first.
    ``table_ms`` f64[T]: each table's predicted compute alone and whole (needed where ``chooses``); ``chooses``:
    the searcher picks sharding types (else only the tables that must be data-parallel)."""
    forced = tuple(i for i, t in enumerate(task.tables) if must_be_data_parallel(t))
    choices = [forced]
    if not chooses or task.num_devices < 2 or table_ms is None:
        return choices
    share = float(table_ms.sum()) / task.num_devices
    room = int(task.cap_bytes().min())
    candidates = [
        i
        for i in np.argsort(-table_ms, kind="stable").tolist()
        if i not in forced
        and may_be_data_parallel(task.tables[i])
        and not task.tables[i].cached  # tiered memory holds one copy of a table's rows
        and table_ms[i] > share
        and task.table_mem_bytes(i) <= room
    ]
    for more in (candidates[:1], candidates):
        choice = tuple(sorted({*forced, *more}))
        if choice not in choices:
            choices.append(choice)
    return choices


def replicas_fit(task: Task, replicated: Sequence[int]) -> int:
    """The bytes the data-parallel tables ``replicated`` take on every device; InfeasibleError if a device cannot
    hold them."""
    need = sum(task.table_mem_bytes(i) for i in replicated)
    caps = task.cap_bytes()
    short = int(np.argmin(caps))
    if need > caps[short]:
        names = ", ".join(str(task.tables[t].id) for t in replicated)
        raise InfeasibleError(
            f"task infeasible: data-parallel table(s) {names} need {need / GIB_BYTES:.3f} GiB on every device; "
            f"device {short} holds {task.caps_gb()[short]} GiB"
        )
    return need


def replica_rest(task: Task, replicated: Sequence[int]) -> tuple[Task, list[int]]:
    """The task the searcher plans around the data-parallel tables ``replicated``: the other tables (and their task
    indices), on devices whose caps lose the replicas' memory. InfeasibleError if a device cannot hold them."""
    need = replicas_fit(task, replicated)
    return task_around(task, np.full(task.num_devices, need, dtype=np.int64), set(replicated))


def with_replicas(task: Task, rest_plan: Plan, rest: Sequence[int], replicated: Sequence[int]) -> Plan:
    """The whole task's plan: ``rest_plan``'s shards renumbered to the task's tables (``row_split.join``), and
    ``replicated`` data-parallel."""
    return dataclasses.replace(join(task, rest_plan, rest, ()), data_parallel=tuple(sorted(replicated)))


# ---------------------------------------------------------------------------------------------
# The row-split stage


def oversized(task: Task) -> tuple[list[int], list[int]]:
    """(tables that only a row split fits: even their narrowest column slice exceeds every cap, tables that a row
    split or column slices fit: larger than every cap whole), as task indices."""
    cap = int(task.cap_bytes().max())
    must, may = [], []
    for i, table in enumerate(task.tables):
        if task.table_mem_bytes(i) > cap:
            (must if task.table_mem_bytes(i, narrowest_dim(table.dim)) > cap else may).append(i)
    return must, may


def hot_tables(single_ms: Sequence[float], num_devices: int) -> list[int]:
    """Tables (task indices) whose predicted compute alone (``single_ms``, ms per table whole) is more than a
    device's fair share of the whole task's (the sum over tables / N): no placement of whole tables balances them."""
    share = float(sum(single_ms)) / num_devices
    return [i for i, ms in enumerate(single_ms) if num_devices > 1 and ms > share]


def wide_tables(task: Task) -> list[int]:
    """Sequence tables (task indices) whose all-to-all width, a row per id (``Table.width``), is more than a device's
    fair share of the task's: whole, they cannot be balanced, and a column slice still sends a row of every id, so
    their row blocks (TorchRec's row_wise, which an EmbeddingCollection's sharder offers) are worth a search."""
    widths = [t.width(t.dim) for t in task.tables]
    share = sum(widths) / task.num_devices
    return [i for i, t in enumerate(task.tables) if t.sequence and task.num_devices > 1 and widths[i] > share]


def sequence_tables(task: Task) -> list[int]:
    """Every sequence table (task indices) of a task on several devices. Cut into row blocks over every device, a
    sequence table moves no more than whole (its blocks send the rows their ids looked up: ``sequence_row_dims``) and
    its lookups, a sequence kernel's costliest work, spread over the devices; a bag table's row blocks add a
    reduce-scatter of the whole batch's partial sums on every device. So all of them cut is a way of its own."""
    return [i for i, t in enumerate(task.tables) if t.sequence and task.num_devices > 1]


def row_split_choices(task: Task, mode: str, hot: Sequence[int] = ()) -> list[tuple[int, ...]]:
    """The sets of tables to cut row-wise that the stage tries, the plain search (no row split) first when it is
    one of them: the tables only rows fit; and those plus the tables larger than every device; and those plus the
    wide sequence tables (``wide_tables``); and those plus every sequence table (``sequence_tables``); and those plus
    the ``hot`` tables (``hot_tables``). A constrained table is
    never cut into rows by choice (its constraints name devices or shard counts of column splits); one that only rows
    can fit is refused with its constraint."""
    check_row_split(mode)
    must, may = oversized(task)
    for i in must:
        table = task.tables[i]
        where = f"table {table.id} ({task.table_mem_bytes(i) / GIB_BYTES:.2f} GiB)"
        if mode == "off":
            raise InfeasibleError(
                f"task infeasible: {where} fits no device even in its narrowest column slices; expected "
                "row_split=fit (row blocks over every device)"
            )
        if _constrained(table):
            raise InfeasibleError(
                f"task infeasible: {where} fits no device even in its narrowest column slices, and its constraints "
                "(pin, exclude, no_split, max_shards, colocate, sharding_types) rule out the row split over every "
                "device it needs"
            )
    if mode == "off":
        return [tuple(must)]
    choices = [tuple(must)]
    wide, sequence = wide_tables(task), sequence_tables(task)
    ways = [may, [*may, *wide], [*may, *sequence]]
    for more in [*ways, [*may, *sequence, *hot]] if mode == "hot" else ways:
        choice = tuple(sorted(set(must) | {i for i in more if _row_splittable(task, i)}))
        if choice not in choices:
            choices.append(choice)
    return choices


def _row_splittable(task: Task, table: int) -> bool:
    """A table that may be cut into rows by choice: unconstrained, with a row for every device, not in tiered memory
    (tiered memory holds the rows of a table too large for the devices: the planner keeps them whole, core.tiers)."""
    t = task.tables[table]
    return not _constrained(t) and t.rows >= task.num_devices and not t.cached


def _constrained(table) -> bool:
    """Constraints that rule out cutting the table into rows by choice: any but sharding types that allow rows."""
    return has_constraints([table.constrained(sharding_types=None)]) or not may_split_rows(table)


def row_blocks_of(task: Task, tables: Sequence[int], within_host: bool = False) -> tuple[Shard, ...]:
    """The row blocks of ``tables`` (task indices), each cut over every device in order (TorchRec's ``row_wise``);
    ``within_host``: over the devices of one host instead (``table_row_wise``: the table's ids and partial sums
    stay on the host's fast links), the host whose devices are least full after the blocks, largest table first;
    a table no host holds is cut over every device."""
    return _blocks(task, _layout(task, tables, within_host)[0])


def _blocks(task: Task, layout: list[tuple[int, list[int]]]) -> tuple[Shard, ...]:
    return tuple(s for t, devices in layout for s in row_shards(t, task.tables[t].rows, task.tables[t].dim, devices))


def _layout(task: Task, tables: Sequence[int], within_host: bool) -> tuple[list[tuple[int, list[int]]], np.ndarray]:
    """``row_blocks_of``'s choice as (table, the devices of its blocks in order) per table, and the bytes the blocks
    take on each device (i64[N]), without making the blocks."""
    groups = task.host_groups() if within_host else None
    everywhere = list(range(task.num_devices))
    used = np.zeros(task.num_devices, dtype=np.int64)
    if groups is None:
        for t in tables:
            used += task.row_block_bytes(t, task.num_devices)
        return [(t, everywhere) for t in tables], used
    caps = task.cap_bytes()
    hosts = np.array(groups)  # [H, devices per host]: the hosts are of equal size
    layout = []
    for t in sorted(tables, key=lambda t: (-task.table_mem_bytes(t), t)):
        chosen = None
        if task.tables[t].rows >= hosts.shape[1]:
            need = task.row_block_bytes(t, hosts.shape[1])  # block i goes to the i-th device of whichever host
            after = used[hosts] + need  # [H, devices per host]
            over_elsewhere = int((used > caps).sum()) - (used[hosts] > caps[hosts]).sum(axis=1)
            fits = (after <= caps[hosts]).all(axis=1) & (over_elsewhere == 0)
            if fits.any():
                fullest = (after / caps[hosts]).max(axis=1)
                chosen = int(np.flatnonzero(fits)[np.argmin(fullest[fits])])  # the first of the least full
        if chosen is None:  # no host holds it: over every device
            layout.append((t, everywhere))
            used += task.row_block_bytes(t, task.num_devices)
        else:
            layout.append((t, hosts[chosen].tolist()))
            used[hosts[chosen]] += need
    return layout, used


def settle(task: Task, tables: Sequence[int], within_host: bool = False) -> tuple[int, ...]:
    """``tables`` and the tables that no device holds whole once their row blocks are placed (the blocks take a
    share of every device: on a full task a table a little under the cap then fits nowhere), until none is left;
    constrained tables are not added (their constraints speak of whole tables and column slices)."""
    split = set(tables)
    whole = np.array([task.table_mem_bytes(i) for i in range(task.num_tables)], dtype=np.int64)
    while True:
        _, used = _layout(task, sorted(split), within_host)
        room = int((task.cap_bytes() - used).max())
        more = {i for i in np.flatnonzero(whole > room).tolist() if i not in split and _row_splittable(task, i)}
        if not more:
            return tuple(sorted(split))
        split |= more


def cut_rows(task: Task, tables: Sequence[int], within_host: bool = False) -> tuple[tuple[Shard, ...], Task, list[int]]:
    """The row blocks of ``tables`` (``row_blocks_of``), and the task the searcher plans around them: the other
    tables (and their task indices) on devices whose caps lose the blocks' memory. The layout is chosen once; a
    device that cannot hold its blocks is InfeasibleError before the blocks are made (thousands of tables on hundreds
    of devices are millions of blocks)."""
    layout, used = _layout(task, tables, within_host)
    split = set(tables)
    _check_room(task, used, split)
    return (_blocks(task, layout), *task_around(task, used, split))


def _check_room(task: Task, used: np.ndarray, split: set[int]) -> None:
    caps = task.cap_bytes()
    for d in np.flatnonzero(used > caps).tolist()[:1]:
        names = ", ".join(str(task.tables[t].id) for t in sorted(split))
        raise InfeasibleError(
            f"task infeasible: the row blocks of table(s) {names} over all {task.num_devices} devices need "
            f"{used[d] / GIB_BYTES:.3f} GiB on device {d}, which holds {task.caps_gb()[d]} GiB"
        )


def task_around(task: Task, used: np.ndarray, removed: set[int]) -> tuple[Task, list[int]]:
    """``task`` without the tables ``removed`` (task indices), and the task indices of those left, on devices whose
    caps lose ``used`` bytes each (i64[N]: what a stage placed before the search, row blocks or replicas)."""
    caps = task.cap_bytes()
    rest = [i for i in range(task.num_tables) if i not in removed]
    speeds, hosts = task.speeds(), task.hosts()
    links = None if task.links is None else dataclasses.replace(task.links, devices_per_host=None)  # hosts given
    tables = [task.tables[i] for i in rest]
    training = dataclasses.replace(task.training, reserve=0.0)  # the caps below are already net of it
    derived = Task(task.devices, task.batch_size, tables, task.precision, task.pool, links, training)
    # the derived task takes its own step's part off its caps again (``Task.cap_bytes``): given back here; a device
    # the blocks fill leaves a room of one byte: nothing else fits there, and the task stays well-formed
    step = derived.step_memory().total
    devices = [
        Device((max(int(caps[d] - used[d]), 1) + step) / GIB_BYTES, float(speeds[d]), hosts[d])
        for d in range(task.num_devices)
    ]
    return dataclasses.replace(derived, devices=tuple(devices)), rest


def join(task: Task, rest_plan: Plan | None, rest: Sequence[int], blocks: Sequence[Shard]) -> Plan:
    """The whole task's plan: ``rest_plan``'s shards (of ``cut_rows``' rest task) renumbered to the task's, and the
    row blocks."""
    shards = () if rest_plan is None else tuple(_renumber(s, rest[s.table]) for s in rest_plan.shards)
    merge = rest_plan is None or rest_plan.merge_column_wise
    return Plan(task, shards + tuple(blocks), merge_column_wise=merge)


def _renumber(shard: Shard, table: int) -> Shard:
    return Shard(table, shard.col_offset, shard.dim, shard.device, shard.row_offset, shard.num_rows)
