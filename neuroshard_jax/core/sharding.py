"""Shard geometry: how a table may be cut into shards, what a shard holds and what it costs in memory.

The one place for these rules; tasks, plans, the searchers, the TorchRec import and export, profiling and
the torch worker all call them. NumPy only (the worker imports it).

* **Splits.** A table of width ``dim`` is cut into 2^k column shards of equal width, each a positive multiple
  of ``DIM_ALIGNMENT``: it may be halved ``max_halvings(dim)`` times (dim 24: once, into two of 12).
* **Shards.** A shard covers a column range and a row range of one table and sits on one device.
* **Row splits.** A table too large for one device is cut into R row blocks laid out as TorchRec lays out a
  row-wise table (``row_blocks``: blocks of ceil(rows / R) rows, the last ones shorter or empty), block i on the
  i-th device of the group it is split over; each of its column slices is cut the same way. A row block does the
  lookups that land in its rows only (``shard_features``).
* **Memory.** A shard's weights are rows x dim x bytes per element of the precision (``mem_bytes``); what it holds
  while it trains (optimizer state, the step's buffers) is ``core.task``'s, summed per device by
  ``Task.device_memory``.
* **Merging.** Sibling slices (the two halves of one halving) on the same device are one shard in all but cost:
  the same memory and output, more work per lookup. ``merge_colocated`` undoes every such halving.
* **Tiling.** A plan is valid only if the shards of every table tile its columns and rows exactly once: 2^k equal
  column slices, each over all rows or over the same R row blocks (``tiling_error``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from neuroshard_jax.core.constants import BYTES_PER_ELEMENT, DIM_ALIGNMENT
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import FEATURE_INDEX, NUM_BINS

# which tables the row-split stage tries row blocks for (``search/ways.py``): fit, the tables only rows fit and
# those larger than every device; hot, and the tables whose compute exceeds a device's share; off, none
ROW_SPLIT_MODES = ("fit", "hot", "off")


def check_row_split(mode: str) -> None:
    """UserError unless ``mode`` is a row-split mode (``ROW_SPLIT_MODES``)."""
    if mode not in ROW_SPLIT_MODES:
        raise UserError(f"row_split: got {mode!r}, expected one of {', '.join(ROW_SPLIT_MODES)}")


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


def row_block_size(rows: int, count: int) -> int:
    """Rows per block of TorchRec's row-wise layout of ``rows`` rows in ``count`` blocks: ceil(rows / count) (row r
    is in block r // this)."""
    return -(-rows // count)


def row_blocks(rows: int, count: int) -> tuple[tuple[int, int], ...]:
    """(row_offset, num_rows) of the ``count`` row blocks of a table of ``rows`` rows, TorchRec's row-wise layout:
    blocks of ceil(rows / count) rows in order, the last ones shorter or empty (10 rows in 4: 3, 3, 3, 1)."""
    if count < 1:
        raise ValueError(f"row blocks: count {count}, expected >= 1")
    block = row_block_size(rows, count)
    return tuple((min(i * block, rows), max(0, min(block, rows - i * block))) for i in range(count))


def row_shards(table: int, rows: int, dim: int, devices: Sequence[int], col_offset: int = 0) -> tuple[Shard, ...]:
    """Columns [col_offset, col_offset + dim) of a table of ``rows`` rows cut into ``len(devices)`` row blocks
    (``row_blocks``), block i on ``devices[i]``."""
    return tuple(
        Shard(table, col_offset, dim, int(d), offset, count)
        for d, (offset, count) in zip(devices, row_blocks(rows, len(devices)))
    )


def is_legal_dim(dim: int) -> bool:
    """Whether ``dim`` is a legal column slice's width: a positive multiple of DIM_ALIGNMENT (a table of another
    width, which FBGEMM's CPU kernels and TorchRec take, is placed whole: ``max_halvings`` 0)."""
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


class MixedSlices(NamedTuple):
    """A device holding column slices of several widths of sequence tables ``dim`` wide."""

    device: int
    dim: int
    widths: tuple[int, ...]  # ascending


def mixed_sequence_slices(tables: Sequence, shards: Iterable[Shard]) -> tuple[MixedSlices, ...]:
    """Each device with column slices of several widths of sequence tables of one dim, by device and dim. TorchRec
    shards an EmbeddingCollection's tables (one dim: it requires it) column-wise into one FBGEMM kernel a rank,
    and FBGEMM's unpooled kernel takes one width (``PoolingMode.NONE``: "Mixed dimension tables only supported
    for pooling tables"): a device with column slices of 16 and of 32 of such tables fails in
    DistributedModelParallel. Tables of one dim are taken as one collection's (what ``export`` makes of them)."""
    widths: dict[tuple[int, int], set[int]] = {}
    for s in shards:
        table = tables[s.table]
        if table.sequence and s.dim < table.dim and s.row_offset == 0 and s.num_rows is None:
            widths.setdefault((s.device, table.dim), set()).add(s.dim)
    return tuple(MixedSlices(d, dim, tuple(sorted(w))) for (d, dim), w in sorted(widths.items()) if len(w) > 1)


def even_sequence_slices(tables: Sequence, shards: Iterable[Shard]) -> tuple[Shard, ...]:
    """``shards`` with every device's column slices of sequence tables of one dim at one width
    (``mixed_sequence_slices``): a table whose slices are wider than the narrowest such slice on a device it shares
    is cut into slices of that width, each old slice's pieces on the old slice's device (the same weights and
    all-to-all width; a copy of the ids a slice, more lookups a kernel). Repeated until no device mixes widths (widths
    only narrow). Other shards unchanged; order: by table, then column."""
    shards = tuple(shards)
    mixed = mixed_sequence_slices(tables, shards)
    while mixed:
        narrowest = {(m.device, m.dim): m.widths[0] for m in mixed}
        recut: dict[int, int] = {}  # table -> its new slice width
        for s in shards:
            width = narrowest.get((s.device, tables[s.table].dim))
            if width is not None and tables[s.table].sequence and width < s.dim < tables[s.table].dim:
                recut[s.table] = min(recut.get(s.table, s.dim), width)
        out = []
        for s in sorted(shards, key=lambda s: (s.table, s.col_offset, s.row_offset)):
            width = recut.get(s.table)
            if width is None or s.dim <= width:
                out.append(s)
                continue
            out.extend(dataclasses.replace(s, col_offset=s.col_offset + k, dim=width) for k in range(0, s.dim, width))
        shards = tuple(out)
        mixed = mixed_sequence_slices(tables, shards)
    return shards


def mem_bytes(rows, dim, precision: str):
    """Weight memory in bytes of ``rows`` x ``dim`` elements at ``precision`` (ints or arrays): the memory rule."""
    return rows * dim * BYTES_PER_ELEMENT[precision]


def element_bytes(precision: str) -> int:
    """The bytes of one weight at ``precision`` (``mem_bytes`` of one element)."""
    return int(mem_bytes(1, 1, precision))


def device_dim_sums(shards: Iterable[Shard], num_devices: int, widths=None):
    """i64[N]: the all-to-all width of each device: the sum of its shards' dims, or of ``widths(shard)`` (a
    sequence table's shard puts a row per id in it: ``Table.width``)."""
    out = np.zeros(num_devices, dtype=np.int64)
    for s in shards:
        out[s.device] += s.dim if widths is None else widths(s)
    return out


def shard_features(
    table_features: np.ndarray, dim: int, rows: int | None = None, stats: tuple[float, Sequence[float]] | None = None
) -> np.ndarray:
    """Features f64[F] of a shard of width ``dim`` (and ``rows`` rows, default all) of a table with
    features ``table_features`` f64[F] (FEATURE_NAMES order).

    A block of ``rows`` of the table's rows does the lookups that land in it. ``stats`` (pooling factor, 17 bin
    shares): the block's own, measured (``Table.block_stats``); without them, a share rows / table rows of the
    pooling factor with the table's access histogram, as where ids are hashed over the rows and no row is very hot
    (a block holding or missing a very hot row is far from that: ``bench_row_blocks``)."""
    out = np.array(table_features, dtype=np.float64)
    if rows is not None:
        table_rows = out[FEATURE_INDEX["rows"]]
        if stats is not None:
            out[FEATURE_INDEX["pooling_factor"]] = stats[0]
            out[FEATURE_INDEX["bin_0"] : FEATURE_INDEX["bin_0"] + NUM_BINS] = stats[1]
        elif table_rows > 0:
            out[FEATURE_INDEX["pooling_factor"]] *= rows / table_rows
        out[FEATURE_INDEX["rows"]] = rows
    out[FEATURE_INDEX["dim"]] = dim
    out[FEATURE_INDEX["size"]] = out[FEATURE_INDEX["rows"]] * dim
    return out


def replica_features(table_features: np.ndarray, num_devices: int) -> np.ndarray:
    """Features f64[F] of one device's part of a data-parallel table: the whole table, looked up by the device's
    slice of the batch, priced as the table with its pooling factor divided by the devices (the same lookups per
    step; the histogram is kept)."""
    out = shard_features(table_features, int(table_features[FEATURE_INDEX["dim"]]))
    out[FEATURE_INDEX["pooling_factor"]] /= num_devices
    return out


def row_split_count(shards: Sequence[Shard], table_rows: int) -> int:
    """Row blocks per column slice of a table's shards: 1 when every shard holds all the rows, else the number of
    shards at column offset 0 (``tiling_error`` checks that the rest agrees)."""
    if all(s.whole_rows(table_rows) for s in shards):
        return 1
    return sum(1 for s in shards if s.col_offset == 0)


def tiling_error(dim: int, table_rows: int, shards: Sequence[Shard]) -> str | None:
    """Why ``shards`` do not tile a table of ``dim`` columns and ``table_rows`` rows exactly once, or None.

    The rule: 2^k column slices of equal legal width, each over all the table's rows or cut into the same R row
    blocks (``row_blocks``)."""
    if not shards:
        return f"has no shard, expected its {dim} columns placed"
    blocks = row_split_count(shards, table_rows)
    count = len(shards) // blocks
    if count * blocks != len(shards) or count not in split_counts(dim):
        return (
            f"(dim {dim}) has {len(shards)} shards, expected 2^k column slices of equal width, each a multiple of "
            f"{DIM_ALIGNMENT} (one of {list(split_counts(dim))})"
            + (f", each in {blocks} row blocks" if blocks > 1 else "")
        )
    width = dim // count
    if any(s.dim != width for s in shards):
        return f"shards do not tile its {dim} columns exactly"
    layout = row_blocks(table_rows, blocks) if blocks > 1 else ((0, table_rows),)
    want = sorted((c, r, n) for c in range(0, dim, width) for r, n in layout)
    if sorted((s.col_offset, s.row_offset, s.rows(table_rows)) for s in shards) != want:
        if blocks == 1 and any(not s.whole_rows(table_rows) for s in shards):
            return (
                f"has a shard of a row range alone in its column slice, expected row blocks over all {table_rows} rows"
            )
        if blocks > 1:
            return (
                f"shards do not tile its {dim} columns and {table_rows} rows: expected every column slice in the "
                f"same {blocks} row blocks (row_offset, num_rows) {list(layout)}"
            )
        return f"shards do not tile its {dim} columns exactly"
    return None
