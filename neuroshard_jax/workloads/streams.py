"""Index streams synthesised from a table's spec, so that any table can be measured, not only pool tables.

A spec is what a user knows of a table: rows, the mean pooling factor and the 17-bin access histogram at a
batch size (``features.py``: bin k holds the share of the rows accessed in one batch whose access count is in
(2^(k-1), 2^k]). ``spec_stream`` builds one batch of indices + offsets (FBGEMM's layout) with exactly those
statistics, up to rounding: bag lengths ~ Poisson(pooling factor); the L lookups go to U distinct rows, U
chosen so that the rows of each bin, holding counts inside their bin, add up to L; the rows are scattered
over the table; the lookups are shuffled into the bags. NumPy only (the torch worker imports it).

A spec no stream can have (more accessed rows than the table holds, a histogram whose counts cannot add up
to pooling x batch lookups, shares that do not sum to 1) raises ``UserError`` naming the table.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import NUM_BINS, access_histogram, bin_shares

SHARE_TOLERANCE = 1e-3  # how far the bin shares may sum from 1
MAX_COUNT = 1 << 40  # the open last bin's practical ceiling
NEAR_LOOKUPS = 0.02  # a histogram within this share of the lookups is taken, the stream's bags adjusted to it


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """One table's statistics at ``batch_size`` (bins: 17 shares summing to 1, or all 0 for an unused table)."""

    rows: int
    pooling_factor: float
    bins: tuple[float, ...]
    batch_size: int


