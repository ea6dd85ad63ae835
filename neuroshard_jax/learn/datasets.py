"""Measured datasets as arrays: a compute dataset's shard sets padded to one width with their labels, a comm
dataset's samples padded to the largest world, several datasets at one width, and seeded train/validation/test
splits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from neuroshard_jax.core.constants import GLIBC_MMAP_MAX_BYTES, OUTPUT_BYTES_PER_ELEMENT
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import NUM_FEATURES, feature_matrix
from neuroshard_jax.core.files import read_records
from neuroshard_jax.core.manifests import label_protocol, load_manifest
from neuroshard_jax.core.sharding import shard_features
from neuroshard_jax.core.table import kernel_kind, kernel_parts
from neuroshard_jax.costs.cost_model import bucket
from neuroshard_jax.kernels.processes import PoolTableRef, SpecTableRef, TableRef, quiet, record_tables
from neuroshard_jax.workloads.pool import PoolSpec, load_pool
from neuroshard_jax.workloads.streams import block_statistics, request_spec


def split_indices(count: int, fractions, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train / validation / test indices from a seeded permutation."""
    perm = np.random.default_rng([seed, 2718]).permutation(count)
    n_train = int(round(fractions[0] * count))
    n_val = int(round(fractions[1] * count))
    return perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val :]


def compute_arrays(dataset_dir: Path, extra_records: list[dict] = ()):
    """Shards of a compute dataset (then ``extra_records`` of the same form, e.g. devices of measured plans):
    feats f32[S, T, F], mask bool[S, T], total_ms f32[S], manifest."""
    feats, mask, _, target, manifest = compute_batches(dataset_dir, extra_records)
    return feats, mask, target, manifest


def run_spread(record: dict) -> float:
    """Interquartile range over median of a record's timed fwd+bwd runs (0 when it has no runs): how much the
    machine disturbed the measurement."""
    runs = sorted(f + b for f, b in zip(record.get("fwd_runs_ms", []), record.get("bwd_runs_ms", [])))
    if len(runs) < 4:
        return 0.0
    q1, q3 = np.quantile(runs, [0.25, 0.75])
    return float((q3 - q1) / max(np.median(runs), 1e-9))


def steady(record: dict, max_spread: float) -> bool:
    """A label training keeps: its runs spread at most ``max_spread`` (``run_spread``) and its worker had at least
    MIN_CPU_SHARE of its core (else the machine was busy while it was taken)."""
    return run_spread(record) <= max_spread and quiet(record)


def output_bytes(record: dict) -> float:
    """What a label's kernel wrote forward, in bytes (FBGEMM's outputs are fp32 whatever the weights): a row per id of
    a sequence kernel (``num_indices`` x its one dim), a row per bag and table of a pooled one (batch x the dims)."""
    dims = [t["dim"] if isinstance(t, dict) else t[1] for t in record["tables"]]
    rows = record.get("num_indices", 0) if record.get("pooling") == "none" else record.get("batch_size", 0)
    width = (dims[0] if dims else 0) if record.get("pooling") == "none" else sum(dims)
    return float(OUTPUT_BYTES_PER_ELEMENT * rows * width)


def may_have_faulted(record: dict, settings: dict) -> bool:
    """A label whose output glibc may have page-faulted afresh (above ``GLIBC_MMAP_MAX_BYTES``) in a dataset taken
    before the workers kept freed memory (``malloc`` absent: ``os``): it read one of two times by what the worker had
    freed before (a 62 MB sequence output: 27 ms or 4.5 ms forward; docs/results/kernel-kinds.md)."""
    return before_reuse(settings) and above_mmap(record)


def above_mmap(record: dict) -> bool:
    """Whether a label's output is above glibc's largest mmap threshold (freed back to the OS by default)."""
    return output_bytes(record) > GLIBC_MMAP_MAX_BYTES


def before_reuse(settings: dict) -> bool:
    """Whether a dataset (its manifest's settings) was taken before the workers kept freed memory."""
    return label_protocol(settings)["malloc"] == "os"


