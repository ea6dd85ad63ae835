"""What the TorchRec adapter takes from its user, checked: statistics measured from their batches
(``batch_statistics``) and the planner's arguments (one-line errors naming the argument, the value and what was
expected). torch is imported: this module sits behind the adapter's wall."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.progress import progress_bar
from neuroshard_jax.torchrec.shardable import feature_tables, table_configs
from neuroshard_jax.workloads.statistics import ROW_BLOCK_COUNTS, StatsAccumulator, TableStats, read_stats_file


def batch_statistics(
    module: torch.nn.Module,
    batches: Iterable,
    batch_size: int,
    max_batches: int = 0,
    progress: bool = True,
    row_blocks: Sequence[int] = ROW_BLOCK_COUNTS,
) -> list[TableStats]:
    """Each table's pooling factor and access histogram at ``batch_size`` (the planning batch: per-rank batch x
    world size) from an iterable of ``KeyedJaggedTensor``s (or of objects with a ``sparse_features`` KJT, as
    TorchRec's DLRM ``Batch``); reads at most ``max_batches`` of them (0: all), with a bar on stderr while
    ``progress``. Rows are the tables'. ``row_blocks``: the row-block counts whose statistics are measured too (a
    row-wise table is cut into world-size blocks: give yours where it is not 2, 4 or 8)."""
    rows = {name: int(config.num_embeddings) for _, name, config in table_configs(module)}
    features = feature_tables(module)
    accumulator = StatsAccumulator(positive_int(batch_size, "batch_size"), features, rows, row_blocks)
    with progress_bar(desc="statistics", unit=" batches", enabled=progress) as bar:
        for i, batch in enumerate(batches):
            if max_batches and i >= max_batches:
                break
            kjt = getattr(batch, "sparse_features", batch)
            unknown = [key for key in kjt.keys() if key not in features]
            if unknown:
                raise UserError(
                    f"batches: feature {unknown[0]!r} is read by no table of the module, expected features of "
                    f"{', '.join(sorted(features)[:6])}{', ...' if len(features) > 6 else ''}"
                )
            if kjt.values().is_floating_point() or kjt.values().is_complex():
                raise UserError(f"batches: ids of dtype {kjt.values().dtype}, expected integer ids")
            lengths = kjt.lengths().detach().cpu().numpy().reshape(len(kjt.keys()), -1)
            values = kjt.values().detach().cpu().numpy()
            starts = np.concatenate([[0], np.cumsum(lengths.sum(axis=1))])
            accumulator.add({key: (values[starts[k] : starts[k + 1]], lengths[k]) for k, key in enumerate(kjt.keys())})
            bar.update(1)
    return accumulator.result()


# TorchRec's training compute kernels this planner's plans use (its quant and key-value kernels are not planned here)
COMPUTE_KERNELS = ("fused", "dense", "fused_uvm", "fused_uvm_caching")


def is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def positive_int(value, key: str) -> int:
    if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1):
        raise UserError(f"{key}: got {value!r}, expected an integer >= 1")
    return int(value)


def positive_number(value, key: str) -> float:
    if not (is_number(value) and np.isfinite(value) and value > 0):
        raise UserError(f"{key}: got {value!r}, expected a number > 0")
    return float(value)


def pooling_factors(given) -> dict[str, float]:
    """``pooling_factors`` checked: a mapping of table or feature names to lookups per sample (>= 0)."""
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise UserError(f"pooling_factors: got {given!r:.60}, expected a mapping of table or feature names to numbers")
    for name, value in given.items():
        if not (is_number(value) and np.isfinite(value) and value >= 0):
            raise UserError(f"pooling_factors[{name!r}]: got {value!r}, expected a number of lookups per sample >= 0")
    return {str(k): float(v) for k, v in given.items()}


def table_stats(stats) -> list[TableStats]:
    """``stats`` checked: a statistics file's path, or TableStats (``batch_statistics``'), or None."""
    if stats is None:
        return []
    if isinstance(stats, (str, Path)):
        return read_stats_file(stats)
    items = list(stats) if isinstance(stats, Iterable) else [stats]
    wrong = next((s for s in items if not isinstance(s, TableStats)), None)
    if wrong is not None:
        raise UserError(
            f"stats: got {wrong!r:.40} ({type(wrong).__name__}), expected TableStats of batch_statistics or a "
            "statistics file's path"
        )
    return items
