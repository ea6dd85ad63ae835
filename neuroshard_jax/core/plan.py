"""A sharding plan: every column of every table of a task on exactly one device (row blocks and data-parallel tables
too), its predicted costs and provenance; its file form is plan.json (``to_json``/``from_json``, through
``core.schema``)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

import numpy as np

from neuroshard_jax.core.config import plain, typed
from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.constraints import violations
from neuroshard_jax.core.errors import PlanError, UserError
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.memory import MemoryParts
from neuroshard_jax.core.records import (
    RECORD_TYPES,
    AutotuneRecord,
    CalibrationRecord,
    PolishRecord,
    PortfolioRecord,
    StageRecord,
)
from neuroshard_jax.core.schema import PlanFile
from neuroshard_jax.core.sharding import (
    Shard,
    column_shards,
    device_dim_sums,
    mixed_sequence_slices,
    tiling_error,
)
from neuroshard_jax.core.task import Task, memory_words


@dataclasses.dataclass(frozen=True)
class PlanCosts:
    """A plan's predicted costs in ms by the cost model ``cost_model``: per device (tuples of N floats) and the
    plan cost (``cost_models.plan_cost_ms``: the slowest device)."""

    compute_ms: tuple[float, ...]
    fwd_comm_ms: tuple[float, ...]
    bwd_comm_ms: tuple[float, ...]
    total_ms: tuple[float, ...]
    cost_ms: float
    cost_model: str
    # An ensemble's per-device relative spread of compute, and the weight its nets kept against the roofline
    # fallback (1: trusted; below 1: the members disagree, the prediction leans on the roofline). None otherwise.
    compute_spread: tuple[float, ...] | None = None
    trust: tuple[float, ...] | None = None


R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class Plan:
    """A sharding plan: every column of every table of ``task`` on exactly one device, but the ``data_parallel``
    tables (task indices, ascending), which every device holds whole: each device looks up its own slice of the
    batch (batch / N) and their gradients are all-reduced (TorchRec's data_parallel). They have no shards.

    ``costs`` (predicted, when the plan was scored), ``searcher``, ``seed`` and ``search_time_s`` say where it
    came from; they do not take part in equality. ``to_json`` / ``from_json`` are the plan.json contract.
    """

    task: Task
    shards: tuple[Shard, ...]
    costs: PlanCosts | None = dataclasses.field(default=None, compare=False)
    searcher: str | None = dataclasses.field(default=None, compare=False)
    seed: int | None = dataclasses.field(default=None, compare=False)
    search_time_s: float | None = dataclasses.field(default=None, compare=False)
    data_parallel: tuple[int, ...] = ()
    # what the planning run's stages recorded, in the order they made it, one record of a kind (``StageRecord``): a
    # portfolio's candidates, the cost model's calibration, autotune's measurements, measured polishing's
    records: tuple[StageRecord, ...] = dataclasses.field(default=(), compare=False)
    # the planning run's stages that acted, in order (``search.stages``; empty for a plan made by hand)
    stages: tuple[str, ...] = dataclasses.field(default=(), compare=False)
    # where the plan cuts a table in columns over devices, its whole tables that may be column-wise are declared
    # column-wise too (one shard each): TorchRec runs one input distribution, one all-to-all and one fused kernel a
    # device per sharding type, so one group in place of two (``column_wise_tables``). False: whole tables
    # stay table-wise (TorchRec's own plans, which say each table's type)
    merge_column_wise: bool = dataclasses.field(default=True, compare=False)

    def record_of(self, kind: type[R]) -> R | None:
        """The plan's record of ``kind`` (a ``StageRecord`` class), or None."""
        return next((r for r in self.records if isinstance(r, kind)), None)

    def with_record(self, kind: type[StageRecord], record: StageRecord | None) -> Plan:
        """The plan with ``record`` as its record of ``kind``: in the place of the one it had, else after the others
        (the latest made); None: without one."""
        if record is None:
            return dataclasses.replace(self, records=tuple(r for r in self.records if not isinstance(r, kind)))
        if self.record_of(kind) is None:
            return dataclasses.replace(self, records=(*self.records, record))
        return dataclasses.replace(self, records=tuple(record if isinstance(r, kind) else r for r in self.records))

    @property
    def polish(self) -> PolishRecord | None:
        """Measured polishing's record (``measure.polish``): measured per-device costs, measurements, improvement."""
        return self.record_of(PolishRecord)

    @property
    def calibration(self) -> CalibrationRecord | None:
        """The cost model's calibration to the measuring machine: factor, its spread, what was measured."""
        return self.record_of(CalibrationRecord)

    @property
    def portfolio(self) -> PortfolioRecord | None:
        """A portfolio's candidates (``searcher=portfolio``): each member's predicted cost, and which was chosen."""
        return self.record_of(PortfolioRecord)

    @property
    def autotune(self) -> AutotuneRecord | None:
        """Autotune's measurements: every candidate measured, and which was chosen."""
        return self.record_of(AutotuneRecord)

    @classmethod
    def from_assignment(cls, task: Task, num_splits: list[int], devices: list[list[int]]) -> Plan:
        """Plan from per-table shard counts (legal splits) and per-table lists of shard devices."""
        shards = []
        for t, (count, devs) in enumerate(zip(num_splits, devices)):
            if len(devs) != count:
                raise ValueError(f"table {t}: {len(devs)} devices for {count} shards")
            shards.extend(column_shards(t, task.tables[t].dim, devs))
        return cls(task, tuple(shards))

    def device_shards(self, device: int) -> list[Shard]:
        return [s for s in self.shards if s.device == device]

    def shards_of(self, table: int) -> list[Shard]:
        """The shards of task table ``table`` (an index), in column order (then row order)."""
        return sorted((s for s in self.shards if s.table == table), key=lambda s: (s.col_offset, s.row_offset))

    def placement(self) -> dict[str | int, list[tuple[int, ...]]]:
        """Per table (its name, else its id): its shards as (col_offset, dim, device), in column order; a row-split
        table's as (col_offset, dim, device, row_offset, num_rows), in column then row order; a data-parallel
        table's as (0, dim, device) for every device (each holds it whole)."""
        out: dict[str | int, list[tuple[int, ...]]] = {}
        replicated = [
            Shard(t, 0, self.task.tables[t].dim, d) for t in self.data_parallel for d in range(self.task.num_devices)
        ]
        for s in sorted([*self.shards, *replicated], key=_shard_order):
            table = self.task.tables[s.table]
            where = (s.col_offset, s.dim, s.device)
            if not s.whole_rows(table.rows):
                where += (s.row_offset, s.rows(table.rows))
            out.setdefault(table.id if table.name is None else table.name, []).append(where)
        return out

    def torchrec_shards(self) -> list[list[dict[str, float]]]:
        """Per task table: its shards as ``torchrec_format`` takes them, {col_offset, dim, rank} (and row_offset,
        num_rows for a row block; cache_load_factor for a table in tiered memory), in column then row order; a
        data-parallel table's is [{data_parallel: 1}]; a whole table declared column-wise (``merge_column_wise``)
        carries column_wise: 1 on its one shard."""
        declared = self.column_wise_tables()
        out: list[list[dict[str, int]]] = [[] for _ in self.task.tables]
        for t in self.data_parallel:  # every rank holds it: TorchRec's data_parallel
            out[t].append({"data_parallel": 1})
        for s in sorted(self.shards, key=_shard_order):
            shard = {"col_offset": s.col_offset, "dim": s.dim, "rank": s.device}
            rows = self.task.tables[s.table].rows
            if not s.whole_rows(rows):
                shard.update(row_offset=s.row_offset, num_rows=s.rows(rows))
            if self.task.tables[s.table].cached:  # tiered memory: TorchRec's fused_uvm_caching at this load factor
                shard["cache_load_factor"] = self.task.tables[s.table].cache_load_factor
            out[s.table].append(shard)
        for t in declared:
            if len(out[t]) == 1:
                out[t][0]["column_wise"] = 1
        return out

    def column_wise_tables(self) -> frozenset[int]:
        """The tables in TorchRec's column_wise group: those cut in columns (whole rows) over more than one device
        and, where there are any and ``merge_column_wise``, every other whole table that joins them
        (``Table.joins_column_group``; the data-parallel ones have no shards). Worked out once a plan: pricing, the
        input distributions, the export and plan.json each ask."""
        return self._column_group

    @functools.cached_property
    def _column_group(self) -> frozenset[int]:
        rows = self.task.table_rows()
        devices: dict[int, set[int]] = {}
        for s in self.shards:
            if s.whole_rows(rows[s.table]):
                devices.setdefault(s.table, set()).add(s.device)
        spread = frozenset(t for t, d in devices.items() if len(d) > 1)
        if not spread or not self.merge_column_wise:
            return spread
        cut_in_rows = {s.table for s in self.shards if not s.whole_rows(rows[s.table])}
        return spread | {t for t in devices if t not in cut_in_rows and self.task.tables[t].joins_column_group}

    def torchrec_names(self) -> list[str]:
        """The tables' names in TorchRec: their names, else ``t{index}``."""
        return [t.name if t.name is not None else f"t{i}" for i, t in enumerate(self.task.tables)]

    def dim_sums(self) -> np.ndarray:
        """i64[N]: each device's all-to-all width (``Task.shard_width``: pooled output, a row per id of a sequence
        table)."""
        return device_dim_sums(self.shards, self.task.num_devices, self.task.shard_width)

    def mem_bytes(self) -> np.ndarray:
        """i64[N]: memory of each device's tables while they train (``Task.device_memory``; a data-parallel table
        counts on every device), against ``Task.cap_bytes``; ``memory`` adds what the step holds for the batch."""
        return self.task.device_mem_bytes(self.shards, self.data_parallel)

    def memory(self) -> list[MemoryParts]:
        """Each device's memory by part: weights, optimizer state, the step's buffers (its shards' and its slice of
        the batch's, ``Task.step_memory``)."""
        step = self.task.step_memory()
        return [parts + step for parts in self.task.device_memory(self.shards, self.data_parallel)]

    def replicated_bytes(self) -> int:
        """Memory of the data-parallel tables, which every device holds."""
        return sum(self.task.table_mem_bytes(t) for t in self.data_parallel)

    def validate(self) -> Plan:
        """Raise PlanError unless every table is tiled exactly once (``sharding.tiling_error``) by shards on
        known devices, within every device's memory. Returns the plan."""
        task = self.task
        by_table: dict[int, list[Shard]] = {t: [] for t in range(task.num_tables)}
        if list(self.data_parallel) != sorted(set(self.data_parallel)) or not all(
            0 <= t < task.num_tables for t in self.data_parallel
        ):
            raise PlanError(
                f"plan: data_parallel {list(self.data_parallel)}, expected distinct ascending table indices "
                f"0..{task.num_tables - 1}"
            )
        for s in self.shards:
            if s.table not in by_table:
                raise PlanError(f"plan shard: table index {s.table} is not in the task (0..{task.num_tables - 1})")
            if not 0 <= s.device < task.num_devices:
                raise PlanError(
                    f"plan shard of table {task.tables[s.table].id}: device {s.device}, "
                    f"expected 0..{task.num_devices - 1}"
                )
            by_table[s.table].append(s)
        for t, shards in by_table.items():
            table = task.tables[t]
            if t in self.data_parallel:
                if shards:
                    raise PlanError(f"plan: table {table.id} is data-parallel (on every device) and also has shards")
                if table.cached:
                    raise PlanError(
                        f"plan: table {table.id} is data-parallel and in tiered memory (cache_load_factor "
                        f"{table.cache_load_factor:g}); expected one: a replica is a whole copy on every device"
                    )
                continue
            error = tiling_error(table.dim, table.rows, shards)
            if error:
                raise PlanError(f"plan: table {table.id} {error}")
        caps, rooms, step = task.cap_bytes(), task.room_bytes(), task.step_memory().total
        for d, used in enumerate(self.mem_bytes()):
            if used > caps[d]:
                raise PlanError(
                    f"plan: device {d} holds {(used + step) / GIB_BYTES:.3f} GiB while it trains, expected at most "
                    f"{rooms[d] / GIB_BYTES:.3f} GiB ({memory_words(task, self.memory()[d])})"
                )
        broken = violations(task.tables, self.shards, task.table_names(), self.data_parallel)
        if broken:
            raise PlanError(f"plan breaks {len(broken)} constraints: {broken[0]}")
        mixed = mixed_sequence_slices(task.tables, self.shards)
        if mixed:
            first = mixed[0]
            raise PlanError(
                f"plan: device {first.device} holds column slices {list(first.widths)} wide of sequence tables "
                f"{first.dim} wide; "
                "expected one width a device (TorchRec runs them in one FBGEMM unpooled kernel, which takes one)"
            )
        return self

    def to_json(self) -> JSONDoc:
        """The plan.json object (docs/plans.md: the contract read by the evaluator and outside tools)."""
        task = self.task
        parts = self.memory()
        dim_sums = self.dim_sums()
        out: dict[str, Any] = {}
        if self.searcher is not None:
            out["searcher"] = self.searcher
        if self.costs is not None:
            out["cost_model"] = self.costs.cost_model
        if self.seed is not None:
            out["seed"] = self.seed
        out["task"] = task.to_json()
        out["shards"] = [_shard_json(task, s) for s in sorted(self.shards, key=_shard_order)]
        if self.data_parallel:  # absent when none: a file without them reads as before
            out["data_parallel"] = [task.tables[t].id for t in self.data_parallel]
        if not self.merge_column_wise:  # absent when true, the rule's default
            out["merge_column_wise"] = False
        group = self.column_wise_tables()
        if group:  # for readers (the printout, outside tools); ignored on input: the rule above makes it
            out["column_wise"] = sorted(task.tables[t].id for t in group)
        if any(t.cached for t in task.tables):  # for readers: the tables in tiered memory keep their rows on the host
            out["host_mem_gb"] = task.host_mem_bytes() / GIB_BYTES
        held = np.bincount([s.device for s in self.shards], minlength=task.num_devices)
        devices = []
        for d in range(task.num_devices):
            device = {
                "device": d,
                "num_shards": int(held[d]),
                "mem_gb": float(parts[d].total / GIB_BYTES),
                "mem_parts_gb": {
                    "weights": float(parts[d].weights / GIB_BYTES),
                    "optimizer_state": float(parts[d].state / GIB_BYTES),
                    "step_buffers": float(parts[d].buffers / GIB_BYTES),
                },
                "dim_sum": int(dim_sums[d]),
            }
            if self.costs is not None:
                c = self.costs
                device["cost_ms"] = {
                    "compute": c.compute_ms[d],
                    "fwd_comm": c.fwd_comm_ms[d],
                    "bwd_comm": c.bwd_comm_ms[d],
                    "total": c.total_ms[d],
                }
                if c.compute_spread is not None:
                    device["model_spread"] = c.compute_spread[d]
                    device["model_trust"] = c.trust[d]
            devices.append(device)
        out["devices"] = devices
        if self.costs is not None:
            out["cost_ms"] = self.costs.cost_ms
        if self.search_time_s is not None:
            out["search_time_s"] = float(self.search_time_s)
        for kind in RECORD_TYPES:  # each stage's record under its own key, in one order whatever made them
            record = self.record_of(kind)
            if record is not None:
                out[kind.key] = record.to_json()
        if self.stages:
            out["stages"] = list(self.stages)
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str = "plan") -> Plan:
        """Parse and validate a plan.json object (costs and provenance are kept when present; numpy numbers and
        arrays are taken as Python's)."""
        obj = plain(obj)
        if not isinstance(obj, dict) or "task" not in obj or "shards" not in obj:
            raise UserError(f"{where}: expected a plan.json object with 'task' and 'shards'")
        raw = typed(PlanFile, obj, where)
        task = Task.from_json(raw.task, where=f"{where}.task")
        index = {t.id: i for i, t in enumerate(task.tables)}
        shards = []
        for i, s in enumerate(raw.shards):
            if s.table not in index:
                raise UserError(f"{where}.shards[{i}].table: got {s.table}, expected a table id of the task")
            shards.append(Shard(index[s.table], s.col_offset, s.dim, s.device, s.row_offset, s.num_rows))
        replicated = raw.data_parallel
        if not all(t in index for t in replicated) or len(set(replicated)) != len(replicated):
            raise UserError(
                f"{where}.data_parallel: got {list(replicated)!r:.80}, expected a list of distinct table ids of the "
                "task"
            )
        records = tuple(
            kind.from_json(getattr(raw, kind.key), f"{where}.{kind.key}")
            for kind in RECORD_TYPES
            if getattr(raw, kind.key) is not None
        )
        return cls(
            task,
            tuple(shards),
            _costs_from_json(raw, task.num_devices),
            raw.searcher,
            raw.seed,
            raw.search_time_s,
            tuple(sorted({index[t] for t in replicated})),
            records,
            tuple(raw.stages),
            # a file from before the rule: TorchRec's plans said each table's type, the rest read as they now run
            not str(raw.searcher).startswith("torchrec") if raw.merge_column_wise is None else raw.merge_column_wise,
        ).validate()


