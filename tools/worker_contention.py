"""Does a device read the same with its neighbour core idle and with a second kernel worker running beside it? The
labels of the shipped models of a 2-core machine were taken with one or two pinned workers, the benchmarks measure
plans with two; both workers share the last-level cache and the memory's bandwidth, so a kernel that leans on them
may read slower beside a neighbour than alone.

    python -m tools.worker_contention --plans outputs/bench/foreign-f26m2/plans.jsonl --checkpoint epyc-f26m2 \
        [--searcher portfolio] [--tasks 8] [--labels 24] [--rounds 3] [--out outputs/bench/worker-contention.json]

The devices of ``--searcher``'s plans of the first ``--tasks`` / 2 tasks at 4 and at 8 devices in a benchmark's
plans file (``tools.foreign_benchmark plan``: the plans of ``--checkpoint``), and ``--labels`` of the model's own
labels (its datasets' quiet records, with their own protocol, as ``measure --drift`` re-times them), are measured
in ``--rounds`` rounds, each round once with one pinned worker (the other core idle) and once with two pinned
workers taking the same requests from one queue (a kernel always beside another), the order of the two alternating
round to round so that the machine's drift falls on both. Per protocol: the median of the rounds of each device, the
model's error on the devices (MAPE and median signed, predicted / measured - 1), and the labels' speed (measured now
/ recorded, median and p10-p90); and the ratio two workers / one worker, per device and per label. Prints a table and
writes the JSON (the raw readings too) with the date, commit and machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import read_records, write_json
from neuroshard_jax.core.manifests import result_stamp
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.records import ratio_errors
from neuroshard_jax.costs.choice import CostModelSpec, build_cost_model, checkpoint_path
from neuroshard_jax.costs.scoring import score_plan
from neuroshard_jax.kernels.executors import ExecutorConfig, open_executor
from neuroshard_jax.measure.evaluator import EvaluateConfig, measure_tables, plan_kernels
from tools.foreign_benchmark import drift_labels, model_datasets

PROTOCOLS = {"alone": 1, "beside": 2}  # name -> pinned workers taking one queue


def plans_of(path: Path, searcher: str, checkpoint: str, count: int) -> list[tuple[str, Plan]]:
    """(task id, plan) of ``searcher``'s plans in a benchmark's plans file (those of ``checkpoint`` where the searcher
    uses a model), the first ``count`` / 2 tasks at 4 and at 8 devices (0: all), in the file's order."""
    models = {"-", f"neural:{Path(checkpoint).name}"}
    rows = [
        r for r in read_records(path) if r.get("searcher") == searcher and r.get("plan") and r.get("model") in models
    ]
    if not rows:
        raise UserError(f"--plans: {str(path)!r} holds no plan of searcher {searcher!r}, expected a benchmark's plans")
    chosen = rows
    if count > 0:
        chosen = [r for n in (4, 8) for r in [r for r in rows if r["task"].startswith(f"d{n}-")][: -(-count // 2)]]
    return [(r["task"], Plan.from_json(r["plan"])) for r in chosen]


def errors(predicted: np.ndarray, measured: np.ndarray) -> dict:
    return {"devices": int(len(predicted)), **ratio_errors(predicted, measured)}


def spread(ratio: np.ndarray) -> dict:
    return {f"p{q}": round(float(np.quantile(ratio, q / 100)), 4) for q in (10, 50, 90)}


def run(plans: list[tuple[str, Plan]], checkpoint: str, labels: int, rounds: int) -> dict:
    jobs = {}
    devices: list[tuple[int, list[str], float]] = []  # (the plan's devices, a device's kernels, its predicted ms)
    spec = CostModelSpec("neural", {"checkpoint": checkpoint_path(checkpoint)})
    for _, plan in plans:
        model, _ = build_cost_model(spec, plan.task)
        compute = np.asarray(score_plan(model.expected, plan).compute_ms, np.float64)
        for d, kernels in enumerate(plan_kernels(plan)):
            if kernels:
                jobs.update({k: (task, tables) for k, task, tables in kernels})
                devices.append((plan.task.num_devices, [k for k, _, _ in kernels], float(compute[d])))
    refs = drift_labels(model_datasets("neural", {"checkpoint": checkpoint_path(checkpoint)}), labels, 1, 0)
    others = {r.id: r for r in refs.requests}
    readings: dict[str, dict[str, list[float]]] = {p: {} for p in PROTOCOLS}
    configs = {p: EvaluateConfig(executor=ExecutorConfig(workers=w), pin=True) for p, w in PROTOCOLS.items()}
    pools = {p: open_executor(c.executor, "cpu", c.timeout_s, pin=True) for p, c in configs.items()}
    try:
        for r in range(rounds):
            order = list(PROTOCOLS) if r % 2 == 0 else list(reversed(PROTOCOLS))
            for name in order:
                answers = measure_tables(jobs, configs[name], pools[name], others=others, what="worker_contention")
                for key, (answer,) in answers.items():
                    readings[name].setdefault(key, []).append(float(answer.total_ms))
                print(f"round {r} {name}: {len(answers)} kernels", flush=True)
    finally:
        for pool in pools.values():
            pool.close()
    medians = {p: {k: float(np.median(v)) for k, v in readings[p].items()} for p in PROTOCOLS}
    result = {
        **result_stamp(),
        "checkpoint": checkpoint,
        "tasks": sorted({t for t, _ in plans}),
        "rounds": rounds,
        "protocols": {},
        "readings": readings,
    }
    pred = np.array([p for *_, p in devices])
    sizes = np.array([n for n, *_ in devices])
    for name in PROTOCOLS:
        measured = np.array([sum(medians[name][k] for k in keys) for _, keys, _ in devices])
        label_speed = np.array([medians[name][k] / refs.recorded_ms[k] for k in others])
        result["protocols"][name] = {
            **{f"{n}_devices": errors(pred[sizes == n], measured[sizes == n]) for n in np.unique(sizes).tolist()},
            "labels_now_over_recorded": spread(label_speed),
        }
    result["beside_over_alone"] = {
        "devices": spread(np.array([medians["beside"][k] / medians["alone"][k] for k in jobs])),
        "labels": spread(np.array([medians["beside"][k] / medians["alone"][k] for k in others])),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.worker_contention", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", required=True, help="a benchmark's plans.jsonl")
    parser.add_argument("--checkpoint", required=True, help="the model whose plans and labels are read")
    parser.add_argument("--searcher", default="portfolio")
    parser.add_argument("--tasks", type=int, default=8, help="the first N/2 tasks at 4 and at 8 devices (0: all)")
    parser.add_argument("--labels", type=int, default=24, help="the model's labels re-timed beside the devices")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="outputs/bench/worker-contention.json")
    args = parser.parse_args(argv)
    try:
        if args.rounds < 1 or args.labels < 1:
            raise UserError(f"--rounds/--labels: got {args.rounds}/{args.labels}, expected numbers >= 1")
        result = run(
            plans_of(Path(args.plans), args.searcher, args.checkpoint, args.tasks),
            args.checkpoint,
            args.labels,
            args.rounds,
        )
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_json(result, Path(args.out))
    for name, p in result["protocols"].items():
        print(f"{name} ({PROTOCOLS[name]} pinned worker{'s' if PROTOCOLS[name] > 1 else ''}): {json.dumps(p)}")
    print(f"two workers / one: {json.dumps(result['beside_over_alone'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
