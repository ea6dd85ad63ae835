"""Shard geometry: how a table may be cut into shards, what a shard holds and what it costs in memory.

The one place for these rules; tasks, plans, the searchers, the TorchRec import and export, profiling and
the torch worker all call them. NumPy only (the worker imports it).

* **Splits.** A table of width ``dim`` is cut into 2^k column shards of equal width, each a positive multiple
  of ``DIM_ALIGNMENT``: it may be halved ``max_halvings(dim)`` times (dim 24: once, into two of 12).
* **Shards.** A shard covers a column range and a row range of one table and sits on one device. The row
  range is the whole table until row-wise sharding gives it meaning.
* **Memory.** A shard holds its weights only: rows x dim x bytes per element of the precision
  (``mem_bytes``); a device holds the sum over its shards (``device_mem_bytes``).
* **Merging.** Sibling slices (the two halves of one halving) on the same device are one shard in all but cost:
  the same memory and output, more work per lookup. ``merge_colocated`` undoes every such halving.
* **Tiling.** A plan is valid only if the shards of every table tile its columns (and rows) exactly once
  (``tiling_error``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from neuroshard_jax.constants import BYTES_PER_ELEMENT, DIM_ALIGNMENT
from neuroshard_jax.features import FEATURE_INDEX


@dataclasses.dataclass(frozen=True)
class Shard:
    """Columns [col_offset, col_offset + dim) and rows [row_offset, row_offset + num_rows) of task table
    ``table`` (an index into task.tables) on ``device``. ``num_rows=None``: through the table's last row."""

    table: int
    col_offset: int
    dim: int
    device: int
    row_offset: int = 0
    num_rows: int | None = None

    def rows(self, table_rows: int) -> int:
        """Rows this shard holds of a table of ``table_rows`` rows."""
        return table_rows - self.row_offset if self.num_rows is None else self.num_rows

    def whole_rows(self, table_rows: int) -> bool:
        return self.row_offset == 0 and self.rows(table_rows) == table_rows


def is_legal_dim(dim: int) -> bool:
    """Whether ``dim`` is a legal table or shard width: a positive multiple of DIM_ALIGNMENT."""
    return dim >= DIM_ALIGNMENT and dim % DIM_ALIGNMENT == 0


def max_halvings(dim: int) -> int:
    """How many times a table of width ``dim`` can be halved, every shard staying a legal width."""
    if not is_legal_dim(dim):
        return 0
    k = 0
    while (dim >> (k + 1)) << (k + 1) == dim and is_legal_dim(dim >> (k + 1)):
        k += 1
    return k


def split_counts(dim: int) -> tuple[int, ...]:
    """The legal numbers of column shards of a table of width ``dim``: 1, 2, 4, ..., 2^max_halvings."""
    return tuple(1 << k for k in range(max_halvings(dim) + 1))


def narrowest_dim(dim: int) -> int:
    """Width of the narrowest legal column shard of a table of width ``dim``."""
    return dim >> max_halvings(dim)


def column_shards(table: int, dim: int, devices: Sequence[int]) -> tuple[Shard, ...]:
    """``len(devices)`` equal column shards of a table of width ``dim``, shard i on ``devices[i]``."""
    count = len(devices)
    if count not in split_counts(dim):
        raise ValueError(f"table {table}: {count} column shards of dim {dim}, expected one of {split_counts(dim)}")
    width = dim // count
    return tuple(Shard(table, i * width, width, int(d)) for i, d in enumerate(devices))


def merge_colocated(shards: Iterable[Shard]) -> tuple[Shard, ...]:
    """The shards with the last halvings undone while both halves of every pair share a device: a table of 2^k
    column slices in which slices 2i and 2i+1 sit together for every i becomes 2^(k-1) slices, and so on (the plan
    format keeps equal slices, so one pair on two devices stops it: [0, 0, 1, 2] stays). Column slices only (shards
    of whole rows); other shards pass unchanged. Order: by table, then column."""
    by_table: dict[int, list[Shard]] = {}
    for s in shards:
        by_table.setdefault(s.table, []).append(s)
    out: list[Shard] = []
    for table in sorted(by_table):
        slices = sorted(by_table[table], key=lambda s: s.col_offset)
        columns_only = all(s.row_offset == 0 and s.num_rows is None for s in slices)
        while columns_only and len(slices) > 1 and len(slices) % 2 == 0:
            pairs = list(zip(slices[::2], slices[1::2]))
            if any(a.device != b.device for a, b in pairs):
                break
            slices = [dataclasses.replace(a, dim=a.dim + b.dim) for a, b in pairs]
        out.extend(slices)
    return tuple(out)


def mem_bytes(rows, dim, precision: str):
    """Weight memory in bytes of ``rows`` x ``dim`` elements at ``precision`` (ints or arrays): the memory rule."""
    return rows * dim * BYTES_PER_ELEMENT[precision]


def device_mem_bytes(shards: Iterable[Shard], table_rows: Sequence[int], precision: str, num_devices: int):
    """i64[N]: weight memory of each device holding ``shards`` (``table_rows[t]``: rows of task table t)."""
    out = np.zeros(num_devices, dtype=np.int64)
    for s in shards:
        out[s.device] += mem_bytes(s.rows(table_rows[s.table]), s.dim, precision)
    return out


def device_dim_sums(shards: Iterable[Shard], num_devices: int):
    """i64[N]: pooled output width (sum of shard dims) of each device."""
    out = np.zeros(num_devices, dtype=np.int64)
    for s in shards:
        out[s.device] += s.dim
    return out


def shard_features(table_features: np.ndarray, dim: int, rows: int | None = None) -> np.ndarray:
    """Features f64[F] of a shard of width ``dim`` (and ``rows`` rows, default all) of a table with
    features ``table_features`` f64[F] (FEATURE_NAMES order)."""
    out = np.array(table_features, dtype=np.float64)
    if rows is not None:
        out[FEATURE_INDEX["rows"]] = rows
    out[FEATURE_INDEX["dim"]] = dim
    out[FEATURE_INDEX["size"]] = out[FEATURE_INDEX["rows"]] * dim
    return out


def tiling_error(dim: int, table_rows: int, shards: Sequence[Shard]) -> str | None:
    """Why ``shards`` do not tile a table of ``dim`` columns and ``table_rows`` rows exactly once, or None.

    The rule: 2^k column shards of equal legal width, each over all the table's rows."""
    count = len(shards)
    if count == 0:
        return f"has no shard, expected its {dim} columns placed"
    if count not in split_counts(dim):
        return (
            f"(dim {dim}) has {count} shards, expected 2^k shards of equal width, each a multiple of "
            f"{DIM_ALIGNMENT} (one of {list(split_counts(dim))})"
        )
    if any(not s.whole_rows(table_rows) for s in shards):
        return f"has a shard of a row range, expected every shard over all {table_rows} rows"
    width = dim // count
    offsets = sorted(s.col_offset for s in shards)
    if any(s.dim != width for s in shards) or offsets != list(range(0, dim, width)):
        return f"shards do not tile its {dim} columns exactly"
    return None
