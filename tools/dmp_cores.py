"""The full training step on one core per rank (issue 54): foreign tasks' plans timed in TorchRec's
DistributedModelParallel on a machine with a core for every rank, beside the GPU check.

    python -m tools.dmp_cores pack .gpu                     # here: the tasks' plans (beam, TorchRec default, TW+CW)
    python -m tools.dmp_cores run OUT --pack .gpu --cores 8-15 --budget-s 600    # there (tools/gpu_check.py starts it)
    python -m tools.dmp_cores run OUT --dry                 # here, tiny: what the tests run
    python -m tools.dmp_cores table OUT                     # the README's table from dmp.json

On this project's 2-core machines 8 gloo ranks share 2 cores, so a step's wall time is the ranks' total work, not the
slowest device's (``neuroshard_jax/measure/training_steps.py``). A lent GPU machine has 16 CPU cores: rank r runs
alone on core ``cores[r]`` and the step's time is its slowest rank's, as on a cluster (gloo over shared memory, not a
network). ``run`` takes the tasks in order, one set of rank processes per task with every plan's steps interleaved,
then a second pass with the plans' order rotated while time is left; ``dmp.json`` is rewritten after each task.

The tasks are the first ``TASKS`` foreign benchmark tasks of 8 devices whose tables take at most ``MAX_TASK_GIB``
(each rank holds every plan's shards at once: 3 plans of 6 GiB in the machine's memory beside the GPU check). Beam
plans them with the shipped CPU model the planner chooses here (the machine that packs), TorchRec with its default
planner (every sharding type) and table-wise + column-wise, as the foreign benchmark runs them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from neuroshard_jax.core.cli import fail
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.files import read_json, write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.task import Task
from neuroshard_jax.measure.training_steps import dmp_steps
from neuroshard_jax.search.sharding_planner import PlannerOptions
from neuroshard_jax.workloads.gpu_tasks import GpuTaskConfig, gpu_task

PLANS_FILE = "dmp-plans.json.gz"
SEARCHERS = ("beam", "torchrec", "torchrec_default")  # the table's columns: beam, TorchRec TW+CW, TorchRec default
SEARCHER_OPTIONS = {"torchrec": {"reservation": "percent"}, "torchrec_default": {"reservation": "percent"}}
# TorchRec where the GPU machine lacks it, with what it imports that is not there: 1.6 is the release paired with the
# FBGEMM GPU 1.6 and torch 2.11 there (../shared/gpu/README.md); the project's export and steps ran on 1.6.1 here
WHEELS = (
    "torchrec==1.6.1",
    "tensordict==0.15.3",
    "pyre-extensions==0.0.32",
    "typing-inspect==0.9.0",
    "mypy-extensions==1.2.0",
    "cloudpickle==3.1.3",
    "pyvers==0.2.3",
)
TASKS = 8
SEED = 54  # the dry run's task: a tiny GPU task (issue 54's seed)
DRY_TASKS = GpuTaskConfig(device_counts=(2,), tables=(6, 8), batch_sizes=(1024,), dims=(8, 16), log10_rows_max=4.0)
MAX_TASK_GIB = 6.0
WARMUP, STEPS = 3, 20
DRY_WARMUP, DRY_STEPS = 1, 3
START_S = {False: 60.0, True: 10.0}  # a task's ranks start, export and load its plans in less (dry: tiny)


def parse_cores(text: str) -> list[int]:
    """``8-15`` or ``0,2,4-7``: the cores, in order; a one-line error for anything else."""
    cores: list[int] = []
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            cores += range(int(low), int(high or low) + 1)
    except ValueError:
        raise UserError(f"--cores: got {text!r}, expected core numbers and ranges such as 8-15 or 0,2,4-7") from None
    have = os.cpu_count() or 1
    if not cores or len(set(cores)) != len(cores) or not all(0 <= c < have for c in cores):
        raise UserError(f"--cores: got {text!r}, expected distinct cores among this machine's 0-{have - 1}")
    return cores


def dmp_tasks(dry: bool) -> list[tuple[str, Task]]:
    """The tasks the step is timed on: foreign benchmark tasks (module docstring), or the dry run's tiny GPU task."""
    if dry:
        return [("dry-0", gpu_task(DRY_TASKS, SEED, 0))]
    from tools.foreign_benchmark import benchmark_tasks

    chosen = []
    for name, _family, task in benchmark_tasks():
        gib = sum(task.table_mem_bytes(t) for t in range(task.num_tables)) / 2**30
        if task.num_devices == 8 and gib <= MAX_TASK_GIB and len(chosen) < TASKS:
            chosen.append((name, task))
    return chosen


