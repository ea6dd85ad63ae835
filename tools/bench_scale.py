"""Planning at production scale: thousands of tables over hundreds of devices, some tables larger than a device.

    python -m tools.bench_scale task  [--tables 5000 --devices 512 --per-host 8 --seed 0]   # the task (~20 s)
    python -m tools.bench_scale plan  [--searchers grid,size_lookup_greedy,beam,beam@60 --cost-model neural]
    python -m tools.bench_scale torchrec [--timeout 900]                    # TorchRec's planner, same task
    python -m tools.bench_scale dmp [--devices 8 --cap-gib 0.25]   # tables up to 4x a device: plan, export, run DMP
    python -m tools.bench_scale compare [--sizes 5000x512,20000x2048 --timeout 600]   # the default command, cold and
                                                   # warm, beside TorchRec's planner: wall, peak memory, predicted step

task: tables drawn by this file's own law (not the training sampler's, not the foreign benchmark's): rows
  log-uniform over 1e2..5e7 with 1% of tables at 5e7..2e8 (production's largest: several GB at dim 128), dims
  16..128, pooling factors log-normal (median 4, a tail past 100), Zipf access hashed over the rows, the
  histogram of one batch of 4096 drawn from that law. Devices: ``--cap-gib`` each (16 GiB: the largest tables
  do not fit one device and are cut into row blocks), 8 per host (300 GB/s within a host, 25 GB/s between
  hosts: NVLink and a 200 Gb/s NIC per GPU; the comm model scales to them, ``Links.comm_scale``). Written to
  outputs/bench/scale/task-TxN.json (gitignored; the same seed gives the same file).
plan: one subprocess per searcher (``beam@60``: beam with ``searcher.budget_s=60``), with an empty JAX compilation
  cache, so each figure is a cold run as a new user sees it (compilation included) with its own peak resident
  memory. Quality at this scale is predicted only.
torchrec: ``searcher=torchrec`` on the same task with its time limit; what it returns (or the limit) is recorded.
dmp: a task whose largest table is 4x a device's cap (and one 2x) is planned by beam (row blocks), exported to a
  TorchRec ShardingPlan and run in DistributedModelParallel on gloo (one process per device; forward checked
  against a known weight pattern, backward), then measured on the kernels. outputs/bench/scale/dmp.json.
Results: outputs/bench/scale/scale.json (one entry per run, the latest per searcher kept).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.features import bin_shares, count_histogram
from neuroshard_jax.core.files import read_json, write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.task import Task

OUT = Path(__file__).resolve().parents[1] / "outputs" / "bench" / "scale"
BATCH_SIZE = 4096
DIMS = (16, 32, 64, 128)


def histogram(rng: np.random.Generator, rows: int, pooling: float, skew: float) -> list[float]:
    """Bin shares of one batch's lookups: Zipf ranks hashed into the rows (hot ids anywhere in the table)."""
    lookups = int(rng.poisson(pooling * BATCH_SIZE))
    if lookups == 0:
        return [1.0] + [0.0] * 16
    ranks = rng.zipf(skew, size=lookups).astype(np.uint64)
    ids = ((ranks * np.uint64(0xD6E8FEB86659FD93)) >> np.uint64(11)) % np.uint64(rows)
    _, counts = np.unique(ids, return_counts=True)
    return [round(float(x), 5) for x in bin_shares(count_histogram(counts)[0])]


def scale_task(tables: int, devices: int, cap_gib: float, seed: int, links: dict | None = None) -> Task:
    rng = np.random.default_rng([seed, tables, devices, 5151])
    out = []
    for i in range(tables):
        huge = rng.random() < 0.01
        rows = int(10 ** rng.uniform(7.7, 8.3) if huge else 10 ** rng.uniform(2, 7.7))
        pooling = float(np.round(np.clip(rng.lognormal(np.log(4), 1.2), 0.1, 300), 3))
        dim = int(128 if huge else rng.choice(DIMS))
        bins = histogram(rng, rows, pooling, float(rng.uniform(1.05, 2.0)))
        out.append({"id": i, "name": f"f{i}", "rows": rows, "dim": dim, "pooling_factor": pooling, "bins": bins})
    obj = {"num_devices": devices, "mem_cap_gb": cap_gib, "batch_size": BATCH_SIZE, "tables": out}
    if links and devices > links["devices_per_host"]:
        obj["links"] = links
    return Task.from_json(obj, where="scale task")


