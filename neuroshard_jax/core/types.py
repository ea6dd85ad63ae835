"""Shared host-side types: tables, tasks, shards and plans (frozen; nothing is mutated in place), and their file
schema.

A task file is exactly the object found under ``"task"`` in plan.json, and plan.json is ``Plan.to_json()``. Files are
parsed by ``core.config.typed``, the one mechanism that parses configs too, through the file's schema (``TaskFile``,
``TableFile``, ``RowBlocksFile``, ``PlanFile``, ``ShardFile``, and ``Device``, ``Links``, ``PoolSpec`` themselves):
types and bounds from the fields, unknown keys refused naming the nearest, then the rules across fields. Validation
of untrusted input raises ``UserError`` naming the field, the value and what was expected. The rules of shard
geometry (splits, memory, tiling) are ``neuroshard_jax.core.sharding``'s; the types only call them.

Why one module of ~900 lines: the schema of each file sits beside the type it reads into and writes from
(``to_json``/``from_json``), so that the contract of plan.json is read, and changed, in one place.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

import numpy as np

from neuroshard_jax.core.config import bounded, plain, typed
from neuroshard_jax.core.constants import BYTES_PER_ELEMENT, DIM_ALIGNMENT, GENERATOR_VERSION, GIB_BYTES, MAX_CAP_GB
from neuroshard_jax.core.constraints import SHARDING_TYPES, violations
from neuroshard_jax.core.errors import PlanError, UserError
from neuroshard_jax.core.features import NUM_BINS, feature_matrix
from neuroshard_jax.core.memory import PLAIN_SGD, MemoryParts, Training, gib, shard_memory, step_memory
from neuroshard_jax.core.paths import pool_file_digest
from neuroshard_jax.core.records import CalibrationRecord, PolishRecord
from neuroshard_jax.core.sharding import (
    Shard,
    column_shards,
    device_dim_sums,
    is_legal_dim,
    row_block_size,
    row_blocks,
    tiling_error,
)

__all__ = ["Device", "Links", "Plan", "PlanCosts", "RowBlockStats", "Shard", "Table", "Task"]


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    """How to obtain a pool; stored in task files so that streams can be regenerated."""

    source: str = "synthetic"  # synthetic (from the seed) | dlrm (a DLRM benchmark file at pool.path)
    seed: int = 0
    num_tables: int = 856
    path: str | None = None

    def __post_init__(self):
        if self.source not in ("synthetic", "dlrm"):
            raise UserError(f"pool.source: got {self.source!r}, expected 'synthetic' or 'dlrm'")
        if self.source == "synthetic" and self.num_tables < 1:
            raise UserError(f"pool.num_tables: got {self.num_tables}, expected a positive integer")
        if self.source == "dlrm" and not self.path:
            raise UserError("pool.path: missing, expected the path of a DLRM benchmark file for source 'dlrm'")

    @property
    def pool_id(self) -> str:
        if self.source == "synthetic":
            return f"synthetic-v{GENERATOR_VERSION}-s{self.seed}-n{self.num_tables}"
        return f"dlrm-{pool_file_digest(Path(self.path))}"

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, obj: dict, where: str = "pool") -> PoolSpec:
        """A task file's ``pool`` (its schema: this class; an unknown key is refused, naming the nearest)."""
        return typed(cls, obj, where)


@dataclasses.dataclass(frozen=True)
class RowBlockStats:
    """Statistics of a table's ``count`` row blocks (TorchRec's row-wise layout, ``sharding.row_blocks``) measured
    from the user's data: per block, its pooling factor (its lookups per sample; they sum to the table's) and its
    own access histogram (``bins``: 17 shares, all 0 for a block never looked up). Hot rows are rarely spread
    evenly over row ranges: ids sorted by frequency put them all in the first block, hashed ids put a very hot row
    in one block, and a block's cost follows its own lookups."""

    count: int
    pooling_factors: tuple[float, ...]
    bins: tuple[tuple[float, ...], ...]

    def __post_init__(self):
        if len(self.pooling_factors) != self.count or len(self.bins) != self.count:
            raise ValueError(f"RowBlockStats: {self.count} blocks, expected as many pooling factors and histograms")


@dataclasses.dataclass(frozen=True)
class Table:
    """One embedding table of a task. ``id`` is its id in the pool it was drawn from (or its position, for
    tables given by the user); ``name`` is the user's name for it, if any."""

    id: int
    rows: int
    dim: int
    pooling_factor: float
    bins: tuple[float, ...]
    name: str | None = None
    # statistics assumed (``stats.estimated_stats``), not measured from the user's data: the plan warns
    estimated: bool = False
    # placement constraints (``constraints.py``): a device for every shard, devices to avoid, no column split or at
    # most K shards, a group of tables kept on one device
    pin: int | None = None
    exclude: tuple[int, ...] = ()
    no_split: bool = False
    max_shards: int | None = None
    colocate: str | None = None
    sharding_types: tuple[str, ...] | None = None  # TorchRec's names (constraints.SHARDING_TYPES); None: any
    # measured statistics of its row blocks, per block count (``stats``: from the user's data); a block of a count
    # not given is assumed to do its rows' share of the lookups with the table's histogram
    row_blocks: tuple[RowBlockStats, ...] = ()

    @property
    def size(self) -> int:
        """Elements (rows * dim)."""
        return self.rows * self.dim

    def block_stats(self, row_offset: int, num_rows: int) -> tuple[float, tuple[float, ...]] | None:
        """(pooling factor, bins) measured for the row block [row_offset, row_offset + num_rows), or None when no
        block count given in ``row_blocks`` has that block."""
        for stats in self.row_blocks:
            layout = row_blocks(self.rows, stats.count)
            if (row_offset, num_rows) in layout:
                i = layout.index((row_offset, num_rows))
                return stats.pooling_factors[i], stats.bins[i]
        return None


