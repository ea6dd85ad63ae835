"""Predicted memory against what DistributedModelParallel holds (issue 52): plans of pool tasks, planned for each
optimizer near their devices' caps, run on gloo ranks on this machine's CPU with that optimizer fused into the
backward pass.

    python -m tools.dmp_memory --tasks 3 --devices 4,8 --optimizers exact_sgd,exact_row_wise_adagrad,exact_adagrad
    python -m tools.dmp_memory --family din_history --tasks 2 --devices 4 --optimizers exact_row_wise_adagrad

Per task (``--tables`` tables drawn from the shipped 856-table pool, its own seeds), device count and optimizer: the
devices' cap is set so that the tables (weights, optimizer state, the step's buffers) and every device's slice of the
batch take ``--fill`` of all the devices' memory (0: 1 GiB caps, the tables' weights half of it), and beam plans the
task with that optimizer (``Task.training``; the analytic cost model: what is judged is the memory of a placement, not
its cost). One set of rank processes per plan (``measure.training_steps.dmp_memory``): each rank's resident memory
growth when its sharded module is built and its peak over 3 training steps, and the allocator's count of its shard
weights and optimizer state, beside ``Plan.memory``. Writes ``--out`` (JSON, after every plan) and prints, per
optimizer, the error of the predicted total against the peak growth (MAPE, bias, worst rank), how exact weights and
state are, the fullest rank's predicted total and peak as shares of its room (cap less reserve), and how many ranks
passed it. ``--family``: tasks of one of the sequence benchmark's families (``tools/sequence_benchmark.py``: sequence
histories, weighted and mean-pooled bags beside plain ones; task indices from 50 on, not the benchmark's own), so
that the unpooled kernels' outputs (a row per id) and their all-to-all buffers are judged as the bags' are.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

import numpy as np

from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.devices import Device
from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.memory import Training
from neuroshard_jax.costs.choice import CostModelSpec
from neuroshard_jax.measure.training_steps import dmp_memory
from neuroshard_jax.search.sharding_planner import Planner
from neuroshard_jax.workloads.builders import TaskConfig, generate_task
from neuroshard_jax.workloads.pool import PoolSpec, load_pool
from tools.sequence_benchmark import FAMILIES, sequence_task

SEED = 720_113  # the tool's own task draws
OUT = Path("outputs/bench/dmp-memory/results.json")


def tasks(count: int, devices: int, tables: int, seed: int = 0) -> list:
    """``count`` pool tasks of ``tables`` tables on ``devices`` devices of 1 GiB, half full (weights); ``seed``: a set
    of draws of its own (0: the first measured)."""
    pool = load_pool(PoolSpec(), 4096)
    config = TaskConfig(num_tables=tables, num_devices=devices, mem_cap_gb=1.0, max_fill=0.5, pool=PoolSpec())
    return [generate_task(pool, config, SEED + 10_000 * seed + 100 * devices + i) for i in range(count)]


def family_tasks(family: str, count: int, devices: int, seed: int = 0) -> list:
    """``count`` tasks of the sequence benchmark's ``family`` at ``devices`` devices (indices 50 + 10 x seed on: draws
    the benchmark never plans)."""
    if family not in FAMILIES:
        raise SystemExit(f"error: --family: got {family!r}, expected pool or one of {', '.join(FAMILIES)}")
    return [sequence_task(family, devices, 50 + 10 * seed + i) for i in range(count)]


def filled(task, optimizer: str, fill: float | None, reserve: float = 0.0):
    """``task`` trained with ``optimizer`` (holding back ``reserve`` of each cap) on devices whose cap makes the
    tables (weights, state and buffers) and every device's slice of the batch take ``fill`` of all the devices' room
    (None: the task's own caps)."""
    trained = dataclasses.replace(task, training=Training(optimizer, reserve))
    if fill is None:
        return trained
    tables = sum(trained.table_mem_bytes(i) for i in range(trained.num_tables))
    per_device = tables / trained.num_devices + trained.step_memory().total
    cap_gb = round(per_device / fill / (1.0 - reserve) / GIB_BYTES, 4)
    return dataclasses.replace(trained, devices=(Device(cap_gb),) * trained.num_devices)


def summarise(rows: list[dict], optimizers: list[str]) -> dict:
    """Per optimizer: the predicted total's error against the peak growth (MAPE, bias, worst), how exact weights
    and state are, and the ranks whose peak passed their room (cap less reserve)."""
    summary = {}
    for name in optimizers:
        part = [r for r in rows if r["optimizer"] == name]
        if not part:
            continue
        ratio = np.array([r["predicted"]["total"] / max(r["peak"], 1) for r in part])
        summary[name] = {
            "ranks": len(part),
            "mape": float(np.mean(np.abs(ratio - 1))),
            "bias": float(np.mean(ratio - 1)),
            "worst": float(ratio[np.argmax(np.abs(ratio - 1))]),
            "median_peak_gb": statistics.median(r["peak"] for r in part) / GIB_BYTES,
            "weights_off": max(abs(r["predicted"]["weights"] / max(r["weights_bytes"], 1) - 1) for r in part),
            "state_off": max(
                abs(r["predicted"]["state"] - r["state_bytes"]) / max(r["predicted"]["total"], 1) for r in part
            ),
            "fullest_predicted": max(r["predicted"]["total"] / r["room"] for r in part),
            "fullest_peak": max(r["peak"] / r["room"] for r in part),
            "over_room": sum(r["peak"] > r["room"] for r in part),
            "fullest_of_cap": max(r["peak"] / r["cap"] for r in part),
            "over_cap": sum(r["peak"] > r["cap"] for r in part),
        }
    return summary


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--devices", default="4,8")
    parser.add_argument("--tables", type=int, default=30)
    parser.add_argument("--optimizers", default="exact_sgd,exact_row_wise_adagrad,exact_adagrad")
    parser.add_argument(
        "--fill", type=float, default=0.9, help="share of all devices' memory the tables take (0: 1 GiB caps)"
    )
    parser.add_argument("--reserve", type=float, default=0.0, help="share of each cap held back (task.mem_reserve)")
    parser.add_argument("--seed", type=int, default=0, help="the tasks' set of draws (0: the first measured)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--family", default="pool", help="pool, or a family of tools/sequence_benchmark.py")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    optimizers = args.optimizers.split(",")
    rows = []
    for n in (int(d) for d in args.devices.split(",")):
        drawn = (
            tasks(args.tasks, n, args.tables, args.seed)
            if args.family == "pool"
            else family_tasks(args.family, args.tasks, n, args.seed)
        )
        for i, task in enumerate(drawn):
            for name in optimizers:
                trained = filled(task, name, args.fill or None, args.reserve)
                plan = Planner(cost_model=CostModelSpec("analytic")).run(trained).plan
                rooms, caps = trained.room_bytes(), trained.caps_gb()
                for rank, r in enumerate(dmp_memory(plan, args.steps)):
                    at = {"room": int(rooms[rank]), "cap": int(caps[rank] * GIB_BYTES)}
                    rows.append({"task": f"d{n}-{i:02d}", "optimizer": name, "rank": rank, **at, **r})
                print(f"d{n}-{i:02d} {name}: {n} ranks of {trained.caps_gb()[0]:.3f} GiB measured", flush=True)
                write_json({"hardware": hardware(), "args": vars(args), "ranks": rows}, Path(args.out))
    summary = summarise(rows, optimizers)
    print(
        f"{'optimizer':<24} {'ranks':>5} {'MAPE':>6} {'bias':>7} {'worst':>6} {'weights':>8} {'state':>8} "
        f"{'fullest pred':>12} {'fullest peak':>12} {'over':>4} {'peak/cap':>8} {'over cap':>8}"
    )
    for name, s in summary.items():
        print(
            f"{name:<24} {s['ranks']:>5} {100 * s['mape']:>5.1f}% {100 * s['bias']:>+6.1f}% {s['worst']:>5.2f}x "
            f"{100 * s['weights_off']:>7.2f}% {100 * s['state_off']:>7.2f}% {100 * s['fullest_predicted']:>11.1f}% "
            f"{100 * s['fullest_peak']:>11.1f}% {s['over_room']:>4} {100 * s['fullest_of_cap']:>7.1f}% "
            f"{s['over_cap']:>8}"
        )
    result = {"hardware": hardware(), "args": vars(args), "summary": summary, "ranks": rows}
    write_json(result, Path(args.out))
    return result


if __name__ == "__main__":
    main()
