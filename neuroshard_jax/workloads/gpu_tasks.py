"""GPU-sized tasks: what users shard over GPUs, generated from a seed, apart from the training samplers.

A task of this family has 8 or 16 devices, 400-512 tables (50-64 a device at 8 devices, 25-32 at 16), one batch
of 16,384, 32,768 or 65,536 samples (the samples each device's kernels look up per step: the project's
``Task.batch_size``; a TorchRec per-rank batch of batch / devices), and tables whose memory fills ``fill`` of the
devices' (about 20 GiB a device at 8 devices).
Its tables follow the synthetic pool's law (``pool.synthetic_table_params``, calibrated against the published
statistics of the 2021 DLRM benchmark, ``data/dlrm_datasets_stats.json``: rows log-spread over 1e2..1e7, log-normal
pooling factors, log-normal row popularity), with the mean pooling factor of its lighter published file
(``fbgemm_t856_bs65536_0``: 8.3 lookups per sample); dims 32-128 as public DLRM models use (MLPerf's DLRM: 128).
Each table's features (rows, pooling factor, 17-bin histogram) are those of its own index stream at the task's
batch (``table_stream``), so a device measured on those streams is the device the cost models see.

``gpu_task(config, seed, index)`` is a pure function of its arguments. The seeds live apart from every sampler of
``collect`` (``samplers.py``) and from the pool's, so no GPU task's tables are drawn into training labels.
``write_stream_pool`` writes a task's streams where the torch worker replays them (a DLRM-format pool: a device's
request then costs a slice of cached arrays, not a regeneration of its lookups). NumPy only.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

from neuroshard_jax.core.config import bounded, check_bounds
from neuroshard_jax.core.constants import GIB_BYTES, MIN_ROWS
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import bin_shares
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.paths import CACHE_HINT, cache_folder, pool_file_digest
from neuroshard_jax.core.sharding import mem_bytes
from neuroshard_jax.core.table import PoolSpec, Table
from neuroshard_jax.core.task import Task
from neuroshard_jax.workloads.pool import (
    SyntheticPoolConfig,
    SyntheticStreams,
    stream_histogram,
    synthetic_table_params,
)

GPU_TASK_STREAM = 54054  # a seed word of this family only (samplers use 31337, 60013, 4099; tasks 104729)
PUBLISHED_LIGHT_POOLING = 8.3  # mean pooling factor of 2021/fbgemm_t856_bs65536_0 (dlrm_datasets_stats.json)
MLPERF_LOG10_ROWS = 7.6  # MLPerf's DLRM caps Criteo 1TB's tables at 40M rows (the pool law's top is 1e7)


@dataclasses.dataclass(frozen=True)
class GpuTaskConfig:
    """The family's ranges (defaults: the GPU check's; a test or a dry run takes smaller ones)."""

    # task ``index`` has device_counts[index % len] devices
    device_counts: tuple[int, ...] = bounded(at_least=1, default=(8, 16))
    # tables per task, drawn uniformly (inclusive): 50-64 a device at 8 devices, 25-32 at 16 (TorchRec's default
    # planner, which plans these tasks where they are packed, takes over 10 minutes for 800 tables over 16 devices)
    tables: tuple[int, int] = (400, 512)
    batch_sizes: tuple[int, ...] = (16384, 32768, 65536)
    dims: tuple[int, ...] = (32, 64, 128)
    mean_pooling: float = PUBLISHED_LIGHT_POOLING
    log10_rows_max: float = MLPERF_LOG10_ROWS
    # the tables' memory over all devices' memory (the cap is rounded up to 0.5 GiB)
    fill: float = bounded(above=0, at_most=1, default=0.6)
    precision: str = "fp32"

    def __post_init__(self):
        check_bounds(self, "gpu tasks: ")
        if not self.device_counts:
            raise UserError("gpu tasks: device_counts: got [], expected a non-empty list of integers >= 1")
        low, high = self.tables
        if not 1 <= low <= high:
            raise UserError(f"gpu tasks: tables {[low, high]}, expected 1 <= low <= high")


def table_params(config: GpuTaskConfig, seed: int, index: int, num_tables: int):
    """The pool law's parameters of task ``index``'s tables (rows, pooling, skew, scatter; ``SyntheticTableParams``),
    and the generator seed of their streams."""
    stream_seed = int(np.random.default_rng([seed, GPU_TASK_STREAM, index, 1]).integers(2**31))
    law = SyntheticPoolConfig(pooling_mean=config.mean_pooling, log10_rows_max=config.log10_rows_max)
    return synthetic_table_params(stream_seed, num_tables, law), stream_seed


def table_stream(params, stream_seed: int, table: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Table ``table``'s indices i64[L] and offsets i64[B + 1] at ``batch_size``: the pool law's stream, with one
    lookup moved to the last row so that the table's rows are its largest index + 1 (the DLRM file rule,
    ``MIN_ROWS``)."""
    indices, offsets = SyntheticStreams(stream_seed, params).stream(table, batch_size)
    rows = int(params.rows[table])
    if len(indices) and rows > MIN_ROWS and indices.max() < rows - 1:
        indices = indices.copy()
        indices[0] = rows - 1
    return indices, offsets