def label_keeper(settings: dict, max_spread: float | None = None, drop_faulted: bool = False) -> Callable[[dict], bool]:
    """Which records of a dataset (its manifest's ``settings``) training keeps: those whose runs spread at most
    ``max_spread`` (``steady``; None: all) and, with ``drop_faulted``, none glibc may have page-faulted
    (``may_have_faulted``; the dataset's protocol read once)."""
    faulted = drop_faulted and before_reuse(settings)
    return lambda r: (max_spread is None or steady(r, max_spread)) and not (faulted and above_mmap(r))


def compute_batches(
    dataset_dir: Path,
    extra_records: list[dict] = (),
    width: int | None = None,
    max_spread: float | None = None,
    block_stats: bool = True,
    drop_faulted: bool = False,
):
    """``compute_arrays`` plus each record's batch size f32[S] (a spec dataset's rows carry their own):
    feats, mask, batch_size, total_ms, manifest. ``max_spread``: drop records whose runs spread more
    (``run_spread``), labels taken while the machine was busy. ``block_stats``: a spec table's row block has the
    statistics of its own lookups (``streams.block_statistics``, what the worker measured), else the table's
    scaled to its rows (what a search knows of a block: ``shard_feature_matrix``). ``drop_faulted``: drop the labels
    glibc may have page-faulted (``may_have_faulted``); both: ``label_keeper``."""
    manifest = load_manifest(dataset_dir, "compute")
    records = read_records(Path(dataset_dir) / "compute.jsonl")
    records = list(filter(label_keeper(manifest["settings"], max_spread, drop_faulted), records))
    records += list(extra_records)
    if not records:
        raise UserError(f"dataset: no successful records in {str(dataset_dir)!r}")
    settings = manifest["settings"]
    shard_sets = [record_tables(r) for r in records]
    uses_pool = any(isinstance(t, PoolTableRef) for tables in shard_sets for t in tables)
    pool = load_pool(PoolSpec.from_json(settings["pool"]), settings["batch_size"]) if uses_pool else None
    batch = np.array([r.get("batch_size", settings["batch_size"]) for r in records], dtype=np.float32)
    kinds = [(r.get("pooling", "sum"), bool(r.get("weighted", False))) for r in records]  # the kernel each ran
    feats, mask = padded_shards(shard_sets, batch, pool, block_stats, width, kinds)
    # a label measured with references is taken at the reference dataset's speed (drift.py): the machine's drift
    # between the hours of a collection does not become label noise
    target = np.array([r["total_ms"] / r.get("speed", 1.0) for r in records], dtype=np.float32)
    return feats, mask, batch, target, manifest


