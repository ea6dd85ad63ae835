"""Speed and scale of the NeuroShard searchers (plan quality: the suite, ``-m experiment=compare``).

    python -m tools.bench_search speed   [--cost-model neural]      # beam vs the plain-Python oracle
    python -m tools.bench_search scale   [--devices 64,128]          # 856 tables; time and peak memory
    python -m tools.bench_search explain [--devices 64]              # explaining the 856-table plan
    python -m tools.bench_search balance [--tasks 8 --tables 40]     # comm_weights on and off: predicted step
    python -m tools.bench_search balance --suite foreign --measure 3 --out outputs/bench/search/foreign
                                                                     # the foreign tasks; changed plans measured
    python -m tools.bench_search balance --option merge_column_wise --tables 20 --first-seed 300 --measure 3
                                                                     # whole tables in the column-wise group or not
``--cost-model``: ``neural`` (default) is the model the planner chooses on this machine (its kind's, as the main job);
a shipped model's name that model; ``analytic`` the roofline. (Before 2026-11-30, commit after cadc8ef, ``neural``
here meant the shipped default checkpoint, ``xeon-union``, on every machine.)

speed: for T = 10, 30, 60 tables and N = 4, 8 devices, beam search (defaults k=3, n=10,
  max_length=10) in JAX, after compilation (compile time reported separately), against the oracle of
  tests/oracle.py (the paper's loops, one shard at a time); both return the same plan.
scale: one subprocess per device count, so each reports its own peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.files import write_json  # noqa: E402
from neuroshard_jax.core.hardware import hardware, hardware_kind  # noqa: E402
from neuroshard_jax.core.task import Task  # noqa: E402
from neuroshard_jax.costs.choice import build_cost_model, spec_of  # noqa: E402
from neuroshard_jax.costs.cost_model import plan_cost_ms  # noqa: E402
from neuroshard_jax.costs.scoring import balanced_step, score_plan, with_costs  # noqa: E402
from neuroshard_jax.measure.breakdown import explanation  # noqa: E402
from neuroshard_jax.measure.evaluator import EvaluateConfig, measure_plans  # noqa: E402
from neuroshard_jax.search.pipeline import search_plan  # noqa: E402
from neuroshard_jax.workloads.builders import TaskConfig, make_task  # noqa: E402
from searchers import make_searcher  # noqa: E402
from tools.foreign_benchmark import FOREIGN, TASKS_FILE, benchmark_tasks  # noqa: E402


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def cost_model(args, task: Task):
    """``--cost-model`` for ``task`` as the planner builds it: ``neural`` is the model chosen for this machine's kind
    (the main job's), a checkpoint's name that model, ``analytic`` the roofline."""
    return build_cost_model(spec_of(args.cost_model), task)[0]


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def speed(args) -> dict:
    from searchers.neuroshard import DEFAULT_ALPHAS
    from tests.oracle import Oracle

    rows = []
    for num_tables in (10, 30, 60):
        for n in (4, 8):
            task = make_task(TaskConfig(num_tables=num_tables, num_devices=n), args.seed)
            model = cost_model(args, task)
            beam = make_searcher("beam")
            first, first_s = timed(beam.search, task, model, 0)
            runs = [timed(beam.search, task, model, 0)[1] for _ in range(3)]
            oracle = Oracle(task, model, DEFAULT_ALPHAS)
            oracle.shard(0, task.tables[0].dim)  # compiles its per-shard functions outside the timing
            (oracle_cost, oracle_plan), oracle_s = timed(oracle.beam, 3, 10, 10)
            beam_s = float(np.median(runs))
            row = {
                "tables": num_tables,
                "devices": n,
                "beam_s": round(beam_s, 4),
                "compile_s": round(max(first_s - beam_s, 0.0), 2),
                "oracle_s": round(oracle_s, 2),
                "speedup": round(oracle_s / beam_s, 1),
                "same_plan": first.shards == oracle_plan.shards,
                "cost_ms": round(float(plan_cost_ms(score_plan(model, first))), 4),
                "oracle_cost_ms": round(oracle_cost, 4),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"cost_model": args.cost_model, "rows": rows}


def scale_one(args) -> dict:
    n = args.devices[0]
    task = make_task(TaskConfig(num_tables=856, num_devices=n), args.seed)
    model = cost_model(args, task)
    plan, total_s = timed(make_searcher("beam").search, task, model, 0)
    return {
        "tables": 856,
        "devices": n,
        "beam_s_including_compile": round(total_s, 2),
        "shards": len(plan.shards),
        "cost_ms": round(float(plan_cost_ms(score_plan(model, plan))), 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def explain(args) -> dict:
    """Time ``breakdown.explanation`` of beam's 856-table plan: the first call (compiling) and a second one."""
    n = args.devices[0]
    task = make_task(TaskConfig(num_tables=856, num_devices=n), args.seed)
    model = cost_model(args, task).expected
    plan = make_searcher("beam").search(task, model, 0)
    _, first_s = timed(explanation, plan, model)
    expl, second_s = timed(explanation, plan, model)
    row = {
        "tables": 856,
        "devices": n,
        "split_tables": len(expl.splits),
        "first_s": round(first_s, 2),
        "second_s": round(second_s, 2),
    }
    print(json.dumps(row), flush=True)
    return row


MEMBERS = (("beam", "fit"), ("grid", "fit"), ("beam", "hot"))  # the portfolio's, searched apart


def _balance_tasks(args) -> list[tuple[str, Task]]:
    if args.suite == "foreign":  # evaluation tasks: measured, never tuned on
        return [(task_id, task) for task_id, _, task in benchmark_tasks(Path(FOREIGN.out) / TASKS_FILE)]
    return [
        (f"d{n}-s{seed}", make_task(TaskConfig(num_tables=args.tables, num_devices=n), seed))
        for n in args.devices
        for seed in range(args.first_seed, args.first_seed + args.tasks)
    ]


# ``balance --option``: the searcher options it compares, (on, off)
OPTIONS = {
    "comm_weights": ({"comm_weights": [1.0]}, {"comm_weights": []}),
    "merge_column_wise": ({"merge_column_wise": True}, {"merge_column_wise": False}),
}


def balance(args) -> dict:
    """The portfolio's members with a searcher option (``--option``: ``comm_weights`` [1.0] or [], or
    ``merge_column_wise`` true or false) on and off, on generated tasks (seeds ``--first-seed``.., default 100, not
    the suite's held-out 20,000..) or the foreign benchmark's (``--suite foreign``), each member through the whole
    pipeline (``search_plan``); per task the cheapest member's predicted step and the plan's own balance bound by the
    model (its predicted compute and widths spread evenly, ``balanced_step``). ``--measure R``: the tasks whose plan
    differs measured on the kernels, both plans R times interleaved (each device's fused fwd+bwd, the real
    all-to-alls; the median of each plan's step)."""
    rows, differ = [], []
    for task_id, task in _balance_tasks(args):
        model = cost_model(args, task)
        row = {"id": task_id, "devices": task.num_devices, "model": model.name}
        for label, options in zip(("on", "off"), OPTIONS[args.option]):
            started = time.perf_counter()
            plans = [search_plan(task, make_searcher(name, options), model, 0, mode) for name, mode in MEMBERS]
            costs = [float(plan_cost_ms(score_plan(model, p))) for p in plans]
            best = plans[int(np.argmin(costs))]
            compute = np.asarray(score_plan(model, best).compute_ms).ravel().tolist()
            row[label] = {
                "step_ms": round(min(costs), 4),
                "bound_ms": round(balanced_step(model, best, compute), 4),
                "search_s": round(time.perf_counter() - started, 2),
            }
            row[f"{label}_plan"] = best
        if row["on_plan"].shards != row["off_plan"].shards:
            differ.append(row)
        if args.plans_out:  # each task's two plans as plan.json files (for tools.dmp_steps)
            for label in ("on", "off"):
                plan = with_costs(model, row[f"{label}_plan"])
                write_json(plan.to_json(), Path(args.plans_out) / f"{task_id}-{label}.json")
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_plan")}), flush=True)
    config = EvaluateConfig(warmup=3, iters=10)
    for r in range(args.measure):  # interleaved: round r of every differing plan before round r + 1
        measured = measure_plans([p for row in differ for p in (row["on_plan"], row["off_plan"])], config)
        for i, row in enumerate(differ):
            for label, m in (("on", measured[2 * i]), ("off", measured[2 * i + 1])):
                row.setdefault(f"measured_{label}_ms", []).append(round(m["cost_ms"], 4))
                compute = max(d["compute"] for d in m["devices"])  # (a): the slowest device's compute alone
                row.setdefault(f"measured_{label}_compute_ms", []).append(round(compute, 4))
        print(f"measured round {r + 1} of {args.measure}: {len(differ)} tasks", flush=True)
    for row in rows:
        del row["on_plan"], row["off_plan"]
    ratio = [r["on"]["step_ms"] / r["off"]["step_ms"] for r in rows]
    measured = [np.median(r["measured_on_ms"]) / np.median(r["measured_off_ms"]) for r in differ if args.measure]
    return {
        "hardware": hardware_kind(hardware()),
        "suite": args.suite,
        "option": args.option,
        "cost_model": args.cost_model,
        "tables": args.tables,
        "rows": rows,
        "geomean_on_over_off": round(float(np.exp(np.mean(np.log(ratio)))), 5),
        "changed_pct": [round(100 * (x - 1), 2) for x in ratio if x != 1.0],
        "measured_on_over_off": [round(float(x), 4) for x in measured],
    }


def scale(args) -> dict:
    rows = []
    for n in args.devices:
        cmd = [sys.executable, __file__, "scale-one", "--devices", str(n), "--cost-model", args.cost_model]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    return {"cost_model": args.cost_model, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["speed", "scale", "scale-one", "explain", "balance"])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--tables", type=int, default=40)
    parser.add_argument("--suite", choices=["generated", "foreign"], default="generated")
    parser.add_argument("--measure", type=int, default=0)
    parser.add_argument("--cost-model", default="neural")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--option", choices=sorted(OPTIONS), default="comm_weights", help="balance: what it compares")
    parser.add_argument("--first-seed", type=int, default=100, help="balance: the generated tasks' first seed")
    parser.add_argument("--plans-out", help="balance: write each task's two plans here (TASK-on.json, TASK-off.json)")
    parser.add_argument("--devices", type=_ints, default=None)
    parser.add_argument("--out", default="outputs/bench/search")
    args = parser.parse_args()
    if args.what == "scale-one":
        print(json.dumps(scale_one(args)))
        return
    args.devices = args.devices or {"scale": [64, 128], "explain": [64]}.get(args.what, [4, 8])
    result = {"speed": speed, "scale": scale, "explain": explain, "balance": balance}[args.what](args)
    print(json.dumps(result, indent=1))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    name = f"{args.what}-{args.option}" if args.what == "balance" and args.option != "comm_weights" else args.what
    write_json(result, Path(args.out) / f"{name}.json")


if __name__ == "__main__":
    main()