def gpu_task(config: GpuTaskConfig, seed: int, index: int) -> Task:
    """Task ``index`` of the family: its device count, batch, tables (ids 0..T-1, features of their streams) and a
    memory cap per device that their memory fills to ``config.fill``."""
    rng = np.random.default_rng([seed, GPU_TASK_STREAM, index])
    devices = int(config.device_counts[index % len(config.device_counts)])
    num_tables = int(rng.integers(config.tables[0], config.tables[1] + 1))
    batch_size = int(rng.choice(config.batch_sizes))
    params, stream_seed = table_params(config, seed, index, num_tables)
    dims = rng.choice(np.asarray(config.dims), size=num_tables)
    tables = []
    for t in range(num_tables):
        indices, _ = table_stream(params, stream_seed, t, batch_size)
        rows = int(params.rows[t])
        bins = bin_shares(stream_histogram(indices, rows)[0])
        pooling = round(len(indices) / batch_size, 4)
        tables.append(Table(t, rows, int(dims[t]), pooling, tuple(round(float(b), 6) for b in bins)))
    total = sum(mem_bytes(t.rows, t.dim, config.precision) for t in tables)
    largest = max(mem_bytes(t.rows, t.dim, config.precision) for t in tables)
    cap_gb = max(total / config.fill / devices, 1.25 * largest) / GIB_BYTES
    cap_gb = float(np.ceil(cap_gb * 2) / 2)
    return Task.uniform(devices, cap_gb, batch_size, tuple(tables), config.precision)


def task_summary(task: Task) -> JSONDoc:
    """What a report says of a task: devices, tables, batch, memory and lookups per device."""
    total_bytes = sum(mem_bytes(t.rows, t.dim, task.precision) for t in task.tables)
    lookups = sum(t.pooling_factor for t in task.tables) * task.batch_size
    return {
        "devices": task.num_devices,
        "tables": task.num_tables,
        "tables_per_device": round(task.num_tables / task.num_devices, 1),
        "batch_size": task.batch_size,
        "mem_cap_gb": task.largest_cap_gb,
        "table_gib_per_device": round(total_bytes / task.num_devices / GIB_BYTES, 2),
        "lookups_per_device_m": round(lookups / task.num_devices / 1e6, 2),
    }


def write_stream_pool(config: GpuTaskConfig, seed: int, index: int, task: Task, path: Path) -> Path:
    """Write task ``index``'s streams as a DLRM-format pool the worker replays: ``path`` names the pool (a small
    JSON saying what it is) and its arrays go where the worker keeps a DLRM file once converted
    (``NEUROSHARD_CACHE_DIR/dlrm/<pool_file_digest(path)>.npz``: indices, offsets over every table's bags, lengths
    [T, B]); the npz appears whole (written beside, then renamed). Returns ``path``."""
    params, stream_seed = table_params(config, seed, index, task.num_tables)
    if not np.array_equal(params.rows, [t.rows for t in task.tables]):
        raise UserError(f"gpu task {index}: its tables' rows are not those of (seed {seed}, index {index})")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"gpu_task": index, "seed": seed, "batch_size": task.batch_size, **asdict(config)}))
    parts, lengths = [], np.empty((task.num_tables, task.batch_size), dtype=np.int64)
    for t in range(task.num_tables):
        indices, offsets = table_stream(params, stream_seed, t, task.batch_size)
        parts.append(indices.astype(np.int32))
        lengths[t] = np.diff(offsets)
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths.reshape(-1), out=offsets[1:])
    folder = cache_folder("dlrm", "converted DLRM files")
    if folder is None:
        raise UserError(f"gpu tasks: the DLRM file's converted copy cannot be kept; {CACHE_HINT}")
    npz = folder / f"{pool_file_digest(path)}.npz"
    tmp = npz.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, indices=np.concatenate(parts), offsets=offsets, lengths=lengths)
    os.replace(tmp, npz)
    return path


def with_stream_pool(task: Task, path: Path) -> Task:
    """``task`` measured on the streams ``write_stream_pool`` wrote at ``path`` (its tables' ids are the pool's)."""
    return dataclasses.replace(task, pool=PoolSpec(source="dlrm", path=str(path)))


def asdict(config: GpuTaskConfig) -> JSONDoc:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}