def task_path(tables: int, devices: int) -> Path:
    return OUT / f"task-{tables}x{devices}.json"


def make_task_file(args) -> dict:
    start = time.perf_counter()
    links = {"intra_host_gbps": args.intra_gbps, "inter_host_gbps": args.inter_gbps}
    task = scale_task(args.tables, args.devices, args.cap_gib, args.seed, {**links, "devices_per_host": args.per_host})
    path = write_json(task.to_json(), task_path(args.tables, args.devices))
    total = sum(task.table_mem_bytes(i) for i in range(task.num_tables)) / 2**30
    over = sum(task.table_mem_bytes(i) > task.largest_cap_bytes for i in range(task.num_tables))
    return {
        "task": str(path.relative_to(OUT.parents[1])),
        "tables": task.num_tables,
        "devices": task.num_devices,
        "cap_gib": args.cap_gib,
        "total_gib": round(total, 1),
        "tables_over_cap": int(over),
        "hosts": len(set(task.hosts())),
        "links": task.to_json().get("links"),
        "generate_s": round(time.perf_counter() - start, 1),
    }


def plan_one(args) -> dict:
    """In its own process: load the task, search, report wall time, peak RSS and the predicted plan cost."""
    from neuroshard_jax.costs.choice import CostModelSpec
    from neuroshard_jax.search.pipeline import search_plan
    from searchers import make_searcher

    task = Task.from_json(read_json(task_path(args.tables, args.devices), "scale task"), where="scale task")
    start = time.perf_counter()
    # TorchRec's planner with every sharding type it has: the largest tables fit only as row blocks
    types = ["table_wise", "column_wise", "row_wise", "table_row_wise"]
    # and a flat 15% reservation: its default reserves storage for every feature's input (5,000 features at batch
    # 4096: more than a device holds) and finds no plan
    options = {"timeout_s": float(args.timeout), "sharding_types": types, "reservation": "percent"}
    options = options if args.searcher == "torchrec" else None
    name, _, budget = args.searcher.partition("@")  # beam@60: beam with searcher.budget_s=60
    if budget:
        options = {"budget_s": float(budget)}
    try:
        plan = search_plan(task, make_searcher(name, options), CostModelSpec(args.cost_model).for_task(task), 0)
    except (UserError, InfeasibleError) as err:
        return {"searcher": args.searcher, "error": str(err), "wall_s": round(time.perf_counter() - start, 1)}
    wall_s = time.perf_counter() - start
    rows = task.table_rows()
    costs = plan.costs
    return {
        "searcher": args.searcher,
        "cost_model": args.cost_model,
        "wall_s": round(wall_s, 1),
        "search_s": round(plan.search_time_s, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "shards": len(plan.shards),
        "row_split_tables": len({s.table for s in plan.shards if not s.whole_rows(rows[s.table])}),
        "predicted_cost_ms": round(costs.cost_ms, 2),
        "predicted_compute_max_over_mean": round(max(costs.compute_ms) / float(np.mean(costs.compute_ms)), 3),
    }


def run_each(args, searchers: list[str]) -> list[dict]:
    results = []
    for searcher in searchers:
        with tempfile.TemporaryDirectory(prefix="neuroshard-scale-") as cache:
            cmd = [sys.executable, __file__, "plan-one", "--searcher", searcher, "--cost-model", args.cost_model]
            cmd += ["--tables", str(args.tables), "--devices", str(args.devices), "--timeout", str(args.timeout)]
            env = {**os.environ, "NEUROSHARD_CACHE_DIR": cache}
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout + 120)
                row = (
                    json.loads(done.stdout.strip().splitlines()[-1])
                    if done.returncode == 0
                    else {
                        "searcher": searcher,
                        "error": done.stderr.strip().splitlines()[-1]
                        if done.stderr.strip()
                        else f"exit {done.returncode}",
                    }
                )
            except subprocess.TimeoutExpired:
                row = {"searcher": searcher, "error": f"no plan within {args.timeout + 120} s (killed)"}
        row.update(tables=args.tables, devices=args.devices, when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        print(json.dumps(row), flush=True)
        results.append(row)
    path = OUT / "scale.json"
    before = read_json(path, "scale results")["runs"] if path.exists() else []
    kept = [r for r in before if r["searcher"] not in searchers]
    write_json({"machine": hardware(), "runs": kept + results}, path)
    return results


def dmp(args) -> dict:
    """Plan, export and run in DistributedModelParallel a task with tables of 4x and 2x a device's cap."""
    from neuroshard_jax.costs.choice import CostModelSpec
    from neuroshard_jax.measure.evaluator import EvaluateConfig, measure_plans
    from neuroshard_jax.search.pipeline import search_plan
    from searchers import make_searcher

    rng = np.random.default_rng([args.seed, 4242])
    cap_rows = int(args.cap_gib * 2**30 / (128 * 4))  # rows of a dim-128 fp32 table that fill a device
    specs = [(4 * cap_rows, 128, 6.0), (2 * cap_rows, 128, 2.0)]
    specs += [(int(10 ** rng.uniform(3, 5.5)), int(rng.choice(DIMS)), float(rng.uniform(1, 30))) for _ in range(10)]
    tables = [
        {"id": i, "name": f"t{i}", "rows": r, "dim": d, "pooling_factor": p, "bins": histogram(rng, r, p, 1.3)}
        for i, (r, d, p) in enumerate(specs)
    ]
    task = Task.from_json(
        {"num_devices": args.devices, "mem_cap_gb": args.cap_gib, "batch_size": BATCH_SIZE, "tables": tables},
        where="dmp task",
    )
    plan = search_plan(task, make_searcher("beam"), CostModelSpec(args.cost_model).for_task(task), 0)
    rows = task.table_rows()
    path = write_json(plan.to_json(), OUT / "dmp-plan.json")
    cmd = [sys.executable, "-m", "neuroshard_jax.export", f"plan={path}", "device=cpu", "check=true"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    dmp_s = time.perf_counter() - start
    measured = measure_plans([plan], EvaluateConfig())[0]
    result = {
        "devices": args.devices,
        "cap_gib": args.cap_gib,
        "largest_table_gib": round(task.table_mem_bytes(0) / 2**30, 3),
        "row_split": {
            task.tables[t].name: len(plan.shards_of(t))
            for t in sorted({s.table for s in plan.shards if not s.whole_rows(rows[s.table])})
        },
        "device_mem_gib": [round(float(m) / 2**30, 3) for m in plan.mem_bytes()],
        "predicted_cost_ms": round(plan.costs.cost_ms, 2),
        "measured_cost_ms": round(measured["cost_ms"], 2),
        "measured_compute_ms": [round(d["compute"], 2) for d in measured["devices"]],
        "dmp_exit": done.returncode,
        "dmp_output": [  # paths relative to the repository: no machine's own paths in a committed record
            line.replace(f"{OUT.parents[1]}/", "")
            for line in done.stdout.strip().splitlines()[-args.devices - 1 :] or done.stderr.strip().splitlines()[-1:]
        ],
        "dmp_s": round(dmp_s, 1),
        "machine": hardware(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    write_json(result, OUT / "dmp.json")
    return result


def measured(command: list[str], env: dict, timeout: float) -> dict:
    """Run ``command`` in a process of its own and report its wall time and peak resident memory (``measure``)."""
    wrapper = [sys.executable, __file__, "measure", "--timeout", str(timeout), "--", *command]
    done = subprocess.run(wrapper, capture_output=True, text=True, env=env, timeout=timeout + 60)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(command: list[str], timeout: float) -> dict:
    """The child's wall seconds, peak RSS, exit code and its last stderr line (this process does nothing else)."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        code, said = done.returncode, (done.stderr.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired:
        code, said = None, f"no plan within {timeout:.0f} s (killed)"
    return {
        "wall_s": round(time.perf_counter() - start, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
        "exit": code,
        "said": said,
    }


def compare(args) -> list[dict]:
    """Per size: the default command (``python -m neuroshard_jax task.path=FILE``: beam, the shipped model) cold
    (an empty compilation cache) and warm (the same cache again), and TorchRec's planner (every sharding type, its
    time limit), side by side: wall, peak memory, predicted step."""
    rows = []
    for size in args.sizes.split(","):
        tables, _, devices = size.partition("x")
        args.tables, args.devices = int(tables), int(devices)
        if not task_path(args.tables, args.devices).exists():
            print(json.dumps(make_task_file(args)), file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="neuroshard-scale-") as cache:
            env = {**os.environ, "NEUROSHARD_CACHE_DIR": cache}
            for run in ("cold", "warm"):
                out = Path(cache) / run
                command = [sys.executable, "-m", "neuroshard_jax", f"task.path={task_path(args.tables, args.devices)}"]
                row = measured([*command, f"hydra.run.dir={out}"], env, args.timeout)
                plan = out / "plan.json"
                cost = read_json(plan, "plan")["cost_ms"] if row["exit"] == 0 and plan.exists() else None
                rows.append({"size": size, "planner": f"default command ({run})", **row, "predicted_ms": cost})
                print(json.dumps(rows[-1]), flush=True)
        torchrec = run_each(args, ["torchrec"])[0]
        rows.append(
            {
                "size": size,
                "planner": f"TorchRec ({args.timeout:.0f} s limit)",
                "wall_s": torchrec.get("wall_s"),
                "peak_rss_mb": torchrec.get("peak_rss_mb"),
                "said": torchrec.get("error", ""),
                "predicted_ms": torchrec.get("predicted_cost_ms"),
            }
        )
    print("| size | planner | wall (s) | peak RSS (MB) | predicted step (ms) | said |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        said = r["said"] if r.get("predicted_ms") is None else ""
        print(f"| {r['size']} | {r['planner']} | {r['wall_s']} | {r['peak_rss_mb']} | {r['predicted_ms']} | {said} |")
    write_json({"machine": hardware(), "runs": rows}, OUT / "compare.json")
    return rows


def main() -> None:
    if sys.argv[1:2] == ["measure"]:  # measure --timeout T -- COMMAND...: compare's own wrapper
        at = sys.argv.index("--")
        print(json.dumps(measure(sys.argv[at + 1 :], float(sys.argv[sys.argv.index("--timeout") + 1]))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["task", "plan", "plan-one", "torchrec", "dmp", "compare"])
    parser.add_argument("--sizes", default="5000x512,20000x2048", help="compare: TABLESxDEVICES, comma-separated")
    parser.add_argument("--tables", type=int, default=5000)
    parser.add_argument("--devices", type=int, default=None, help="default: 512 (8 for dmp: its 4x and 2x tables)")
    parser.add_argument("--cap-gib", type=float, default=None, help="default: 16 (0.25 for dmp)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-host", type=int, default=8, help="devices per host (task; default 8: 512 are 64 hosts)")
    parser.add_argument("--intra-gbps", type=float, default=300.0, help="GB/s per device within a host (task)")
    parser.add_argument("--inter-gbps", type=float, default=25.0, help="GB/s per device between hosts (task)")
    parser.add_argument("--searchers", default="grid,size_lookup_greedy,beam")
    parser.add_argument("--searcher", default="grid")
    parser.add_argument("--cost-model", default="neural")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    small = args.what == "dmp"  # DMP runs one gloo process per device holding real tables: a small task
    args.devices = args.devices or (8 if small else 512)
    args.cap_gib = args.cap_gib or (0.25 if small else 16.0)
    if args.what == "task":
        print(json.dumps(make_task_file(args)))
    elif args.what == "plan-one":
        print(json.dumps(plan_one(args)))
    elif args.what == "plan":
        run_each(args, args.searchers.split(","))
    elif args.what == "dmp":
        print(json.dumps(dmp(args), indent=1))
    elif args.what == "compare":
        compare(args)
    else:
        run_each(args, ["torchrec"])


if __name__ == "__main__":
    main()