def _shard_order(s: Shard) -> tuple[int, int, int]:
    return s.table, s.col_offset, s.row_offset


def _shard_json(task: Task, s: Shard) -> JSONDoc:
    """A plan.json shard: the row range only for a row block, so a column-wise plan's file is unchanged."""
    out = {"table": task.tables[s.table].id, "col_offset": s.col_offset, "dim": s.dim, "device": s.device}
    rows = task.tables[s.table].rows
    if not s.whole_rows(rows):
        out.update(row_offset=s.row_offset, num_rows=s.rows(rows))
    return out


def _costs_from_json(raw: PlanFile, num_devices: int) -> PlanCosts | None:
    """The predicted costs of a parsed plan.json object, or None when it has none (or not all of them)."""
    devices = raw.devices
    try:
        per_device = [devices[d]["cost_ms"] for d in range(num_devices)]
        columns = [tuple(float(c[k]) for c in per_device) for k in ("compute", "fwd_comm", "bwd_comm", "total")]
        unsure = [None, None]
        if all("model_spread" in devices[d] for d in range(num_devices)):
            unsure = [tuple(float(devices[d][k]) for d in range(num_devices)) for k in ("model_spread", "model_trust")]
        return PlanCosts(*columns, float(raw.cost_ms), str(raw.cost_model), *unsure)
    except (KeyError, TypeError, ValueError, IndexError):
        return None
