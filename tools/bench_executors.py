"""Labels per second, local pool against Ray on the same cores, and the driver's cost per label.

    python -m tools.bench_executors [--samples 40] [--workers 2] [--overhead 200] [--address ADDR]

``throughput``: the same ``--samples`` compute samples (the collection sampler at batch 4096, the label protocol:
5 warm-ups, 10 timed iterations) measured by ``--workers`` kernel workers of ``executor=local`` (unpinned, as a
Ray collection is) and of ``executor=ray`` (a local cluster started here unless ``--address``); labels per
second, each run from warm workers (a first pass of ``--workers`` samples starts them and is not timed).

``overhead``: ``--overhead`` trivial requests (one 1000-row table, pooling 0.25, batch 256, no warm-up, one
iteration) through one worker of each executor: seconds per request, and the driver's CPU seconds per request
(``time.process_time`` of this process: the serial part that bounds how many labels per second one driver can take in).

From them, an estimate for a fleet: with ``W`` workers each measuring a label in ``t`` seconds, a driver that
costs ``c`` CPU seconds per answer takes in min(W / (t + o), 1 / c) labels per second (``o``: Ray's round trip
beyond the local pool's). The figures and the estimate go to ``outputs/bench/executors/executors.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.kernels.executors import ExecutorConfig, open_executor
from neuroshard_jax.kernels.messages import ComputeRequest
from neuroshard_jax.kernels.processes import compute_request
from neuroshard_jax.workloads.pool import PoolSpec, pool_streams
from neuroshard_jax.workloads.samplers import ComputeSamplerConfig, sample_shard

OUT = Path("outputs/bench/executors/executors.json")
FLEET = {"hosts": 8, "gpus": 64}


def label_requests(count: int, seed: int) -> list[ComputeRequest]:
    """``count`` requests of the collection's pool sampler at batch 4096 with the label protocol."""
    pool = PoolSpec()
    rows = pool_streams(pool)[0]
    sampler = ComputeSamplerConfig()
    return [compute_request(i, sample_shard(rows, sampler, seed, i), pool, 4096) for i in range(count)]


def trivial_requests(count: int) -> list[ComputeRequest]:
    table = {"rows": 1000, "pooling_factor": 0.25, "bins": [1.0] + [0.0] * 16, "dim": 4, "seed": 0}
    return [compute_request(i, [table], None, 256, warmup=0, iters=1) for i in range(count)]


def timed_map(executor, requests: list[ComputeRequest]) -> dict:
    """Wall and driver CPU seconds of one ``map`` over ``requests``; every answer must be ok."""
    answers = []
    wall, cpu = time.perf_counter(), time.process_time()
    executor.map(requests, lambda request, answer: answers.append(answer))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    failed = [a for a in answers if not a.ok]
    if failed or len(answers) != len(requests):
        raise SystemExit(f"error: {len(failed)} failed answers of {len(requests)}: {failed[:1]}")
    return {"requests": len(requests), "wall_s": round(wall, 3), "driver_cpu_s": round(cpu, 3)}


def run(name: str, config: ExecutorConfig, labels: list[dict], trivial: list[dict], workers: int) -> dict:
    with open_executor(config, "cpu", 600) as executor:
        timed_map(executor, labels[:workers])  # start and warm every worker, untimed
        throughput = timed_map(executor, labels[workers:])
    one = dataclasses.replace(config, workers=1)
    with open_executor(one, "cpu", 600) as executor:
        timed_map(executor, trivial[:5])
        overhead = timed_map(executor, trivial[5:])
    per = overhead["requests"]
    result = {
        "workers": workers,
        "labels_per_s": round(throughput["requests"] / throughput["wall_s"], 3),
        "throughput": throughput,
        "overhead": overhead,
        "s_per_trivial_request": round(overhead["wall_s"] / per, 5),
        "driver_cpu_s_per_request": round(overhead["driver_cpu_s"] / per, 6),
    }
    print(
        f"{name:6s} {result['labels_per_s']:.3f} labels/s ({workers} workers); trivial request "
        f"{1e3 * result['s_per_trivial_request']:.2f} ms, driver CPU {1e3 * result['driver_cpu_s_per_request']:.3f} ms",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--overhead", type=int, default=200)
    parser.add_argument("--address", default=None, help="a running Ray cluster (default: start a local one)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import ray

    started = time.perf_counter()
    if args.address:
        ray.init(address=args.address, log_to_driver=False, configure_logging=False)
    else:
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray_start_s = round(time.perf_counter() - started, 2)
    labels = label_requests(args.samples + args.workers, args.seed)
    trivial = trivial_requests(args.overhead + 5)
    results = {}
    for name, config in (
        ("local", ExecutorConfig(workers=args.workers)),
        ("ray", ExecutorConfig(name="ray", workers=args.workers, address=args.address)),
    ):
        results[name] = run(name, config, labels, trivial, args.workers)
    ray.shutdown()

    local, remote = results["local"], results["ray"]
    label_s = args.workers / local["labels_per_s"]  # one worker's seconds per label here
    extra = max(0.0, remote["s_per_trivial_request"] - local["s_per_trivial_request"])
    driver = remote["driver_cpu_s_per_request"]
    workers_bound = FLEET["gpus"] / (label_s + extra)
    estimate = {
        **FLEET,
        "assumption": (
            "every GPU is one kernel worker taking as long per label as one CPU worker here (a GPU label is "
            "faster, which only moves the bound towards the driver's)"
        ),
        "seconds_per_label_per_worker": round(label_s, 3),
        "ray_round_trip_extra_s": round(extra, 5),
        "workers_bound_labels_per_s": round(workers_bound, 1),
        "driver_bound_labels_per_s": round(1 / driver, 1) if driver > 0 else None,
        "labels_per_s": round(min(workers_bound, 1 / driver if driver > 0 else workers_bound), 1),
    }
    print(
        f"fleet of {FLEET['gpus']} GPUs on {FLEET['hosts']} hosts: ~{estimate['labels_per_s']:.0f} labels/s "
        f"(workers bound {estimate['workers_bound_labels_per_s']:.0f}, driver bound "
        f"{estimate['driver_bound_labels_per_s']})"
    )
    write_json(
        {
            "hardware": hardware(),
            "ray_start_s": ray_start_s,
            "samples": args.samples,
            "results": results,
            "ray_vs_local": round(remote["labels_per_s"] / local["labels_per_s"], 3),
            "fleet_estimate": estimate,
            "how": "python -m tools.bench_executors " + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v),
            "when": time.strftime("%Y-%m-%d"),
        },
        OUT,
    )
    print(f"written to {OUT}")


if __name__ == "__main__":
    main()
