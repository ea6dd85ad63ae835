"""The foreign benchmark: tasks from table generators that share nothing with the training data, every
searcher's plans (and TorchRec's) measured on the real kernels.

    python tools/foreign_benchmark.py plan --model neural        # plans of every searcher (resumable)
    python tools/foreign_benchmark.py measure --repeats 5         # every device, 5 interleaved repeats (resumable)
    python tools/foreign_benchmark.py report --model neural       # the table in the README (and report.json)

The generators below are written apart from the training sampler (``collect source=specs``): their
own laws for rows, pooling factors and access, their own seeds, and tables described only by their specs
(the evaluator synthesises index streams that match them). Never train or tune on these tasks.

Families (rotating over the tasks; 24 tasks at 4 devices and 24 at 8):
* ``zipf_hashed``: rows log-normal over 1e2..1e7, pooling factors Pareto-tailed, ids from a Zipf law whose
  ranks are hashed into the rows;
* ``pooling_follows_rows``: the bigger the table, the more lookups per sample;
* ``tiny_hot``: many tables of 100-2000 rows looked up 50-300 times per sample (skewed), with a few big ones;
* ``huge_cold``: tables of 1e6-1e7 rows with pooling factors below 1 to 3, and a few hot ones;
* ``extreme_pooling``: pooling factors past 100 and below 1 side by side;
* ``uniform``: uniform access, every size;
* ``one_dominant``: one table costs as much as all the others together.

Measurement: a device's compute is the fused TBE fwd+bwd of its shards (the label protocol); each distinct
device (the same set of shards in several plans is measured once) is measured ``--repeats`` times, the
repeats interleaved (repeat r of every device of a task before repeat r + 1), and its median is the figure.
Results live in ``--out`` (plans.jsonl, measurements.jsonl: append-only, resumable).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from neuroshard_jax.datasets import JsonlLog, write_json
from neuroshard_jax.errors import InfeasibleError, UserError
from neuroshard_jax.evaluation import EvaluateConfig, device_tables
from neuroshard_jax.features import bin_shares, count_histogram
from neuroshard_jax.models import expected_cost_model, make_cost_model
from neuroshard_jax.profiling import compute_request, map_requests
from neuroshard_jax.scoring import score_plan
from neuroshard_jax.search import search_plan
from neuroshard_jax.types import Plan, Task

SEARCHERS = (
    "beam",
    "grid",
    "rl",
    "random",
    "size_greedy",
    "lookup_greedy",
    "dim_greedy",
    "size_lookup_greedy",
    "torchrec",
)
# TorchRec's default storage reservation sets aside GBs for the input tensors of tiny, very hot tables (13 of the
# 48 tasks found no plan at all, with devices whose tables take MBs); a flat 15% lets it plan every task.
SEARCHER_OPTIONS = {"torchrec": {"reservation": "percent"}}
MODEL_FREE = {"size_greedy", "lookup_greedy", "dim_greedy", "size_lookup_greedy", "torchrec"}
FAMILIES = (
    "zipf_hashed",
    "pooling_follows_rows",
    "tiny_hot",
    "huge_cold",
    "extreme_pooling",
    "uniform",
    "one_dominant",
)
BASE_SEED = 771_905  # this benchmark's own seeds; nothing else in the project uses them
TASKS_PER_SIZE = 24
BATCH_SIZE = 4096
DIMS = (16, 32, 64, 128)
TASKS_FILE = "tasks.json"
MAX_DEVICE_GIB = 5.0  # the measuring machine has 24 GiB for two kernel workers and the collection


# ---------------------------------------------------------------------------------------------
# Table generators


def batch_histogram(rng: np.random.Generator, rows: int, pooling: float, access: str, skew: float) -> list[float]:
    """Bin shares of one batch of ``pooling`` x batch lookups drawn by the ``access`` law."""
    lookups = int(rng.poisson(max(pooling, 1e-3) * BATCH_SIZE))
    if lookups == 0:
        return [1.0] + [0.0] * 16
    if access == "uniform":
        ids = rng.integers(0, rows, size=lookups)
    else:  # Zipf ranks hashed into the rows: hot ids anywhere in the table
        ranks = rng.zipf(skew, size=lookups).astype(np.uint64)
        ids = ((ranks * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(17)) % np.uint64(rows)
    _, counts = np.unique(ids, return_counts=True)
    return [round(float(x), 5) for x in bin_shares(count_histogram(counts)[0])]


def table(rng, rows: float, pooling: float, access: str = "zipf", skew: float | None = None, dim=None) -> dict:
    rows = int(np.clip(round(rows), 100, 10_000_000))
    pooling = float(np.round(np.clip(pooling, 0.1, 400.0), 3))
    skew = float(rng.uniform(1.05, 2.2)) if skew is None else skew
    return {
        "rows": rows,
        "dim": int(dim or rng.choice(DIMS)),
        "pooling_factor": pooling,
        "bins": batch_histogram(rng, rows, pooling, access, skew),
    }


def family_tables(family: str, rng: np.random.Generator) -> list[dict]:
    count = int(rng.integers(12, 61))
    if family == "zipf_hashed":
        return [table(rng, np.exp(rng.normal(np.log(3e4), 2.5)), 1 + rng.pareto(1.3) * 3) for _ in range(count)]
    if family == "pooling_follows_rows":
        out = []
        for _ in range(count):
            rows = 10 ** rng.uniform(2, 7)
            out.append(table(rng, rows, (rows / 100) ** 0.35 * rng.lognormal(0, 0.4)))
        return out
    if family == "tiny_hot":
        hot = [
            table(rng, 10 ** rng.uniform(2, 3.3), rng.uniform(50, 300), skew=rng.uniform(1.2, 2.5))
            for _ in range(count - 4)
        ]
        return hot + [table(rng, 10 ** rng.uniform(5, 7), rng.uniform(1, 10)) for _ in range(4)]
    if family == "huge_cold":
        cold = [
            table(rng, 10 ** rng.uniform(6, 7), 10 ** rng.uniform(-1, 0.5), dim=rng.choice((16, 32, 64)))
            for _ in range(count - 3)
        ]
        return cold + [table(rng, 10 ** rng.uniform(3, 5), rng.uniform(20, 80)) for _ in range(3)]
    if family == "extreme_pooling":
        return [
            table(rng, 10 ** rng.uniform(2, 6.5), rng.uniform(100, 250) if rng.random() < 0.4 else rng.uniform(0.1, 1))
            for _ in range(count)
        ]
    if family == "uniform":
        return [table(rng, 10 ** rng.uniform(2, 7), 10 ** rng.uniform(0, 1.7), access="uniform") for _ in range(count)]
    if family == "one_dominant":
        small = [
            table(rng, 10 ** rng.uniform(3, 6), rng.uniform(1, 8), dim=rng.choice((16, 32))) for _ in range(count - 1)
        ]
        work = sum(t["pooling_factor"] * t["dim"] for t in small)
        return small + [table(rng, 10 ** rng.uniform(4, 6), work / 128, dim=128)]
    raise ValueError(family)


def gib(t: dict) -> float:
    return t["rows"] * t["dim"] * 4 / 2**30


def device_cap_gib(tables: list[dict], devices: int) -> float:
    """The task's memory cap: roomy (2.5x the mean, 1.5x the largest table), so that TorchRec's planner, which
    also reserves memory for inputs, optimizer state and headroom, finds plans; memory is not what this
    benchmark is about."""
    return max(2.5 * sum(map(gib, tables)) / devices, 1.5 * max(map(gib, tables)), 1.0)


def fit_measurable(tables: list[dict], devices: int) -> None:
    """Narrow the largest tables (dim halved, down to 16, then rows halved) until the cap is at most
    MAX_DEVICE_GIB: every device of every plan must be measurable on the benchmark machine."""
    while device_cap_gib(tables, devices) > MAX_DEVICE_GIB:
        big = max(tables, key=gib)
        if big["dim"] > 16:
            big["dim"] //= 2
        else:
            big["rows"] //= 2


def benchmark_tasks(cache: Path | None = None) -> list[tuple[str, str, Task]]:
    """(task id, family, task) of every benchmark task, the same on every machine (``cache``: a tasks.json
    written on first use, read after; generating takes a minute)."""
    if cache is not None and cache.exists():
        return [(r["id"], r["family"], Task.from_json(r["task"])) for r in json.loads(cache.read_text())]
    tasks = []
    for devices in (4, 8):
        for i in range(TASKS_PER_SIZE):
            family = FAMILIES[i % len(FAMILIES)]
            rng = np.random.default_rng([BASE_SEED, devices, i])
            tables = family_tables(family, rng)
            fit_measurable(tables, devices)
            cap = float(np.round(device_cap_gib(tables, devices), 2))
            obj = {
                "num_devices": devices,
                "mem_cap_gb": cap,
                "batch_size": BATCH_SIZE,
                "tables": [{**t, "id": j, "name": f"{family}_{j}"} for j, t in enumerate(tables)],
            }
            tasks.append((f"d{devices}-{i:02d}", family, Task.from_json(obj, where=f"foreign task {i}")))
    if cache is not None:
        write_json([{"id": i, "family": f, "task": t.to_json()} for i, f, t in tasks], cache)
    return tasks


# ---------------------------------------------------------------------------------------------
# Plans


def plan_all(out: Path, model: str, model_options: dict, searchers: list[str]) -> None:
    log = JsonlLog(out / "plans.jsonl")
    for task_id, family, task in benchmark_tasks(out / TASKS_FILE):
        for searcher in searchers:
            label = "-" if searcher in MODEL_FREE else model_label(model, model_options)
            options = SEARCHER_OPTIONS.get(searcher)
            key = f"{task_id}/{searcher}/{label}" + "".join(f"/{k}={v}" for k, v in (options or {}).items())
            if key in log.ids:
                continue
            row = {"id": key, "task": task_id, "family": family, "searcher": searcher, "model": label}
            try:
                plan = search_plan(task, searcher, model, 0, options, model_options)
                row.update(plan=plan.to_json(), search_time_s=plan.search_time_s)
            except InfeasibleError as err:
                row.update(infeasible=str(err))
            except UserError as err:
                row.update(error=str(err))
            log.append(row)
            print(f"{key}: {row.get('infeasible') or row.get('error') or round(row['plan']['cost_ms'], 2)}", flush=True)


def current(row: dict) -> bool:
    """Whether a plans.jsonl row was made with this benchmark's searcher options (older rows are kept, unused)."""
    options = SEARCHER_OPTIONS.get(row["searcher"], {})
    return row["id"].endswith("".join(f"/{k}={v}" for k, v in options.items())) if options else True