def plan_tasks(tasks: list[tuple[str, Task]], cost_model: str) -> list[dict]:
    """Every searcher's plan of every task (``{"task", "searcher", "plan"}`` or ``"error"``)."""
    rows = []
    for name, task in tasks:
        for searcher in SEARCHERS:
            started = time.monotonic()
            planner = PlannerOptions(
                searcher=searcher,
                cost_model=cost_model if searcher == "beam" else "analytic",  # TorchRec's: its own estimator
                searcher_options=SEARCHER_OPTIONS.get(searcher) or {},
                device="cpu",
            ).planner()
            try:
                plan = planner.run(task).plan
                rows.append({"task": name, "searcher": searcher, "plan": plan.to_json()})
            except (UserError, InfeasibleError) as err:
                rows.append({"task": name, "searcher": searcher, "error": str(err)[:300]})
            print(f"dmp plans: {name} {searcher}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return rows


def pack(out: Path) -> None:
    """The plans (``PLANS_FILE``) and, in ``out/whl``, TorchRec's wheels for a Python 3.12 machine without them."""
    out.mkdir(parents=True, exist_ok=True)
    download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    subprocess.run([*download, "--python-version", "3.12", "-d", str(out / "whl"), *WHEELS], check=True)
    rows = plan_tasks(dmp_tasks(dry=False), "neural")
    with gzip.open(out / PLANS_FILE, "wt") as f:
        json.dump({"hardware": hardware(), "plans": rows}, f)


def run(out: Path, pack_dir: Path | None, cores: list[int] | None, budget_s: float, dry: bool) -> dict:
    """Time the plans, task by task, until ``budget_s``; ``dmp.json`` after each task (returned)."""
    deadline = time.monotonic() + budget_s
    out.mkdir(parents=True, exist_ok=True)
    if pack_dir is not None and (pack_dir / PLANS_FILE).exists():
        rows = json.loads(gzip.open(pack_dir / PLANS_FILE, "rt").read())["plans"]
    else:
        rows = plan_tasks(dmp_tasks(dry), "analytic" if dry else "neural")
    by_task: dict[str, dict[str, Plan]] = {}
    for row in rows:
        if "plan" in row:
            by_task.setdefault(row["task"], {})[row["searcher"]] = Plan.from_json(row["plan"])
    warmup, steps = (DRY_WARMUP, DRY_STEPS) if dry else (WARMUP, STEPS)
    result = {
        "hardware": hardware(),
        "cores": cores,
        "warmup": warmup,
        "steps": steps,
        "errors": [r for r in rows if "error" in r],
        "tasks": {},
    }
    for rotation in range(1 if dry else 2):
        for name, plans in by_task.items():
            left = deadline - time.monotonic()
            if left < START_S[dry]:
                break
            order = [s for s in SEARCHERS if s in plans]
            order = order[rotation % len(order) :] + order[: rotation % len(order)]
            entry = result["tasks"].setdefault(name, {"runs": []})
            try:
                timed = dmp_steps([plans[s] for s in order], warmup, steps, timeout_s=left, cores=cores)
            except UserError as err:
                entry.setdefault("failed", []).append(str(err)[:300])
                print(f"dmp: {name}: {err}", file=sys.stderr, flush=True)
                continue
            entry["runs"].append({s: t for s, t in zip(order, timed)})
            write_json(summarise(result), out / "dmp.json")
            print(
                f"dmp: {name} pass {rotation + 1}: "
                + ", ".join(f"{s} {t['step_ms']:.1f} ms" for s, t in zip(order, timed)),
                file=sys.stderr,
                flush=True,
            )
    write_json(summarise(result), out / "dmp.json")
    return summarise(result)


def summarise(result: dict) -> dict:
    """Each task's plans: the median over its runs of the step (slowest rank's wall) and busiest rank's CPU ms."""
    for entry in result["tasks"].values():
        entry["plans"] = {
            s: {
                "step_ms": round(statistics.median(run[s]["step_ms"] for run in entry["runs"] if s in run), 3),
                "busiest_cpu_ms": round(
                    statistics.median(run[s]["busiest_cpu_ms"] for run in entry["runs"] if s in run), 3
                ),
            }
            for s in SEARCHERS
            if any(s in run for run in entry["runs"])
        }
    return result


def table(out: Path) -> str:
    """The README's table: per task, each plan's step ms / busiest rank's CPU ms, and beam's step against TorchRec's
    (the median of the per-task ratios)."""
    result = read_json(out / "dmp.json", "dmp results")
    cpu = result["hardware"].get("cpu")
    lines = [
        f"DistributedModelParallel on {cpu}, gloo, "
        + (f"rank r alone on core {result['cores']}[r]; " if result["cores"] else "the ranks on any core; ")
        + f"{result['warmup']} warm-up and {result['steps']} timed steps a plan, interleaved; "
        "step ms (slowest rank) / busiest rank's CPU ms",
        "",
        "| task | runs | beam | TorchRec TW+CW | TorchRec default |",
        "| --- | --- | --- | --- | --- |",
    ]
    ratios: dict[str, list[float]] = {"torchrec": [], "torchrec_default": []}
    for name, entry in result["tasks"].items():
        plans = entry.get("plans", {})
        cells = [
            f"{plans[s]['step_ms']:.1f} / {plans[s]['busiest_cpu_ms']:.1f}" if s in plans else "-" for s in SEARCHERS
        ]
        lines.append(f"| {name} | {len(entry['runs'])} | " + " | ".join(cells) + " |")
        for base in ratios:
            if "beam" in plans and base in plans:
                ratios[base].append(plans["beam"]["step_ms"] / plans[base]["step_ms"])
    lines.append("")
    for base, label in (("torchrec_default", "TorchRec default"), ("torchrec", "TorchRec TW+CW")):
        values = ratios[base]
        if values:
            lines.append(
                f"beam's step / {label}'s: median {statistics.median(values):.1%} over {len(values)} tasks "
                f"({min(values):.1%} .. {max(values):.1%})"
            )
    for row in result.get("errors", []):
        lines.append(f"no plan: {row['task']} {row['searcher']}: {row['error']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("pack", "run", "table"))
    parser.add_argument("out")
    parser.add_argument("--pack", default=None, help="run: the folder pack wrote (else the plans are made here)")
    parser.add_argument("--cores", default=None, help="run: a core per rank, e.g. 8-15 (default: any core)")
    parser.add_argument("--budget-s", type=float, default=600.0, help="run: wall seconds for every task together")
    parser.add_argument("--dry", action="store_true", help="run: one tiny task, a few steps")
    args = parser.parse_args()
    try:
        if args.stage == "pack":
            pack(Path(args.out))
        elif args.stage == "run":
            cores = parse_cores(args.cores) if args.cores else None
            run(Path(args.out), Path(args.pack) if args.pack else None, cores, args.budget_s, args.dry)
        else:
            print(table(Path(args.out)))
    except UserError as err:
        fail(err)


if __name__ == "__main__":
    main()
