"""Table pools: where tables, their features and their index streams come from.

Three sources, one interface (``TablePool``):

* ``synthetic``: a DLRM-like pool generated from a seed. Each table has a row count, a mean
  pooling factor and a power-law access skew; its index stream for a batch (indices + offsets,
  the layout FBGEMM consumes) is regenerated on demand from ``(seed, table id, batch size)``,
  so nothing but the seed is stored. Calibrated against the published 2021 DLRM statistics
  (``tools/calibrate_pool.py`` prints the distances, ``tests/test_tables.py`` checks them).
* ``zipf``: another law from a seed (Zipf ranks hashed into the rows; ``zipf_pool.py``), an independent
  reader's, for checking that what a table's histogram keeps is what its kernel feels.
* ``dlrm``: the public DLRM benchmark file format (``torch.load`` gives indices, offsets,
  lengths). torch is never imported here: the file is converted to ``.npz`` once by the
  torch worker subprocess (``neuroshard_jax.kernels.worker``).

Features (rows, pooling factor, 17-bin access histogram) are measured from the streams at the
pool's batch size and cached on disk (``NEUROSHARD_CACHE_DIR``, default ``~/.cache/neuroshard_jax``).
NumPy only: the profiling worker imports this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import numpy as np

from neuroshard_jax.core.constants import GENERATOR_VERSION, GIB_BYTES, MIN_ROWS
from neuroshard_jax.core.errors import UserError, first_line
from neuroshard_jax.core.features import NUM_BINS, access_histogram, bin_shares, count_histogram
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.hardware import MEMORY_SHARE, available_bytes
from neuroshard_jax.core.paths import CACHE_HINT, cache_dir, cache_folder, pool_file_digest
from neuroshard_jax.core.table import PoolSpec
from neuroshard_jax.workloads.zipf_pool import ZipfStreams, zipf_table_params


@dataclasses.dataclass(frozen=True)
class SyntheticPoolConfig:
    """Distributions of the synthetic generator; the defaults are the calibrated ones.

    Two kinds of table. A share ``small_share`` are small categorical tables: log10(rows) uniform
    on [log10_rows_min, small_log10_rows_max], near-uniform access (popularity sigma ``skew_low``).
    The others: log10(rows) = log10_rows_min + span * Kumaraswamy(rows_shape_a, rows_shape_b), and
    a popularity sigma of ``skew_low`` for a share ``skew_low_share`` of them, else
    skew_min + (skew_max - skew_min) * U^skew_power (a few very skewed tables).
    Mean pooling factor ~ LogNormal(log(pooling_mean) - sigma^2/2, sigma), correlated with log rows
    by ``pooling_rows_corr``, clipped; per-sample bag length ~ Poisson(pooling factor).
    Row popularity is log-normal across a table's rows; popular rows are scattered over the table by
    an affine bijection (hot rows are not contiguous). ``tools/fit_pool.py`` fits these numbers.
    """

    log10_rows_min: float = 2.0
    log10_rows_max: float = 7.0
    rows_shape_a: float = 3.083
    rows_shape_b: float = 2.914
    pooling_mean: float = 15.8
    pooling_sigma: float = 0.789
    pooling_min: float = 0.05
    pooling_max: float = 400.0
    skew_min: float = 0.945
    skew_max: float = 2.673
    skew_power: float = 0.831
    skew_low_share: float = 0.636
    skew_low: float = 0.544
    pooling_rows_corr: float = 0.0
    small_share: float = 0.109
    small_log10_rows_max: float = 2.774


@dataclasses.dataclass(frozen=True, eq=False)
class TablePool:
    """A pool of tables at one batch size.

    rows: i64[P]; pooling_factor: f64[P] (measured mean bag length); bins: f64[P, 17].
    """

    spec: PoolSpec
    batch_size: int
    rows: np.ndarray
    pooling_factor: np.ndarray
    bins: np.ndarray
    _streams: StreamSource = dataclasses.field(repr=False, default=None)

    @property
    def num_tables(self) -> int:
        return len(self.rows)

    def index_stream(self, table_id: int) -> tuple[np.ndarray, np.ndarray]:
        """The table's indices i64[L] and offsets i64[B + 1] for one batch."""
        if not 0 <= table_id < self.num_tables:
            raise UserError(f"table id: got {table_id}, expected 0..{self.num_tables - 1} in pool {self.spec.pool_id}")
        return self._streams.stream(table_id, self.batch_size)


