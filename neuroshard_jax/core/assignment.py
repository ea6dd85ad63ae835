"""A plan as the devices of each table's column slices, and back: what perturbations, polishing and plan labels
move (a row-split table's row blocks are not slices: they stay where they are); and the plan's collectives as the
devices take part in them: the all-to-all widths, the row groups, the input distributions (``costs.scoring`` prices
them)."""

from __future__ import annotations

import dataclasses

import numpy as np

from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard, column_shards
from neuroshard_jax.core.task import Task


def assignment(plan: Plan) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """(slices per table, each table's slice devices in column order) of a plan's column slices. A row-split table
    has none: its row blocks stay where they are (``row_blocks_in``), perturbations move column slices only."""
    by_table: dict[int, list[Shard]] = {t: [] for t in range(plan.task.num_tables)}
    for s in plan.shards:
        by_table[s.table].append(s)
    rows = plan.task.table_rows()
    devices = tuple(
        ()
        if any(not s.whole_rows(rows[t]) for s in by_table[t])
        else tuple(s.device for s in sorted(by_table[t], key=lambda s: s.col_offset))
        for t in by_table
    )
    return tuple(len(d) for d in devices), devices


def row_blocks_in(plan: Plan) -> tuple[Shard, ...]:
    """The shards of the plan's row-split tables."""
    rows = plan.task.table_rows()
    split = {s.table for s in plan.shards if not s.whole_rows(rows[s.table])}
    return tuple(s for s in plan.shards if s.table in split)


def plan_of(
    task: Task,
    devices,
    row_blocks: tuple[Shard, ...] = (),
    data_parallel: tuple[int, ...] = (),
    merge_column_wise: bool = True,
) -> Plan:
    """The plan of the tables' column slice devices (``assignment``), the row-split tables' ``row_blocks`` and the
    ``data_parallel`` tables (which have no slices: they stay on every device); ``merge_column_wise`` as
    ``Plan``'s (the plan it perturbs)."""
    shards = [s for t, devs in enumerate(devices) if devs for s in column_shards(t, task.tables[t].dim, devs)]
    return Plan(task, tuple(shards) + row_blocks, data_parallel=data_parallel, merge_column_wise=merge_column_wise)


def row_groups(plan: Plan) -> list[tuple[int, list[int]]]:
    """The plan's row-split groups: (width, sorted devices) per set of devices holding row blocks, the widths of
    every column range cut into row blocks over that set added up (TorchRec fuses a sharding group's outputs). The
    data-parallel tables' gradient all-reduce is a group over every device (``replica_width``). A sequence table's
    row blocks are no group: they reduce nothing, each sends the rows its ids looked up (``sequence_row_dims``)."""
    rows = plan.task.table_rows()
    ranges: dict[tuple[int, int, int], set[int]] = {}
    for s in plan.shards:
        if not s.whole_rows(rows[s.table]) and not plan.task.tables[s.table].sequence:
            ranges.setdefault((s.table, s.col_offset, plan.task.tables[s.table].width(s.dim)), set()).add(s.device)
    widths: dict[tuple[int, ...], int] = {}
    for (_, _, dim), devices in ranges.items():
        key = tuple(sorted(devices))
        widths[key] = widths.get(key, 0) + dim
    if plan.data_parallel and plan.task.num_devices > 1:
        every = tuple(range(plan.task.num_devices))
        widths[every] = widths.get(every, 0) + replica_width(plan)
    return [(width, list(devices)) for devices, width in sorted(widths.items())]


