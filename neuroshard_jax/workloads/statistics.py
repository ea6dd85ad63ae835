"""Table statistics from the user's own data: each table's pooling factor and access histogram.

    python -m neuroshard_jax.stats data=PATH out=tables.json batch_size=4096 [format=auto] [max_batches=0]

The statistics are the profiler's (``features.py``): at batch size B, a table's pooling factor is its lookups per
sample, and bin k of its histogram holds the share of the rows one batch of B samples touches whose access count
is in bin k. Samples are regrouped into batches of B whatever the data's own batches are; each full batch gives
one histogram, and a table's bins are their mean (a trailing partial batch counts for the pooling factor only).
A table looked up by several features pools the lookups of all of them (one stream per sample, as TorchRec's
EmbeddingBagCollection does), so its statistics come from their union.

Data: an ``.npz`` with ``NAME/indices`` and ``NAME/offsets`` (or ``NAME/lengths``) per feature (``NAME/rows``
optional), or a DLRM benchmark file (``indices``, ``offsets``, ``lengths`` [T, B]; tables named ``t0``, ``t1``,
...). Rows are the given ones, else the DLRM rule max(100, largest index + 1). From TorchRec batches, the
adapter (``torchrec_planner.batch_statistics``) feeds the same accumulator.

Without data, ``estimated_stats`` draws one batch from rows and a pooling factor with an assumed Zipf exponent
(ids ~ Zipf(s) over the rows); such a table is marked ``"estimated": true`` and the printed plan warns.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from neuroshard_jax.core.config import bounded, check_bounds, plain
from neuroshard_jax.core.constants import MIN_ROWS
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import NUM_BINS, bin_shares, count_bins, count_histogram
from neuroshard_jax.core.files import JSONDoc, read_json
from neuroshard_jax.core.progress import progress_bar
from neuroshard_jax.core.schema import row_blocks_from_json, row_blocks_json
from neuroshard_jax.core.sharding import row_block_size
from neuroshard_jax.core.table import RowBlockStats
from neuroshard_jax.workloads.pool import load_dlrm_arrays
from neuroshard_jax.workloads.streams import zipf_ids

logger = logging.getLogger(__name__)
DEFAULT_ZIPF = 1.05  # the estimate's assumed exponent; published DLRM tables span roughly 0.6..1.4
FORMATS = ("auto", "npz", "dlrm")
ROW_BLOCK_COUNTS = (2, 4, 8)  # the row-block counts whose statistics are measured (rows known up front)


@dataclasses.dataclass(frozen=True)
class TableStats:
    """One table's statistics at ``batch_size``: ``bins`` f64[17] sum to 1 (all 0 for a table never looked up).
    ``samples`` / ``batches``: how much data they come from (0 for an estimate)."""

    name: str
    rows: int
    pooling_factor: float
    bins: tuple[float, ...]
    batch_size: int
    samples: int
    batches: int
    estimated: bool = False
    row_blocks: tuple[RowBlockStats, ...] = ()  # its row blocks' own statistics (rows known up front only)

    def to_json(self) -> JSONDoc:
        out = {
            "name": self.name,
            "rows": self.rows,
            "pooling_factor": self.pooling_factor,
            "bins": list(self.bins),
            "samples": self.samples,
            "batches": self.batches,
        }
        if self.estimated:
            out["estimated"] = True
        if self.row_blocks:
            out["row_blocks"] = row_blocks_json(self.row_blocks)
        return out


def read_stats_file(path: str | Path) -> list[TableStats]:
    """The tables of a statistics file (``stats_file``, as the command writes it)."""
    obj = read_json(path, "stats", "a statistics file of python -m neuroshard_jax.stats")
    try:
        batch = int(obj["batch_size"])
        return [
            TableStats(
                t["name"],
                int(t["rows"]),
                float(t["pooling_factor"]),
                tuple(float(b) for b in t["bins"]),
                batch,
                int(t.get("samples", 0)),
                int(t.get("batches", 0)),
                bool(t.get("estimated", False)),
                row_blocks_from_json(
                    t.get("row_blocks", []), int(t["rows"]), float(t["pooling_factor"]), f"{where}.row_blocks"
                ),
            )
            for where, t in ((f"stats {str(path)!r}: table {i}", t) for i, t in enumerate(obj["tables"]))
        ]
    except (ValueError, KeyError, TypeError) as err:
        raise UserError(
            f"stats: {str(path)!r} is not a statistics file ({err!r}), expected batch_size and tables"
        ) from None


@dataclasses.dataclass
class _Table:
    """The accumulator's state of one table: buffered samples (values + lengths chunks) and running sums."""

    values: list[np.ndarray] = dataclasses.field(default_factory=list)
    lengths: list[np.ndarray] = dataclasses.field(default_factory=list)
    buffered: int = 0
    samples: int = 0
    lookups: int = 0
    largest: int = -1
    share_sum: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(NUM_BINS))
    batches: int = 0
    # per block count: lookups f64[count] and summed bin shares f64[count, 17] over full batches
    block_lookups: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)
    block_share_sum: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)


