"""Speed and scale of the NeuroShard searchers (plan quality: the suite, ``-m experiment=compare``).

    python -m tools.bench_search speed   [--cost-model neural]      # beam vs the plain-Python oracle
    python -m tools.bench_search scale   [--devices 64,128]          # 856 tables; time and peak memory
    python -m tools.bench_search explain [--devices 64]              # explaining the 856-table plan

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
from neuroshard_jax.costs.choice import make_cost_model  # noqa: E402
from neuroshard_jax.costs.cost_model import plan_cost_ms  # noqa: E402
from neuroshard_jax.costs.scoring import score_plan  # noqa: E402
from neuroshard_jax.measure.breakdown import explanation  # noqa: E402
from neuroshard_jax.workloads.builders import TaskConfig, make_task  # noqa: E402
from searchers import make_searcher  # noqa: E402


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
                "cost_ms": round(float(plan_cost_ms(score_plan(model, first))), 4),
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
        "cost_ms": round(float(plan_cost_ms(score_plan(model, plan))), 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def explain(args) -> dict:
    """Time ``breakdown.explanation`` of beam's 856-table plan: the first call (compiling) and a second one."""
    n = args.devices[0]
    task = make_task(TaskConfig(num_tables=856, num_devices=n), args.seed)
    model = make_cost_model(args.cost_model, task).expected
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
    parser.add_argument("what", choices=["speed", "scale", "scale-one", "explain"])
    parser.add_argument("--cost-model", default="neural")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", type=_ints, default=None)
    parser.add_argument("--out", default="outputs/bench/search")
    args = parser.parse_args()
    if args.what == "scale-one":
        print(json.dumps(scale_one(args)))
        return
    args.devices = args.devices or {"scale": [64, 128], "explain": [64]}.get(args.what, [4, 8])
    result = {"speed": speed, "scale": scale, "explain": explain}[args.what](args)
    print(json.dumps(result, indent=1))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_json(result, Path(args.out) / f"{args.what}.json")


if __name__ == "__main__":
    main()
