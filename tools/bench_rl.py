"""Inference time of the rl searcher (after compilation) and the shipped policy's training record.

    python -m tools.bench_rl [--policy DIR] [--tables 60] [--devices 8] [--repeats 20]

Times ``searcher=rl`` on one task (conf/task/neuroshard.yaml at the given size, test half of the pool):
greedy decoding alone (samples=0) and best-of-16, each the median of ``--repeats`` calls after a
first, compiling call; prints the policy's training history (time per round, measured plans).
"""

import argparse
import json
import statistics
import time

from neuroshard_jax.costs.choice import make_cost_model
from neuroshard_jax.workloads.builders import TaskConfig, make_task
from searchers import make_searcher


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default=None)
    parser.add_argument("--tables", type=int, default=60)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    task = make_task(TaskConfig(num_tables=args.tables, num_devices=args.devices, split="test"), 0)
    model = make_cost_model("neural", task)
    result = {"tables": args.tables, "devices": args.devices}
    for samples in (0, 16):
        searcher = make_searcher("rl", {"policy": args.policy, "samples": samples})
        start = time.perf_counter()
        searcher.search(task, model, 0)
        compile_s = time.perf_counter() - start
        times = []
        for seed in range(args.repeats):
            start = time.perf_counter()
            searcher.search(task, model, seed)
            times.append(time.perf_counter() - start)
        result[f"samples_{samples}"] = {
            "ms": round(1e3 * statistics.median(times), 2),
            "first_call_s": round(compile_s, 2),
        }
    from searchers.rl import _load

    _, _, _, meta = _load(searcher.path())
    result["training"] = {
        "rounds": meta["rounds_done"],
        "policy_s": sum(h["policy_s"] for h in meta["history"]),
        "refine_s": sum(h.get("refine_s", 0) for h in meta["history"]),
        "measured_plans": meta["history"][-1].get("measured_plans"),
        "history": meta["history"],
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