class StatsAccumulator:
    """Statistics of tables from a stream of batches, in bounded memory (at most one batch of B samples buffered
    per table). ``feature_tables`` maps each feature to its table (default: a table per feature, named like it);
    ``rows`` gives tables' row counts (others get the DLRM rule). A table whose rows are given also gets the
    statistics of its row blocks for each count of ``row_blocks`` (TorchRec's row-wise layout), what a row-wise
    split of it would send each device."""

    def __init__(
        self,
        batch_size: int,
        feature_tables: Mapping[str, str] | None = None,
        rows: Mapping[str, int] | None = None,
        row_blocks: Sequence[int] = ROW_BLOCK_COUNTS,
    ):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UserError(f"batch_size: got {batch_size!r}, expected an integer >= 1")
        self.row_blocks = checked_block_counts(row_blocks)
        self.batch_size = batch_size
        self.feature_tables = dict(feature_tables) if feature_tables is not None else None
        self.rows = dict(rows or {})
        self._tables: dict[str, _Table] = {}

    def add(self, features: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """One batch: per feature (values i64[L], lengths i64[B']), every feature with the same B' samples.
        The features of one table are pooled per sample."""
        per_table: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        size = None
        for feature, (values, lengths) in features.items():
            values = np.asarray(values, dtype=np.int64).reshape(-1)
            lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
            if lengths.sum() != len(values) or (len(lengths) and lengths.min() < 0):
                raise UserError(
                    f"feature {feature!r}: lengths sum to {int(lengths.sum())} for {len(values)} values, "
                    "expected non-negative lengths summing to the number of values"
                )
            if size is not None and len(lengths) != size:
                raise UserError(
                    f"feature {feature!r}: {len(lengths)} samples in a batch of {size}, expected the same per feature"
                )
            size = len(lengths)
            if len(values) and values.min() < 0:
                raise UserError(f"feature {feature!r}: index {int(values.min())}, expected indices >= 0")
            table = self._table_of(feature)
            if table is not None:
                per_table.setdefault(table, []).append((values, lengths))
        for table, parts in per_table.items():
            values, lengths = parts[0] if len(parts) == 1 else _pool_per_sample(parts)
            self._add_table(table, values, lengths)

    def _table_of(self, feature: str) -> str | None:
        """The table ``feature`` feeds, or None for a feature no table reads (an EmbeddingBagCollection ignores it)."""
        if self.feature_tables is None:
            return feature
        return self.feature_tables.get(feature)

    def _add_table(self, name: str, values: np.ndarray, lengths: np.ndarray) -> None:
        state = self._tables.setdefault(name, _Table())
        limit = self.rows.get(name)
        if limit is not None and len(values) and values.max() >= limit:
            raise UserError(f"table {name!r}: index {int(values.max())}, expected indices below its {limit} rows")
        state.values.append(values)
        state.lengths.append(lengths)
        state.buffered += len(lengths)
        state.samples += len(lengths)
        state.lookups += len(values)
        if len(values):
            state.largest = max(state.largest, int(values.max()))
        if state.buffered >= self.batch_size:
            self._flush_batches(state, limit)

    def _flush_batches(self, state: _Table, rows: int | None) -> None:
        """A histogram per full batch of ``batch_size`` buffered samples (one concatenation), and with ``rows``
        one per row block of each count; the rest stays."""
        values, lengths = np.concatenate(state.values), np.concatenate(state.lengths)
        starts = np.concatenate([[0], np.cumsum(lengths)])
        full = state.buffered // self.batch_size
        for b in range(full):
            batch = values[starts[b * self.batch_size] : starts[(b + 1) * self.batch_size]]
            if len(batch):
                ids, counts = np.unique(batch, return_counts=True)
                state.share_sum += bin_shares(count_histogram(counts)[0])
                for count in (c for c in self.row_blocks if rows is not None and c <= rows):
                    _add_blocks(state, count, ids // row_block_size(rows, count), counts)
        state.batches += full
        cut = full * self.batch_size
        state.values, state.lengths = [values[starts[cut] :]], [lengths[cut:]]
        state.buffered -= cut

    def result(self) -> list[TableStats]:
        """Every table seen, in first-seen order (tables of ``feature_tables`` never seen are left out: a model whose
        towers read separate loaders is measured loader by loader). A table needs at least one full batch."""
        names = list(self._tables)
        out = []
        for name in names:
            state = self._tables.get(name, _Table())
            if state.batches == 0:
                raise UserError(
                    f"table {name!r}: {state.samples} samples, expected at least one batch of "
                    f"{self.batch_size} (the planning batch size)"
                )
            rows = self.rows.get(name, max(MIN_ROWS, state.largest + 1))
            bins = state.share_sum / state.batches
            if bins.sum() > 0:
                bins = bins / bins.sum()
            pooling = state.lookups / state.samples
            out.append(
                TableStats(
                    name,
                    int(rows),
                    pooling,
                    tuple(float(b) for b in bins),
                    self.batch_size,
                    state.samples,
                    state.batches,
                    row_blocks=_block_stats(state, pooling),
                )
            )
        return out


def checked_block_counts(counts: Sequence[int]) -> tuple[int, ...]:
    """The row-block counts whose statistics are measured, sorted; UserError unless each is an integer >= 2."""
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 2 for c in counts):
        raise UserError(f"row_blocks: got {list(counts)!r:.60}, expected block counts (integers >= 2)")
    return tuple(sorted(set(counts)))


def _add_blocks(state: _Table, count: int, block_of: np.ndarray, counts: np.ndarray) -> None:
    """One full batch's unique ids (their block ``block_of`` i64[U] and access ``counts`` i64[U]) added to the
    table's row-block sums of ``count`` blocks."""
    lookups = state.block_lookups.setdefault(count, np.zeros(count))
    shares = state.block_share_sum.setdefault(count, np.zeros((count, NUM_BINS)))
    lookups += np.bincount(block_of, weights=counts, minlength=count)
    rows = np.bincount(block_of * NUM_BINS + count_bins(counts), minlength=count * NUM_BINS).reshape(count, NUM_BINS)
    touched = rows.sum(axis=1)  # each block's accessed rows: its histogram's shares (``bin_shares``) in one pass
    shares += rows / np.maximum(touched, 1)[:, None]


def _block_stats(state: _Table, pooling: float) -> tuple[RowBlockStats, ...]:
    """Each block count's statistics: the table's pooling factor shared by the blocks' lookups in full batches,
    and each block's mean histogram over the batches (renormalised; all 0 for a block never looked up)."""
    out = []
    for count, lookups in sorted(state.block_lookups.items()):
        total = lookups.sum()
        factors = pooling * lookups / total if total > 0 else np.zeros(count)
        shares = state.block_share_sum[count]
        bins = shares / np.maximum(shares.sum(axis=1, keepdims=True), 1e-300)  # a block never looked up: all 0
        out.append(RowBlockStats(count, tuple(map(float, factors)), tuple(tuple(map(float, b)) for b in bins)))
    return tuple(out)


def _pool_per_sample(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The features of one table as one stream: sample i's lookups are those of every feature's sample i."""
    lengths = np.sum([p[1] for p in parts], axis=0)
    sample_of = [np.repeat(np.arange(len(p[1])), p[1]) for p in parts]
    values = np.concatenate([p[0] for p in parts])
    order = np.argsort(np.concatenate(sample_of), kind="stable")
    return values[order], lengths


def estimated_stats(
    name: str, rows: int, pooling_factor: float, batch_size: int, zipf: float = DEFAULT_ZIPF, seed: int = 0
) -> TableStats:
    """A table's statistics without data: one batch of Poisson(pooling_factor) bags whose ids follow a Zipf law
    of exponent ``zipf`` over the rows (0: uniform), measured like real data; marked estimated."""
    if not (isinstance(rows, int) and rows >= 1):
        raise UserError(f"table {name!r}: rows {rows!r}, expected an integer >= 1")
    if not (math.isfinite(pooling_factor) and pooling_factor >= 0):
        raise UserError(f"table {name!r}: pooling_factor {pooling_factor!r}, expected a finite number >= 0")
    zipf = plain(zipf)
    if isinstance(zipf, bool) or not isinstance(zipf, (int, float)) or not (math.isfinite(zipf) and zipf >= 0):
        raise UserError(f"zipf: got {zipf!r:.60}, expected a finite exponent >= 0")
    rng = np.random.default_rng(seed)
    lookups = int(rng.poisson(pooling_factor, size=batch_size).sum())
    ids = zipf_ids(rng, rows, zipf, lookups)
    bins = bin_shares(count_histogram(np.unique(ids, return_counts=True)[1])[0]) if lookups else np.zeros(NUM_BINS)
    return TableStats(name, rows, float(pooling_factor), tuple(float(b) for b in bins), batch_size, 0, 0, True)


# ---------------------------------------------------------------------------------------------
# Files


def read_npz(path: Path) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, int]]:
    """Per feature (indices, lengths) and the given rows of an ``.npz`` with NAME/indices + NAME/offsets or
    NAME/lengths (+ NAME/rows)."""
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise UserError(f"data: cannot read {str(path)!r} as an .npz ({err})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise UserError(f"data: {str(path)!r} holds one array, expected an .npz of NAME/indices, NAME/offsets arrays")
    with data:
        keys = set(data.files)
        names = sorted({k.rsplit("/", 1)[0] for k in keys if k.endswith("/indices")})
        if not names:
            raise UserError(
                f"data: {str(path)!r} has no NAME/indices arrays (keys: {', '.join(sorted(keys)[:6])}), expected "
                "NAME/indices with NAME/offsets or NAME/lengths per feature"
            )
        features, rows = {}, {}
        for name in names:
            indices = _int_array(data, f"{name}/indices", path)
            if f"{name}/lengths" in keys:
                lengths = _int_array(data, f"{name}/lengths", path)
                if lengths.min(initial=0) < 0 or lengths.sum() != len(indices):
                    raise UserError(
                        f"data: {name}/lengths of {str(path)!r} sum to {int(lengths.sum())} (min "
                        f"{int(lengths.min(initial=0))}), expected non-negative lengths summing to {len(indices)}"
                    )
            elif f"{name}/offsets" in keys:
                offsets = _int_array(data, f"{name}/offsets", path)
                if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(indices) or np.any(np.diff(offsets) < 0):
                    raise UserError(
                        f"data: {name}/offsets of {str(path)!r} must start at 0, not decrease and end at "
                        f"{len(indices)} (the number of indices)"
                    )
                lengths = np.diff(offsets)
            else:
                raise UserError(f"data: {str(path)!r} has {name}/indices but neither {name}/offsets nor {name}/lengths")
            features[name] = (indices, lengths)
            if f"{name}/rows" in keys:
                value = _int_array(data, f"{name}/rows", path, dims=0)
                if value < 1:
                    raise UserError(f"data: {name}/rows of {str(path)!r} is {int(value)}, expected a row count >= 1")
                rows[name] = int(value)
    empty = [name for name, (_, lengths) in features.items() if len(lengths) == 0]
    if len(empty) == len(features):
        raise UserError(f"data: every feature of {str(path)!r} has 0 samples, expected at least one batch of samples")
    if empty:  # nothing to measure, but said: a feature missing from the statistics file is otherwise a surprise
        logger.warning(
            "data: features of %r with 0 samples are left out of the statistics: %s", str(path), ", ".join(empty)
        )
        features = {name: f for name, f in features.items() if name not in empty}
        rows = {name: n for name, n in rows.items() if name not in empty}
    sizes = {len(v[1]) for v in features.values()}
    if len(sizes) != 1:
        raise UserError(f"data: the features of {str(path)!r} have different sample counts {sorted(sizes)}")
    return features, rows


def _int_array(data, key: str, path: Path, dims: int = 1) -> np.ndarray:
    """An integer array of ``dims`` dimensions from an npz, or a one-line error naming it."""
    try:
        value = data[key]
    except ValueError as err:
        raise UserError(f"data: {key} of {str(path)!r} cannot be read ({err})") from None
    if value.ndim != dims or not np.issubdtype(value.dtype, np.integer):
        raise UserError(
            f"data: {key} of {str(path)!r} is {value.dtype}{list(value.shape)}, expected integers of {dims} dimensions"
        )
    return value.astype(np.int64)


def file_batches(features: Mapping[str, tuple[np.ndarray, np.ndarray]], chunk: int) -> Iterable[dict]:
    """The file's samples in chunks of ``chunk`` samples (the accumulator regroups them into batches)."""
    size = len(next(iter(features.values()))[1])
    starts = {name: np.concatenate([[0], np.cumsum(lengths)]) for name, (_, lengths) in features.items()}
    for lo in range(0, size, chunk):
        hi = min(size, lo + chunk)
        yield {
            name: (values[starts[name][lo] : starts[name][hi]], lengths[lo:hi])
            for name, (values, lengths) in features.items()
        }


def data_features(path: str | Path, fmt: str = "auto") -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict]:
    """(features, rows) of a data file: an npz of features, or a DLRM benchmark file (tables t0, t1, ...)."""
    path = Path(path)
    if fmt not in FORMATS:
        raise UserError(f"format: got {fmt!r}, expected one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise UserError(f"data: {str(path)!r} does not exist or is not a file, expected an .npz or a DLRM file")
    if fmt == "npz" or (fmt == "auto" and path.suffix == ".npz"):
        return read_npz(path)
    try:
        arrays = load_dlrm_arrays(path)
    except UserError as err:  # the pool loader names its own setting
        raise UserError(f"data: {str(err).removeprefix('pool.path: ')} (or an .npz of NAME/indices)") from None
    lengths = arrays.offsets[1:] - arrays.offsets[:-1]
    per_table = lengths.reshape(-1, arrays.file_batch)
    features = {}
    for t in range(per_table.shape[0]):
        start, stop = arrays.offsets[t * arrays.file_batch], arrays.offsets[(t + 1) * arrays.file_batch]
        features[f"t{t}"] = (arrays.indices[start:stop], per_table[t])
    return features, {}


def file_stats(
    path: str | Path,
    batch_size: int,
    fmt: str = "auto",
    max_batches: int = 0,
    progress: bool = True,
    row_blocks: Sequence[int] = ROW_BLOCK_COUNTS,
) -> list[TableStats]:
    """Statistics of every table (feature) of a data file at ``batch_size`` (at most ``max_batches`` batches;
    0: all); tables whose rows the file gives also get their ``row_blocks`` counts' block statistics."""
    features, rows = data_features(path, fmt)
    accumulator = StatsAccumulator(batch_size, rows=rows, row_blocks=row_blocks)
    size = len(next(iter(features.values()))[1])
    limit = size if max_batches <= 0 else min(size, max_batches * batch_size)
    chunks = file_batches({n: _head(v, limit) for n, v in features.items()}, batch_size)
    for chunk in progress_bar(chunks, enabled=progress, total=math.ceil(limit / batch_size), desc="batches"):
        accumulator.add(chunk)
    return accumulator.result()


def _head(feature: tuple[np.ndarray, np.ndarray], samples: int) -> tuple[np.ndarray, np.ndarray]:
    values, lengths = feature
    return values[: int(lengths[:samples].sum())], lengths[:samples]


# ---------------------------------------------------------------------------------------------
# The command line


@dataclasses.dataclass(frozen=True)
class StatsConfig:
    """conf/stats.yaml."""

    # an .npz with NAME/indices + NAME/offsets (or NAME/lengths) per feature, or a DLRM benchmark file
    data: str | None = None
    out: str = "tables.json"  # the statistics file (per table: rows, pooling_factor, bins, samples, batches)
    # the batch the statistics are taken at: the planning batch (per-rank batch x ranks in TorchRec)
    batch_size: int = bounded(at_least=1, default=4096)
    format: str = "auto"  # auto (.npz by suffix, else DLRM), npz or dlrm
    max_batches: int = bounded(at_least=0, default=0)  # read at most this many batches (0: all)
    progress: bool = True  # a progress bar on stderr
    # tables with rows given (NAME/rows): statistics of their row blocks cut in this many
    row_blocks: tuple[int, ...] = ROW_BLOCK_COUNTS

    def __post_init__(self):
        if self.format not in FORMATS:
            raise UserError(f"format: got {self.format!r}, expected one of {', '.join(FORMATS)}")
        checked_block_counts(self.row_blocks)
        check_bounds(self)


def stats_file(tables: list[TableStats], batch_size: int, source: str) -> JSONDoc:
    """The statistics file: what ``plan``/the TorchRec planner read (give each table a ``dim`` to make it a
    task's table list)."""
    return {"batch_size": batch_size, "source": source, "tables": [t.to_json() for t in tables]}
