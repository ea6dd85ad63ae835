"""Measurement noise of compute labels: how far one measurement lies from the median of several, per protocol.

    python tools/measure_noise.py protocols [--sets 16] [--repeats 5]   # the noise floor under the cost model
    python tools/measure_noise.py processes [--sample 1]                # one shard set in 5 fresh processes

``protocols``: draws ``--sets`` shard sets with the collection sampler (conf/collect.yaml defaults, the pool at
batch 4096) and measures each ``--repeats`` times under every protocol, the repeats and the protocols interleaved
(repeat r of every protocol before repeat r + 1, the sets shuffled within a repeat), so that drift of the machine
falls on all alike. A protocol is a number of workers (2: the collection's two workers side by side; 1: no
neighbour), pinned to cores of their own or not, and the timed iterations of the label protocol (warm-up 5). The
noise of a protocol is the MAPE of one measurement against the median of its set's repeats, with the 90th
percentile, and the seconds of worker time per measurement. Results: ``bench/noise/noise.json`` (the raw
measurements too) and a table on stdout.

``processes``: one shard set measured in ``--processes`` fresh worker processes one after another (the spread
between processes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.datasets import hardware, write_json
from neuroshard_jax.profiling import ComputeSamplerConfig, ComputeWorker, KernelPool, compute_request, sample_shard
from neuroshard_jax.tables import PoolSpec, pool_streams

# name: (workers, pinned, timed iterations)
PROTOCOLS = {
    "label (2 workers)": (2, False, 10),
    "2 workers pinned": (2, True, 10),
    "2 workers pinned, 30 iters": (2, True, 30),
    "1 worker": (1, False, 10),
}


def protocols(sets: int, repeats: int, batch_size: int, out: Path) -> dict:
    pool = PoolSpec()
    rows, _ = pool_streams(pool)
    shard_sets = [sample_shard(rows, ComputeSamplerConfig(), 0, i) for i in range(sets)]
    runs: dict[str, list[list[float]]] = {name: [[] for _ in shard_sets] for name in PROTOCOLS}
    busy: dict[str, float] = dict.fromkeys(PROTOCOLS, 0.0)
    pools = {name: KernelPool(w, "cpu", 600, pin=pin) for name, (w, pin, _) in PROTOCOLS.items()}
    try:
        for r in range(repeats):
            for name, (_, _, iters) in PROTOCOLS.items():
                order = np.random.default_rng([r, len(name)]).permutation(sets)
                requests = [
                    {**compute_request(f"{r}/{i}", shard_sets[i], pool, batch_size, warmup=5, iters=iters), "set": i}
                    for i in map(int, order)
                ]

                def record(request: dict, answer: dict, name=name) -> None:
                    if not answer.get("ok"):
                        raise SystemExit(f"measurement failed: {answer.get('error')}")
                    runs[name][request["set"]].append(answer["total_ms"])

                start = time.perf_counter()
                pools[name].map(requests, record)
                busy[name] += (time.perf_counter() - start) * PROTOCOLS[name][0]
                print(f"repeat {r} {name}: {sets} sets in {time.perf_counter() - start:.1f} s", flush=True)
    finally:
        for p in pools.values():
            p.close()
    summary = {}
    for name, per_set in runs.items():
        errors = [abs(x - statistics.median(xs)) / statistics.median(xs) for xs in per_set for x in xs]
        summary[name] = {
            "workers": PROTOCOLS[name][0],
            "pinned": PROTOCOLS[name][1],
            "iters": PROTOCOLS[name][2],
            "mape_vs_median": float(np.mean(errors)),
            "p90_error": float(np.percentile(errors, 90)),
            "worker_s_per_measurement": busy[name] / (sets * repeats),
        }
    result = {
        "sets": sets,
        "repeats": repeats,
        "batch_size": batch_size,
        "hardware": hardware(),
        "date": time.strftime("%Y-%m-%d"),
        "summary": summary,
        "runs": runs,
        "shard_sets": shard_sets,
    }
    write_json(result, out / "noise.json")
    print(f"\n{'protocol':28s} {'MAPE vs median':>14s} {'p90':>7s} {'worker s/meas':>13s}")
    for name, s in summary.items():
        print(
            f"{name:28s} {100 * s['mape_vs_median']:13.2f}% {100 * s['p90_error']:6.2f}% "
            f"{s['worker_s_per_measurement']:13.2f}"
        )
    return result


def processes(count: int, sample: int, batch_size: int) -> None:
    pool = PoolSpec()
    rows, _ = pool_streams(pool)
    tables = sample_shard(rows, ComputeSamplerConfig(), 0, sample)
    totals = []
    for p in range(count):
        worker = ComputeWorker("cpu")
        try:
            answer = worker.request(compute_request(p, tables, pool, batch_size), timeout_s=600)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("protocols", "processes"))
    parser.add_argument("--sets", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--sample", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--out", default="bench/noise")
    args = parser.parse_args()
    if args.mode == "protocols":
        protocols(args.sets, args.repeats, args.batch_size, Path(args.out))
    else:
        processes(args.processes, args.sample, args.batch_size)


if __name__ == "__main__":
    main()
