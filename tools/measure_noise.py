"""Spread of one shard's measured cost across separate worker processes.

    python tools/measure_noise.py [--processes 5] [--sample 1] [--batch-size 4096]

Draws shard ``--sample`` with the collection sampler (conf/collect.yaml defaults), measures it in
``--processes`` fresh worker processes one after another, and prints the per-process fwd+bwd medians
and their median, min and max (and the relative spread).
"""

import argparse
import json
import statistics

from neuroshard_jax.profiling import ComputeSamplerConfig, ComputeWorker, sample_shard
from neuroshard_jax.tables import PoolSpec, pool_streams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--sample", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    pool = PoolSpec()
    rows, _ = pool_streams(pool)
    tables = sample_shard(rows, ComputeSamplerConfig(), 0, args.sample)
    totals = []
    for p in range(args.processes):
        worker = ComputeWorker(args.device)
        try:
            answer = worker.request(
                {
                    "id": p,
                    "device": args.device,
                    "pool": pool.to_json(),
                    "batch_size": args.batch_size,
                    "tables": tables,
                    "warmup": 5,
                    "iters": 10,
                },
                timeout_s=600,
            )
        finally:
            worker.close()
        totals.append(answer["total_ms"])
    med = statistics.median(totals)
    print(
        json.dumps(
            {
                "tables": tables,
                "total_ms_per_process": [round(t, 3) for t in totals],
                "median_ms": round(med, 3),
                "min_ms": round(min(totals), 3),
                "max_ms": round(max(totals), 3),
                "spread_pct": round(100 * (max(totals) - min(totals)) / med, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
