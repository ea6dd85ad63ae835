"""Why the cost model reads devices low on tables nobody here generated (issue 51): tables timed alone and fused
in one kernel of 2-32 tables, against the working set and this machine's caches, beside a model's predictions.

    python -m tools.study_fusion measure --repeats 3 --workers 2 --pin    # ~15 min on 2 cores (resumable)
    python -m tools.study_fusion report --checkpoint epyc-f26m2           # docs/results/fusion.md's tables

The study's own tables (seeded apart from the sampler, the pool and both benchmarks): rows 1e2..1e7, widths
4..128, pooling factors 0.3..200, uniform or Zipf access of several skews. Every table is timed alone (one device
holding it), and groups of k = 2, 3, 5, 8, 16, 32 of them fused in one TBE (as a device of a plan runs them); the
devices are measured ``--repeats`` times, interleaved and shuffled, with the label protocol (5 warm-ups, 10 timed
iterations, the median). A device's *working set* is the bytes its kernel touches per batch: the distinct rows each
table's batch looks up times the width (fp32), summed over its tables, read against the L2 and L3 this machine
reports (``hardware.cache_bytes``).

What the report shows: the model's error on tables alone by pooling, rows, width and working set; a fused
kernel's measured cost over the sum of its tables alone (the *fusion ratio*) by k and by working set, beside the
model's own ratio. Choosing model features from this study is what it is for: it is not a benchmark.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

from neuroshard_jax.core.constants import MIN_CPU_SHARE
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JsonlLog, write_json
from neuroshard_jax.core.hardware import cache_bytes, hardware, hardware_kind
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.choice import CostModelSpec
from neuroshard_jax.costs.ensemble import physics
from neuroshard_jax.kernels.executors import ExecutorConfig, map_requests
from neuroshard_jax.kernels.messages import ComputeAnswer, ComputeRequest
from neuroshard_jax.measure.calibration import predicted_compute_ms, whole
from neuroshard_jax.measure.evaluator import EvaluateConfig, device_request, device_tables
from tools.foreign_benchmark import table

SEED = 404_913  # the study's own; nothing else in the project draws tables from it
NUM_TABLES = 48
GROUP_SIZES = (2, 3, 5, 8, 16, 32)
GROUPS_PER_SIZE = 8
BATCH_SIZE = 4096  # the foreign benchmark's (its ``table`` draws the access histograms at this batch)
WIDTHS = (4, 8, 16, 32, 64, 128)
MAX_TABLE_BYTES = 1 << 30
MAX_DEVICE_BYTES = 4 << 30  # two workers and their tables within this machine's 24 GiB
OUT = Path("outputs/study/fusion")


def study_task() -> Task:
    """The study's tables as one task (its devices are the groups measured; the task only carries the tables)."""
    rng = np.random.default_rng([SEED, 1])
    tables = []
    for i in range(NUM_TABLES):
        dim = int(rng.choice(WIDTHS))
        rows = min(10 ** rng.uniform(2, 7), MAX_TABLE_BYTES / (4 * dim))
        pooling = 10 ** rng.uniform(-0.5, 2.3)
        uniform = rng.random() < 0.25
        skew = None if uniform else float(rng.choice((1.05, 1.2, 1.5, 2.0)))
        spec = table(rng, rows, pooling, access="uniform" if uniform else "zipf", skew=skew or 1.2, dim=dim)
        tables.append({**spec, "id": i, "name": f"study_{i}"})
    obj = {"num_devices": 1, "mem_cap_gb": 64.0, "batch_size": BATCH_SIZE, "tables": tables}
    return Task.from_json(obj, where="the fusion study")


def study_groups(task: Task) -> dict[str, list[int]]:
    """Device name -> the table indices it fuses: every table alone, then GROUPS_PER_SIZE random groups of each
    size in GROUP_SIZES (drawn again while over MAX_DEVICE_BYTES)."""
    rng = np.random.default_rng([SEED, 2])
    sizes = np.array([task.table_mem_bytes(t) for t in range(task.num_tables)])
    groups = {f"alone-{t}": [t] for t in range(task.num_tables)}
    for k in GROUP_SIZES:
        for g in range(GROUPS_PER_SIZE):
            while True:
                chosen = sorted(int(t) for t in rng.choice(task.num_tables, size=k, replace=False))
                if sizes[chosen].sum() <= MAX_DEVICE_BYTES:
                    break
            groups[f"k{k}-{g}"] = chosen
    return groups