class StreamSource:
    """Produces index streams; subclasses for synthetic and file-backed pools."""

    def stream(self, table_id: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def fingerprint(self) -> str:
        """A digest of what determines the streams beyond the pool id (for cache keys)."""
        return ""


# ---------------------------------------------------------------------------------------------
# Synthetic pools


@dataclasses.dataclass(frozen=True)
class SyntheticTableParams:
    """Per-table generator parameters. rows i64[P], pooling f64[P], skew f64[P], scatter i64[P, 2]."""

    rows: np.ndarray
    pooling: np.ndarray
    skew: np.ndarray
    scatter: np.ndarray


def synthetic_table_params(seed: int, num_tables: int, config: SyntheticPoolConfig = SyntheticPoolConfig()):
    """Draw every table's parameters; table t depends only on (seed, t), so pools nest."""
    rows = np.empty(num_tables, dtype=np.int64)
    pooling = np.empty(num_tables)
    skew = np.empty(num_tables)
    scatter = np.empty((num_tables, 2), dtype=np.int64)
    sigma = config.pooling_sigma
    mu = math.log(config.pooling_mean) - sigma**2 / 2
    for t in range(num_tables):
        rng = np.random.default_rng([seed, GENERATOR_VERSION, t])
        u_rows, z_pooling, u_skew, u_kind = rng.random(), rng.standard_normal(), rng.random(), rng.random()
        small = u_kind < config.small_share  # small categorical tables, accessed near-uniformly
        # Kumaraswamy quantile: a Beta-like shape with a closed-form inverse CDF (smooth in the config).
        q = (1.0 - (1.0 - u_rows) ** (1.0 / config.rows_shape_b)) ** (1.0 / config.rows_shape_a)
        top = config.small_log10_rows_max if small else config.log10_rows_max
        log_rows = config.log10_rows_min + (top - config.log10_rows_min) * (u_rows if small else q)
        rows[t] = max(MIN_ROWS, int(round(10**log_rows)))
        # Pooling is correlated with size (rho < 0: big id-like tables are looked up less per sample).
        z_rows = math.sqrt(2.0) * _erfinv(2.0 * q - 1.0)
        rho = config.pooling_rows_corr
        z = rho * z_rows + math.sqrt(1.0 - rho * rho) * z_pooling
        pooling[t] = float(np.clip(math.exp(mu + sigma * z), config.pooling_min, config.pooling_max))
        if small or u_skew < config.skew_low_share:  # a mildly skewed group (near-uniform access) ...
            skew[t] = config.skew_low
        else:  # ... and a strongly skewed one
            u = (u_skew - config.skew_low_share) / (1.0 - config.skew_low_share)
            skew[t] = config.skew_min + (config.skew_max - config.skew_min) * u**config.skew_power
        multiplier = int(rng.integers(1, rows[t]))
        while math.gcd(multiplier, int(rows[t])) != 1:
            multiplier += 1
        scatter[t] = (multiplier % rows[t], rng.integers(0, rows[t]))
    return SyntheticTableParams(rows, pooling, skew, scatter)


def _erfinv(y: float) -> float:
    """Inverse error function by Newton steps on math.erf (scalar; used once per table)."""
    y = min(max(y, -1 + 1e-12), 1 - 1e-12)
    x = 0.0
    for _ in range(60):
        step = (math.erf(x) - y) / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
        x -= step
        if abs(step) < 1e-12:
            break
    return x


def normal_sf(z: np.ndarray) -> np.ndarray:
    """P(Z > z) for a standard normal, with relative error < 1.2e-7 even deep in the tail.

    Chebyshev fit of erfc (Numerical Recipes' erfcc); numpy has no erfc.
    """
    x = np.abs(z) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.5 * x)
    poly = -1.26551223 + t * (
        1.00002368
        + t
        * (
            0.37409196
            + t
            * (
                0.09678418
                + t
                * (
                    -0.18628806
                    + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))
                )
            )
        )
    )
    erfc = t * np.exp(-x * x + poly)
    return np.where(z >= 0, 0.5 * erfc, 1.0 - 0.5 * erfc)


