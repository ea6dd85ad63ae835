"""Row splits, the stage before a searcher: tables cut row-wise over every device, where that may beat columns.

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

On several hosts of equal size each cut is also tried with its blocks within one host (``table_row_wise``); tables
that no device holds once the blocks are placed are cut too (``settle``).

The searcher does not see the blocks' compute: over every device they add about 1/N of the table's work to every
device alike, which shifts every device and leaves the balance it seeks (within one host they do not: that choice
is kept only where the whole plan, scored with the blocks, comes out cheaper). Blocks of a table with its own block
statistics (``Table.row_blocks``) may be far from alike: ``search.loaded_rest`` then also plans the rest on the
room they leave each device. NumPy only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.constraints import has_constraints, may_split_rows
from neuroshard_jax.core.devices import Device
from neuroshard_jax.core.errors import InfeasibleError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard, check_row_split, narrowest_dim, row_shards
from neuroshard_jax.core.task import Task


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


def row_split_choices(task: Task, mode: str, hot: Sequence[int] = ()) -> list[tuple[int, ...]]:
    """The sets of tables to cut row-wise that the stage tries, the plain search (no row split) first when it is
    one of them: the tables only rows fit; and those plus the tables larger than every device; and those plus the
    ``hot`` tables (``hot_tables``). A constrained table is never cut into rows by choice (its constraints name
    devices or shard counts of column splits); one that only rows can fit is refused with its constraint."""
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
    for more in (may, [*may, *hot]) if mode == "hot" else (may,):
        choice = tuple(sorted(set(must) | {i for i in more if _row_splittable(task, i)}))
        if choice not in choices:
            choices.append(choice)
    return choices


def _row_splittable(task: Task, table: int) -> bool:
    """A table that may be cut into rows by choice: unconstrained, with a row for every device."""
    return not _constrained(task.tables[table]) and task.tables[table].rows >= task.num_devices


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
    return Plan(task, shards + tuple(blocks))


def _renumber(shard: Shard, table: int) -> Shard:
    return Shard(table, shard.col_offset, shard.dim, shard.device, shard.row_offset, shard.num_rows)
