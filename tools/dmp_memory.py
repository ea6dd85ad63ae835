"""Predicted memory against what DistributedModelParallel holds (issue 52): plans of pool tasks, planned for each
optimizer, run on gloo ranks on this machine's CPU with that optimizer fused into the backward pass.

    python -m tools.dmp_memory --tasks 3 --devices 4,8 --optimizers exact_sgd,exact_row_wise_adagrad,exact_adagrad

Per task (drawn from the shipped 856-table pool, ``--tables`` tables filling half of 1 GiB devices, its own seeds),
device count and optimizer: beam's plan for the task with that optimizer (``Task.training``; the analytic cost model:
what is judged is the memory of a placement, not its cost), then one set of rank
processes (``torchrec.steps.dmp_memory``): each rank's resident memory growth when its sharded module is built and
at its peak over 3 training steps, and the allocator's count of its shard weights and optimizer state, beside
``Plan.memory``. Writes ``--out`` (JSON) and prints, per optimizer, the error of the predicted total against the
peak growth (MAPE, bias, worst rank) and how exact the weights and state are.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

import numpy as np

from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.memory import Training
from neuroshard_jax.costs.registry import CostModelSpec
from neuroshard_jax.search.planner import Planner
from neuroshard_jax.torchrec.steps import dmp_memory
from neuroshard_jax.workloads.pool import PoolSpec, load_pool
from neuroshard_jax.workloads.tasks import TaskConfig, generate_task

SEED = 720_113  # the tool's own task draws
OUT = Path("outputs/bench/dmp-memory/results.json")


def tasks(count: int, devices: int, tables: int) -> list:
    """``count`` pool tasks of ``tables`` tables on ``devices`` devices of 1 GiB, half full (weights)."""
    pool = load_pool(PoolSpec(), 4096)
    config = TaskConfig(num_tables=tables, num_devices=devices, mem_cap_gb=1.0, max_fill=0.5, pool=PoolSpec())
    return [generate_task(pool, config, SEED + 100 * devices + i) for i in range(count)]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--devices", default="4,8")
    parser.add_argument("--tables", type=int, default=30)
    parser.add_argument("--optimizers", default="exact_sgd,exact_row_wise_adagrad,exact_adagrad")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    rows = []
    for n in (int(d) for d in args.devices.split(",")):
        for i, task in enumerate(tasks(args.tasks, n, args.tables)):
            for name in args.optimizers.split(","):
                trained = dataclasses.replace(task, training=Training(name))
                plan = Planner(cost_model=CostModelSpec("analytic")).run(trained).plan
                for rank, r in enumerate(dmp_memory(plan, args.steps)):
                    rows.append({"task": f"d{n}-{i:02d}", "optimizer": name, "rank": rank, **r})
                print(f"d{n}-{i:02d} {name}: {n} ranks measured", flush=True)
    summary = {}
    print(f"{'optimizer':<24} {'ranks':>5} {'MAPE':>6} {'bias':>7} {'worst':>6} {'weights':>8} {'state':>8}")
    for name in args.optimizers.split(","):
        part = [r for r in rows if r["optimizer"] == name]
        ratio = np.array([r["predicted"]["total"] / max(r["peak"], 1) for r in part])
        weights = max(abs(r["predicted"]["weights"] / max(r["weights_bytes"], 1) - 1) for r in part)
        state = max(abs(r["predicted"]["state"] - r["state_bytes"]) / max(r["predicted"]["total"], 1) for r in part)
        summary[name] = {
            "ranks": len(part),
            "mape": float(np.mean(np.abs(ratio - 1))),
            "bias": float(np.mean(ratio - 1)),
            "worst": float(ratio[np.argmax(np.abs(ratio - 1))]),
            "median_peak_gb": statistics.median(r["peak"] for r in part) / GIB_BYTES,
            "weights_off": weights,
            "state_off": state,
        }
        s = summary[name]
        print(
            f"{name:<24} {s['ranks']:>5} {100 * s['mape']:>5.1f}% {100 * s['bias']:>+6.1f}% {s['worst']:>5.2f}x "
            f"{100 * weights:>7.2f}% {100 * state:>7.2f}%"
        )
    result = {"hardware": hardware(), "args": vars(args), "summary": summary, "ranks": rows}
    write_json(result, Path(args.out))
    return result


if __name__ == "__main__":
    main()