def measure(out: Path, repeats: int, config: EvaluateConfig) -> None:
    """Every group ``repeats`` times: repeat r of every group (shuffled) before repeat r + 1; resumable."""
    task = study_task()
    groups = study_groups(task)
    log = JsonlLog(out / "measurements.jsonl")
    kind = hardware_kind(hardware())
    for repeat in range(repeats):
        names = [n for n in groups if f"{kind}/{n}/{repeat}" not in log.ids]
        order = np.random.default_rng([SEED, 3, repeat]).permutation(len(names))
        requests = [
            device_request(
                f"{kind}/{names[i]}/{repeat}", task, device_tables(task, whole(task, groups[names[i]])), config
            ).tagged(group=names[i], repeat=repeat)
            for i in order
        ]

        def record(request: ComputeRequest, answer: ComputeAnswer) -> None:
            keys = ("ok", "total_ms", "fwd_ms", "bwd_ms", "error", "cpu_share")
            log.write_record(
                {
                    "id": request.id,
                    "group": request.tag("group"),
                    "repeat": request.tag("repeat"),
                    "hardware": kind,
                    **{k: getattr(answer, k) for k in keys},
                }
            )

        if requests:
            map_requests(requests, record, config.executor, config.device, config.timeout_s, pin=config.pin)
            print(f"repeat {repeat}: {len(requests)} devices measured", flush=True)


def measured_ms(out: Path) -> dict[str, float]:
    """Group -> the median of its repeats on this machine's kind (repeats that got less than MIN_CPU_SHARE of
    their core left out where the group has others)."""
    kind = hardware_kind(hardware())
    runs: dict[str, list[dict]] = {}
    for r in JsonlLog(out / "measurements.jsonl").records():
        if r.get("ok") and r.get("hardware") == kind:
            runs.setdefault(r["group"], []).append(r)
    out_ms = {}
    for group, rs in runs.items():
        quiet = [r for r in rs if (r.get("cpu_share") or 1.0) >= MIN_CPU_SHARE] or rs
        out_ms[group] = statistics.median(r["total_ms"] for r in quiet)
    return out_ms


def working_set_bytes(task: Task) -> np.ndarray:
    """f64[T]: the bytes each table's batch touches (distinct rows x width x 4, the model's own distinct-row
    estimate from the access histogram)."""
    feats = task.features().astype(np.float32)
    _, distinct, dim, _ = physics(feats, float(task.batch_size))
    return np.asarray(distinct, np.float64) * np.asarray(dim, np.float64) * 4


def binned(values: np.ndarray, errors: np.ndarray, edges: list[float], fmt) -> list[dict]:
    """Rows of (bin label, count, median and mean of ``errors``) for ``values`` cut at ``edges``."""
    rows = []
    bounds = [-np.inf, *edges, np.inf]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        inside = (values >= lo) & (values < hi)
        if inside.any():
            rows.append(
                {
                    "bin": f"{fmt(lo) if np.isfinite(lo) else ''}..{fmt(hi) if np.isfinite(hi) else ''}",
                    "count": int(inside.sum()),
                    "median": round(float(np.median(errors[inside])), 4),
                    "mean": round(float(np.mean(errors[inside])), 4),
                }
            )
    return rows