def padded_shards(
    shards: list[list[TableRef]],
    batch: np.ndarray,
    pool,
    block_stats: bool = True,
    width: int | None = None,
    kinds: list[tuple[str, bool]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Features f32[S, W, F] and mask bool[S, W] of shard sets (each a list of tables as ``shard_feature_matrix``
    takes them, at its batch size ``batch[s]``, in the kernel ``kinds[s]``: (pooling, weighted), default sum-pooled
    bags), padded to ``width`` (default: the power of two above the largest)."""
    width = width or bucket(max(len(tables) for tables in shards))
    feats = np.zeros((len(shards), width, NUM_FEATURES), dtype=np.float32)
    mask = np.zeros((len(shards), width), dtype=bool)
    for i, tables in enumerate(shards):
        pooling, weighted = kinds[i] if kinds is not None else ("sum", False)
        feats[i, : len(tables)] = shard_feature_matrix(tables, pool, int(batch[i]), block_stats, pooling, weighted)
        mask[i, : len(tables)] = True
    return feats, mask


def shard_feature_matrix(
    tables: list[TableRef],
    pool,
    batch_size: int | None = None,
    block_stats: bool = False,
    pooling: str = "sum",
    weighted: bool = False,
) -> np.ndarray:
    """Features f64[T, F] of a measured shard's tables: a ``PoolTableRef`` reads the pool's features, a
    ``SpecTableRef`` carries its own; a row block's are the block's (``sharding.shard_features``: its rows, its share
    of the lookups, the table's histogram, as the search scores it). ``block_stats`` (with the record's
    ``batch_size``): a spec table's block has the pooling factor and histogram of the lookups that landed in it
    (``streams.block_statistics``), which is what the worker measured: a block missing the table's hottest rows does
    a fraction of its share."""
    rows, dims, lookups, bins, blocks, stats = [], [], [], [], [], []
    for table in tables:
        if isinstance(table, SpecTableRef):
            rows.append(table.rows)
            lookups.append(table.pooling_factor)
            bins.append(table.bins)
            dims.append(table.dim)
            blocks.append(table.num_rows)
            if block_stats and table.num_rows is not None:
                spec, seed = request_spec(table.to_json(), batch_size)
                stats.append(block_statistics(spec, seed, table.row_offset, table.num_rows))
            else:
                stats.append(None)
        else:
            rows.append(pool.rows[table.table_id])
            lookups.append(pool.pooling_factor[table.table_id])
            bins.append(pool.bins[table.table_id])
            dims.append(table.dim)
            blocks.append(table.num_rows)
            stats.append(None)
    # each table's kernel: its own (a device of several kernels), else the record's
    record_kind = kernel_kind(pooling, weighted)
    kinds = [kernel_parts(t.kernel if t.kernel != "sum" else record_kind) for t in tables]
    out = feature_matrix(rows, dims, lookups, bins, [p for p, _ in kinds], [w for _, w in kinds])
    for i, block in enumerate(blocks):
        if block is not None:
            out[i] = shard_features(out[i], dims[i], block, stats[i])
    return out


def comm_arrays(dataset_dir: Path, extra_records: list[dict] = ()):
    """Comm samples (then ``extra_records``) padded to the largest world: dim_sums, delays_ms, mask, fwd_ms,
    bwd_ms (f32[S, N]: the all-to-all's; a sample's row groups' collectives and input distributions are priced apart,
    ``row_comm.py``, ``input_dist.py``), manifest."""
    manifest = load_manifest(dataset_dir, "comm")
    records = read_records(Path(dataset_dir) / "comm.jsonl") + list(extra_records)
    if not records:
        raise UserError(f"dataset: no successful records in {str(dataset_dir)!r}")
    n = max(r["world"] for r in records)
    out = {k: np.zeros((len(records), n), dtype=np.float32) for k in ("dim_sums", "delays_ms", "fwd_ms", "bwd_ms")}
    mask = np.zeros((len(records), n), dtype=bool)
    for i, r in enumerate(records):
        w = r["world"]
        for k in out:
            out[k][i, :w] = r[k]
        for key in ("fwd_rows_ms", "bwd_rows_ms", "fwd_inputs_ms"):
            out[key[:3] + "_ms"][i, :w] -= np.asarray(r.get(key, np.zeros(w)), np.float32)
        mask[i, :w] = True
    return out["dim_sums"], out["delays_ms"], mask, out["fwd_ms"], out["bwd_ms"], manifest


def ensemble_arrays(dataset_dirs: list[Path], max_spread: float | None = None, drop_faulted: bool = False):
    """Every compute dataset's records at one padded width: feats f32[S, T, F], mask bool[S, T], batch f32[S],
    target f32[S], source i32[S] (the dataset index of each record), manifests (``compute_batches``' filters)."""
    loaded = [compute_batches(Path(d), max_spread=max_spread, drop_faulted=drop_faulted) for d in dataset_dirs]
    width = max(f.shape[1] for f, *_ in loaded)  # each part is already a power of two
    parts = [
        (np.pad(f, ((0, 0), (0, width - f.shape[1]), (0, 0))), np.pad(m, ((0, 0), (0, width - m.shape[1]))), b, t, man)
        for f, m, b, t, man in loaded
    ]
    source = np.concatenate([np.full(len(p[3]), i, dtype=np.int32) for i, p in enumerate(parts)])
    feats, mask, batch, target = (np.concatenate([p[j] for p in parts]) for j in range(4))
    return feats, mask, batch, target, source, [p[4] for p in parts]
