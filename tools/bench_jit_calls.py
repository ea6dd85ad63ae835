"""How many jitted calls a search makes, and how large: what an accelerator can gain (issue 41, item 4).

    python -m tools.bench_jit_calls [--tables 856 --devices 64 --searchers grid,beam]

Counts the host's calls into the jitted scoring functions the NeuroShard searchers make (``grid_search``, the batched
greedy: one ``lax.scan`` over the shard slots, vmapped over candidates and alphas; ``single_shard_costs``), with
each call's candidates, alphas and shard slots, and the search's wall time on this JAX backend.
"""

from __future__ import annotations

import argparse
import json
import time

import jax

import searchers.neuroshard as neuroshard
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.costs import scoring
from neuroshard_jax.costs.choice import CostModelSpec
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.workloads.builders import TaskConfig, generate_task
from neuroshard_jax.workloads.pool import PoolSpec, load_pool
from searchers import make_searcher


def counted(calls: list[dict]) -> None:
    """Route the searchers' jitted calls through counters (the module attributes they call)."""
    grid, single = neuroshard.grid_search, scoring.single_shard_costs

    def grid_search(fns, params, batch, bounds, *args, **kwargs):
        calls.append({"fn": "grid_search", "candidates": batch.feats.shape[0], "alphas": len(bounds)})
        calls[-1]["scan_steps"] = batch.feats.shape[1]
        return grid(fns, params, batch, bounds, *args, **kwargs)

    def single_shard_costs(fns, params, feats):
        calls.append({"fn": "single_shard_costs", "candidates": feats.shape[0], "alphas": 0, "scan_steps": 0})
        return single(fns, params, feats)

    neuroshard.grid_search, scoring.single_shard_costs = grid_search, single_shard_costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=856)
    parser.add_argument("--devices", type=int, default=64)
    parser.add_argument("--searchers", default="grid,beam")
    args = parser.parse_args()
    pool = PoolSpec()
    config = TaskConfig(num_tables=args.tables, num_devices=args.devices, mem_cap_gb=4.0, batch_size=4096, pool=pool)
    task = generate_task(load_pool(pool, 4096), config, 0)
    calls: list[dict] = []
    counted(calls)
    rows = []
    for searcher in args.searchers.split(","):
        for state in ("cold", "warm"):  # the first run compiles
            calls.clear()
            started = time.perf_counter()
            search_plan(task, make_searcher(searcher), CostModelSpec("neural").for_task(task), 0)
            grid = [c for c in calls if c["fn"] == "grid_search"]
            rows.append(
                {
                    "searcher": searcher,
                    "state": state,
                    "wall_s": round(time.perf_counter() - started, 2),
                    "jitted_calls": len(calls),
                    "grid_search_calls": len(grid),
                    "candidates_per_call": [c["candidates"] for c in grid],
                    "alphas": grid[0]["alphas"] if grid else 0,
                    "scan_steps_per_call": grid[0]["scan_steps"] if grid else 0,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"backend": jax.default_backend(), "machine": hardware().get("cpu_id")}))


if __name__ == "__main__":
    main()
