"""How closely streams synthesised from table specs match the specs (neuroshard_jax/workloads/streams.py).

    python -m tools.bench_streams [--tables 856] [--batch-size 4096]

Every table of the synthetic pool is re-described by its spec (rows, pooling factor, histogram at the batch
size), a stream is synthesised from the spec alone, and its measured histogram and pooling factor are compared
with the spec: total-variation distance of the 17 bin shares, relative pooling error, and synthesis time.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from neuroshard_jax.core.features import bin_shares
from neuroshard_jax.workloads.pool import PoolSpec, load_pool, stream_histogram
from neuroshard_jax.workloads.streams import TableSpec, spec_stream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=856)
    parser.add_argument("--batch-size", type=int, default=4096)
    args = parser.parse_args()
    pool = load_pool(PoolSpec(num_tables=args.tables), args.batch_size)
    tv, pooling_error = [], []
    start = time.perf_counter()
    for t in range(pool.num_tables):
        spec = TableSpec(int(pool.rows[t]), float(pool.pooling_factor[t]), tuple(pool.bins[t]), args.batch_size)
        indices, _ = spec_stream(spec, seed=t)
        if spec.pooling_factor > 0:
            pooling_error.append(abs(len(indices) / args.batch_size - spec.pooling_factor) / spec.pooling_factor)
        if len(indices):
            shares = bin_shares(stream_histogram(indices, spec.rows)[0])
            tv.append(0.5 * float(np.abs(shares - np.asarray(spec.bins)).sum()))
    elapsed = time.perf_counter() - start
    summary = {
        "tables": pool.num_tables,
        "batch_size": args.batch_size,
        "tv_max": round(max(tv), 4),
        "tv_mean": round(float(np.mean(tv)), 4),
        "tv_p99": round(float(np.quantile(tv, 0.99)), 4),
        "pooling_rel_error_max": round(max(pooling_error), 4),
        "synthesis_ms_per_table": round(elapsed / pool.num_tables * 1e3, 2),
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