@dataclasses.dataclass(frozen=True)
class Device:
    """One device of a heterogeneous task: its memory cap for tables, its relative compute speed (a device's
    predicted compute is divided by its speed: 2.0 computes twice as fast as 1.0) and the host it sits in (a
    task's ``links`` say how fast devices talk within a host and between hosts)."""

    mem_cap_gb: float = bounded(above=0, at_most=MAX_CAP_GB)
    speed: float = bounded(above=0, default=1.0)
    host: int = bounded(at_least=0, default=0)


@dataclasses.dataclass(frozen=True)
class Links:
    """A multi-host task's bandwidths per device in GB/s: between devices of one host (NVLink, shared memory) and
    between hosts (the network)."""

    intra_host_gbps: float = bounded(above=0)
    inter_host_gbps: float = bounded(above=0)
    # hosts of consecutive devices, for a task whose devices carry no host of their own: device d is in host
    # d // devices_per_host (8 GPUs per host: 512 devices are 64 hosts)
    devices_per_host: int | None = bounded(at_least=1, default=None)

    def comm_scale(self, hosts: list[int]) -> np.ndarray:
        """f64[N]: how much longer each device's all-to-all takes than on one host (``hosts``: each device's host).

        Every device exchanges with every other, so a share ``f = off-host peers / (N - 1)`` of its bytes crosses
        the network: its time is ``(1 - f) + f * intra / inter`` times the one-host time the comm labels measure
        (bytes over bandwidth, the two links used in turn). An analytic extrapolation, stated as such: the labels
        are all-to-alls of at most 8 ranks on one machine."""
        n = len(hosts)
        if n < 2:
            return np.ones(n)
        per_host = {h: hosts.count(h) for h in set(hosts)}
        off_host = np.array([(n - per_host[h]) / (n - 1) for h in hosts])
        return (1.0 - off_host) + off_host * (self.intra_host_gbps / self.inter_host_gbps)


