"""A table of a task: its shape, its access statistics (pooling factor, access histogram, per row block) and its
placement constraints; and ``PoolSpec``, where a task's tables were drawn from. Frozen: nothing is mutated in place;
their file schema is ``core.schema``'s."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from neuroshard_jax.core.config import typed
from neuroshard_jax.core.constants import BYTES_PER_ELEMENT, GENERATOR_VERSION, ZIPF_VERSION
from neuroshard_jax.core.constraints import NONE, TableConstraints, may_be_column_wise
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.paths import pool_file_digest
from neuroshard_jax.core.sharding import (
    row_blocks,
)

POOL_SOURCES = ("synthetic", "zipf", "dlrm")
# How a table's lookups are reduced, FBGEMM's ``PoolingMode`` as TorchRec's modules run it: ``sum`` and ``mean`` pool
# each bag to one row (EmbeddingBagCollection), ``none`` returns one row per id (EmbeddingCollection: sequence
# embeddings, whose output and all-to-all carry ids x dim)
POOLINGS = ("sum", "mean", "none")
# The kernels a device runs: TorchRec fuses a device's tables into one table-batched kernel per (pooling, weighted)
# group, so a device holding tables of several kinds runs one kernel of each (``kernel_kind``)
KERNEL_KINDS = ("sum", "mean", "sum_weighted", "mean_weighted", "sequence")


def kernel_parts(kind: str) -> tuple[str, bool]:
    """(pooling, weighted) of a kernel kind (``KERNEL_KINDS``); ValueError for another name."""
    if kind not in KERNEL_KINDS:
        raise ValueError(f"kernel: got {kind!r}, expected one of {', '.join(KERNEL_KINDS)}")
    if kind == "sequence":
        return "none", False
    pooling, _, weighted = kind.partition("_")
    return pooling, bool(weighted)


def kernel_kind(pooling: str, weighted: bool) -> str:
    """The kernel a table runs in (``KERNEL_KINDS``): its pooling, and whether its lookups carry per-id weights
    (``is_weighted`` features, TorchRec's feature processors). ValueError for a pooling not in ``POOLINGS`` or a
    weighted sequence table (TorchRec's EmbeddingCollection takes no weights)."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling: got {pooling!r}, expected one of {', '.join(POOLINGS)}")
    if pooling == "none":
        if weighted:
            raise ValueError(
                "pooling: 'none' (sequence) with weighted lookups, expected unweighted (TorchRec's "
                "EmbeddingCollection takes no weights)"
            )
        return "sequence"
    return f"{pooling}_weighted" if weighted else pooling


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    """How to obtain a pool; stored in task files so that streams can be regenerated."""

    # synthetic (from the seed) | zipf (from the seed, another law: ``workloads.zipf_pool``) | dlrm (a DLRM
    # benchmark file at pool.path)
    source: str = "synthetic"
    seed: int = 0
    num_tables: int = 856
    path: str | None = None

    def __post_init__(self):
        if self.source not in POOL_SOURCES:
            raise UserError(f"pool.source: got {self.source!r}, expected one of {', '.join(POOL_SOURCES)}")
        if self.source != "dlrm" and self.num_tables < 1:
            raise UserError(f"pool.num_tables: got {self.num_tables}, expected a positive integer")
        if self.source == "dlrm" and not self.path:
            raise UserError("pool.path: missing, expected the path of a DLRM benchmark file for source 'dlrm'")

    @property
    def pool_id(self) -> str:
        if self.source == "synthetic":
            return f"synthetic-v{GENERATOR_VERSION}-s{self.seed}-n{self.num_tables}"
        if self.source == "zipf":
            return f"zipf-v{ZIPF_VERSION}-s{self.seed}-n{self.num_tables}"
        return f"dlrm-{pool_file_digest(Path(self.path))}"

    def to_json(self) -> JSONDoc:
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
    # where it may go (``core.constraints``): a device for every shard, devices to avoid, no column split or at most
    # K shards, a group of tables kept on one device, TorchRec's sharding types
    constraints: TableConstraints = NONE
    # measured statistics of its row blocks, per block count (``stats``: from the user's data); a block of a count
    # not given is assumed to do its rows' share of the lookups with the table's histogram
    row_blocks: tuple[RowBlockStats, ...] = ()
    # the kernel it runs in (``kernel_kind``): its pooling (``POOLINGS``) and per-id weights
    pooling: str = "sum"
    weighted: bool = False
    # its weights' data type (``constants.BYTES_PER_ELEMENT``) where it differs from the task's (``Task.precision``;
    # None: the task's): TorchRec plans and runs modules mixing fp16 and fp32 tables, each table at its own bytes,
    # a device's tables of each data type in a kernel of their own
    precision: str | None = None
    # tiered memory (a GPU's): the table in host memory reached through UVM, this share of its rows cached in the
    # device's memory (FBGEMM's managed caching, TorchRec's ``fused_uvm_caching`` with ``CacheParams(load_factor)``);
    # None: the table in the device's memory. Set by the user, or by the planner where a GPU's memory is short
    # (``core.tiers.tiered``)
    cache_load_factor: float | None = None

    def __post_init__(self):
        kernel_kind(self.pooling, self.weighted)
        if self.precision is not None and self.precision not in BYTES_PER_ELEMENT:
            raise ValueError(f"precision: got {self.precision!r}, expected one of {', '.join(BYTES_PER_ELEMENT)}")
        lf = self.cache_load_factor
        if lf is not None and not (isinstance(lf, (int, float)) and not isinstance(lf, bool) and 0 < lf < 1):
            raise ValueError(f"cache_load_factor: got {lf!r}, expected a share of the rows in (0, 1) (or none)")

    @property
    def cached(self) -> bool:
        """Whether it sits in tiered memory: host rows, a share of them cached on the device (``cache_load_factor``)."""
        return self.cache_load_factor is not None

    @property
    def kernel(self) -> str:
        """The kernel it runs in (``KERNEL_KINDS``)."""
        return kernel_kind(self.pooling, self.weighted)

    @property
    def sequence(self) -> bool:
        """Whether its lookups are unpooled (sequence embeddings): one output row per id, not per bag."""
        return self.pooling == "none"

    @property
    def joins_column_group(self) -> bool:
        """Whether, whole, it runs in a plan's column-wise group where the plan cuts a table over devices
        (``Plan.merge_column_wise``): its sharding types allow column_wise, and it is no sequence table (an
        EmbeddingCollection runs a rank's column slices in one kernel of one width)."""
        return may_be_column_wise(self) and not self.sequence

    def width(self, dim: int, row_offset: int = 0, num_rows: int | None = None) -> int:
        """Elements per sample that a shard of ``dim`` columns (of the row block [row_offset, row_offset + num_rows),
        default all rows) puts in the all-to-all: its pooled output, ``dim``; a sequence table's is one row per id,
        ``dim`` x the lookups per sample landing in the shard (the block's measured ones, else its rows' share),
        rounded up; the lengths that travel with them are not counted. The one width rule of every comm price and
        search bound."""
        if not self.sequence:
            return int(dim)
        lookups = self.pooling_factor
        if num_rows is not None and num_rows != self.rows:
            measured = self.block_stats(row_offset, num_rows)
            lookups = measured[0] if measured is not None else lookups * num_rows / max(self.rows, 1)
        return int(math.ceil(dim * lookups - 1e-9))

    def constrained(self, **changes) -> Table:
        """This table with ``changes`` to its constraints (``pin=0``, ``exclude=(1,)``, ...)."""
        return dataclasses.replace(self, constraints=dataclasses.replace(self.constraints, **changes))

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
