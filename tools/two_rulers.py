"""Two rulers on the same kernels (issue 65): does a device measured with ids drawn to match its tables' histograms
(what the evaluator, the calibration and the spec labels do for a task file) read what the same device reads when
it replays the streams its tables came from?

    python -m tools.two_rulers measure [--tasks 3] [--repeats 3] [--out outputs/bench/rulers]   # resumable, per task
    python -m tools.two_rulers report [--out outputs/bench/rulers]                          # rulers.json + the tables

Tasks are drawn (``builders.generate_task``) from two pools that keep their streams, with this study's own seed: the
synthetic pool (log-normal row popularity scattered by a bijection, the training pool's law) and the ``zipf`` pool
(Zipf ranks hashed into the rows: an independent reader's law, ``workloads/zipf_pool.py``), at 4 and 8 devices.
On each task, three kinds of device: each table alone (``table``), the calibration's groups of whole tables
(``group``, ``calibrate=measured``'s ``sample_devices``) and the devices of the portfolio's and TorchRec TW+CW's
plans (``device``). Each is measured by both rulers: ``histogram``, the task without its pool (every table a spec:
rows, pooling factor, 17-bin histogram; ids synthesised to match, ``streams.spec_stream``), and ``stream``, the
task with its pool (the worker replays the table's own ids); the labels' protocol either way (the evaluator's
requests, pinned workers), ``--repeats`` interleaved rounds (round r of every reading of a task, both rulers, before
round r + 1), so the machine's drift reads both alike. The report gives, per pool and kind, the ratio stream /
histogram (median and p90 of |ratio - 1|), the repeats' own spread, and the model's error against each ruler; for
single tables, the ratio by rows, pooling factor, width and reuse.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import numpy as np

from neuroshard_jax.core.constants import MIN_CPU_SHARE
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.files import JsonlLog, write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.progress import progress_bar
from neuroshard_jax.core.records import ratio_errors
from neuroshard_jax.core.table import PoolSpec
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.choice import CostModelSpec, build_cost_model
from neuroshard_jax.costs.scoring import score_plan
from neuroshard_jax.kernels.executors import ExecutorConfig, open_executor
from neuroshard_jax.measure.calibration import predicted_compute_ms, sample_devices, whole
from neuroshard_jax.measure.evaluator import EvaluateConfig, device_key, device_tables, measure_tables
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.workloads.builders import TaskConfig, generate_task
from neuroshard_jax.workloads.pool import load_pool
from neuroshard_jax.workloads.streams import bin_bounds
from searchers import make_searcher
from tools.foreign_benchmark import drift_labels, label_speed, model_datasets

SEED = 402_117  # this study's own pools and draws; nothing else in the project uses it
POOLS = ("synthetic", "zipf")
RULERS = ("histogram", "stream")
PLANNERS = ("portfolio", "torchrec")
BATCH_SIZE = 4096
CAP_GB = 2.0  # every device measurable beside another worker on a 24 GiB machine
GROUPS = 8  # the calibration's default samples
OUT = "outputs/bench/rulers"


def study_tasks(per: int) -> list[tuple[str, Task]]:
    """(task id ``<pool>-d<devices>-<i>``, task) of the study: ``per`` tasks of each pool at 4 and at 8 devices."""
    out = []
    for source in POOLS:
        pool = load_pool(PoolSpec(source=source, seed=SEED), BATCH_SIZE)
        for devices in (4, 8):
            config = TaskConfig(num_devices=devices, mem_cap_gb=CAP_GB, batch_size=BATCH_SIZE, pool=pool.spec)
            for i in range(per):
                out.append((f"{source}-d{devices}-{i}", generate_task(pool, config, SEED * 100 + devices * 10 + i)))
    return out


@dataclasses.dataclass(frozen=True)
class Item:
    """One device measured by both rulers: its kind, where it comes from, its shards and the model's prediction."""

    kind: str  # table | group | device
    source: str  # the table's index, the group's, or "<planner>/<device>"
    shards: list
    predicted: float