def bin_bounds() -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest access count of each bin, i64[17] each: 1..1, 2..2, 3..4, ..., 32769..MAX_COUNT."""
    lo = np.array([1] + [(1 << (k - 1)) + 1 for k in range(1, NUM_BINS)], dtype=np.int64)
    hi = np.array([1] + [1 << k for k in range(1, NUM_BINS - 1)] + [MAX_COUNT], dtype=np.int64)
    return lo, hi


def _rows_per_bin(shares: np.ndarray, total: int, settled: bool = False) -> np.ndarray:
    """i64[17] rows per bin for ``total`` accessed rows: largest-remainder rounding of shares x total, every bin
    with a positive share holding at least one row. ``settled``: a bin raised to its one row has no remainder left;
    without it (the rounding every dataset so far was drawn with) a share rounded just below one row (0.99999) takes
    a second row, from the bin that needed it (a 123-row table's two hottest rows became one, and its lookups no
    longer fitted)."""
    exact = shares * total
    counts = np.floor(exact).astype(np.int64)
    positive = shares > 0
    counts[positive & (counts == 0)] = 1
    left = total - counts.sum()
    order = np.argsort(-(exact - (counts if settled else np.floor(exact))), kind="stable")
    for k in order:
        if left <= 0:
            break
        if positive[k]:
            counts[k] += 1
            left -= 1
    return counts


def accessed_rows(spec: TableSpec, lookups: int, where: str = "table") -> np.ndarray:
    """Rows per bin i64[17] whose counts can add up to ``lookups``; raises UserError if the spec allows none. The
    rounding every dataset was drawn with first, then (only where it finds none) the settled one: a stream that
    existed stays as it was; a spec it refused gets one (``_rows_per_bin``)."""
    for settled in (False, True):
        per_bin = _accessed_rows(spec, lookups, settled)
        if per_bin is not None:
            return per_bin
    raise UserError(
        f"{where}: its histogram cannot hold {lookups} lookups (pooling factor {spec.pooling_factor} x batch "
        f"{spec.batch_size}) in at most {spec.rows} rows; expected bins consistent with rows, pooling and batch size"
    )


def _accessed_rows(spec: TableSpec, lookups: int, settled: bool) -> np.ndarray | None:
    """``accessed_rows`` with one rounding; None where it finds no rows per bin."""
    shares = np.asarray(spec.bins, dtype=np.float64)
    lo, hi = bin_bounds()
    mid = np.sqrt(lo * np.minimum(hi, 4 * lo))  # a typical count of each bin (the open bin: up to 4x its floor)
    guess = max(1, int(round(lookups / float(shares @ mid))))
    positive = int((shares > 0).sum())
    near = (math.inf, None)
    # The feasible range of U is an interval (min and max totals grow with U); search outward from the guess.
    for step in range(0, 64):
        for total in sorted({max(positive, guess - step), max(positive, guess + step)}):
            if total > spec.rows:
                continue
            per_bin = _rows_per_bin(shares, total, settled)
            if per_bin @ lo <= lookups <= per_bin @ hi:
                return per_bin
            near = min(near, (max(per_bin @ lo - lookups, lookups - per_bin @ hi), total), key=lambda x: x[0])
    # Not near the guess: bisect on U for the smallest total whose maximum reaches the lookups.
    low, high = positive, spec.rows
    while low < high:
        middle = (low + high) // 2
        if _rows_per_bin(shares, middle, settled) @ hi >= lookups:
            high = middle
        else:
            low = middle + 1
    per_bin = _rows_per_bin(shares, low, settled)
    if low <= spec.rows and per_bin @ lo <= lookups <= per_bin @ hi:
        return per_bin
    # Histograms of exact counts (bins 0 and 1 hold rows hit once and twice) whose rounded row counts miss the
    # lookups by a few: the nearest, the stream then moves those few lookups between bags (``spec_stream``).
    if near[1] is not None and near[0] <= max(2, NEAR_LOOKUPS * lookups):
        return _rows_per_bin(shares, near[1], settled)
    return None


def check_spec(spec: TableSpec, where: str = "table") -> None:
    """Raise UserError unless ``spec`` describes some stream."""
    shares = np.asarray(spec.bins, dtype=np.float64)
    if spec.rows < 1 or spec.batch_size < 1:
        raise UserError(f"{where}: got rows {spec.rows}, batch size {spec.batch_size}, expected both >= 1")
    if shares.shape != (NUM_BINS,) or not np.all(np.isfinite(shares)) or (shares < 0).any():
        raise UserError(f"{where}.bins: got {list(spec.bins)!r:.80}, expected {NUM_BINS} shares >= 0")
    if not math.isfinite(spec.pooling_factor) or spec.pooling_factor < 0:
        raise UserError(f"{where}.pooling_factor: got {spec.pooling_factor}, expected a finite number >= 0")
    total = shares.sum()
    if spec.pooling_factor > 0 and abs(total - 1.0) > SHARE_TOLERANCE:
        raise UserError(f"{where}.bins: shares sum to {total:.4g}, expected 1 (a table that is looked up)")


def spec_stream(spec: TableSpec, seed: int, where: str = "table") -> tuple[np.ndarray, np.ndarray]:
    """One batch of the table: indices i64[L] and offsets i64[B + 1], a function of (spec, seed)."""
    check_spec(spec, where)
    rng = np.random.default_rng([seed, spec.rows, spec.batch_size, 7717])
    lengths = rng.poisson(spec.pooling_factor, size=spec.batch_size)
    offsets = np.zeros(spec.batch_size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    lookups = int(offsets[-1])
    if lookups == 0:
        return np.zeros(0, dtype=np.int64), offsets
    shares = np.asarray(spec.bins, dtype=np.float64) / max(sum(spec.bins), 1e-12)
    per_bin = accessed_rows(dataclasses.replace(spec, bins=tuple(shares)), lookups, where)
    lo, hi = bin_bounds()
    reachable = int(np.clip(lookups, per_bin @ lo, per_bin @ hi))
    if reachable != lookups:  # the nearest histogram (``accessed_rows``): a few bags one lookup longer or shorter
        lengths = _moved_lookups(rng, lengths, reachable - lookups)
        np.cumsum(lengths, out=offsets[1:])
        lookups = reachable
    low, high = np.repeat(lo, per_bin), np.repeat(hi, per_bin)
    counts = low.copy()
    spare = lookups - int(counts.sum())  # spread over the rows within their bins, at random
    room = (high - low).astype(np.float64)
    if spare > 0:
        weights = rng.random(len(counts)) * room
        add = np.minimum(np.floor(spare * weights / weights.sum()).astype(np.int64), high - low)
        counts += add
        spare -= int(add.sum())
        open_rows = np.flatnonzero(counts < high)
        while spare > 0:  # the last few, one at a time where there is room
            chosen = rng.choice(open_rows, size=min(spare, len(open_rows)), replace=False)
            counts[chosen] += 1
            spare -= len(chosen)
            open_rows = np.flatnonzero(counts < high)
    row_ids = rng.choice(spec.rows, size=len(counts), replace=False)
    indices = np.repeat(row_ids.astype(np.int64), counts)
    rng.shuffle(indices)
    return indices, offsets


def _moved_lookups(rng: np.random.Generator, lengths: np.ndarray, delta: int) -> np.ndarray:
    """Bag lengths i64[B] with ``delta`` lookups added to (or, negative, taken from) bags drawn at random."""
    lengths = lengths.copy()
    if delta > 0:
        np.add.at(lengths, rng.integers(0, len(lengths), size=delta), 1)
    elif delta < 0:
        owners = np.repeat(np.arange(len(lengths)), lengths)
        np.subtract.at(lengths, rng.choice(owners, size=-delta, replace=False), 1)
    return lengths


def restrict_rows(
    indices: np.ndarray, offsets: np.ndarray, row_offset: int, num_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """The lookups of one batch (indices i64[L], offsets i64[B + 1]) that land in rows [row_offset, row_offset +
    num_rows), renumbered from 0, with every bag kept (possibly empty): what the owner of that row block of a
    row-wise table receives."""
    indices = np.asarray(indices, dtype=np.int64)
    keep = (indices >= row_offset) & (indices < row_offset + num_rows)
    kept_before = np.concatenate([[0], np.cumsum(keep)])
    return indices[keep] - row_offset, kept_before[np.asarray(offsets, dtype=np.int64)]


# A row read at most this often in one batch is a cold row: the next batch reads other rows in its place
# (``next_batches``), as a training step's next batch does; a row read more often is hot and stays hot.
COLD_READS = 2


def next_batches(
    indices: np.ndarray, offsets: np.ndarray, rows: int, count: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` batches (at least one) of one table (indices i64[L] into ``rows`` rows, offsets i64[B + 1]) with
    the statistics of the given one, which comes first (a batch of no lookup: itself ``count`` times): each other
    has its bags in another order and its cold rows (read at most ``COLD_READS`` times) moved to other rows, none of
    them hot; the hot rows, the bag lengths and the access histogram stay exactly. A function of (the batch,
    ``count``, ``seed``): tables whose streams are one (the column slices of a table) get the same batches.

    Why (docs/results/batches.md): a CPU kernel timed on one batch over and over runs low-pooling tables up to
    1.5x faster than on the batches a training step sees one after another: the core's branch predictors learn the
    bags' lengths and its caches keep the batch's cold rows."""
    indices = np.asarray(indices, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    out = [(indices, offsets)]
    if len(indices) == 0:  # no lookup (an empty row block, a table read by no sample of the batch): bags alone
        return out * max(count, 1)
    if count <= 1:
        return out
    lengths = np.diff(offsets)
    unique, inverse, reads = np.unique(indices, return_inverse=True, return_counts=True)
    cold = reads <= COLD_READS
    hot = unique[~cold]  # sorted
    free = None
    if 2 * len(hot) > rows:  # hot rows everywhere: draw the cold ones' places from the free rows themselves
        free = np.setdiff1d(np.arange(rows, dtype=np.int64), hot, assume_unique=True)
    for k in range(1, count):
        rng = np.random.default_rng([seed, k, 52711])
        order = rng.permutation(len(lengths))
        moved = lengths[order]
        starts = np.zeros(len(moved) + 1, dtype=np.int64)
        np.cumsum(moved, out=starts[1:])
        gather = np.repeat(offsets[:-1][order] - starts[:-1], moved) + np.arange(starts[-1], dtype=np.int64)
        now = unique.copy()
        if cold.any():
            if free is not None:
                now[cold] = free[rng.permutation(len(free))[: int(cold.sum())]]
            else:
                now[cold] = _walk(rng, rows, hot, unique[cold])
        out.append((now[inverse][gather], starts))
    return out


def _walk(rng: np.random.Generator, rows: int, hot: np.ndarray, cold: np.ndarray) -> np.ndarray:
    """The rows ``cold`` (none of them in ``hot``, sorted) moved by a random affine permutation of [0, ``rows``),
    walked on past the hot rows (cycle walking: a permutation of the rows that are not hot), so that they stay
    distinct and none lands on a hot row; O(len(cold)) a batch."""
    scale = int(rng.integers(1, rows)) if rows > 1 else 1
    while math.gcd(scale, rows) != 1:
        scale = int(rng.integers(1, rows))
    shift = int(rng.integers(0, rows))
    moved = (cold * scale + shift) % rows
    landed = np.isin(moved, hot, assume_unique=False)
    while landed.any():
        moved[landed] = (moved[landed] * scale + shift) % rows
        landed[landed] = np.isin(moved[landed], hot)
    return moved


def request_spec(table: dict, batch_size: int) -> tuple[TableSpec, int]:
    """(spec, seed) of a measurement request's table spec {rows, pooling_factor, bins(, seed)} at ``batch_size``:
    the worker's stream is ``spec_stream(spec, seed)``, and everything that reads a label's lookups rebuilds it from
    here. KeyError / TypeError / ValueError on a malformed table."""
    spec = TableSpec(int(table["rows"]), float(table["pooling_factor"]), tuple(table["bins"]), int(batch_size))
    return spec, int(table.get("seed", 0))


def block_statistics(spec: TableSpec, seed: int, row_offset: int, num_rows: int) -> tuple[float, np.ndarray]:
    """(pooling factor, bin shares f64[17]) of the row block [row_offset, row_offset + num_rows) of the spec table's
    batch ``spec_stream(spec, seed)``: the lookups its owner receives, as the worker measures the block. Hot rows
    are scattered, so a block's share of the lookups is rows / table rows only on average: a block that holds
    (or misses) a very hot row is far from it, and its features say so."""
    indices, offsets = spec_stream(spec, seed)
    kept, _ = restrict_rows(indices, offsets, row_offset, num_rows)
    return len(kept) / spec.batch_size, bin_shares(access_histogram(kept, num_rows)[0])


def zipf_ids(rng: np.random.Generator, rows: int, s: float, size: int) -> np.ndarray:
    """i64[size] ids in [0, rows) with P(id = r) ~ (r + 1)^-s, by inverting the continuous law's CDF on [1, rows+1)
    (O(size), no row-sized table)."""
    u = rng.random(size)
    n = rows + 1.0
    if abs(s - 1.0) < 1e-9:
        x = np.exp(u * np.log(n))
    else:
        x = (1.0 + u * (n ** (1.0 - s) - 1.0)) ** (1.0 / (1.0 - s))
    return np.clip(np.floor(x).astype(np.int64) - 1, 0, rows - 1)
