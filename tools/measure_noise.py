"""Measurement noise of compute labels: how far one measurement lies from the median of several, per protocol.

    python -m tools.measure_noise protocols [--sets 16] [--repeats 5]   # the noise floor under the cost model
    python -m tools.measure_noise processes [--sample 1]                # one shard set in 5 fresh processes
    python -m tools.measure_noise steps [--tasks 3] [--batches 4]       # what a polishing step can resolve

``protocols``: draws ``--sets`` shard sets with the collection sampler (conf/collect.yaml defaults, the pool at
batch 4096) and measures each ``--repeats`` times under every protocol, the repeats and the protocols interleaved
(repeat r of every protocol before repeat r + 1, the sets shuffled within a repeat), so that drift of the machine
falls on all alike. A protocol is a number of workers (2: the collection's two workers side by side; 1: no
neighbour), pinned to cores of their own or not, and the timed iterations of the label protocol (warm-up 5). The
noise of a protocol is the MAPE of one measurement against the median of its set's repeats, with the 90th
percentile, and the seconds of worker time per measurement. Results: ``outputs/bench/noise/noise.json`` (the raw
measurements too) and a table on stdout.

``processes``: one shard set measured in ``--processes`` fresh worker processes one after another (the spread
between processes).

``steps``: what one step of measured polishing (``polish=measured``) can resolve. Beam's plans of the first
``--tasks`` held-out suite tasks at 4 and at 8 devices (tools/data/s14-plans.jsonl, committed) have their
devices measured in ``--batches`` consecutive batches, each of polishing's interleaved repeats, under each step
protocol (``STEP_PROTOCOLS``; the batches of the protocols interleaved). Per protocol: one repeat against its
batch's median (the noise a step reads off its own repeats); a device's median in a later batch against the first,
as measured (``between``), with the batch's common factor removed (``common_removed``: what a perfect anchor would
leave) and divided by the first batch's slowest device's ratio as polishing's anchor does (``anchored``); how often
the slowest device of a later batch is the first batch's; and the plan's measured max / mean. A change whose gain
is below ``anchored`` cannot be told from noise in one step. Results: ``outputs/bench/noise/steps.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.files import read_jsonl, write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.kernels.executors import ExecutorConfig, open_executor
from neuroshard_jax.kernels.messages import ComputeAnswer, ComputeRequest
from neuroshard_jax.kernels.processes import ComputeWorker, KernelPool, compute_request
from neuroshard_jax.learn.plan_labels import row_plans
from neuroshard_jax.measure.evaluator import EvaluateConfig, device_key, device_tables, measure_tables
from neuroshard_jax.measure.polish import PolishConfig
from neuroshard_jax.workloads.pool import PoolSpec, pool_streams
from neuroshard_jax.workloads.samplers import ComputeSamplerConfig, sample_shard
from tools.bench_plan_accuracy import FIRST_SEED, S14_PLANS

# name: (workers, pinned, timed iterations)
PROTOCOLS = {
    "label (2 workers)": (2, False, 10),
    "2 workers pinned": (2, True, 10),
    "2 workers pinned, 30 iters": (2, True, 30),
    "1 worker": (1, False, 10),
}

# name: (workers, warm-ups, timed iterations); the first is polish=measured's own
STEP_PROTOCOLS = {
    "polish (2 workers, 2 + 5 iters)": (2, PolishConfig.warmup, PolishConfig.iters),
    "2 workers, 5 + 20 iters": (2, 5, 20),
    "1 worker, 2 + 5 iters": (1, PolishConfig.warmup, PolishConfig.iters),
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
                    compute_request(f"{r}/{i}", shard_sets[i], pool, batch_size, warmup=5, iters=iters).tagged(set=i)
                    for i in map(int, order)
                ]

                def record(request: ComputeRequest, answer: ComputeAnswer, name=name) -> None:
                    if not answer.ok:
                        raise SystemExit(f"measurement failed: {answer.error}")
                    runs[name][request.tag("set")].append(answer.total_ms)

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
        totals.append(answer.total_ms)
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


def steps(tasks: int, batches: int, repeats: int, out: Path) -> dict:
    rows = [r for r in read_jsonl(S14_PLANS) if r["index"] < FIRST_SEED + tasks]
    jobs = []  # per plan: {device key: (task, tables)} in device order
    for row in rows:
        task, plans = row_plans(row)
        plan = next(p for p, e in zip(plans, row["plans"]) if e["searcher"] == "beam" and e["variant"] == "searched")
        devices = [device_tables(task, plan.device_shards(d)) for d in range(task.num_devices)]
        jobs.append({device_key(task, t): (task, t) for t in devices if t})
    medians: dict[str, list[list[dict]]] = {name: [[] for _ in rows] for name in STEP_PROTOCOLS}
    within: dict[str, list[float]] = {name: [] for name in STEP_PROTOCOLS}
    configs = {
        name: EvaluateConfig(executor=ExecutorConfig(workers=w), pin=True, warmup=warmup, iters=iters)
        for name, (w, warmup, iters) in STEP_PROTOCOLS.items()
    }
    with contextlib.ExitStack() as stack:
        executors = {
            n: stack.enter_context(open_executor(c.executor, c.device, c.timeout_s, pin=True))
            for n, c in configs.items()
        }
        for i, plan_jobs in enumerate(jobs):
            for _ in range(batches):
                for name, config in configs.items():
                    answers = measure_tables(plan_jobs, config, executors[name], repeats)
                    runs = {k: [a.total_ms for a in v] for k, v in answers.items()}
                    medians[name][i].append({k: statistics.median(v) for k, v in runs.items()})
                    within[name] += [abs(x / statistics.median(v) - 1) for v in runs.values() for x in v]
            print(f"{rows[i]['id']}: {len(plan_jobs)} devices x {batches} batches x {repeats} repeats", flush=True)
    summary = {name: step_noise(medians[name], within[name]) for name in STEP_PROTOCOLS}
    result = {
        "what": "device medians of beam's plans measured in consecutive batches, as polishing's steps see them",
        "plans": [r["id"] for r in rows],
        "batches": batches,
        "repeats": repeats,
        "hardware": hardware(),
        "date": time.strftime("%Y-%m-%d"),
        "protocols": {n: dict(zip(("workers", "warmup", "iters"), p)) for n, p in STEP_PROTOCOLS.items()},
        "summary": summary,
        "medians": medians,
    }
    write_json(result, out / "steps.json")
    print(
        f"\n{'protocol':32s} {'repeat':>7s} {'between':>8s} {'common removed':>15s} {'anchored':>9s}"
        f" {'same straggler':>15s}"
    )
    for name, s in summary.items():
        print(
            f"{name:32s} {s['repeat_vs_batch_median']:7.1%} {s['between']:8.1%} {s['common_removed']:15.1%} "
            f"{s['anchored']:9.1%} {s['same_straggler']:15.0%}"
        )
    return result


def step_noise(per_plan: list[list[dict]], within: list[float]) -> dict:
    """``steps``' figures of one protocol from each plan's per-batch device medians (key -> ms)."""
    between, common_removed, anchored, same, imbalance = [], [], [], [], []
    for batches in per_plan:
        first = batches[0]
        slow = max(first, key=first.get)
        for later in batches:
            imbalance.append(max(later.values()) / statistics.mean(later.values()))
        for later in batches[1:]:
            ratios = {k: later[k] / first[k] for k in first}
            common = statistics.median(ratios.values())
            between += [abs(r - 1) for r in ratios.values()]
            common_removed += [abs(r / common - 1) for r in ratios.values()]
            anchored += [abs(r / ratios[slow] - 1) for k, r in ratios.items() if k != slow]
            same.append(max(later, key=later.get) == slow)
    return {
        "repeat_vs_batch_median": float(np.mean(within)),
        "between": float(np.mean(between)),
        "between_p90": float(np.percentile(between, 90)),
        "common_removed": float(np.mean(common_removed)),
        "common_removed_p90": float(np.percentile(common_removed, 90)),
        "anchored": float(np.mean(anchored)),
        "anchored_p90": float(np.percentile(anchored, 90)),
        "same_straggler": float(np.mean(same)),
        "measured_max_over_mean": float(np.mean(imbalance)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("protocols", "processes", "steps"))
    parser.add_argument("--sets", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--sample", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--tasks", type=int, default=3, help="steps: suite tasks at each device count")
    parser.add_argument("--batches", type=int, default=4, help="steps: consecutive batches per plan")
    parser.add_argument("--out", default="outputs/bench/noise")
    args = parser.parse_args()
    if args.mode == "protocols":
        protocols(args.sets, args.repeats, args.batch_size, Path(args.out))
    elif args.mode == "steps":
        steps(args.tasks, args.batches, PolishConfig.repeats, Path(args.out))
    else:
        processes(args.processes, args.sample, args.batch_size)


if __name__ == "__main__":
    main()