@dataclasses.dataclass(frozen=True)
class Task:
    """Tables to shard over ``devices`` (each with its memory cap for tables, relative compute speed and host);
    ``Task.uniform(num_devices, mem_cap_gb, ...)`` builds a task of identical devices of speed 1."""

    devices: tuple[Device, ...]
    batch_size: int
    tables: tuple[Table, ...]
    precision: str = "fp32"
    pool: PoolSpec | None = None
    links: Links | None = None
    training: Training = PLAIN_SGD  # the fused optimizer and the cap's reserve: what memory holds (core.memory)

    def __post_init__(self):
        object.__setattr__(self, "devices", tuple(self.devices))
        if not self.devices:
            raise ValueError("task: no devices, expected at least one")
        if any(not (0 < d.mem_cap_gb <= MAX_CAP_GB and d.speed > 0) for d in self.devices):
            raise ValueError(f"task: device caps must be in (0, {MAX_CAP_GB}] GiB and speeds > 0, got {self.devices}")
        if self.links is not None:
            if not (self.links.intra_host_gbps > 0 and self.links.inter_host_gbps > 0):
                raise ValueError(f"task: link bandwidths must be > 0, got {self.links}")
            if self.links.devices_per_host and any(d.host for d in self.devices):
                raise ValueError("task: devices_per_host given beside the devices' own hosts; expected one")

    @classmethod
    def uniform(
        cls,
        num_devices: int,
        mem_cap_gb: float,
        batch_size: int,
        tables,
        precision: str = "fp32",
        pool: PoolSpec | None = None,
        links: Links | None = None,
        training: Training = PLAIN_SGD,
    ) -> Task:
        """A task of ``num_devices`` identical devices of ``mem_cap_gb`` GiB each and speed 1."""
        return cls((Device(mem_cap_gb),) * num_devices, batch_size, tuple(tables), precision, pool, links, training)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def is_uniform(self) -> bool:
        """Whether every device is the same, of speed 1 in host 0 (a task file then names their count and cap)."""
        return all(d == Device(self.devices[0].mem_cap_gb) for d in self.devices)

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def largest_cap_gb(self) -> float:
        """The largest device's cap in GiB (every device's, for a uniform task)."""
        return max(d.mem_cap_gb for d in self.devices)

    @property
    def largest_cap_bytes(self) -> int:
        """The largest device's cap in bytes (every device's, for a uniform task)."""
        return int(self.largest_cap_gb * GIB_BYTES)

    @property
    def has_speeds(self) -> bool:
        """Whether some device's speed is not 1 (its compute is scaled)."""
        return any(d.speed != 1.0 for d in self.devices)

    def cap_bytes(self) -> np.ndarray:
        """i64[N]: the bytes each device has for its tables' shards: its cap less the training's reserve share and
        less what every device holds for its slice of the batch (``step_memory``); 0 where that leaves none."""
        return np.maximum(self.room_bytes() - self.step_memory().total, 0)

    def room_bytes(self) -> np.ndarray:
        """i64[N]: each device's memory for training: its cap less the training's reserve share."""
        keep = 1.0 - self.training.reserve
        return np.array([int(cap * keep * GIB_BYTES) for cap in self.caps_gb()], dtype=np.int64)

    def step_memory(self) -> MemoryParts:
        """What every device holds for its own slice of the batch, whatever tables it holds (``core.memory``);
        computed once per task (``cap_bytes`` asks for it on every call)."""
        return self._step

    @functools.cached_property
    def _step(self) -> MemoryParts:
        return step_memory(
            self.batch_size,
            self.num_devices,
            sum(t.dim for t in self.tables),
            sum(t.pooling_factor for t in self.tables),
            self.num_tables,
        )

    def caps_gb(self) -> list[float]:
        """Each device's memory cap in GiB."""
        return [d.mem_cap_gb for d in self.devices]

    def speeds(self) -> np.ndarray:
        """f64[N]: each device's relative compute speed."""
        return np.array([d.speed for d in self.devices], dtype=np.float64)

    def hosts(self) -> list[int]:
        """Each device's host: consecutive groups of ``links.devices_per_host`` where given, else the devices' own."""
        if self.links is not None and self.links.devices_per_host:
            return [d // self.links.devices_per_host for d in range(self.num_devices)]
        return [d.host for d in self.devices]

    def comm_scale(self) -> np.ndarray:
        """f64[N]: each device's all-to-all time relative to one host (``Links.comm_scale``; 1 without links)."""
        if self.links is None:
            return np.ones(self.num_devices)
        return self.links.comm_scale(self.hosts())

    def local_size(self) -> int | None:
        """Devices per host where the task spans several hosts of equal size, each holding consecutive devices (the
        layout TorchRec's topology assumes); None for one host or any other layout."""
        hosts = self.hosts()
        if not self.multi_host:
            return None
        local = hosts.count(hosts[0])
        regular = self.num_devices % local == 0 and all(h == hosts[(d // local) * local] for d, h in enumerate(hosts))
        return local if regular and len(set(hosts)) == self.num_devices // local else None

    def host_groups(self) -> list[list[int]] | None:
        """Each host's devices, where the task spans several hosts of the same size holding consecutive devices (the
        layout TorchRec's ``table_row_wise`` runs on); None otherwise."""
        local = self.local_size()
        if local is None:
            return None
        return [list(range(h * local, (h + 1) * local)) for h in range(self.num_devices // local)]

    @property
    def multi_host(self) -> bool:
        """Whether the devices sit in more than one host (the comm is then scaled by ``comm_scale``)."""
        return self.links is not None and len(set(self.hosts())) > 1

    def describe_devices(self) -> str:
        """The devices in a few words, for messages: ``4 x 2.0 GiB`` or ``4 devices of 1.0-8.0 GiB``."""
        if self.is_uniform:
            return f"{self.num_devices} x {self.devices[0].mem_cap_gb} GiB"
        caps = self.caps_gb()
        return f"{self.num_devices} devices of {min(caps)}-{max(caps)} GiB ({sum(caps):.2f} GiB in all)"

    def need_words(self) -> str:
        """``tables need 0.000139 GiB of 4 x 0.001 GiB``: what the tables take and where, for messages."""
        need = sum(self.table_mem_bytes(i) for i in range(self.num_tables))
        return f"tables need {gib(need)} GiB of {self.describe_devices()}"

    def table_mem_bytes(self, index: int, dim: int | None = None) -> int:
        """Memory of table ``index`` while it trains (of a column shard of it when ``dim`` is given): weights,
        optimizer state and the step's buffers (``core.memory``)."""
        table = self.tables[index]
        return self.rows_memory(index, table.rows, table.dim if dim is None else dim).total

    def rows_memory(self, index: int, rows: int, dim: int) -> MemoryParts:
        """The parts of ``rows`` rows x ``dim`` columns of table ``index`` (a row block looks up its rows' share
        of the table's ids, taken as even)."""
        table = self.tables[index]
        ids = table.pooling_factor * rows / table.rows
        return shard_memory(rows, dim, ids, self.batch_size, self.precision, self.training.state)

    def row_block_bytes(self, index: int, count: int, dim: int | None = None) -> np.ndarray:
        """i64[count]: the bytes of each of the ``count`` row blocks of table ``index`` (``sharding.row_blocks``:
        ceil-sized blocks in order, the last ones shorter or empty; ``dim`` columns, default all), each distinct
        size worked out once."""
        table = self.tables[index]
        block = row_block_size(table.rows, count)
        sizes = np.clip(table.rows - block * np.arange(count, dtype=np.int64), 0, block)
        dim = table.dim if dim is None else dim
        distinct, which = np.unique(sizes, return_inverse=True)
        return np.array([self.rows_memory(index, int(c), dim).total for c in distinct], dtype=np.int64)[which]

    def device_memory(self, shards, replicated: tuple[int, ...] = ()) -> list[MemoryParts]:
        """Each device's memory by part, holding ``shards`` and the ``replicated`` tables (task indices) whole."""
        out = [MemoryParts()] * self.num_devices
        for s in shards:
            out[s.device] = out[s.device] + self.rows_memory(s.table, s.rows(self.tables[s.table].rows), s.dim)
        for t in replicated:
            whole = self.rows_memory(t, self.tables[t].rows, self.tables[t].dim)
            out = [parts + whole for parts in out]
        return out

    def device_mem_bytes(self, shards, replicated: tuple[int, ...] = ()) -> np.ndarray:
        """i64[N]: each device's bytes holding ``shards`` (and ``replicated`` tables whole): ``device_memory``'s
        totals, each distinct shape of shard worked out once (thousands of row blocks are a few shapes)."""
        out = np.zeros(self.num_devices, dtype=np.int64)
        if shards:
            rows = self.table_rows()
            totals: dict[tuple[int, int, int], int] = {}
            keys = [(s.table, s.rows(rows[s.table]), s.dim) for s in shards]
            for key in keys:
                if key not in totals:
                    totals[key] = self.rows_memory(*key).total
            np.add.at(out, [s.device for s in shards], [totals[key] for key in keys])
        for t in replicated:
            out += self.table_mem_bytes(t)
        return out

    def table_names(self) -> list[str]:
        """Each table's name, else its id, as text (for messages)."""
        return [t.name if t.name is not None else str(t.id) for t in self.tables]

    def table_rows(self) -> list[int]:
        return [t.rows for t in self.tables]

    def features(self) -> np.ndarray:
        """Raw features f64[T, 21] in FEATURE_NAMES order."""
        return feature_matrix(
            [t.rows for t in self.tables],
            [t.dim for t in self.tables],
            [t.pooling_factor for t in self.tables],
            [t.bins for t in self.tables],
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "num_devices": self.num_devices,
            "mem_cap_gb": self.largest_cap_gb,
            **({"devices": _devices_json(self.devices)} if not self.is_uniform else {}),
            **({"links": _links_json(self.links)} if self.links is not None else {}),
            "batch_size": self.batch_size,
            "precision": self.precision,
            **({"optimizer": self.training.optimizer} if self.training.optimizer != Training.optimizer else {}),
            **({"mem_reserve": self.training.reserve} if self.training.reserve else {}),
            "tables": [
                {
                    "id": t.id,
                    **({"name": t.name} if t.name is not None else {}),
                    "rows": t.rows,
                    "dim": t.dim,
                    "pooling_factor": t.pooling_factor,
                    "size": t.size,
                    "bins": list(t.bins),
                    **({"estimated": True} if t.estimated else {}),
                    **_constraints_json(t),
                    **({"row_blocks": row_blocks_json(t.row_blocks)} if t.row_blocks else {}),
                }
                for t in self.tables
            ],
        }
        if self.pool is not None:
            out["pool"] = self.pool.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str = "task") -> Task:
        """Parse and validate a task object (numpy numbers and arrays taken as Python's) through its schema
        (``TaskFile``, ``TableFile``: ``core.config.typed``, then the rules across fields); errors name
        ``where.field``, and a table by its name where it has one (``where.tables['user_id'].rows``)."""
        obj = plain(obj)
        if not isinstance(obj, dict):
            raise UserError(f"{where}: got {type(obj).__name__}, expected a JSON object")
        raw = typed(TaskFile, obj, where)
        devices = _devices_of(raw, where)
        if raw.batch_size is None:
            raise UserError(f"{where}.batch_size: missing, expected a value")
        if raw.precision not in BYTES_PER_ELEMENT:
            raise UserError(f"{where}.precision: got {raw.precision!r}, expected one of {', '.join(BYTES_PER_ELEMENT)}")
        if not isinstance(raw.tables, list) or not raw.tables:
            raise UserError(f"{where}.tables: got {raw.tables!r:.60}, expected a non-empty list of tables")
        at = [_table_where(t, i, where) for i, t in enumerate(raw.tables)]
        tables = tuple(_table_from_json(t, at[i]) for i, t in enumerate(raw.tables))
        seen: set[int] = set()
        names: set[str] = set()
        for i, t in enumerate(tables):
            if t.id in seen:
                raise UserError(f"{at[i]}.id: got {t.id}, expected ids unique within a task")
            if t.name is not None and t.name in names:
                raise UserError(f"{where}.tables[{i}].name: got {t.name!r}, expected names unique within a task")
            seen.add(t.id)
            names.add(t.name)
        for i, t in enumerate(tables):
            for d in ((t.pin,) if t.pin is not None else ()) + t.exclude:
                if not 0 <= d < len(devices):
                    key = "pin" if d == t.pin else "exclude"
                    raise UserError(f"{at[i]}.{key}: got device {d}, expected 0..{len(devices) - 1}")
        links = _checked_links(raw.links, devices, where)
        training = training_of(raw.optimizer, raw.mem_reserve, where)
        return cls(tuple(devices), raw.batch_size, tables, raw.precision, raw.pool, links, training)


def memory_words(task: Task, parts: MemoryParts) -> str:
    """``weights 0.900 + row-wise state 0.225 + step buffers 0.010 GiB``-like words of a device's memory."""
    gib = GIB_BYTES
    state = task.training.state
    words = f"weights {parts.weights / gib:.3f}"
    if parts.state or state.per_row or state.per_weight:
        words += f" + {state.name} state {parts.state / gib:.3f}"
    words += f" + step buffers {parts.buffers / gib:.3f} GiB"
    return words + (f"; {100 * task.training.reserve:g}% of the cap reserved" if task.training.reserve else "")


def training_of(optimizer: str, reserve: float, where: str = "task") -> Training:
    """The ``Training`` of a task's optimizer and reserve; UserError naming ``where``'s field otherwise."""
    try:
        return Training(optimizer, reserve)
    except UserError as err:
        raise UserError(f"{where}.{str(err).removeprefix('task.')}") from None


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
    # measured polishing's record (``polish.py``): measured per-device costs, measurements, time, improvement
    polish: PolishRecord | None = dataclasses.field(default=None, compare=False)
    # the cost model's calibration to the measuring machine (``calibrate.py``): factor, its spread, what was measured
    calibration: CalibrationRecord | None = dataclasses.field(default=None, compare=False)
    data_parallel: tuple[int, ...] = ()

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

    def torchrec_shards(self) -> list[list[dict[str, int]]]:
        """Per task table: its shards as ``torchrec_format`` takes them, {col_offset, dim, rank} (and row_offset,
        num_rows for a row block), in column then row order; a data-parallel table's is [{data_parallel: 1}]."""
        out: list[list[dict[str, int]]] = [[] for _ in self.task.tables]
        for t in self.data_parallel:  # every rank holds it: TorchRec's data_parallel
            out[t].append({"data_parallel": 1})
        for s in sorted(self.shards, key=_shard_order):
            shard = {"col_offset": s.col_offset, "dim": s.dim, "rank": s.device}
            rows = self.task.tables[s.table].rows
            if not s.whole_rows(rows):
                shard.update(row_offset=s.row_offset, num_rows=s.rows(rows))
            out[s.table].append(shard)
        return out

    def torchrec_names(self) -> list[str]:
        """The tables' names in TorchRec: their names, else ``t{index}``."""
        return [t.name if t.name is not None else f"t{i}" for i, t in enumerate(self.task.tables)]

    def dim_sums(self) -> np.ndarray:
        """i64[N]: pooled output width of each device."""
        return device_dim_sums(self.shards, self.task.num_devices)

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
        return self

    def to_json(self) -> dict[str, Any]:
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
        if self.polish is not None:
            out["polish"] = self.polish.to_json()
        if self.calibration is not None:
            out["calibration"] = self.calibration.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str = "plan") -> Plan:
        """Parse and validate a plan.json object (costs and provenance are kept when present; numpy numbers and
        arrays are taken as Python's)."""
        obj = plain(obj)
        if not isinstance(obj, dict) or "task" not in obj or "shards" not in obj:
            raise UserError(f"{where}: expected a plan.json object with 'task' and 'shards'")
        raw = typed(PlanFile, obj, where)  # its keys and provenance; the task, shards and records parsed below
        task = Task.from_json(obj["task"], where=f"{where}.task")
        index = {t.id: i for i, t in enumerate(task.tables)}
        if not isinstance(obj["shards"], list):
            raise UserError(f"{where}.shards: got {obj['shards']!r:.60}, expected a list of shards")
        shards = []
        for i, shard in enumerate(obj["shards"]):
            at = f"{where}.shards[{i}]"
            if not isinstance(shard, dict):
                raise UserError(f"{at}: got {shard!r:.80}, expected an object with keys {', '.join(SHARD_KEYS)}")
            s = typed(ShardFile, shard, at)
            if s.table not in index:
                raise UserError(f"{at}.table: got {s.table}, expected a table id of the task")
            shards.append(Shard(index[s.table], s.col_offset, s.dim, s.device, s.row_offset, s.num_rows))
        replicated = obj.get("data_parallel", [])
        if (
            not isinstance(replicated, list)
            or not all(isinstance(t, int) and not isinstance(t, bool) and t in index for t in replicated)
            or len(set(replicated)) != len(replicated)
        ):
            raise UserError(
                f"{where}.data_parallel: got {replicated!r:.80}, expected a list of distinct table ids of the task"
            )
        return cls(
            task,
            tuple(shards),
            _costs_from_json(obj, task.num_devices),
            raw.searcher,
            raw.seed,
            raw.search_time_s,
            None if obj.get("polish") is None else PolishRecord.from_json(obj["polish"], f"{where}.polish"),
            None
            if obj.get("calibration") is None
            else CalibrationRecord.from_json(obj["calibration"], f"{where}.calibration"),
            tuple(sorted({index[t] for t in replicated})),
        ).validate()


def _shard_order(s: Shard) -> tuple[int, int, int]:
    return s.table, s.col_offset, s.row_offset


def _shard_json(task: Task, s: Shard) -> dict[str, int]:
    """A plan.json shard: the row range only for a row block, so a column-wise plan's file is unchanged."""
    out = {"table": task.tables[s.table].id, "col_offset": s.col_offset, "dim": s.dim, "device": s.device}
    rows = task.tables[s.table].rows
    if not s.whole_rows(rows):
        out.update(row_offset=s.row_offset, num_rows=s.rows(rows))
    return out


def _costs_from_json(obj: dict, num_devices: int) -> PlanCosts | None:
    """The predicted costs of a plan.json object, or None when it has none (or not all of them)."""
    devices = obj.get("devices")
    try:
        per_device = [devices[d]["cost_ms"] for d in range(num_devices)]
        columns = [tuple(float(c[k]) for c in per_device) for k in ("compute", "fwd_comm", "bwd_comm", "total")]
        unsure = [None, None]
        if all("model_spread" in devices[d] for d in range(num_devices)):
            unsure = [tuple(float(devices[d][k]) for d in range(num_devices)) for k in ("model_spread", "model_trust")]
        return PlanCosts(*columns, float(obj["cost_ms"]), str(obj["cost_model"]), *unsure)
    except (KeyError, TypeError, ValueError, IndexError):
        return None


# The file schema, in one place: task, table, row-block and shard objects are the dataclasses below (and
# ``Device``, ``Links``, ``PoolSpec``), parsed by ``core.config.typed`` like every config: types and bounds from the
# fields, an unknown key refused naming the nearest. ``size`` is written by ``to_json`` for readers and ignored on
# input (rows x dim); ``samples`` and ``batches``, written by the statistics tool, are provenance and ignored too. The
# histogram is ``bins`` (a list) or ``bin_0`` .. ``bin_16`` (the feature names). The rules across fields (the
# histogram's sum, unique ids, devices in range, hosts and links) are the hooks after the parse.
BIN_KEYS = tuple(f"bin_{k}" for k in range(NUM_BINS))
BINS_TOLERANCE = 0.01  # the access-histogram shares of a looked-up table sum to 1 within this


@dataclasses.dataclass(frozen=True)
class TaskFile:
    """A task object (the one under ``"task"`` in plan.json): ``devices``, or ``num_devices`` x ``mem_cap_gb``."""

    # a field left out stays None (an explicit null is refused with the field's type)
    devices: tuple[Device, ...] | None = None
    num_devices: int = bounded(at_least=1, default=None)
    mem_cap_gb: float = bounded(above=0, at_most=MAX_CAP_GB, default=None)
    batch_size: int = bounded(at_least=1, default=None)
    precision: str = "fp32"
    optimizer: str = Training.optimizer  # the fused optimizer, FBGEMM's or TorchRec's name (core.memory)
    mem_reserve: float = bounded(at_least=0, default=0.0)  # share of every cap held back
    tables: Any = None  # a list of TableFile objects, each parsed where errors can name it
    pool: PoolSpec | None = None
    links: Links | None = None


@dataclasses.dataclass(frozen=True)
class TableFile:
    """A table object of a task file (constraints: ``core.constraints``)."""

    id: int = bounded(at_least=0)
    rows: int = bounded(at_least=1)
    dim: int = bounded(at_least=DIM_ALIGNMENT)
    pooling_factor: float = bounded(at_least=0)
    bins: Any = None  # 17 shares (``_checked_bins``); or bin_0 .. bin_16 (``_bins_field``)
    name: str | None = None
    size: Any = None
    estimated: bool = False
    samples: Any = None
    batches: Any = None
    row_blocks: Any = ()  # a list of RowBlocksFile objects
    pin: int | None = bounded(at_least=0, default=None)
    exclude: Any = ()
    no_split: bool = False
    max_shards: int | None = bounded(at_least=1, default=None)
    colocate: Any = None
    sharding_types: Any = None


@dataclasses.dataclass(frozen=True)
class RowBlocksFile:
    """One entry of a table's ``row_blocks``: the statistics of its ``count`` row blocks."""

    count: int = bounded(at_least=2)
    pooling_factors: Any = None
    bins: Any = None


@dataclasses.dataclass(frozen=True)
class PlanFile:
    """A plan.json object (``Plan.to_json``): the task, the shards and the replicated tables; the predicted costs
    (``devices``' ``cost_ms``, ``cost_ms``, ``cost_model``), provenance, the polishing and calibration records."""

    task: Any
    shards: Any
    searcher: str | None = None
    cost_model: str | None = None
    seed: int | None = None
    data_parallel: Any = None
    devices: Any = None
    cost_ms: Any = None
    search_time_s: float | None = None
    polish: Any = None
    calibration: Any = None


@dataclasses.dataclass(frozen=True)
class ShardFile:
    """A plan.json shard: a table's column slice on a device, and for a row block its row range."""

    table: int
    col_offset: int = bounded(at_least=0)
    dim: int = bounded(at_least=1)
    device: int = bounded(at_least=0)
    row_offset: int = bounded(at_least=0, default=0)
    num_rows: int | None = bounded(at_least=0, default=None)


SHARD_KEYS = tuple(f.name for f in dataclasses.fields(ShardFile))


def _devices_of(raw: TaskFile, where: str) -> list[Device]:
    """The task's devices: ``devices`` (``num_devices`` and ``mem_cap_gb``, if given beside them, must agree: the
    number of devices, the largest cap, as ``to_json`` writes them), else ``num_devices`` x ``mem_cap_gb``."""
    if raw.devices is None:
        for key in ("num_devices", "mem_cap_gb"):
            if getattr(raw, key) is None:
                raise UserError(f"{where}.{key}: missing, expected a value")
        return [Device(raw.mem_cap_gb)] * raw.num_devices
    devices = list(raw.devices)
    if not devices:
        raise UserError(f"{where}.devices: got [], expected a non-empty list like [{{'mem_cap_gb': 16, 'speed': 1.0}}]")
    if raw.num_devices is not None and raw.num_devices != len(devices):
        raise UserError(f"{where}.num_devices: got {raw.num_devices!r}, expected {len(devices)} (the devices given)")
    largest = max(d.mem_cap_gb for d in devices)
    if raw.mem_cap_gb is not None and raw.mem_cap_gb != largest:
        raise UserError(
            f"{where}.mem_cap_gb: got {raw.mem_cap_gb!r}, expected {largest} (the largest of the devices' caps) "
            f"or no mem_cap_gb beside devices"
        )
    return devices


def _devices_json(devices: tuple[Device, ...]) -> list[dict[str, Any]]:
    """The devices as plan.json writes them: their hosts only where they sit in several."""
    several = len({d.host for d in devices}) > 1
    return [{"mem_cap_gb": d.mem_cap_gb, "speed": d.speed, **({"host": d.host} if several else {})} for d in devices]


def _links_json(links: Links) -> dict[str, Any]:
    return {key: value for key, value in dataclasses.asdict(links).items() if value is not None}


def _checked_links(links: Links | None, devices: list[Device], where: str) -> Links | None:
    """The task's ``links`` (None when absent): required when the devices sit in more than one host, and hosts come
    from the devices or from ``devices_per_host``, not both."""
    hosts = sorted({d.host for d in devices})
    if links is None:
        if len(hosts) > 1:
            raise UserError(
                f"{where}.links: missing, but the devices sit in {len(hosts)} hosts; expected "
                "{'intra_host_gbps': ..., 'inter_host_gbps': ...} (GB/s per device within a host and between hosts)"
            )
        return None
    at = f"{where}.links"
    if links.devices_per_host is not None and len(hosts) > 1:
        raise UserError(
            f"{at}.devices_per_host: got {links.devices_per_host}, but the devices name their hosts; expected one"
        )
    if links.devices_per_host is None and len(hosts) < 2:
        raise UserError(
            f"{at}: the devices sit in one host; expected a host per device (devices[i].host) or links.devices_per_host"
        )
    if links.devices_per_host is not None and len(devices) % links.devices_per_host:
        raise UserError(
            f"{at}.devices_per_host: got {links.devices_per_host}, but {len(devices)} devices do not fill whole hosts "
            f"of it; expected a divisor of {len(devices)}"
        )
    return links


def _table_where(obj: Any, index: int, where: str) -> str:
    """How errors name a table: by its name where it has one (``plan.tables['user_id']``), else by position."""
    name = obj.get("name") if isinstance(obj, dict) else None
    return f"{where}.tables[{name!r}]" if isinstance(name, str) and name else f"{where}.tables[{index}]"


def _table_from_json(obj: Any, where: str) -> Table:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: got {obj!r:.60}, expected a table object")
    bins = _bins_field(obj, where)
    raw = typed(TableFile, {k: v for k, v in obj.items() if k not in BIN_KEYS}, where)
    if not is_legal_dim(raw.dim):
        raise UserError(f"{where}.dim: got {raw.dim}, expected a multiple of {DIM_ALIGNMENT}")
    bins = _checked_bins(bins, raw.pooling_factor, f"{where}.bins")
    if raw.name == "":
        raise UserError(f"{where}.name: got '', expected a non-empty string")
    table = Table(raw.id, raw.rows, raw.dim, raw.pooling_factor, bins, raw.name, raw.estimated)
    blocks = row_blocks_from_json(raw.row_blocks, raw.rows, raw.pooling_factor, f"{where}.row_blocks")
    return dataclasses.replace(table, row_blocks=blocks, **_constraints_of(raw, where))


def _checked_bins(bins: Any, pooling: float, where: str) -> tuple[float, ...]:
    """An access histogram: 17 shares in [0, 1] summing to 1 (or all 0 where nothing is looked up)."""
    if (
        not isinstance(bins, list)
        or len(bins) != NUM_BINS
        or not all(isinstance(b, (int, float)) and math.isfinite(b) and 0 <= b <= 1 for b in bins)
    ):
        raise UserError(f"{where}: got {bins!r:.60}, expected {NUM_BINS} shares in [0, 1]")
    total = math.fsum(bins)
    if pooling > 0 and abs(total - 1) > BINS_TOLERANCE:
        raise UserError(
            f"{where}: the shares sum to {total:.4g}, expected 1 (within {BINS_TOLERANCE}) for a pooling_factor of "
            f"{pooling:g}"
        )
    if pooling == 0 and total > 0 and abs(total - 1) > BINS_TOLERANCE:
        raise UserError(f"{where}: the shares sum to {total:.4g}, expected 1 (within {BINS_TOLERANCE}) or all 0")
    return tuple(float(b) for b in bins)


def row_blocks_from_json(raw: Any, rows: int, pooling: float, where: str) -> tuple[RowBlockStats, ...]:
    """A table's ``row_blocks``: a list of {count, pooling_factors, bins} (one per block count), the block pooling
    factors summing to the table's (within 1%)."""
    if not isinstance(raw, list | tuple):
        raise UserError(f"{where}: got {raw!r:.60}, expected a list of {{count, pooling_factors, bins}}")
    out, counts = [], set()
    for k, obj in enumerate(raw):
        at = f"{where}[{k}]"
        if not isinstance(obj, dict):
            raise UserError(f"{at}: got {obj!r:.60}, expected an object with count, pooling_factors, bins")
        entry = typed(RowBlocksFile, obj, at)
        count = entry.count
        if count > rows or count in counts:
            why = f"at most the table's {rows} rows" if count > rows else "one entry per count"
            raise UserError(f"{at}.count: got {count}, expected {why}")
        counts.add(count)
        for name in ("pooling_factors", "bins"):
            value = getattr(entry, name)
            if value is None:
                raise UserError(f"{at}.{name}: missing, expected a value")
            if not isinstance(value, list) or len(value) != count:
                raise UserError(f"{at}.{name}: got {value!r:.60}, expected a list of {count} (one per block)")
        for i, f in enumerate(entry.pooling_factors):
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f < 0:
                raise UserError(f"{at}.pooling_factors[{i}]: got {f!r:.60}, expected a finite number >= 0")
        factors = [float(f) for f in entry.pooling_factors]
        if abs(math.fsum(factors) - pooling) > 0.01 * pooling + 1e-9:
            raise UserError(
                f"{at}.pooling_factors: they sum to {math.fsum(factors):.4g}, expected the table's pooling_factor "
                f"{pooling:g} (within 1%)"
            )
        bins = tuple(_checked_bins(b, f, f"{at}.bins[{i}]") for i, (b, f) in enumerate(zip(entry.bins, factors)))
        out.append(RowBlockStats(count, tuple(factors), bins))
    return tuple(sorted(out, key=lambda b: b.count))


def row_blocks_json(blocks: tuple[RowBlockStats, ...]) -> list[dict]:
    """``row_blocks`` as task-file objects."""
    return [
        {"count": b.count, "pooling_factors": list(b.pooling_factors), "bins": [list(x) for x in b.bins]}
        for b in blocks
    ]


def _constraints_of(raw: TableFile, where: str) -> dict:
    """A table's constraints, checked (device ranges are checked by the task, which knows its devices)."""
    exclude = raw.exclude
    indices = isinstance(exclude, list | tuple) and all(isinstance(d, int) and not isinstance(d, bool) for d in exclude)
    if not indices:
        raise UserError(f"{where}.exclude: got {exclude!r:.60}, expected a list of device indices")
    out: dict[str, Any] = {"pin": raw.pin, "exclude": tuple(sorted(set(exclude))), "no_split": raw.no_split}
    out["max_shards"] = raw.max_shards
    group = raw.colocate
    if group is not None and not (isinstance(group, str) and group):
        raise UserError(f"{where}.colocate: got {group!r:.60}, expected a group name (a non-empty string)")
    out["colocate"] = group
    types = raw.sharding_types
    if types is not None:
        if (
            not isinstance(types, list)
            or not types
            or not all(isinstance(x, str) and x in SHARDING_TYPES for x in types)
            or len(set(types)) != len(types)
        ):
            raise UserError(
                f"{where}.sharding_types: got {types!r:.80}, expected a non-empty list of distinct names among "
                f"{', '.join(SHARDING_TYPES)}"
            )
        if not set(types) & {"table_wise", "column_wise", "data_parallel"}:
            raise UserError(
                f"{where}.sharding_types: got {types}, expected table_wise, column_wise or data_parallel among them "
                "(row blocks alone are not planned here: a table that cannot be placed whole has no fallback)"
            )
        out["sharding_types"] = tuple(x for x in SHARDING_TYPES if x in types)
        if types == ["data_parallel"] and (out["pin"] is not None or out["exclude"] or out["colocate"]):
            raise UserError(
                f"{where}.sharding_types: got ['data_parallel'] (on every device) with pin, exclude or colocate, "
                "expected one or the other"
            )
    return out


def _constraints_json(table: Table) -> dict:
    """The table's constraints as task-file keys (only those set)."""
    out: dict[str, Any] = {}
    if table.pin is not None:
        out["pin"] = table.pin
    if table.exclude:
        out["exclude"] = list(table.exclude)
    if table.no_split:
        out["no_split"] = True
    if table.max_shards is not None:
        out["max_shards"] = table.max_shards
    if table.colocate is not None:
        out["colocate"] = table.colocate
    if table.sharding_types is not None:
        out["sharding_types"] = list(table.sharding_types)
    return out


def _bins_field(obj: dict, where: str) -> Any:
    """The histogram as ``bins`` or as ``bin_0`` .. ``bin_16`` (not both)."""
    given = [k for k in BIN_KEYS if k in obj]
    if not given:
        if "bins" not in obj:
            raise UserError(f"{where}.bins: missing, expected a value")
        return obj["bins"]
    if "bins" in obj:
        raise UserError(f"{where}: both bins and {given[0]}.. given, expected one form of the histogram")
    missing = [k for k in BIN_KEYS if k not in obj]
    if missing:
        raise UserError(f"{where}.{missing[0]}: missing, expected all of bin_0 .. bin_{NUM_BINS - 1} (or bins)")
    return [obj[k] for k in BIN_KEYS]