def task_items(task: Task, model) -> tuple[list[Item], dict]:
    """Every table alone, the calibration's groups and the planners' devices of ``task`` (a device two plans share,
    once), with ``model``'s predicted compute; and what the planners made (or why not)."""
    seed = SEED
    singles = [[t] for t in range(len(task.tables))]
    groups = sample_devices(task, GROUPS, seed)
    items = [
        Item("table", str(g[0]), whole(task, g), float(p)) for g, p in zip(singles, _predicted(model, task, singles))
    ]
    items += [
        Item("group", str(i), whole(task, g), float(p))
        for i, (g, p) in enumerate(zip(groups, _predicted(model, task, groups)))
    ]
    made, seen = {}, set()
    for name in PLANNERS:
        try:
            plan = search_plan(task, make_searcher(name), model, seed)
        except (InfeasibleError, UserError) as err:
            made[name] = {"error": str(err)}
            continue
        made[name] = {"plan": plan.to_json()}
        if plan.data_parallel:  # its devices' predictions include the replicas' kernel, which these items leave out
            made[name]["skipped"] = "data-parallel tables"
            continue
        predicted = np.asarray(score_plan(model.expected, plan).compute_ms, np.float64)
        for d in range(task.num_devices):
            shards = plan.device_shards(d)
            key = device_key(task, device_tables(task, shards)) if shards else None
            if key is None or key in seen:
                continue
            seen.add(key)
            items.append(Item("device", f"{name}/{d}", shards, float(predicted[d])))
    return items, made


def _predicted(model, task: Task, groups: list[list[int]]) -> np.ndarray:
    return predicted_compute_ms(model, task, groups) if groups else np.zeros(0)


def ruler_task(task: Task, ruler: str) -> Task:
    """The task as ``ruler`` reads it: with its pool (its streams replayed) or without (every table a spec)."""
    return task if ruler == "stream" else dataclasses.replace(task, pool=None)


def measure(args) -> None:
    out = Path(args.out)
    log = JsonlLog(out / "readings.jsonl")
    config = EvaluateConfig(executor=ExecutorConfig(workers=args.workers), pin=True)
    tasks = study_tasks(args.tasks)
    todo = [(i, tid, task) for i, (tid, task) in enumerate(tasks) if tid not in log.ids]
    print(f"{len(todo)} tasks to measure ({len(log.ids)} done) into {out}", file=sys.stderr)
    spec = CostModelSpec(args.model, {}, chosen=args.model == "neural")
    with open_executor(config.executor, config.device, config.timeout_s, pin=True) as pool:
        for index, tid, task in todo:
            model, choice = build_cost_model(spec, task)
            items, made = task_items(task, model)
            # the model's own labels re-timed in the same rounds: the machine's speed against them, this hour
            labels = drift_labels(model_datasets(choice.name, choice.options), args.drift, args.drift, SEED + index)
            others = {f"drift/{r.id}": r for r in labels.requests} if args.drift else {}
            jobs = {}
            for i, item in enumerate(items):
                for ruler in RULERS:
                    seen = ruler_task(task, ruler)
                    jobs[f"{i}/{ruler}"] = (seen, device_tables(seen, item.shards))
            with progress_bar(total=len(jobs) * args.repeats, desc=tid, unit="kernel") as bar:
                answers = measure_tables(jobs, config, pool, args.repeats, others=others, done=bar.update)
            rows = []
            for i, item in enumerate(items):
                row = {"kind": item.kind, "source": item.source, "predicted": round(item.predicted, 4)}
                row["shards"] = [[s.table, s.col_offset, s.dim, s.row_offset, s.num_rows] for s in item.shards]
                for ruler in RULERS:
                    got = answers[f"{i}/{ruler}"]
                    row[ruler] = [round(a.total_ms, 4) for a in got]
                    row[f"{ruler}_busy"] = sum(a.core_share < MIN_CPU_SHARE for a in got)
                    row[f"{ruler}_share"] = [round(a.core_share, 3) for a in got]
                rows.append(row)
            retimed = [
                {"drift": key, "label_ms": labels.recorded_ms[key.removeprefix("drift/")], "total_ms": a.total_ms}
                | {"cpu_share": a.core_share}
                for key in others
                for a in answers[key]
            ]
            label = CostModelSpec(choice.name, choice.options).label
            record = {"id": tid, "task": task.to_json(), "model": label, "hardware": hardware()}
            log.write_record(record | {"plans": made, "items": rows, "retimed": retimed})
            print(f"{tid}: {len(items)} devices", file=sys.stderr)


def _quiet(row: dict, ruler: str) -> list[float]:
    """A reading's repeats taken while the worker held its core (all of them in rows that did not record shares)."""
    shares = row.get(f"{ruler}_share")
    kept = [x for x, share in zip(row[ruler], shares) if share >= MIN_CPU_SHARE] if shares else []
    return kept or row[ruler]


def _first_quiet(row: dict) -> bool:
    """Whether round 1's histogram reading was taken while the worker held its core (True where not recorded)."""
    shares = row.get("histogram_share")
    return not shares or shares[0] >= MIN_CPU_SHARE


def _median(xs) -> float:
    return float(statistics.median(xs))