def model_label(model: str, options: dict) -> str:
    return model + "".join(f":{Path(v).name}" for v in options.values())


def plan_of(row: dict, tasks: dict[str, Task]) -> Plan | None:
    return Plan.from_json(row["plan"]) if "plan" in row else None


def device_key(task: Task, tables: list) -> str:
    text = json.dumps([task.batch_size, task.precision, tables], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:20]


# ---------------------------------------------------------------------------------------------
# Measurements


def measure_all(out: Path, repeats: int, config: EvaluateConfig) -> None:
    tasks = {task_id: task for task_id, _, task in benchmark_tasks(out / TASKS_FILE)}
    rows = [r for r in JsonlLog(out / "plans.jsonl").records() if current(r)]
    log = JsonlLog(out / "measurements.jsonl")
    order = [t for pair in zip(*[[t for t in tasks if t.startswith(f"d{n}-")] for n in (4, 8)]) for t in pair]
    for repeat in range(repeats):
        for task_id in order:  # 4 and 8 devices alternating: a stopped run covers both
            task = tasks[task_id]
            devices: dict[str, list] = {}
            for row in rows:
                plan = plan_of(row, tasks) if row["task"] == task_id else None
                for d in range(task.num_devices) if plan else ():
                    tables = device_tables(task, plan.device_shards(d))
                    if tables:
                        devices.setdefault(device_key(task, tables), tables)
            todo = [k for k in devices if f"{k}/{repeat}" not in log.ids]
            order = np.random.default_rng([BASE_SEED, repeat, len(todo)]).permutation(len(todo))
            requests = [
                {
                    **compute_request(
                        f"{todo[i]}/{repeat}",
                        devices[todo[i]],
                        None,
                        task.batch_size,
                        config.device,
                        config.optimizer,
                        task.precision,
                        config.warmup,
                        config.iters,
                    ),
                    "key": todo[i],
                }
                for i in order
            ]

            def record(request: dict, answer: dict) -> None:
                log.append(
                    {
                        "id": request["id"],
                        "key": request["key"],
                        "repeat": int(request["id"].rsplit("/", 1)[1]),
                        **{k: answer.get(k) for k in ("ok", "total_ms", "fwd_ms", "bwd_ms", "error")},
                    }
                )

            if requests:
                map_requests(requests, record, config.workers, config.device, config.timeout_s)
                print(f"repeat {repeat} {task_id}: {len(requests)} devices measured", flush=True)