def report(out: Path, checkpoint: str) -> dict:
    task = study_task()
    groups = study_groups(task)
    ms = measured_ms(out)
    missing = [g for g in groups if g not in ms]
    if len(missing) == len(groups):
        raise UserError(f"study: no measurements of this machine's kind in {out}; run the measure stage first")
    model = CostModelSpec("neural", {"checkpoint": checkpoint}).for_task(task)
    names = [g for g in groups if g in ms]
    predicted = dict(zip(names, predicted_compute_ms(model, task, [groups[g] for g in names])))
    ws = working_set_bytes(task)
    caches = cache_bytes()
    l2, l3 = caches.get("l2"), caches.get("l3")
    alone = [t for t in range(task.num_tables) if f"alone-{t}" in ms]
    err = np.array([predicted[f"alone-{t}"] / ms[f"alone-{t}"] - 1 for t in alone])
    tables = task.tables
    pooling = np.array([tables[t].pooling_factor for t in alone])
    rows = np.array([tables[t].rows for t in alone], np.float64)
    dims = np.array([tables[t].dim for t in alone], np.float64)
    ws_alone = ws[alone]
    result: dict = {
        "hardware": hardware_kind(hardware()),
        "caches": caches,
        "checkpoint": checkpoint,
        "missing": missing,
        "alone": {
            "count": len(alone),
            "mape": round(float(np.mean(np.abs(err))), 4),
            "bias": round(float(np.mean(err)), 4),
            "by_pooling": binned(pooling, err, [2, 10, 40], lambda x: f"{x:g}"),
            "by_rows": binned(rows, err, [1e4, 1e5, 1e6], lambda x: f"{x:.0e}"),
            "by_dim": binned(dims, err, [8, 32, 128], lambda x: f"{x:g}"),
            "by_working_set": binned(ws_alone, err, [x for x in (l2, l3) if x], _mib),
        },
        "fused": [],
    }
    for name, group in groups.items():
        if name.startswith("alone") or name not in ms or any(f"alone-{t}" not in ms for t in group):
            continue
        alone_sum = sum(ms[f"alone-{t}"] for t in group)
        model_sum = sum(predicted[f"alone-{t}"] for t in group)
        result["fused"].append(
            {
                "group": name,
                "k": len(group),
                "working_set_mib": round(float(ws[group].sum()) / 2**20, 2),
                "measured_ms": round(ms[name], 3),
                "fusion_ratio": round(ms[name] / alone_sum, 4),
                "model_ratio": round(predicted[name] / model_sum, 4),
                "model_error": round(predicted[name] / ms[name] - 1, 4),
            }
        )
    fused = result["fused"]
    if fused:
        k = np.array([f["k"] for f in fused], np.float64)
        ratio = np.array([f["fusion_ratio"] for f in fused])
        model_ratio = np.array([f["model_ratio"] for f in fused])
        fws = np.array([f["working_set_mib"] for f in fused]) * 2**20
        ferr = np.array([f["model_error"] for f in fused])
        result["fusion"] = {
            "by_k": binned(k, ratio, [3, 5, 8, 16, 32], lambda x: f"{x:g}"),
            "model_by_k": binned(k, model_ratio, [3, 5, 8, 16, 32], lambda x: f"{x:g}"),
            "by_working_set": binned(fws, ratio, [x for x in (l2, l3, 4 * l3 if l3 else None) if x], _mib),
            "model_error_by_k": binned(k, ferr, [3, 5, 8, 16, 32], lambda x: f"{x:g}"),
        }
    write_json(result, out / f"report-{Path(checkpoint).name}.json")
    return result


def _mib(x: float) -> str:
    return f"{x / 2**20:g} MiB"


def print_report(result: dict) -> None:
    print(f"{result['hardware']}; caches {result['caches']}; model {result['checkpoint']}")
    a = result["alone"]
    print(f"\ntables alone ({a['count']}): model MAPE {a['mape']:.1%}, bias {a['bias']:+.1%}")
    for key in ("by_pooling", "by_rows", "by_dim", "by_working_set"):
        print(f"\n| {key.replace('_', ' ')} | tables | median error | mean error |\n| --- | --- | --- | --- |")
        for r in a[key]:
            print(f"| {r['bin']} | {r['count']} | {r['median']:+.1%} | {r['mean']:+.1%} |")
    fusion = result.get("fusion")
    if fusion:
        print("\n| tables fused (k) | kernels | measured / sum alone (median) | model's ratio (median) | model error |")
        print("| --- | --- | --- | --- | --- |")
        for m, p, e in zip(fusion["by_k"], fusion["model_by_k"], fusion["model_error_by_k"]):
            print(f"| {m['bin']} | {m['count']} | {m['median']:.2f}x | {p['median']:.2f}x | {e['median']:+.1%} |")
        print("\n| fused working set | kernels | measured / sum alone (median) |\n| --- | --- | --- |")
        for r in fusion["by_working_set"]:
            print(f"| {r['bin']} | {r['count']} | {r['median']:.2f}x |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.study_fusion", description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("measure", "report"))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pin", action="store_true", help="each kernel worker on a core of its own")
    parser.add_argument("--checkpoint", default="epyc-f26m2", help="the model whose predictions are compared")
    args = parser.parse_args(argv)
    try:
        if args.stage == "measure":
            config = EvaluateConfig(executor=ExecutorConfig(workers=args.workers), pin=args.pin)
            measure(args.out, args.repeats, config)
        else:
            print_report(report(args.out, args.checkpoint))
    except UserError as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
