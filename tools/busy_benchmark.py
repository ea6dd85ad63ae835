"""Noise never overrules the model, on real tasks (issue 75): each task planned with ``autotune=MODE`` while a busy
loop runs on every core of this machine, then the plan it returned and the model's own pick (the plan
``autotune=off`` returns: the portfolio's cheapest by the model) measured again on the quiet machine, interleaved, by
the evaluator's kernels; the verdict per task and mode: is the returned plan slower than the pick beyond the quiet
run's noise (its fastest repeat slower than the pick's slowest)?

    python -m tools.busy_benchmark run --tasks 4 --modes kernels,loop,steps --run NAME [--budget 120]
    python -m tools.busy_benchmark measure --run NAME [--repeats 5]
    python -m tools.busy_benchmark report --run NAME

``run`` (busy) and ``measure`` (quiet) are separate stages so that nothing else runs beside the quiet one; both resume
(rows of ``busy-NAME.jsonl`` and ``busy-quiet-NAME.jsonl`` in the suite's folder; each busy run keeps its readings in
``busy-NAME/``). A plan's step in a repeat is its devices' measured compute with the model's collectives, as autotune
prices its candidates, so the two plans are read with one ruler.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JsonlLog, write_json
from neuroshard_jax.core.hardware import hardware, hardware_kind
from neuroshard_jax.core.manifests import result_stamp
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.records import AutotuneRecord
from neuroshard_jax.costs.choice import CostModelSpec
from neuroshard_jax.costs.cost_model import plan_cost_ms
from neuroshard_jax.measure.autotune import AutotuneConfig
from neuroshard_jax.measure.evaluator import EvaluateConfig, measure_tables, plan_kernels
from neuroshard_jax.measure.polish import simulate
from neuroshard_jax.search.sharding_planner import PlannerOptions
from tools.autotune_benchmark import suite_of
from tools.foreign_benchmark import TASKS_FILE, chosen

MODES = ("kernels", "loop", "steps")


class Hogs:
    """A busy loop on every core of this machine while the block runs (what another user's job does to a run)."""

    def __enter__(self) -> Hogs:
        loop = [sys.executable, "-c", "while True: pass"]
        self.procs = [subprocess.Popen(loop) for _ in range(os.cpu_count() or 2)]
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def run(suite, out: Path, only: set[str], tag: str, modes: list[str], budget_s: float) -> None:
    log = JsonlLog(out / f"busy-{tag}.jsonl")
    folder = out / f"busy-{tag}"
    folder.mkdir(parents=True, exist_ok=True)
    pick_planner = PlannerOptions().planner()  # autotune off: the model's own pick
    for task_id, _, task in suite.tasks(out / TASKS_FILE):
        if task_id not in only:
            continue
        pick = None
        for mode in modes:
            if f"{task_id}/{mode}" in log.ids:
                continue
            pick = pick or pick_planner.plan(task)
            config = AutotuneConfig(name=mode, budget_s=budget_s, readings=str(folder / f"{task_id}-{mode}.jsonl"))
            started = time.perf_counter()
            with Hogs():
                planned = PlannerOptions(autotune=config).planner().plan(task)
            wall = round(time.perf_counter() - started, 1)
            record = planned.autotune
            log.write_record(
                {
                    "id": f"{task_id}/{mode}",
                    "task": task_id,
                    "mode": mode,
                    "wall_s": wall,
                    "hardware": hardware_kind(hardware()),
                    "autotune": record.to_json(),
                    "returned": planned.to_json(),
                    "pick": pick.to_json(),
                    "same_as_pick": planned == pick,
                }
            )
            print(
                f"{task_id} {mode}: {record.chosen} (model's pick {record.model_pick}; {record.stopped}, "
                f"{record.busy} busy; {wall:.0f} s)" + (f"; kept: {record.kept_pick}" if record.kept_pick else ""),
                flush=True,
            )


def quiet_steps(plans: list[Plan], repeats: int, config: EvaluateConfig) -> np.ndarray:
    """f64[K, R]: each plan's step in each of ``repeats`` interleaved quiet repeats (its devices' kernels measured,
    the model's collectives priced from them, as autotune prices a candidate)."""
    kernels = [plan_kernels(p) for p in plans]
    jobs = {key: (task, tables) for per_plan in kernels for device in per_plan for key, task, tables in device}
    answers = measure_tables(jobs, config, repeats=repeats, what="a quiet measurement failed")
    model = CostModelSpec("neural").for_task(plans[0].task).expected
    out = []
    for plan, per_plan in zip(plans, kernels):
        speeds = plan.task.speeds()
        compute = np.zeros((repeats, plan.task.num_devices))
        for d, device in enumerate(per_plan):
            for key, _, _ in device:
                compute[:, d] += [a.total_ms / speeds[d] for a in answers[key]]
        out.append(np.asarray(plan_cost_ms(simulate(model, [plan] * repeats, compute)), np.float64))
    return np.stack(out)


def against_pick(got: np.ndarray, pick: np.ndarray) -> dict:
    """A returned plan's quiet repeats against the model's pick's: their steps, the ratio of the medians, and whether
    it is slower beyond the noise (its fastest repeat slower than the pick's slowest: ``decide``'s rule, reversed)."""
    return {
        "steps_ms": [round(float(x), 3) for x in got],
        "vs_pick": round(float(np.median(got) / np.median(pick)), 4),
        "slower_beyond_noise": bool(got.min() > pick.max()),
    }


def measure(out: Path, tag: str, repeats: int) -> None:
    rows = list(JsonlLog(out / f"busy-{tag}.jsonl").records())
    if not rows:
        raise UserError(f"{out}/busy-{tag}.jsonl: no rows, expected the run stage first")
    log = JsonlLog(out / f"busy-quiet-{tag}.jsonl")
    config = EvaluateConfig()
    for task_id in dict.fromkeys(r["task"] for r in rows):
        if task_id in log.ids:
            continue
        mine = [r for r in rows if r["task"] == task_id]
        plans = [Plan.from_json(mine[0]["pick"]), *(Plan.from_json(r["returned"]) for r in mine)]
        distinct: list[Plan] = []  # a mode that returned the pick is measured once, as the pick
        for plan in plans:
            if plan not in distinct:
                distinct.append(plan)
        steps = quiet_steps(distinct, repeats, config)
        by_plan = {i: steps[distinct.index(p)] for i, p in enumerate(plans)}
        modes = {}
        pick = by_plan[0]
        for i, r in enumerate(mine, start=1):
            modes[r["mode"]] = {"same_as_pick": r["same_as_pick"], **against_pick(by_plan[i], pick)}
        log.write_record(
            {
                "id": task_id,
                "hardware": hardware_kind(hardware()),
                "pick_steps_ms": [round(float(x), 3) for x in pick],
                "noise": round(float((pick.max() - pick.min()) / np.median(pick)), 4),
                "modes": modes,
            }
        )
        print(
            f"{task_id}: "
            + ", ".join(
                f"{m} {v['vs_pick']:.3f}x the pick{' (SLOWER)' if v['slower_beyond_noise'] else ''}"
                for m, v in modes.items()
            ),
            flush=True,
        )


def report(out: Path, tag: str) -> dict:
    busy = {r["id"]: r for r in JsonlLog(out / f"busy-{tag}.jsonl").records()}
    quiet = list(JsonlLog(out / f"busy-quiet-{tag}.jsonl").records())
    if not quiet:
        raise UserError(f"{out}/busy-quiet-{tag}.jsonl: no rows, expected the measure stage first")
    result: dict = {"run": tag, "stamp": result_stamp(), "hardware": quiet[0]["hardware"], "modes": {}, "tasks": []}
    for row in quiet:
        for mode, v in row["modes"].items():
            record = AutotuneRecord.from_json(busy[f"{row['id']}/{mode}"]["autotune"])
            result["tasks"].append(
                {
                    "task": row["id"],
                    "mode": mode,
                    "returned": record.chosen,
                    "model_pick": record.model_pick,
                    "stopped": record.stopped,
                    "busy_kernels": record.busy,
                    "kept_pick": record.kept_pick,
                    "wall_s": busy[f"{row['id']}/{mode}"]["wall_s"],
                    "vs_pick_quiet": v["vs_pick"],
                    "quiet_noise": row["noise"],
                    "slower_beyond_noise": v["slower_beyond_noise"],
                }
            )
    for mode in dict.fromkeys(t["mode"] for t in result["tasks"]):
        mine = [t for t in result["tasks"] if t["mode"] == mode]
        ratios = [t["vs_pick_quiet"] for t in mine]
        result["modes"][mode] = {
            "tasks": len(mine),
            "returned_the_pick": sum(t["returned"] == t["model_pick"] for t in mine),
            "slower_beyond_noise": sum(t["slower_beyond_noise"] for t in mine),
            "vs_pick_geo": round(float(np.exp(np.mean(np.log(ratios)))), 4),
            "vs_pick_worst": round(float(max(ratios)), 4),
        }
    write_json(result, out / f"busy-report-{tag}.json")
    for t in result["tasks"]:
        print(
            f"{t['task']} {t['mode']}: returned {t['returned']} (pick {t['model_pick']}, {t['stopped']}, "
            f"{t['busy_kernels']} busy, {t['wall_s']:.0f} s): quiet {t['vs_pick_quiet']:.3f}x the pick "
            f"(noise {t['quiet_noise']:.1%})" + ("  SLOWER BEYOND THE NOISE" if t["slower_beyond_noise"] else "")
        )
    for mode, s in result["modes"].items():
        print(
            f"{mode}: {s['tasks']} tasks, the pick returned on {s['returned_the_pick']}, slower than the pick beyond "
            f"the quiet noise on {s['slower_beyond_noise']}; quiet step / the pick's {s['vs_pick_geo']} "
            f"(worst {s['vs_pick_worst']})"
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.busy_benchmark", description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("run", "measure", "report"))
    parser.add_argument("--suite", default="foreign")
    parser.add_argument("--out", default=None, help="the suite's folder (default: its own)")
    parser.add_argument("--tasks", type=int, default=4, help="the first N/2 tasks at 4 and at 8 devices")
    parser.add_argument("--run", required=True, help="the run's name: its date, commit and machine")
    parser.add_argument("--modes", default="kernels,loop,steps", help=f"autotune's modes, of {', '.join(MODES)}")
    parser.add_argument("--budget", type=float, default=120.0, help="autotune.budget_s of each busy run")
    parser.add_argument("--repeats", type=int, default=5, help="quiet repeats of each plan")
    args = parser.parse_args(argv)
    try:
        modes = [m for m in args.modes.split(",") if m]
        bad = [m for m in modes if m not in MODES]
        if bad or not modes:
            raise UserError(f"--modes: got {args.modes!r}, expected some of {', '.join(MODES)}")
        if args.repeats < 2:
            raise UserError(f"--repeats: got {args.repeats}, expected >= 2 (the noise is their spread)")
        suite = suite_of(args.suite)
        out = Path(args.out or suite.out)
        out.mkdir(parents=True, exist_ok=True)
        if args.stage == "run":
            run(suite, out, chosen(suite, out, args.tasks), args.run, modes, args.budget)
        elif args.stage == "measure":
            measure(out, args.run, args.repeats)
        else:
            report(out, args.run)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
