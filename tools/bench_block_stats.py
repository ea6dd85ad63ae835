"""Row blocks of tables whose ids are numbered by frequency, planned knowing their blocks' statistics or not, measured.

    python -m tools.bench_block_stats [--tasks 3] [--devices 4] [--repeats 3] [--searcher beam] [--model neural]

Many pipelines number a table's ids by frequency (id 0 the most looked up), so TorchRec's row-wise layout puts all
of a table's hot rows in its first block. Each task here has two large tables whose ids are Zipf-distributed in
that order and 12 small tables with hashed ids, one data stream per table (a seed per task, the Zipf exponent drawn
in 1.05..1.3). ``stats.StatsAccumulator`` measures each table's statistics and, rows being known, its row blocks'
(``Table.row_blocks``). The task is planned twice with the same searcher and model, the two large tables cut into
row blocks over every device (``ways.search_with_rows``): knowing the blocks' statistics, and with them removed (a
block priced as its rows' share of the table's lookups with the table's histogram, all a search knew before).
Both plans are measured on the task with the statistics (each block measured as its own lookups, which is what its
device does), compute and comm, ``--repeats`` interleaved times (each device's median). Reported per plan: the
measured step and slowest device compute, and the device compute MAPE of the plan's own predictions. Run it with
nothing else running. Writes outputs/bench/row_blocks/block_stats.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.cli import fail
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.choice import CostModelSpec
from neuroshard_jax.kernels.executors import ExecutorConfig
from neuroshard_jax.measure.evaluator import EvaluateConfig, measure_plans
from neuroshard_jax.search.ways import search_with_rows
from neuroshard_jax.workloads.statistics import StatsAccumulator
from neuroshard_jax.workloads.streams import zipf_ids
from searchers import make_searcher

OUT = Path(__file__).resolve().parents[1] / "outputs" / "bench" / "row_blocks"
BATCH = 4096
BIG = ((1_000_000, 32, 60.0), (400_000, 64, 30.0))  # (rows, dim, pooling factor) of the two row-split tables


def make_task(seed: int, num_devices: int) -> Task:
    """The task of ``seed``: its tables' statistics (blocks' included) measured from four batches of drawn data."""
    rng = np.random.default_rng([seed, 3141])
    s = float(rng.uniform(1.05, 1.3))
    small = [
        (int(rng.integers(5_000, 100_000)), int(rng.choice([16, 32, 64])), float(rng.uniform(2, 20))) for _ in range(12)
    ]
    specs = list(BIG) + small
    rows = {f"t{i}": r for i, (r, _, _) in enumerate(specs)}
    acc = StatsAccumulator(BATCH, rows=rows, row_blocks=(num_devices,))
    for _ in range(4):
        batch = {}
        for i, (r, _, pooling) in enumerate(specs):
            lengths = rng.poisson(pooling, size=BATCH)
            ids = zipf_ids(rng, r, s, int(lengths.sum()))  # id 0 the hottest
            if i >= len(BIG):  # hashed ids: the hot rows scattered over the table
                ids = (ids * 2_654_435_761 + seed) % r
            batch[f"t{i}"] = (ids, lengths)
        acc.add(batch)
    tables = [t.to_json() | {"id": i, "dim": specs[i][1]} for i, t in enumerate(acc.result())]
    return Task.from_json({"num_devices": num_devices, "mem_cap_gb": 1.0, "batch_size": BATCH, "tables": tables})


def blind(task: Task) -> Task:
    """The task without its row blocks' statistics."""
    return dataclasses.replace(task, tables=tuple(dataclasses.replace(t, row_blocks=()) for t in task.tables))


def run(args) -> dict:
    if args.tasks < 1 or args.repeats < 1:
        raise UserError(f"--tasks/--repeats: got {args.tasks}/{args.repeats}, expected >= 1")
    evaluate = EvaluateConfig(executor=ExecutorConfig(workers=args.workers), pin=True)
    rows = []
    for seed in range(args.tasks):
        task = make_task(seed, args.devices)
        split = tuple(range(len(BIG)))
        knowing = search_with_rows(
            task, make_searcher(args.searcher), CostModelSpec(args.model).for_task(task), 0, split
        )
        unknowing = search_with_rows(
            blind(task), make_searcher(args.searcher), CostModelSpec(args.model).for_task(blind(task)), 0, split
        )
        plans = {"knowing": knowing, "blind": Plan(task, unknowing.shards)}  # both measured as they run
        predicted = {"knowing": knowing.costs.compute_ms, "blind": unknowing.costs.compute_ms}
        runs = {name: [] for name in plans}
        for _ in range(args.repeats):  # interleaved: every plan once per repeat
            for name, result in zip(plans, measure_plans(list(plans.values()), evaluate)):
                runs[name].append(result)
        row = {"seed": seed, "hot_block_pooling": [round(p, 3) for p in task.tables[0].row_blocks[0].pooling_factors]}
        for name, results in runs.items():
            compute = np.median([[d["compute"] for d in r["devices"]] for r in results], axis=0)
            pred = np.asarray(predicted[name])
            row[name] = {
                "step_ms": statistics.median(r["cost_ms"] for r in results),
                "slowest_compute_ms": float(compute.max()),
                "predicted_slowest_compute_ms": float(pred.max()),
                "device_mape": float(np.mean(np.abs(pred - compute) / compute)),
                "compute_ms": [round(float(c), 3) for c in compute],
                "predicted_compute_ms": [round(float(c), 3) for c in pred],
            }
        print(
            f"task {seed}: step knowing {row['knowing']['step_ms']:.1f} ms, blind {row['blind']['step_ms']:.1f} ms; "
            f"device MAPE {row['knowing']['device_mape']:.1%} / {row['blind']['device_mape']:.1%}",
            flush=True,
        )
        rows.append(row)
    mean = {
        name: {k: float(np.mean([r[name][k] for r in rows])) for k in ("step_ms", "slowest_compute_ms", "device_mape")}
        for name in ("knowing", "blind")
    }
    return {
        "what": "row-split plans of tables with frequency-ordered ids, planned knowing their blocks' statistics or not",
        "machine": hardware(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": vars(args),
        "step_knowing_over_blind": float(np.mean([r["knowing"]["step_ms"] / r["blind"]["step_ms"] for r in rows])),
        "mean": mean,
        "tasks": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--searcher", default="beam")
    parser.add_argument("--model", default="neural")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    try:
        result = run(args)
    except UserError as err:
        fail(err)
    write_json(result, OUT / "block_stats.json")
    print(f"step knowing / blind: {result['step_knowing_over_blind']:.3f}; {result['mean']}")


if __name__ == "__main__":
    main()
