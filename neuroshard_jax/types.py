"""Shared host-side types: tables, tasks, shards and plans (frozen; nothing is mutated in place).

JSON (de)serialisation lives with the types so that a task file is exactly the object found
under ``"task"`` in plan.json. Validation of untrusted input raises ``UserError`` naming the field,
the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from neuroshard_jax.constants import BYTES_PER_ELEMENT, DIM_ALIGNMENT, GIB_BYTES
from neuroshard_jax.errors import UserError
from neuroshard_jax.features import NUM_BINS, feature_matrix
from neuroshard_jax.tables import PoolSpec


@dataclasses.dataclass(frozen=True)
class Table:
    """One embedding table of a task. ``id`` is its id in the pool it was drawn from."""

    id: int
    rows: int
    dim: int
    pooling_factor: float
    bins: tuple[float, ...]

    @property
    def size(self) -> int:
        """Elements (rows * dim)."""
        return self.rows * self.dim


@dataclasses.dataclass(frozen=True)
class Task:
    """Tables to shard over ``num_devices`` devices with ``mem_cap_gb`` GiB each."""

    num_devices: int
    mem_cap_gb: float
    batch_size: int
    tables: tuple[Table, ...]
    precision: str = "fp32"
    pool: PoolSpec | None = None

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def bytes_per_element(self) -> int:
        return BYTES_PER_ELEMENT[self.precision]

    @property
    def mem_cap_bytes(self) -> int:
        return int(self.mem_cap_gb * GIB_BYTES)

    def table_mem_bytes(self, index: int, dim: int | None = None) -> int:
        """Memory of table ``index`` (of a column shard of it when ``dim`` is given). The one memory rule."""
        table = self.tables[index]
        return table.rows * (table.dim if dim is None else dim) * self.bytes_per_element

    def features(self) -> np.ndarray:
        """Raw features f64[T, 21] in FEATURE_NAMES order."""
        return feature_matrix(
            [t.rows for t in self.tables],
            [t.dim for t in self.tables],
            [t.pooling_factor for t in self.tables],
            [t.bins for t in self.tables],
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            "num_devices": self.num_devices,
            "mem_cap_gb": self.mem_cap_gb,
            "batch_size": self.batch_size,
            "precision": self.precision,
            "tables": [
                {
                    "id": t.id,
                    "rows": t.rows,
                    "dim": t.dim,
                    "pooling_factor": t.pooling_factor,
                    "size": t.size,
                    "bins": list(t.bins),
                }
                for t in self.tables
            ],
        }
        if self.pool is not None:
            out["pool"] = self.pool.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str = "task") -> Task:
        """Parse and validate a task object; errors name ``where.field``."""
        if not isinstance(obj, dict):
            raise UserError(f"{where}: got {type(obj).__name__}, expected a JSON object")
        num_devices = _int_field(obj, "num_devices", where, minimum=1)
        mem_cap_gb = _float_field(obj, "mem_cap_gb", where, positive=True)
        batch_size = _int_field(obj, "batch_size", where, minimum=1)
        precision = obj.get("precision", "fp32")
        if precision not in BYTES_PER_ELEMENT:
            raise UserError(f"{where}.precision: got {precision!r}, expected one of {', '.join(BYTES_PER_ELEMENT)}")
        raw_tables = _field(obj, "tables", where)
        if not isinstance(raw_tables, list) or not raw_tables:
            raise UserError(f"{where}.tables: got {raw_tables!r:.60}, expected a non-empty list of tables")
        tables = tuple(_table_from_json(t, f"{where}.tables[{i}]") for i, t in enumerate(raw_tables))
        seen: set[int] = set()
        for i, t in enumerate(tables):
            if t.id in seen:
                raise UserError(f"{where}.tables[{i}].id: got {t.id}, expected ids unique within a task")
            seen.add(t.id)
        pool = obj.get("pool")
        if pool is not None and not isinstance(pool, dict):
            raise UserError(
                f"{where}.pool: got {pool!r:.60}, expected an object like {{'source': 'synthetic', 'seed': 0}}"
            )
        return cls(num_devices, mem_cap_gb, batch_size, tables, precision, PoolSpec.from_json(pool) if pool else None)


@dataclasses.dataclass(frozen=True)
class Shard:
    """Columns [col_offset, col_offset + dim) of task table ``table`` (an index into task.tables) on ``device``."""

    table: int
    col_offset: int
    dim: int
    device: int


@dataclasses.dataclass(frozen=True)
class Plan:
    """A sharding plan: every column of every table of ``task`` on exactly one device."""

    task: Task
    shards: tuple[Shard, ...]

    @classmethod
    def from_assignment(cls, task: Task, num_splits: list[int], devices: list[list[int]]) -> Plan:
        """Plan from per-table shard counts (powers of two) and per-table lists of shard devices."""
        shards = []
        for t, (count, devs) in enumerate(zip(num_splits, devices)):
            dim = task.tables[t].dim // count
            shards.extend(Shard(t, i * dim, dim, int(d)) for i, d in enumerate(devs))
        return cls(task, tuple(shards))

    def device_shards(self, device: int) -> list[Shard]:
        return [s for s in self.shards if s.device == device]

    def dim_sums(self) -> np.ndarray:
        """i64[N]: pooled output width of each device."""
        out = np.zeros(self.task.num_devices, dtype=np.int64)
        for s in self.shards:
            out[s.device] += s.dim
        return out

    def mem_bytes(self) -> np.ndarray:
        """i64[N]: weight memory of each device."""
        out = np.zeros(self.task.num_devices, dtype=np.int64)
        for s in self.shards:
            out[s.device] += self.task.table_mem_bytes(s.table, s.dim)
        return out


def _field(obj: dict, name: str, where: str) -> Any:
    if name not in obj:
        raise UserError(f"{where}.{name}: missing, expected a value")
    return obj[name]


def _int_field(obj: dict, name: str, where: str, minimum: int) -> int:
    value = _field(obj, name, where)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{where}.{name}: got {value!r}, expected an integer >= {minimum}")
    return value


def _float_field(obj: dict, name: str, where: str, positive: bool = False) -> float:
    value = _field(obj, name, where)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        expected = "a finite number > 0" if positive else "a finite number >= 0"
        raise UserError(f"{where}.{name}: got {value!r}, expected {expected}")
    return float(value)


def _table_from_json(obj: Any, where: str) -> Table:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: got {obj!r:.60}, expected a table object")
    table_id = _int_field(obj, "id", where, minimum=0)
    rows = _int_field(obj, "rows", where, minimum=1)
    dim = _int_field(obj, "dim", where, minimum=DIM_ALIGNMENT)
    if dim % DIM_ALIGNMENT:
        raise UserError(f"{where}.dim: got {dim}, expected a multiple of {DIM_ALIGNMENT}")
    pooling = _float_field(obj, "pooling_factor", where)
    bins = _field(obj, "bins", where)
    if (
        not isinstance(bins, list)
        or len(bins) != NUM_BINS
        or not all(isinstance(b, (int, float)) and math.isfinite(b) and 0 <= b <= 1 for b in bins)
    ):
        raise UserError(f"{where}.bins: got {bins!r:.60}, expected {NUM_BINS} shares in [0, 1]")
    return Table(table_id, rows, dim, pooling, tuple(float(b) for b in bins))
