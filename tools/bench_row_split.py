"""Row splits of hot tables, measured: cutting them into row blocks against the default plan, compute and comm.

    python -m tools.bench_row_split [--devices 4,8] [--tasks 5] [--scan 60] [--repeats 3] [--searcher beam]

``row_split=hot`` also tries cutting into row blocks every table whose predicted compute alone exceeds a device's
fair share of the task (``row_split.hot_tables``): no placement of whole tables balances those. It is not the
default because it had not been measured. This draws tasks of the suite's kind (the pool's test half, 10-59
tables, seeds from 0), keeps those with a hot table, and plans each twice: as ``row_split=hot`` would choose (the
model prices row groups' collectives with its ``row_comm`` fit; on its own it may keep the tables whole) and with
the hot tables cut into row blocks over every device whatever the model thinks (``search.ways.search_with_rows``). Both
are measured with the evaluator (every device's compute on the FBGEMM kernels and the all-to-all and row groups'
collectives on gloo ranks), ``--repeats`` interleaved times; the figure is each plan's median step (its slowest
device). So it tells whether cutting hot tables pays here, and whether the model's choice is the faster one. Run it
with nothing else running. Writes outputs/bench/row_split/row_split.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.costs.choice import CostModelSpec, make_cost_model
from neuroshard_jax.kernels.executors import ExecutorConfig
from neuroshard_jax.measure.evaluator import EvaluateConfig, measured_steps
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.search.ways import hot_tables, search_with_rows, whole_table_ms
from neuroshard_jax.workloads.builders import TaskConfig, generate_task
from neuroshard_jax.workloads.pool import load_pool
from searchers import make_searcher

OUT = Path(__file__).resolve().parents[1] / "outputs" / "bench" / "row_split"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="4,8")
    parser.add_argument("--tasks", type=int, default=5, help="tasks whose plans differ, per device count")
    parser.add_argument("--scan", type=int, default=60, help="seeds tried per device count")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--searcher", default="beam")
    parser.add_argument("--model", default="neural")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    try:
        run(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def run(args) -> None:
    if args.scan < 1 or args.tasks < 1 or args.repeats < 1:
        raise UserError(f"--scan/--tasks/--repeats: got {args.scan}/{args.tasks}/{args.repeats}, expected >= 1")
    pool = load_pool(TaskConfig().pool, TaskConfig().batch_size)
    pairs, scanned = [], {}
    for n in (int(x) for x in args.devices.split(",")):
        found = hot_count = 0
        for seed in range(args.scan):
            task = generate_task(pool, TaskConfig(num_tables=None, num_devices=n, split="test"), seed)
            model = make_cost_model(args.model, task)
            if not model.prices_rows:
                raise UserError(
                    f"--model {args.model}: prices row groups as all-to-all width (no row comm fit of its hardware "
                    "kind is shipped), expected a model with one (python -m neuroshard_jax.train family=row_comm)"
                )
            if not hot_tables(whole_table_ms(model.expected, task), n):
                continue
            hot_count += 1
            chosen = search_plan(
                task, make_searcher(args.searcher), CostModelSpec(args.model).for_task(task), 0, row_split="hot"
            )
            hot = tuple(hot_tables(whole_table_ms(model.expected, task), n))
            try:
                cut = search_with_rows(
                    task, make_searcher(args.searcher), CostModelSpec(args.model).for_task(task), 0, hot
                )
            except InfeasibleError:  # the blocks leave no room for the rest
                continue
            if set(chosen.shards) == set(cut.shards):  # the model chose the cut itself: compare with the plain plan
                chosen = search_plan(
                    task, make_searcher(args.searcher), CostModelSpec(args.model).for_task(task), 0, row_split="fit"
                )
            pairs.append({"devices": n, "seed": seed, "hot": list(hot), "plans": {"fit": chosen, "hot": cut}})
            found += 1
            print(
                f"{n} devices seed {seed}: chosen {chosen.costs.cost_ms:.1f} ms, "
                f"hot tables cut {cut.costs.cost_ms:.1f} ms predicted",
                flush=True,
            )
            if found == args.tasks:
                break
        scanned[n] = {"seeds": seed + 1, "with_hot_tables": hot_count, "compared": found}
    config = EvaluateConfig(executor=ExecutorConfig(workers=args.workers), pin=True)  # the labels' protocol
    plans = [p["plans"][k] for p in pairs for k in ("fit", "hot")]
    runs = measured_steps(plans, config, args.repeats)
    rows = []
    for j, p in enumerate(pairs):
        measured = {k: statistics.median(runs[2 * j + i]) for i, k in enumerate(("fit", "hot"))}
        predicted = {k: p["plans"][k].costs.cost_ms for k in ("fit", "hot")}
        hot_plan = p["plans"]["hot"]
        rows_of = hot_plan.task.table_rows()
        row_tables = sorted({s.table for s in hot_plan.shards if not s.whole_rows(rows_of[s.table])})
        rows.append(
            {"devices": p["devices"], "seed": p["seed"], "hot_tables": p["hot"], "row_split_tables": row_tables}
            | {"predicted_ms": predicted, "measured_ms": measured, "hot_vs_fit": measured["hot"] / measured["fit"]}
        )
        print(
            f"{p['devices']} devices seed {p['seed']}: measured fit {measured['fit']:.1f} ms, "
            f"hot {measured['hot']:.1f} ms ({100 * (measured['hot'] / measured['fit'] - 1):+.1f}%); "
            f"predicted {predicted['fit']:.1f} / {predicted['hot']:.1f}"
        )
    summary = {}
    for n in scanned:
        ratios = [r["hot_vs_fit"] for r in rows if r["devices"] == n]
        right = [
            (r["predicted_ms"]["hot"] < r["predicted_ms"]["fit"]) == (r["measured_ms"]["hot"] < r["measured_ms"]["fit"])
            for r in rows
            if r["devices"] == n
        ]
        summary[n] = scanned[n] | {
            "mean_hot_vs_fit": float(np.mean(ratios)) if ratios else None,
            "hot_faster": int(sum(x < 1 for x in ratios)),
            "model_picks_the_faster": int(sum(right)),
        }
        print(f"{n} devices: {summary[n]}")
    write_json(
        {
            "machine": hardware(),
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "args": vars(args),
            "summary": summary,
            "tasks": rows,
        },
        OUT / "row_split.json",
    )


if __name__ == "__main__":
    main()
