"""Speed, scale and quality of the NeuroShard searchers.

    python tools/bench_search.py speed   [--cost-model neural]      # beam vs the plain-Python oracle
    python tools/bench_search.py scale   [--devices 64,128]          # 856 tables; time and peak memory
    python tools/bench_search.py quality [--tasks 50 --devices 4,8]  # measured cost of every searcher

speed: for T = 10, 30, 60 tables and N = 4, 8 devices, beam search (defaults k=3, n=10,
  max_length=10) in JAX, after compilation (compile time reported separately), against the oracle of
  tests/oracle.py (the paper's loops, one shard at a time); both return the same plan.
scale: one subprocess per device count, so each reports its own peak resident memory.
quality: held-out tasks (conf/task/neuroshard.yaml, 10..59 tables from the test half of the pool, which
  the rl policy never saw, seeds from --first-seed), every searcher's plan measured by the evaluator;
  plans and measurements are appended to OUT/quality.jsonl (a stopped run resumes). Infeasible plans
  are counted per searcher, never dropped: means are over the tasks every searcher solved, and each
  searcher's solved count is reported beside them.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/oracle.py

from neuroshard_jax.cost_models import make_cost_model, score_plan  # noqa: E402
from neuroshard_jax.datasets import JsonlLog  # noqa: E402
from neuroshard_jax.errors import InfeasibleError, UserError  # noqa: E402
from neuroshard_jax.evaluate import EvaluateConfig, measure_plans  # noqa: E402
from neuroshard_jax.search import write_json  # noqa: E402
from neuroshard_jax.tasks import TaskConfig, make_task  # noqa: E402
from searchers import make_searcher  # noqa: E402

GREEDY = ["dim_greedy", "size_greedy", "lookup_greedy", "size_lookup_greedy"]
SEARCHERS = ["beam", "grid", "rl", "torchrec", "random", *GREEDY]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


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
            model = make_cost_model(args.cost_model, task)
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
                "cost_ms": round(float(score_plan(model, first).total_ms.max()), 4),
                "oracle_cost_ms": round(oracle_cost, 4),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"cost_model": args.cost_model, "rows": rows}


def scale_one(args) -> dict:
    n = args.devices[0]
    task = make_task(TaskConfig(num_tables=856, num_devices=n), args.seed)
    model = make_cost_model(args.cost_model, task)
    plan, total_s = timed(make_searcher("beam").search, task, model, 0)
    return {
        "tables": 856,
        "devices": n,
        "beam_s_including_compile": round(total_s, 2),
        "shards": len(plan.shards),
        "cost_ms": round(float(score_plan(model, plan).total_ms.max()), 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def scale(args) -> dict:
    rows = []
    for n in args.devices:
        cmd = [sys.executable, __file__, "scale-one", "--devices", str(n), "--cost-model", args.cost_model]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    return {"cost_model": args.cost_model, "rows": rows}


def quality(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = JsonlLog(out / "quality.jsonl")
    done = {(r["devices"], r["task_seed"], r["searcher"]): r for r in log.records()}
    todo = [(n, args.first_seed + i, s) for n in args.devices for i in range(args.tasks) for s in args.searchers]
    todo = [key for key in todo if key not in done]
    evaluate = EvaluateConfig(workers=args.workers)
    for start in range(0, len(todo), args.chunk):
        plans, records = [], []
        for n, seed, searcher in todo[start : start + args.chunk]:
            task = make_task(TaskConfig(num_tables=None, num_devices=n, split="test"), seed)
            model = make_cost_model(args.cost_model, task)
            record = {"id": f"{n}/{seed}/{searcher}", "devices": n, "task_seed": seed, "searcher": searcher}
            record["tables"] = task.num_tables
            try:
                plan, search_s = timed(make_searcher(searcher).search, task, model, seed)
            except (InfeasibleError, UserError) as err:  # no plan (or one our format cannot hold): counted
                records.append({**record, "infeasible": str(err)})
                continue
            costs = score_plan(model, plan)
            record.update(search_s=search_s, predicted_ms=float(costs.total_ms.max()))
            record["shards"] = [[s.table, s.col_offset, s.dim, s.device] for s in plan.shards]  # task: from the seed
            plans.append(plan)
            records.append(record)
        measured = iter(measure_plans(plans, evaluate))
        for record in records:
            if "infeasible" not in record:
                result = next(measured)
                record.update(measured_ms=result["cost_ms"], measured_devices=result["devices"])
            log.append(record)
            done[(record["devices"], record["task_seed"], record["searcher"])] = record
        print(f"{len(done)} / {len(args.devices) * args.tasks * len(args.searchers)} plans measured", flush=True)
    return summarize(done, args)


def summarize(done: dict, args) -> dict:
    summary = {"cost_model": args.cost_model, "tasks_per_device_count": args.tasks, "by_devices": {}}
    for n in args.devices:
        seeds = [args.first_seed + i for i in range(args.tasks)]
        solved = {s: [seed for seed in seeds if "measured_ms" in done[(n, seed, s)]] for s in args.searchers}
        common = [seed for seed in seeds if all(seed in solved[s] for s in args.searchers)]
        cost = {s: np.array([done[(n, seed, s)]["measured_ms"] for seed in common]) for s in args.searchers}
        greedy = [s for s in args.searchers if s in GREEDY]
        best_greedy = min(greedy, key=lambda s: cost[s].mean()) if greedy else None
        per_task_best_greedy = np.min([cost[s] for s in greedy], axis=0) if greedy else None
        rows = {}
        for s in args.searchers:
            rows[s] = {
                "solved": len(solved[s]),
                "infeasible": args.tasks - len(solved[s]),
                "mean_measured_ms": float(cost[s].mean()),
                "median_measured_ms": float(np.median(cost[s])),
                "mean_predicted_ms": float(np.mean([done[(n, seed, s)]["predicted_ms"] for seed in common])),
                "mean_search_s": float(np.mean([done[(n, seed, s)]["search_s"] for seed in solved[s]])),
            }
            if best_greedy:
                rows[s]["improvement_vs_best_greedy"] = float(np.mean(1 - cost[s] / cost[best_greedy]))
                rows[s]["improvement_vs_per_task_best_greedy"] = float(np.mean(1 - cost[s] / per_task_best_greedy))
        summary["by_devices"][str(n)] = {
            "tasks": args.tasks,
            "common_tasks": len(common),
            "best_greedy": best_greedy,
            "searchers": rows,
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["speed", "scale", "scale-one", "quality"])
    parser.add_argument("--cost-model", default="neural")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", type=_ints, default=None)
    parser.add_argument("--tasks", type=int, default=50, help="quality: tasks per device count")
    parser.add_argument("--first-seed", type=int, default=20_000, help="quality: held-out task seeds")
    parser.add_argument("--searchers", type=lambda s: s.split(","), default=SEARCHERS)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=24, help="quality: plans measured per batch (and appended)")
    parser.add_argument("--out", default="bench/search")
    args = parser.parse_args()
    if args.what == "scale-one":
        print(json.dumps(scale_one(args)))
        return
    args.devices = args.devices or ([64, 128] if args.what == "scale" else [4, 8])
    result = {"speed": speed, "scale": scale, "quality": quality}[args.what](args)
    print(json.dumps(result, indent=1))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_json(result, Path(args.out) / f"{args.what}.json")


if __name__ == "__main__":
    main()
