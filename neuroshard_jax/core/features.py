"""Table features: the one source of truth for their names and order.

A table is described to every cost model by 25 numbers, in this order:
``rows, dim, pooling_factor, bin_0 .. bin_16, size, mean_pooling, weighted, sequence, weight_bytes`` where
``bin_k`` is the share of the rows accessed in one batch whose access count falls in bin k (see ``BIN_EDGES``),
``size = rows * dim`` (elements, not bytes), the next three say which kernel the table runs in (0/1: mean pooling,
per-id weights, unpooled sequence lookups; all 0 for a sum-pooled bag) and ``weight_bytes`` is the bytes of an
element of its weights (0: not given, the model's own precision; a task's tables carry theirs, ``Task.features``).
Models trained before kernel kinds read the first 21; the neural models read no ``weight_bytes`` (each is trained at
one precision and priced tasks of that precision alone), the analytic roofline does.
NumPy only: the profiling worker imports it.
"""

from __future__ import annotations

import numpy as np

NUM_BINS = 17
# the 21 features every model reads; models trained before kernel kinds read these alone
BASE_FEATURE_NAMES = ("rows", "dim", "pooling_factor") + tuple(f"bin_{k}" for k in range(NUM_BINS)) + ("size",)
NUM_BASE_FEATURES = len(BASE_FEATURE_NAMES)
# the kernel a table runs in (``core.table.kernel_kind``), as 0/1: mean pooling, per-id weights, sequence lookups
KIND_FEATURE_NAMES = ("mean_pooling", "weighted", "sequence")
# what a neural model that knows the kernel kinds reads (each is trained at one precision: no ``weight_bytes``)
KIND_MODEL_FEATURE_NAMES = BASE_FEATURE_NAMES + KIND_FEATURE_NAMES
FEATURE_NAMES = KIND_MODEL_FEATURE_NAMES + ("weight_bytes",)
NUM_FEATURES = len(FEATURE_NAMES)
FEATURE_INDEX = {name: i for i, name in enumerate(FEATURE_NAMES)}


def count_bins(counts: np.ndarray) -> np.ndarray:
    """Bin index of each positive access count: (0,1] -> 0, (2^(k-1), 2^k] -> k, > 32768 -> 16.

    counts: int[...] with every entry >= 1. Returns int[...] in [0, 16].
    """
    counts = np.asarray(counts)
    # ceil(log2(c)) exactly for integers: bit length of (c - 1).
    k = np.zeros(counts.shape, dtype=np.int64)
    c = counts.astype(np.int64) - 1
    while np.any(c > 0):
        k += c > 0
        c >>= 1
    return np.minimum(k, NUM_BINS - 1)


def access_histogram(indices: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-bin unique-row counts and access counts of one table's index stream in one batch.

    indices: int[L] local row ids. Returns (unique_rows int[17], accesses int[17]).
    """
    counts = np.bincount(np.asarray(indices, dtype=np.int64), minlength=num_rows)
    return count_histogram(counts[counts > 0])


def count_histogram(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-bin (unique rows int[17], accesses int[17]) from the positive access counts of rows."""
    bins = count_bins(counts)
    unique_rows = np.bincount(bins, minlength=NUM_BINS)
    accesses = np.bincount(bins, weights=counts, minlength=NUM_BINS).astype(np.int64)
    return unique_rows, accesses


def bin_shares(unique_rows: np.ndarray) -> np.ndarray:
    """Normalise per-bin unique-row counts to shares (all zeros for a table unused in the batch)."""
    total = unique_rows.sum()
    return unique_rows / total if total > 0 else np.zeros(NUM_BINS)


def feature_matrix(rows, dims, pooling_factors, bins, poolings=None, weighted=None, weight_bytes=None) -> np.ndarray:
    """Stack raw table features in ``FEATURE_NAMES`` order.

    rows, dims, pooling_factors: [T]; bins: [T, 17]; poolings: [T] of ``core.table.POOLINGS`` (default all sum),
    weighted: [T] bool (default none); weight_bytes: [T] (default 0: not given). Returns f64[T, 25].
    """
    rows = np.asarray(rows, dtype=np.float64)
    dims = np.asarray(dims, dtype=np.float64)
    pooling = np.asarray(pooling_factors, dtype=np.float64)
    bins = np.asarray(bins, dtype=np.float64).reshape(len(rows), NUM_BINS)
    kinds = np.zeros((len(rows), len(KIND_FEATURE_NAMES)))
    if poolings is not None:
        kinds[:, 0] = [p == "mean" for p in poolings]
        kinds[:, 2] = [p == "none" for p in poolings]
    if weighted is not None:
        kinds[:, 1] = np.asarray(weighted, dtype=bool)
    element = np.zeros(len(rows)) if weight_bytes is None else np.asarray(weight_bytes, dtype=np.float64)
    columns = [rows[:, None], dims[:, None], pooling[:, None], bins, (rows * dims)[:, None], kinds, element[:, None]]
    return np.concatenate(columns, axis=1)


# which features name a table, as a shard of it carries them: all but its width and size (a column slice is its
# table; a row block, whose rows differ, is not)
IDENTITY = np.ones(NUM_FEATURES, bool)
IDENTITY[[FEATURE_INDEX["dim"], FEATURE_INDEX["size"]]] = False


def table_keys(feats: np.ndarray) -> np.ndarray:
    """f32[T, F]: tables' features (``Task.features``) as a per-table correction matches shards to them
    (``costs.cost_model.table_matches``): width and size zeroed."""
    return np.where(IDENTITY, np.asarray(feats, np.float32), 0.0).astype(np.float32)
