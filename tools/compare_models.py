"""Two cost models on the in-pool suite's tasks, measured side by side: is a new default a regression?

    python -m tools.compare_models --models xeon-union,cpu-b4096 [--devices 8] [--tasks 10] [--repeats 3] \
        [--searcher beam] [--out outputs/bench/compare/models.json]

Plans the suite's held-out tasks (conf/experiment/compare.yaml: seeds 20000.., the pool's test half, 10-59 tables)
with ``--searcher`` under each model, then measures every plan with the evaluator (each device's compute on the
FBGEMM kernels, the all-to-all on gloo ranks, workers pinned as the labels were), ``--repeats`` interleaved times
(repeat r of every plan before r + 1: drift hits every model alike). Per task the figure is each plan's median
measured step; the report gives, per model, the mean ratio of its step to the first model's, its wins, and the
measurements' own noise (one repeat against its plan's median), so a difference can be read against it. Run it
with nothing else running.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import hardware, write_json
from neuroshard_jax.kernels.executors import ExecutorConfig
from neuroshard_jax.measure.plans import EvaluateConfig, measured_steps
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.workloads.pool import load_pool
from neuroshard_jax.workloads.tasks import TaskConfig, generate_task

FIRST_SEED = 20000  # conf/experiment/compare.yaml: the suite's held-out tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="comma-separated cost models (shipped names or checkpoints)")
    parser.add_argument("--devices", default="8")
    parser.add_argument("--tasks", type=int, default=10, help="suite tasks per device count")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--searcher", default="beam")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="outputs/bench/compare/models.json")
    args = parser.parse_args()
    try:
        result = compare(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    write_json(result, Path(args.out))
    for n, summary in result["summary"].items():
        print(f"{n} devices: {summary}")


def compare(args) -> dict:
    models = [m for m in args.models.split(",") if m]
    if len(models) < 2 or args.tasks < 1 or args.repeats < 1:
        raise UserError(
            f"--models/--tasks/--repeats: got {models}/{args.tasks}/{args.repeats}, expected two models or more, "
            "a task and a repeat at least"
        )
    pool = load_pool(TaskConfig().pool, TaskConfig().batch_size)
    plans, index = [], []
    for n in (int(x) for x in args.devices.split(",")):
        for seed in range(FIRST_SEED, FIRST_SEED + args.tasks):
            task = generate_task(pool, TaskConfig(num_tables=None, num_devices=n, split="test"), seed)
            for model in models:
                plans.append(search_plan(task, args.searcher, model, 0))
                index.append((n, seed, model))
        print(f"{n} devices: {args.tasks} tasks planned", flush=True)
    config = EvaluateConfig(executor=ExecutorConfig(workers=args.workers), pin=True)
    runs = measured_steps(plans, config, args.repeats)
    step = {key: statistics.median(r) for key, r in zip(index, runs)}
    noise = [abs(x - statistics.median(r)) / statistics.median(r) for r in runs for x in r]
    summary = {}
    for n in sorted({k[0] for k in index}):
        seeds = sorted({k[1] for k in index if k[0] == n})
        base = models[0]
        summary[n] = {"tasks": len(seeds), "noise_one_repeat_vs_median": round(float(np.mean(noise)), 4)}
        for model in models:
            ratios = [step[(n, s, model)] / step[(n, s, base)] for s in seeds]
            best = sum(step[(n, s, model)] <= min(step[(n, s, m)] for m in models) for s in seeds)
            summary[n][model] = {
                f"step_vs_{base}": round(float(np.mean(ratios)), 4),
                "mean_step_ms": round(float(np.mean([step[(n, s, model)] for s in seeds])), 3),
                "best": int(best),
            }
    return {
        "what": f"{args.searcher} plans of the suite's held-out tasks under each model, measured interleaved",
        "machine": hardware(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "args": vars(args),
        "summary": summary,
        "plans": [{"devices": n, "seed": s, "model": m, "runs_ms": r} for (n, s, m), r in zip(index, runs)],
    }


if __name__ == "__main__":
    main()