# ---------------------------------------------------------------------------------------------
# Report


def report(out: Path, model: str, model_options: dict, tie: float) -> dict:
    tasks = {task_id: (family, task) for task_id, family, task in benchmark_tasks(out / TASKS_FILE)}
    label = model_label(model, model_options)
    measured: dict[str, list[float]] = {}
    for m in JsonlLog(out / "measurements.jsonl").records():
        if m.get("ok"):
            measured.setdefault(m["key"], []).append(m["total_ms"])
    by_task: dict[str, dict[str, dict]] = {}
    models: dict = {}
    for row in JsonlLog(out / "plans.jsonl").records():
        if row["model"] not in ("-", label) or not current(row):
            continue
        family, task = tasks[row["task"]]
        entry = {"family": family}
        if "plan" not in row:
            entry["infeasible" if "infeasible" in row else "error"] = row.get("infeasible") or row.get("error")
        else:
            plan = Plan.from_json(row["plan"])
            # every plan (model-free searchers' too) re-scored by the model under test
            scorer = models.setdefault(row["task"], expected_cost_model(make_cost_model(model, task, model_options)))
            predicted = [float(x) for x in score_plan(scorer, plan).compute_ms]
            compute, spread = [], []
            for d in range(task.num_devices):
                tables = device_tables(task, plan.device_shards(d))
                runs = measured.get(device_key(task, tables), []) if tables else [0.0]
                compute.append(statistics.median(runs) if runs else None)
                if len(runs) > 1 and statistics.median(runs) > 0:
                    spread.append((max(runs) - min(runs)) / 2 / statistics.median(runs))
            entry.update(predicted=predicted, measured=compute, noise=max(spread) if spread else None)
        by_task.setdefault(row["task"], {})[row["searcher"]] = entry
    summary = summarise(by_task, tasks, tie)
    write_json({"model": label, "tie": tie, "tasks": by_task, "summary": summary}, out / f"report-{label}.json")
    return summary