def _spread(xs) -> float:
    m = _median(xs)
    return float(statistics.median(abs(x - m) for x in xs) / m) if m > 0 else 0.0


def _summary(ratios: list[float]) -> dict:
    """How far apart: n, the signed median ratio, the median and p90 of |ratio - 1|."""
    if not ratios:
        return {"n": 0}
    off = np.abs(np.asarray(ratios) - 1.0)
    return {
        "n": len(ratios),
        "median_ratio": round(float(np.median(ratios)), 4),
        "median_off": round(float(np.median(off)), 4),
        "p90_off": round(float(np.quantile(off, 0.9)), 4),
    }


SHAPES = {
    "rows": ((1e4, "< 1e4"), (1e6, "1e4-1e6"), (float("inf"), ">= 1e6")),
    "pooling": ((1.0, "< 1"), (10.0, "1-10"), (float("inf"), ">= 10")),
    "dim": ((32.5, "<= 32"), (float("inf"), ">= 64")),
    "reuse": ((1.5, "< 1.5"), (5.0, "1.5-5"), (float("inf"), ">= 5")),
}


def _bucket(value: float, shape: str) -> str:
    return next(label for bound, label in SHAPES[shape] if value < bound)


def _reuse(table) -> float:
    """Lookups per row touched in one batch: the histogram's mean access count (each bin's share of the touched rows
    at its middle count; the last bin at its lower bound)."""
    lo, hi = bin_bounds()
    middle = np.where(np.arange(len(lo)) < len(lo) - 1, (lo + hi) / 2, lo).astype(np.float64)
    return float(np.dot(table.bins, middle)) if sum(table.bins) > 0 else 0.0


def report(args) -> dict:
    out = Path(args.out)
    records = list(JsonlLog(out / "readings.jsonl").records())
    if not records:
        raise UserError(f"{out / 'readings.jsonl'}: no readings, expected a measure stage first")
    cells: dict[str, dict] = {}
    shapes: dict[str, dict[str, list[float]]] = {}  # key -> ratio, predicted, histogram
    spreads, retimed = [], []
    for record in records:
        retimed += record.get("retimed", [])
        task = Task.from_json(record["task"])
        source = record["id"].split("-")[0]
        for row in record["items"]:
            if row["histogram_busy"] == len(row["histogram"]) or row["stream_busy"] == len(row["stream"]):
                continue
            h, s = _median(_quiet(row, "histogram")), _median(_quiet(row, "stream"))
            if h <= 0 or s <= 0:
                continue
            spreads += [_spread(_quiet(row, "histogram")), _spread(_quiet(row, "stream"))]
            for key in (f"{source}/{row['kind']}", f"all/{row['kind']}"):
                cell = cells.setdefault(key, {"ratio": [], "predicted": [], "histogram": [], "stream": []})
                cell["ratio"].append(s / h)
                cell["predicted"].append(row["predicted"])
                cell["histogram"].append(h)
                cell["stream"].append(s)
            if row["kind"] == "table":
                table = task.tables[row["shards"][0][0]]
                values = {"rows": table.rows, "pooling": table.pooling_factor, "dim": table.dim, "reuse": _reuse(table)}
                for shape, value in values.items():
                    for key in (f"{source}/{shape} {_bucket(value, shape)}", f"all/{shape} {_bucket(value, shape)}"):
                        cell = shapes.setdefault(key, {"ratio": [], "predicted": [], "histogram": []})
                        cell["ratio"].append(s / h)
                        cell["predicted"].append(row["predicted"])
                        cell["histogram"].append(h)
    result = {
        "hardware": records[0]["hardware"],
        "model": records[0]["model"],
        "tasks": len(records),
        "repeat_spread_median": round(float(np.median(spreads)), 4) if spreads else None,
        "drift": label_speed(retimed),
        "kinds": {
            key: {
                **_summary(c["ratio"]),
                "model_vs_histogram": ratio_errors(c["predicted"], c["histogram"]),
                "model_vs_stream": ratio_errors(c["predicted"], c["stream"]),
            }
            for key, c in sorted(cells.items())
        },
        "shapes": {
            key: {**_summary(c["ratio"]), "model_vs_histogram": ratio_errors(c["predicted"], c["histogram"])}
            for key, c in sorted(shapes.items())
        },
        "calibration": calibration_study(records),
    }
    write_json(result, out / "rulers.json")
    print_report(result)
    return result


CALIBRATIONS = ("trained", "tables", "plan")