def lognormal_popularity_ranks(rng: np.random.Generator, num_rows: int, sigma: float, size: int) -> np.ndarray:
    """Ranks in [0, num_rows) where rank r has popularity exp(sigma * z_r), z_r the normal quantile of r.

    Row r sits at upper-tail quantile (r + 1/2) / num_rows. Sampling a row with probability
    proportional to exp(sigma * z) is sampling z from the tilted law N(sigma, 1), then mapping
    z back to its quantile: exact, vectorised, no table of probabilities.
    """
    z = rng.normal(sigma, 1.0, size)
    return np.minimum((normal_sf(z) * num_rows).astype(np.int64), num_rows - 1)


class SyntheticStreams(StreamSource):
    def __init__(self, seed: int, params: SyntheticTableParams):
        self.seed = seed
        self.params = params

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for array in (self.params.rows, self.params.pooling, self.params.skew, self.params.scatter):
            digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()[:12]

    def lengths(self, table_id: int, batch_size: int) -> tuple[np.random.Generator, np.ndarray]:
        rng = np.random.default_rng([self.seed, GENERATOR_VERSION, table_id, batch_size])
        return rng, rng.poisson(self.params.pooling[table_id], size=batch_size)

    def stream(self, table_id: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        rng, lengths = self.lengths(table_id, batch_size)
        num_rows = int(self.params.rows[table_id])
        ranks = lognormal_popularity_ranks(rng, num_rows, float(self.params.skew[table_id]), int(lengths.sum()))
        multiplier, shift = self.params.scatter[table_id]
        indices = (ranks * multiplier + shift) % num_rows
        offsets = np.zeros(batch_size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return indices, offsets


def stream_histogram(indices: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """access_histogram, with np.unique for sparse streams (no row-sized buffer)."""
    if len(indices) * 8 < num_rows:
        return count_histogram(np.unique(indices, return_counts=True)[1])
    return access_histogram(indices, num_rows)


# ---------------------------------------------------------------------------------------------
# DLRM benchmark files


class ArrayStreams(StreamSource):
    """Streams held as arrays: lengths i64[T, B_file], offsets i64[T*B_file + 1], indices i64[L]."""

    def __init__(self, indices: np.ndarray, offsets: np.ndarray, lengths: np.ndarray):
        self.indices = indices
        self.offsets = offsets
        self.file_batch = lengths.shape[1]

    def stream(self, table_id: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        if batch_size > self.file_batch:
            raise UserError(f"batch_size: got {batch_size}, expected at most {self.file_batch} (the file's batch size)")
        start = table_id * self.file_batch
        offsets = self.offsets[start : start + batch_size + 1].astype(np.int64)
        indices = self.indices[offsets[0] : offsets[-1]].astype(np.int64)
        return indices, offsets - offsets[0]


logger = logging.getLogger(__name__)


def cached_arrays(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    """The arrays ``keys`` of the cache file ``path``; None where there is none, or where it is damaged (a torn or
    truncated write, another program's file): then it is removed, with a one-line warning, to be rebuilt."""
    if not path.is_file():  # none, or not a regular file (a FIFO, a device): never opened
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in keys}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        logger.warning("cache file %s is damaged (%s): rebuilding it", path, first_line(err))
        with contextlib.suppress(OSError):
            path.unlink()
        return None


def write_cache(path: Path, **arrays: np.ndarray) -> None:
    """Write a cache file whole (a temporary file renamed over it); where the cache folder cannot be written, warn
    in one line and go on without it (the next run measures again)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    except OSError as err:
        logger.warning("cannot write the cache file %s (%s); %s", path, err.strerror or err, CACHE_HINT)


def load_dlrm_arrays(path: Path) -> ArrayStreams:
    """Read a DLRM benchmark file (converted to .npz by the torch worker on first use)."""
    folder = cache_folder("dlrm", "converted DLRM files")
    if folder is None:
        raise UserError(f"pool.path: its converted copy cannot be kept in {str(cache_dir() / 'dlrm')!r}; {CACHE_HINT}")
    npz = folder / f"{pool_file_digest(path)}.npz"
    data = cached_arrays(npz, ("indices", "offsets", "lengths"))
    if data is None:
        tmp = npz.with_suffix(f".{os.getpid()}.tmp.npz")
        cmd = [sys.executable, "-m", "neuroshard_jax.kernels.worker", "dlrm-to-npz", str(path), str(tmp)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise UserError(f"pool.path: cannot read {str(path)!r} as a DLRM benchmark file: {reason}")
        os.replace(tmp, npz)
        data = cached_arrays(npz, ("indices", "offsets", "lengths"))
        if data is None:
            raise UserError(f"pool.path: the converted copy of {str(path)!r} at {str(npz)!r} cannot be read back")
    indices, offsets, lengths = data["indices"], data["offsets"], data["lengths"]
    if lengths.ndim != 2 or len(offsets) != lengths.size + 1:
        raise UserError(
            f"pool.path: {str(path)!r} has lengths of shape {lengths.shape} and {len(offsets)} offsets, "
            "expected lengths [T, B] and T*B + 1 offsets"
        )
    return ArrayStreams(indices, offsets, lengths)


# ---------------------------------------------------------------------------------------------
# Features and caching


def measure_features(streams: StreamSource, rows: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Measured mean pooling factor f64[P] and bin shares f64[P, 17] of every table."""
    pooling = np.empty(len(rows))
    bins = np.empty((len(rows), NUM_BINS))
    for t in range(len(rows)):
        indices, _ = streams.stream(t, batch_size)
        pooling[t] = len(indices) / batch_size
        bins[t] = bin_shares(stream_histogram(indices, int(rows[t]))[0])
    return pooling, bins


def pool_streams(spec: PoolSpec) -> tuple[np.ndarray, StreamSource]:
    """Row counts i64[P] and the stream source of a pool, without measuring features."""
    if spec.source == "synthetic":
        params = synthetic_table_params(spec.seed, spec.num_tables)
        return params.rows, SyntheticStreams(spec.seed, params)
    if spec.source == "zipf":
        params = zipf_table_params(spec.seed, spec.num_tables)
        return params.rows, ZipfStreams(spec.seed, params)
    streams = load_dlrm_arrays(Path(spec.path))
    return np.maximum(MIN_ROWS, _max_index_per_table(streams) + 1), streams


def load_pool(spec: PoolSpec, batch_size: int) -> TablePool:
    """Build (or read from the cache) the pool of ``spec`` at ``batch_size``."""
    if batch_size < 1:
        raise UserError(f"batch_size: got {batch_size}, expected a positive integer")
    rows, streams = pool_streams(spec)
    _check_stream_room(streams, batch_size)
    # The generator's parameters are in the key: features cached before a recalibration are never reused.
    key = "-".join(filter(None, (spec.pool_id, streams.fingerprint(), f"b{batch_size}")))
    folder = cache_folder("pools", "pool features")
    cache = None if folder is None else folder / f"{key}.npz"
    data = None if cache is None else cached_arrays(cache, ("pooling_factor", "bins"))
    if data is not None and data["bins"].shape == (len(rows), NUM_BINS) and data["pooling_factor"].shape == rows.shape:
        pooling, bins = data["pooling_factor"], data["bins"]
    else:
        pooling, bins = measure_features(streams, rows, batch_size)
        if cache is not None:
            write_cache(cache, pooling_factor=pooling, bins=bins)
    return TablePool(spec, batch_size, rows, pooling, bins, streams)


STREAM_BYTES = 24  # per lookup while a table's stream is measured: its id, its bag's offset share, the histogram's sort


def _check_stream_room(streams: StreamSource, batch_size: int) -> None:
    """UserError where the busiest synthetic table's stream at ``batch_size`` (its expected lookups) would not fit
    this machine's available memory: refused before it is drawn (a batch of 2**40 asked for 8 TiB at once)."""
    params = getattr(streams, "params", None)
    room = available_bytes()
    if params is None or room is None:
        return
    need = float(np.max(params.pooling)) * batch_size * STREAM_BYTES
    if need > MEMORY_SHARE * room:
        raise UserError(
            f"task.batch_size: got {batch_size}, at which the pool's busiest table draws a stream of "
            f"{need / GIB_BYTES:.1f} GiB, this machine has {room / GIB_BYTES:.1f} GiB available; expected a smaller "
            "batch"
        )


def _max_index_per_table(streams: ArrayStreams) -> np.ndarray:
    num_tables = len(streams.offsets[:-1]) // streams.file_batch
    bounds = streams.offsets[:: streams.file_batch]
    out = np.full(num_tables, -1, dtype=np.int64)
    for t in range(num_tables):
        chunk = streams.indices[bounds[t] : bounds[t + 1]]
        if len(chunk):
            out[t] = int(chunk.max())
    return out


# ---------------------------------------------------------------------------------------------
# Calibration statistics (pooled over tables, as published)


@dataclasses.dataclass(frozen=True)
class PooledStatistics:
    """Statistics pooled over tables: unique_row_share f64[17], access_share f64[17], the mean pooling factor, the
    unique rows looked up and the indices drawn."""

    unique_row_share: np.ndarray
    access_share: np.ndarray
    mean_pooling_factor: float
    unique_table_rows: int
    total_indices: int


def pooled_statistics(streams: StreamSource, rows: np.ndarray, batch_size: int, table_ids=None) -> PooledStatistics:
    """Pooled unique_row_share[17], access_share[17] and mean pooling factor over tables."""
    table_ids = range(len(rows)) if table_ids is None else table_ids
    unique = np.zeros(NUM_BINS)
    accesses = np.zeros(NUM_BINS)
    total_indices = 0
    for t in table_ids:
        indices, _ = streams.stream(t, batch_size)
        u, a = stream_histogram(indices, int(rows[t]))
        unique += u
        accesses += a
        total_indices += len(indices)
    return PooledStatistics(
        unique_row_share=unique / unique.sum(),
        access_share=accesses / accesses.sum(),
        mean_pooling_factor=total_indices / (len(table_ids) * batch_size),
        unique_table_rows=int(unique.sum()),
        total_indices=total_indices,
    )


PUBLISHED_FILE = "2021/fbgemm_t856_bs65536"


def published_statistics(name: str = PUBLISHED_FILE) -> JSONDoc:
    """Published pooled statistics of a DLRM benchmark file (neuroshard_jax/data/dlrm_datasets_stats.json)."""
    data = json.loads((resources.files("neuroshard_jax") / "data" / "dlrm_datasets_stats.json").read_text())
    return data["files"][name]


def calibration_report(spec: PoolSpec | None = None, name: str = PUBLISHED_FILE, every: int = 1) -> JSONDoc:
    """Generate the synthetic pool at the published batch size and compare it with the published statistics.

    Returns L1 distances of the pooled unique_row_share and access_share vectors, the mean pooling
    factor, and the spread of row counts and pooling factors. ``every``: stream every k-th table only (a
    systematic sample, k times faster; the row and pooling spreads are of all tables).
    """
    spec = spec or PoolSpec()
    ref = published_statistics(name)
    params = synthetic_table_params(spec.seed, spec.num_tables)
    ids = range(0, spec.num_tables, every)
    stats = pooled_statistics(SyntheticStreams(spec.seed, params), params.rows, ref["batch_size"], ids)
    return {
        "unique_row_share_l1": float(np.abs(stats.unique_row_share - ref["unique_row_share"]).sum()),
        "access_share_l1": float(np.abs(stats.access_share - ref["access_share"]).sum()),
        "mean_pooling_factor": stats.mean_pooling_factor,
        "published_mean_pooling_factor": ref["mean_pooling_factor"],
        "unique_row_share": stats.unique_row_share.round(4).tolist(),
        "access_share": stats.access_share.round(4).tolist(),
        "rows_min": int(params.rows.min()),
        "rows_max": int(params.rows.max()),
        "rows_decades": np.histogram(np.log10(params.rows), bins=np.arange(2, 8.5))[0].tolist(),
        "pooling_p50_p90_p99_max": np.percentile(params.pooling, [50, 90, 99, 100]).round(2).tolist(),
        "total_indices": stats.total_indices,
        "unique_table_rows": stats.unique_table_rows,
    }