def summarise(by_task: dict, tasks: dict, tie: float) -> dict:
    """Per device count and searcher: mean slowest device relative to TorchRec's, wins (within ``tie``), infeasible
    and failed counts; the balance bound; the model's device-level compute error."""
    out = {}
    for devices in (4, 8):
        ids = [t for t in by_task if tasks[t][1].num_devices == devices]
        complete = [
            t
            for t in ids
            if all(e.get("measured") and None not in e["measured"] for e in by_task[t].values() if "measured" in e)
        ]
        per_searcher: dict[str, dict] = {}
        bound_ratio = []
        for t in complete:
            entries = by_task[t]
            slow = {s: max(e["measured"]) for s, e in entries.items() if "measured" in e}
            if "torchrec" not in slow or not slow:
                continue
            best = min(slow.values())
            bound = min(sum(e["measured"]) / devices for e in entries.values() if "measured" in e)
            bound_ratio.append(bound / slow["torchrec"])
            for s, e in entries.items():
                stats = per_searcher.setdefault(
                    s, {"ratio": [], "wins": 0, "infeasible": 0, "failed": 0, "ape": [], "over2x": 0}
                )
                if "measured" not in e:
                    stats["infeasible" if "infeasible" in e else "failed"] += 1
                    continue
                stats["ratio"].append(slow[s] / slow["torchrec"])
                stats["wins"] += slow[s] <= best * (1 + tie)
                for p, m in zip(e["predicted"], e["measured"]):
                    if m > 0:
                        stats["ape"].append(abs(p - m) / m)
                        stats["over2x"] += not (0.5 <= p / m <= 2.0)
        pooled = [x for v in per_searcher.values() for x in v["ape"]]
        out[devices] = {
            "model_device_mape": float(np.mean(pooled)) if pooled else None,
            "model_devices_off_2x": sum(v["over2x"] for v in per_searcher.values()),
            "model_devices": len(pooled),
            "tasks": len(ids),
            "measured_tasks": len(bound_ratio),
            "balance_bound_vs_torchrec": float(np.mean(bound_ratio)) if bound_ratio else None,
            "searchers": {
                s: {
                    "slowest_vs_torchrec": float(np.mean(v["ratio"])) if v["ratio"] else None,
                    "best_or_tied": v["wins"],
                    "infeasible": v["infeasible"],
                    "failed": v["failed"],
                    "device_mape": float(np.mean(v["ape"])) if v["ape"] else None,
                    "devices_off_2x": v["over2x"],
                    "devices": len(v["ape"]),
                }
                for s, v in sorted(per_searcher.items())
            },
        }
    return out


