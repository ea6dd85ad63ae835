"""The cost model on the plans searchers produce for held-out tasks, against the median of interleaved repeats.

    python -m tools.bench_plan_accuracy measure [--tasks 5] [--devices 4,8] [--repeats 5] [--variants 8] \
        [--model xeon-union] [--references 6] [--polish beam,size_lookup_greedy] [--out outputs/bench/plan_accuracy/RUN]
    python -m tools.bench_plan_accuracy report --models xeon-union,cpu-b4096[,CHECKPOINT] [--tie 0.03] \
        [--out outputs/bench/plan_accuracy/RUN]

``measure`` takes the suite's held-out tasks (conf/experiment/compare.yaml: seeds 20000.., the pool's test half,
10-59 tables; never seen by training or the label loop), has every searcher of the plan-label collection plan each
with ``--model``, adds ``--variants`` perturbed variants per task drawn at random (not by a model's spread: the set
judges several models), with ``--polish`` also the named searchers' plans polished on the kernels
(``polish=measured``'s defaults, entries ``SEARCHER+polish`` with their polishing record: issue 16's benchmark), and
measures every distinct device ``--repeats`` times with the label protocol, workers
pinned, the repeats interleaved (repeat r of every device of a task before r + 1). Among each task's devices it
measures ``--references`` quiet records of a training dataset (``--reference``, the probe's draw): their time now
against their recorded time is the machine's speed while that task was measured, so the drift of a long run (5-10%
in half an hour here) is seen and can be taken out. Resumable: ``plans.jsonl`` (a row per task, the form of
``collect kind=plans``) and ``compute.jsonl`` (a row per device: its repeats and their median; a row per
reference and task) only append; a rerun continues where it stopped, and a copy of another run's ``plans.jsonl``
re-measures the same plans.

``report`` scores every plan's devices with each model and compares them with the medians (issue 15's targets):
device compute MAPE and mean signed error overall, per searcher, for the variants and for devices holding split
slices; the per-task Kendall tau of the plans' slowest devices over the pairs more than ``--tie`` apart; the noise
floor (one repeat against its device's median); with references, also with each task's predictions scaled by its
measured speed (``drift_corrected``) and by that speed over the run's median (``within_run``: the drift within the
run removed, the level kept). Writes ``report.json`` beside the measurements.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JsonlLog, read_jsonl, read_records, write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import DeviceCosts
from neuroshard_jax.costs.scoring import score_plans_devices
from neuroshard_jax.kernels.executors import ExecutorConfig, open_executor
from neuroshard_jax.learn.metrics import noise_floor, ranking_tau
from neuroshard_jax.learn.plan_labels import (
    PlanLabelConfig,
    device_errors,
    plan_devices,
    plan_entry,
    plan_task,
    row_plans,
    task_rows,
)
from neuroshard_jax.measure.drift import references as reference_records
from neuroshard_jax.measure.evaluator import EvaluateConfig, device_key, device_tables, measure_tables
from neuroshard_jax.measure.polish import POLISHED, PolishConfig, polish_plan
from neuroshard_jax.workloads.builders import TaskConfig, generate_task
from neuroshard_jax.workloads.pool import load_pool

FIRST_SEED = 20000  # conf/experiment/compare.yaml: the suite's held-out tasks
S14_PLANS = (
    Path(__file__).resolve().parent / "data" / "s14-plans.jsonl"
)  # the 2026-11-25 (commit 5a0c178) 20 suite tasks' plans
BEST = "(best measured plan)"  # plan_quality's row for each task's measured plan with the lowest slowest device


def measure(args) -> dict:
    out = Path(args.out)
    config = PlanLabelConfig(model=args.model, variants=args.variants, select="random")
    plans_log, compute_log = JsonlLog(out / "plans.jsonl"), JsonlLog(out / "compute.jsonl")
    pool = load_pool(TaskConfig().pool, TaskConfig().batch_size)
    evaluate = EvaluateConfig(executor=ExecutorConfig(workers=args.workers), pin=True)
    refs = reference_records(args.reference, args.references) if args.references else None
    rows = task_rows(plans_log)
    polish = [s for s in args.polish.split(",") if s]
    started = time.perf_counter()
    counts = {"tasks": 0, "plans": 0, "devices_measured": 0}
    with open_executor(evaluate.executor, evaluate.device, evaluate.timeout_s, pin=True) as executor:
        for n in (int(x) for x in args.devices.split(",")):
            for seed in range(FIRST_SEED, FIRST_SEED + args.tasks):
                row_id = f"{n}/{seed}"
                if row_id not in rows:
                    task = generate_task(pool, TaskConfig(num_tables=None, num_devices=n, split="test"), seed)
                    plans = plan_task(config, task, seed)
                    rows[row_id] = {"id": row_id, "round": 0, "index": seed, "source": "pool-test"} | {
                        "model": args.model,
                        "task": task.to_json(),
                        "plans": plans + polished(task, plans, polish, args.model, PolishConfig(name="measured"), seed),
                    }
                    plans_log.write_record(rows[row_id])
                row = rows[row_id]
                jobs = {key: (task, tables) for key, _, task, tables in plan_devices(row) if key not in compute_log.ids}
                if not jobs:
                    continue
                others = {f"{r['id']}@{row_id}": r for r in (refs.requests if refs else ())}
                answers = measure_tables(jobs, evaluate, executor, repeats=args.repeats, others=others)
                fields = {k: {"reference": True, "label_ms": refs.recorded[r.id]} for k, r in others.items()}
                fields |= {key: {"tables": tables} for key, (_, tables) in jobs.items()}
                for key, extra in fields.items():
                    runs = [a.total_ms for a in answers[key]]
                    compute_log.write_record(
                        {"id": key, **extra, "task": row_id, "ok": True}
                        | {"runs_ms": [round(x, 4) for x in runs], "total_ms": statistics.median(runs)}
                    )
                counts["tasks"] += 1
                counts["plans"] += len(row["plans"])
                counts["devices_measured"] += len(jobs)
                print(f"{row_id}: {len(row['plans'])} plans, {len(jobs)} devices measured x{args.repeats}", flush=True)
    return counts | {"wall_s": round(time.perf_counter() - started, 1)}


def polished(
    task: Task, entries: list[dict], searchers: list[str], model: str, config: PolishConfig, seed: int
) -> list[dict]:
    """The searched plans of ``searchers`` polished on the kernels (``config``: ``measure`` uses
    ``polish=measured``'s defaults), ranked with ``model``, as plan entries named ``SEARCHER+polish`` with the
    polishing record (every step tried, the drift its anchor saw)."""
    scorer = PlanLabelConfig(model=model).cost_model().for_task(task)
    out = []
    for searcher in searchers:
        entry = next((e for e in entries if e["searcher"] == searcher and e["variant"] == "searched"), None)
        if entry is None:  # the searcher found no plan: nothing to polish, counted like its own plan
            continue
        plan = Plan(task, tuple(Shard(*shard) for shard in entry["shards"]))
        done = polish_plan(plan, scorer, config, seed)
        record = done.polish
        c = done.costs
        costs = DeviceCosts(*(np.asarray(x) for x in (c.compute_ms, c.fwd_comm_ms, c.bwd_comm_ms, c.total_ms)))
        row = plan_entry(searcher + POLISHED, searcher + POLISHED, "searched", done, costs)
        out.append(row | {"polish": record.to_json()})  # JSON: the entries are the benchmark's JSONL rows
        print(
            f"  {searcher}{POLISHED}: {record.changes_kept} changes kept, {record.measurements} measurements, "
            f"{record.time_s:.0f} s, measured compute {record.compute_improvement:+.1%}",
            flush=True,
        )
    return out


def report(args) -> dict:
    out = Path(args.out)
    rows = read_jsonl(out / "plans.jsonl")
    parsed = [row_plans(r) for r in rows]
    records = list(read_records(out / "compute.jsonl"))
    if not rows or not records:
        raise UserError(f"--out: {out} holds no measurements; expected the output of `measure` first")
    measured = {r["id"]: r["total_ms"] for r in records if not r.get("reference")}
    drift = task_speeds(records)
    scales = {"as_trained": [1.0] * len(rows)}
    if drift:
        level = statistics.median(drift.values())
        scales["drift_corrected"] = [drift.get(r["id"], level) for r in rows]
        scales["within_run"] = [drift.get(r["id"], level) / level for r in rows]
    result = {
        "what": "each model's device compute against the median of interleaved repeats, plans of held-out tasks",
        "machine": hardware(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "tie": args.tie,
        "reference_speed": {t: round(f, 4) for t, f in drift.items()},
        "tasks": len(rows),
        "plans": sum(len(r["plans"]) for r in rows),
        "noise": noise_floor({r["id"]: r["runs_ms"] for r in records if not r.get("reference")}),
        "measured_plans": plan_quality(rows, parsed, measured),
        "models": {},
    }
    for model in (m for m in args.models.split(",") if m):
        predicted = predictions(model, parsed)
        result["models"][model] = {
            how: model_figures(rows, parsed, predicted, measured, args.tie, scale) for how, scale in scales.items()
        }
    write_json(result, out / "report.json")
    return result


def task_speeds(records: list[dict]) -> dict[str, float]:
    """Per task, the machine's speed while its devices were measured: the median over the reference records
    measured among them of (measured now / recorded in their dataset). Predictions x this speed read the model at
    the machine's state of that moment (``drift_corrected``); divided by the run's median speed, it removes the
    drift within the run only (``within_run``)."""
    ratios: dict[str, list[float]] = {}
    for r in records:
        if r.get("reference") and r.get("label_ms"):
            ratios.setdefault(r["task"], []).append(r["total_ms"] / r["label_ms"])
    return {task: float(statistics.median(v)) for task, v in ratios.items()}


def predictions(model: str, parsed: list[tuple[Task, list[Plan]]]) -> list[np.ndarray]:
    """The model's expected compute ms [plan, device] of every task's plans (``row_plans`` of each row)."""
    spec = PlanLabelConfig(model=model).cost_model()
    out = []
    for task, plans in parsed:
        scored = spec.for_task(task).expected
        out.append(np.asarray(score_plans_devices(scored, plans)[0].compute_ms))
    return out


def model_figures(
    rows: list[dict],
    parsed: list[tuple[Task, list[Plan]]],
    predicted: list[np.ndarray],
    measured: dict[str, float],
    tie: float,
    scales: list[float],
) -> dict:
    """A model's errors (each task's predictions x its scale) on every measured device, overall and by group, per
    device count; its per-task tau. ``parsed``: ``row_plans`` of each row."""
    by_devices: dict[int, dict] = {}
    for row, (task, plans), compute, scale in zip(rows, parsed, predicted, scales):
        entry = by_devices.setdefault(task.num_devices, {"errors": {}, "taus": []})
        pairs = []
        for spec, plan, plan_compute in zip(row["plans"], plans, compute * scale):
            errors, slowest = device_errors(task, spec, plan, plan_compute, measured)
            errors.pop("keys", None)
            for group, values in errors.items():
                entry["errors"].setdefault(group, []).extend(values)
            if slowest is not None:
                pairs.append(slowest)
        tau = ranking_tau(pairs, tie)
        if tau is not None:
            entry["taus"].append(tau)
    figures = {}
    for n, entry in sorted(by_devices.items()):
        figures[str(n)] = {
            "device_error": {
                g: {"devices": len(e), "mape": float(np.mean(np.abs(e))), "mean_signed": float(np.mean(e))}
                for g, e in sorted(entry["errors"].items())
            },
            "per_task_tau": float(np.mean(entry["taus"])) if entry["taus"] else None,
            "tasks_with_tau": len(entry["taus"]),
        }
    return figures


def plan_quality(rows: list[dict], parsed: list[tuple[Task, list[Plan]]], measured: dict[str, float]) -> dict:
    """Per device count and searcher, the searched plans' measured slowest device compute against TorchRec's and
    against the task's balance bound (the lowest mean device compute of any measured plan of the task), split into
    the plan's imbalance (slowest / mean device) and its overhead (mean / bound: what its splits added), averaged
    over the tasks where both are measured; ``tasks`` of ``of_tasks`` have the searcher's plan (a searcher finding
    none, e.g. TorchRec's planner under a tight cap, is counted, not hidden). The row ``BEST`` is, per task, the
    measured plan (searched or a variant) whose slowest device is lowest: how close to the bound any plan came."""
    ratios: dict[int, dict[str, dict[str, list]]] = {}
    tasks: dict[int, int] = {}
    for row, (task, plans) in zip(rows, parsed):
        tasks[task.num_devices] = tasks.get(task.num_devices, 0) + 1
        slowest, means, polishing, mean_of = {}, [], {}, {}
        for spec, plan in zip(row["plans"], plans):
            if spec.get("polish"):
                polishing[spec["searcher"]] = spec["polish"]
            devices = [device_tables(task, plan.device_shards(d)) for d in range(task.num_devices)]
            ms = [measured.get(device_key(task, t)) if t else 0.0 for t in devices]
            if None in ms:
                continue
            means.append(sum(ms) / task.num_devices)
            if spec["variant"] == "searched":
                slowest[spec["searcher"]] = max(ms)
                mean_of[spec["searcher"]] = means[-1]
            if max(ms) < slowest.get(BEST, float("inf")):  # any measured plan, variants too: what was reachable
                slowest[BEST], mean_of[BEST] = max(ms), means[-1]
        bound = min(means) if means else None
        entry = ratios.setdefault(task.num_devices, {})
        for searcher, ms in slowest.items():
            figures = entry.setdefault(
                searcher, {"vs_torchrec": [], "vs_bound": [], "max_over_mean": [], "mean_vs_bound": []}
            )
            if "torchrec" in slowest:
                figures["vs_torchrec"].append(ms / slowest["torchrec"])
            figures["vs_bound"].append(ms / bound)
            # vs_bound = imbalance (slowest / mean device) x overhead (mean / bound: what splits and the mix added)
            figures["max_over_mean"].append(ms / mean_of[searcher])
            figures["mean_vs_bound"].append(mean_of[searcher] / bound)
            if searcher in polishing:  # what polishing cost, and what its own fresh re-measurement saw
                for key in ("measurements", "time_s", "changes_kept", "reverted", "compute_improvement"):
                    figures.setdefault(f"polish_{key}", []).append(float(polishing[searcher][key]))
    return {
        str(n): {
            s: {k: (float(np.mean(v)) if v else None) for k, v in f.items()}
            | {"tasks": len(f["vs_bound"]), "of_tasks": tasks[n]}
            for s, f in sorted(entry.items())
        }
        for n, entry in sorted(ratios.items())
    }


def print_report(result: dict) -> None:
    noise = result["noise"]
    print(
        f"{result['tasks']} tasks, {result['plans']} plans; noise floor: one repeat "
        f"{noise['one_repeat_vs_median']:.1%} "
        f"from its device's median ({noise['devices']} devices)"
    )
    for n, searchers in result["measured_plans"].items():
        quality = ", ".join(
            f"{s} {f['vs_torchrec']:.1%} / {f['vs_bound']:.1%} (max/mean {f['max_over_mean']:.3f})" + polish_cost(f)
            for s, f in searchers.items()
            if f["vs_torchrec"]
        )
        print(f"{n} devices, measured slowest device compute vs TorchRec's / vs the balance bound: {quality}")
    for model, scaled in result["models"].items():
        for how, n, f in ((h, n, f) for h, figures in scaled.items() for n, f in figures.items()):
            err = f["device_error"]
            if "all" not in err:
                continue
            groups = ", ".join(f"{g} {e['mean_signed']:+.1%}" for g, e in err.items() if g != "all")
            tau = "n/a" if f["per_task_tau"] is None else f"{f['per_task_tau']:.3f}"
            all_ = err["all"]
            print(
                f"{model} ({how}) @ {n} devices: MAPE {all_['mape']:.1%} (signed {all_['mean_signed']:+.1%}, "
                f"{all_['devices']} devices), tau {tau} over {f['tasks_with_tau']} tasks; signed: {groups}"
            )


def polish_cost(figures: dict) -> str:
    if figures.get("polish_time_s") is None:
        return ""
    return f" ({figures['polish_measurements']:.0f} measurements, {figures['polish_time_s']:.0f} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--tasks", type=int, default=5, help="held-out tasks per device count")
    m.add_argument("--devices", default="4,8")
    m.add_argument("--repeats", type=int, default=5)
    m.add_argument("--variants", type=int, default=8, help="perturbed variants per task, drawn at random")
    m.add_argument("--model", default="xeon-union", help="the searchers' cost model")
    m.add_argument("--workers", type=int, default=2)
    m.add_argument("--references", type=int, default=6, help="reference records measured among each task's devices")
    m.add_argument("--reference", default="neuroshard_jax/data/profiles/xeon-plans", help="their dataset")
    m.add_argument(
        "--polish", default="", help="searchers whose plans are also polished on the kernels (beam,size_lookup_greedy)"
    )
    r = sub.add_parser("report")
    r.add_argument("--models", required=True, help="comma-separated shipped names or checkpoint directories")
    r.add_argument("--tie", type=float, default=0.03, help="plans closer than this (relative) have no order")
    for p in (m, r):
        p.add_argument("--out", default="outputs/bench/plan_accuracy")
    args = parser.parse_args()
    try:
        if args.command == "measure":
            if args.tasks < 1 or args.repeats < 3:
                raise UserError(f"--tasks/--repeats: got {args.tasks}/{args.repeats}, expected >= 1 / >= 3")
            print(measure(args))
        else:
            print_report(report(args))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