def replica_width(plan: Plan) -> int:
    """The data-parallel tables' gradient all-reduce as a row group's width: a ring all-reduce of E elements is a
    reduce-scatter and an all-gather of them, and a row group of width w moves batch x w elements each way, so
    w = ceil(E / batch). The row groups' fitted collectives (``row_comm.py``) and the comm benchmark price and
    measure it that way."""
    elements = sum(plan.task.tables[t].size for t in plan.data_parallel)
    return -(-elements // plan.task.batch_size)


def all_to_all_widths(plan: Plan) -> list[int]:
    """Each device's all-to-all width: the widths of its whole-row shards (table-wise and column-wise) and of its
    sequence tables' row blocks (``sequence_row_dims``); a bag table's row blocks are row groups (``row_groups``)."""
    rows = plan.task.table_rows()
    dims = [0] * plan.task.num_devices
    for s in plan.shards:
        if s.whole_rows(rows[s.table]) or plan.task.tables[s.table].sequence:
            dims[s.device] += plan.task.shard_width(s)
    return dims


def sequence_row_dims(plan: Plan) -> list[int]:
    """Each device's width in the sequence row-wise all-to-all: its sequence tables' row blocks, a row per id that
    landed in the block (``Task.shard_width``). TorchRec's sequence row_wise sharding reduces nothing: each block
    sends the rows its ids looked up back to the samples' ranks, an all-to-all of its own (one per sharding type), so
    a sequence table cut into row blocks moves what it moves whole (ids x dim), spread over the blocks' devices."""
    rows = plan.task.table_rows()
    dims = [0] * plan.task.num_devices
    for s in plan.shards:
        if plan.task.tables[s.table].sequence and not s.whole_rows(rows[s.table]):
            dims[s.device] += plan.task.shard_width(s)
    return dims


def column_wise_dims(plan: Plan) -> list[int]:
    """Each device's width in the column-wise all-to-all: its shards of the column-wise group
    (``Plan.column_wise_tables``: tables cut in columns over more than one device and, merged with them, the plan's
    other whole tables that may be column-wise). TorchRec runs one input distribution and one output all-to-all per
    sharding type, so a plan with column-wise tables beside table-wise ones runs two all-to-alls a step, and one where
    the whole tables join the column-wise group; all zero without column-wise tables. A table whose slices all sit on
    one device is one shard: the pipeline merges them back (``sharding.merge_colocated``), and the searchers price it
    so."""
    rows = plan.task.table_rows()
    spread = plan.column_wise_tables()
    dims = [0] * plan.task.num_devices
    for s in plan.shards:
        if s.table in spread and s.whole_rows(rows[s.table]):
            dims[s.device] += plan.task.shard_width(s)
    return dims


def all_to_all_dims(plan: Plan, rows_apart: bool) -> np.ndarray:
    """f32[N]: each device's all-to-all width: its whole-row shards' and sequence row blocks' (``rows_apart``: the bag
    tables' row blocks and the data-parallel all-reduce are row groups of their own), else every shard's and the
    replicas' all-reduce as width."""
    if rows_apart:
        return np.asarray(all_to_all_widths(plan), dtype=np.float32)
    # without a row-comm fit, row blocks and the data-parallel all-reduce are priced as all-to-all width
    return (plan.dim_sums() + replicated_width(plan)).astype(np.float32)


def replicated_width(plan: Plan) -> int:
    """The data-parallel tables' all-reduce as an all-to-all width on every device (0 on one device)."""
    return replica_width(plan) if plan.data_parallel and plan.task.num_devices > 1 else 0


# all-to-alls apart from the table-wise one: the column-wise tables', as width the replicas' and the bag row blocks',
# and the sequence row blocks'
APART = 4


def apart_arrays(plan: Plan, rows_apart: bool = False) -> np.ndarray:
    """f32[APART, N]: the parts of ``plan_arrays``' all-to-all widths that are collectives of their own (TorchRec runs
    one per sharding type), priced as all-to-alls (``combine_costs``' ``apart``): the column-wise tables' widths
    (``column_wise_dims``); for a model without a row-comm fit (with one, they are row groups: ``fitted_ms``), the
    data-parallel tables' all-reduce and the bag tables' row blocks' widths; the sequence row-wise all-to-all
    (``sequence_row_dims``)."""
    out = np.zeros((APART, plan.task.num_devices), np.float32)
    out[0] = column_wise_dims(plan)
    if not rows_apart:
        out[1] = replicated_width(plan)
        out[2] = plan.dim_sums() - np.asarray(all_to_all_widths(plan))  # bag row blocks' widths
    out[3] = sequence_row_dims(plan)
    return out


INPUT_TYPES = ("table_wise", "column_wise", "row_wise")  # the input distributions a plan runs, in this order


def input_features(plan: Plan) -> dict[str, list[list[float]]]:
    """TorchRec's input distributions of ``plan``, one per sharding type that moves ids (``INPUT_TYPES``): for each
    device, the ids per sample of each feature it takes. A table-wise table's feature goes to its one device (its
    slices sitting there are one shard, ``sharding.merge_colocated``); a column-wise table's goes whole to every
    device holding a slice of it; a row-split table's ids go to the row blocks holding their rows (a block's
    measured pooling factor, else its rows' share); a data-parallel table's stay on the device that read them."""
    rows = plan.task.table_rows()
    spread = plan.column_wise_tables()
    taken: dict[str, dict[tuple, float]] = {kind: {} for kind in INPUT_TYPES}
    for s in plan.shards:
        table = plan.task.tables[s.table]
        if s.whole_rows(rows[s.table]):
            kind = "column_wise" if s.table in spread else "table_wise"
            taken[kind][(s.table, s.device)] = table.pooling_factor
        else:
            stats = table.block_stats(s.row_offset, s.rows(table.rows))
            pooling = stats[0] if stats else table.pooling_factor * s.rows(table.rows) / table.rows
            key = (s.table, s.col_offset, s.device)
            taken["row_wise"][key] = taken["row_wise"].get(key, 0.0) + pooling
    out = {}
    for kind, features in taken.items():
        if features:
            per_device: list[list[float]] = [[] for _ in range(plan.task.num_devices)]
            for key, pooling in sorted(features.items()):
                per_device[key[-1]].append(round(pooling, 3))
            out[kind] = per_device
    return out


@dataclasses.dataclass(frozen=True)
class CommLayout:
    """What the comm benchmark exchanges for a plan (``comm_layout``): each device's all-to-all width ``dim_sums``, of
    which ``column_wise`` and ``row_wise`` (empty where the plan has none) are all-to-alls of their own, the bag tables'
    ``row_groups`` ([width, sorted devices]) and the input distributions ``inputs`` (per sharding type, each device's
    features' ids per sample)."""

    dim_sums: list[int]
    column_wise: list[int] = dataclasses.field(default_factory=list)
    row_wise: list[int] = dataclasses.field(default_factory=list)
    row_groups: list[list] = dataclasses.field(default_factory=list)
    inputs: list[list[list[float]]] = dataclasses.field(default_factory=list)

    def to_json(self) -> JSONDoc:
        """As a comm request takes it (``CommRequest.of``): ``dim_sums`` and the parts the plan has."""
        parts = ("column_wise", "row_wise", "row_groups", "inputs")
        return {"dim_sums": self.dim_sums, **{k: getattr(self, k) for k in parts if getattr(self, k)}}


def comm_layout(plan: Plan) -> CommLayout:
    """What the comm benchmark exchanges for ``plan``: each device's all-to-all width (``dim_sums``: its whole-row
    shards and sequence row blocks), of which ``column_wise`` (present where the plan has column-wise tables:
    ``column_wise_dims``) and ``row_wise`` (sequence row blocks: ``sequence_row_dims``) are all-to-alls of their own
    after the table-wise one, and the bag tables' row-split groups (``row_groups``: [width, sorted
    devices], one per set of devices, the widths of every column range cut into row blocks over them added up:
    TorchRec fuses a sharding group's outputs into one reduce-scatter of partial sums forward and one all-gather
    backward, row_wise and table_row_wise), and the input distributions before them (``inputs``: per sharding type,
    each device's features' ids per sample, ``input_features``)."""
    column_wise = column_wise_dims(plan)
    row_wise = sequence_row_dims(plan)
    return CommLayout(
        all_to_all_widths(plan),
        column_wise if any(column_wise) else [],
        row_wise if any(row_wise) else [],
        [[width, devices] for width, devices in row_groups(plan)],
        list(input_features(plan).values()),
    )


def crosses_hosts(plan: Plan, devices: list[int]) -> bool:
    hosts = plan.task.hosts()
    return len({hosts[d] for d in devices}) > 1