def print_summary(summary: dict) -> None:
    for devices, s in summary.items():
        print(
            f"\n{devices} devices: {s['measured_tasks']}/{s['tasks']} tasks measured; balance bound "
            f"{_pct(s['balance_bound_vs_torchrec'])} of TorchRec's slowest device; the model's device compute MAPE "
            f"{_pct(s['model_device_mape'])} over {s['model_devices']} devices, {s['model_devices_off_2x']} off by > 2x"
        )
        print(f"{'searcher':20s} {'slowest/torchrec':>16s} {'best':>5s} {'infeas':>6s} {'MAPE':>7s} {'>2x':>5s}")
        for name, v in sorted(s["searchers"].items(), key=lambda kv: kv[1]["slowest_vs_torchrec"] or 9):
            print(
                f"{name:20s} {_pct(v['slowest_vs_torchrec']):>16s} {v['best_or_tied']:>5d} {v['infeasible']:>6d} "
                f"{_pct(v['device_mape']):>7s} {v['devices_off_2x']:>5d}"
            )


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("tasks", "plan", "measure", "report"))
    parser.add_argument("--out", default="bench/foreign")
    parser.add_argument("--model", default="neural", help="cost model: neural or analytic")
    parser.add_argument("--checkpoint", default=None, help="a neural checkpoint directory or shipped name")
    parser.add_argument("--searchers", default=",".join(SEARCHERS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--tie", type=float, default=0.03, help="relative margin within which plans tie")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    options = {"checkpoint": args.checkpoint} if args.checkpoint else {}
    try:
        if args.stage == "tasks":
            for task_id, family, task in benchmark_tasks(out / TASKS_FILE):
                mem = sum(task.table_mem_bytes(i) for i in range(task.num_tables)) / 2**30
                print(f"{task_id} {family:22s} {task.num_tables:3d} tables {mem:7.2f} GiB cap {task.mem_cap_gb} GiB")
        elif args.stage == "plan":
            plan_all(out, args.model, options, args.searchers.split(","))
        elif args.stage == "measure":
            measure_all(out, args.repeats, EvaluateConfig(workers=args.workers))
        else:
            print_summary(report(out, args.model, options, args.tie))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