def calibration_study(records: list[dict]) -> dict:
    """The model on the portfolio plan's devices as the histogram ruler reads them (the task-file protocol) in
    rounds 2.. (their median), as trained and calibrated from round 1's readings two ways: on the calibration's groups
    of the task's own tables (``calibrate=measured``) and on the plan's own devices (``calibrate.on=plan``, here the
    portfolio's plan alone). Held out in time; the plan's calibration is held in by device, as its record is. Per pool
    and over all: devices, mean absolute error, median signed error, the worst device either way."""
    pairs: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        rows = [r for r in record["items"] if len(r["histogram"]) >= 2 and r["predicted"] > 0 and _first_quiet(r)]
        groups = [r for r in rows if r["kind"] == "group"]
        devices = [r for r in rows if r["kind"] == "device" and r["source"].startswith("portfolio/")]
        if not groups or not devices:
            continue
        factors = {
            "trained": 1.0,
            "tables": _median([r["histogram"][0] / r["predicted"] for r in groups]),
            "plan": _median([r["histogram"][0] / r["predicted"] for r in devices]),
        }
        source = record["id"].split("-")[0]
        for r in devices:
            later = {**r, "histogram": r["histogram"][1:], "histogram_share": (r.get("histogram_share") or [])[1:]}
            measured = _median(_quiet(later, "histogram"))
            if measured <= 0:
                continue
            for name, factor in factors.items():
                for key in (f"{source}/{name}", f"all/{name}"):
                    pairs.setdefault(key, []).append((r["predicted"] * factor, measured))
    out = {}
    for key, got in sorted(pairs.items()):
        predicted, measured = zip(*got)
        out[key] = {"devices": len(got), **ratio_errors(predicted, measured)}
    return out


def print_report(result: dict) -> None:
    hw = result["hardware"]
    print(
        f"{result['tasks']} tasks; {hw.get('cpu_id') or hw.get('cpu')}; model {result['model']}; "
        f"one repeat's spread from its median (median): {result['repeat_spread_median'] or 0:.1%}"
    )
    drift = result["drift"]
    if drift:
        print(
            f"the model's labels re-timed among the readings ({drift['retimings']} quiet of {drift['labels']} labels): "
            f"x{drift['speed_median']:.3f} their recorded times (p10 x{drift['p10']:.3f}, p90 x{drift['p90']:.3f})"
        )
    print(
        f"{'pool/kind':24s} {'n':>5s} {'stream/hist':>11s} {'|off| med':>9s} {'p90':>7s} "
        f"{'model MAPE hist':>15s} {'bias':>7s} {'MAPE stream':>11s} {'bias':>7s}"
    )
    for key, v in result["kinds"].items():
        mh, ms = v["model_vs_histogram"], v["model_vs_stream"]
        print(
            f"{key:24s} {v['n']:5d} {v['median_ratio']:11.3f} {v['median_off']:9.1%} {v['p90_off']:7.1%} "
            f"{mh['mape']:15.1%} {mh['bias']:+7.1%} {ms['mape']:11.1%} {ms['bias']:+7.1%}"
        )
    print("\nthe portfolio plan's devices (histogram ruler, rounds 2..), the model calibrated from round 1:")
    print(f"{'pool/calibrated on':24s} {'n':>5s} {'MAPE':>7s} {'bias':>7s} {'worst':>7s}")
    for key, v in result["calibration"].items():
        print(f"{key:24s} {v['devices']:5d} {v['mape']:7.1%} {v['bias']:+7.1%} {v['worst']:6.2f}x")
    print(
        f"\n{'tables alone, by shape':30s} {'n':>5s} {'stream/hist':>11s} {'|off| med':>9s} {'p90':>7s} "
        f"{'model MAPE hist':>15s} {'bias':>7s}"
    )
    for key, v in result["shapes"].items():
        m = v["model_vs_histogram"]
        print(
            f"{key:30s} {v['n']:5d} {v['median_ratio']:11.3f} {v['median_off']:9.1%} {v['p90_off']:7.1%} "
            f"{m['mape']:15.1%} {m['bias']:+7.1%}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.two_rulers", description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("measure", "report"))
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--tasks", type=int, default=3, help="tasks of each pool at 4 and at 8 devices")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model", default="neural", help="the cost model compared (default: this machine's)")
    parser.add_argument("--drift", type=int, default=4, help="the model's labels re-timed in each task's rounds")
    args = parser.parse_args(argv)
    try:
        if args.tasks < 1 or args.repeats < 1 or args.workers < 1 or args.drift < 0:
            raise UserError(
                f"--tasks/--repeats/--workers/--drift: got {args.tasks}/{args.repeats}/{args.workers}/{args.drift}, "
                "expected >= 1 (--drift >= 0)"
            )
        measure(args) if args.stage == "measure" else report(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
