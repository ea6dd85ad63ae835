"""``autotune=kernels`` run for real on a benchmark's tasks (issue 63): each task planned as a user would plan it
(the portfolio, then its best candidates and TorchRec's default and TW+CW plans measured on this machine's kernels,
the measured fastest returned), one row a task, resumable; the report: what was chosen, its measured step against
TorchRec's two plans in the same rounds, whether either was faster beyond the rounds' spread, and the wall time.

    python -m tools.autotune_benchmark run [--suite foreign|sealed-N] [--tasks 24] [--run s34] [--mode loop]
    python -m tools.autotune_benchmark report [--suite ...] [--run s34]

The suites are the foreign benchmark's and the sealed sets' (``tools.foreign_benchmark``, ``tools.sealed_benchmark``);
the rows go to the suite's folder, ``autotune-<run>.jsonl``. A candidate's step in a round is its devices'
measured compute with the model's comm (``measure/autotune.py``), so TorchRec's plans and ours are priced alike.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JsonlLog, write_json
from neuroshard_jax.core.hardware import hardware, hardware_kind
from neuroshard_jax.core.records import AutotuneRecord
from neuroshard_jax.measure.autotune import AutotuneConfig
from neuroshard_jax.search.sharding_planner import PlannerOptions
from tools.foreign_benchmark import FOREIGN, TASKS_FILE, Suite, chosen
from tools.sealed_benchmark import sealed_suite

BASELINES = ("torchrec_default", "torchrec")
SAME = "the same plan as "  # a candidate autotune measured once, as the other


def suite_of(name: str) -> Suite:
    if name == "foreign":
        return FOREIGN
    if name.startswith("sealed-") and name.removeprefix("sealed-").isdigit():
        return sealed_suite(int(name.removeprefix("sealed-")))
    raise UserError(f"--suite: got {name!r}, expected foreign or sealed-N")


def run(suite: Suite, out: Path, only: set[str], tag: str, model: str, mode: str = "kernels") -> None:
    log = JsonlLog(out / f"autotune-{tag}.jsonl")
    planner = PlannerOptions(cost_model=model, autotune=AutotuneConfig(name=mode)).planner()
    for task_id, family, task in suite.tasks(out / TASKS_FILE):
        if task_id not in only or task_id in log.ids:
            continue
        started = time.perf_counter()
        plan = planner.plan(task)
        wall = round(time.perf_counter() - started, 1)
        record = {"id": task_id, "family": family, "wall_s": wall, "tables": task.num_tables}
        log.write_record(record | {"hardware": hardware_kind(hardware()), "autotune": plan.autotune.to_json()})
        a = plan.autotune
        print(f"{task_id}: {a.chosen} ({a.rounds} rounds, {a.stopped}; {wall:.0f} s)", flush=True)


def report(out: Path, tag: str) -> dict:
    rows = list(JsonlLog(out / f"autotune-{tag}.jsonl").records())
    if not rows:
        raise UserError(f"{out}/autotune-{tag}.jsonl: no rows, expected the run stage first")
    result = {"session": tag, "hardware": rows[0]["hardware"], "sizes": {}}
    for devices in sorted({int(r["id"].split("-")[0][1:]) for r in rows}):
        mine = [r for r in rows if r["id"].startswith(f"d{devices}-")]
        logs = {b: [] for b in BASELINES}
        bound_logs = []  # the chosen plan's measured step over the task's balance bound (records that have one)
        beaten, chosen_by, walls, rounds, busy = 0, {}, [], [], 0
        unplanned = dict.fromkeys(BASELINES, 0)  # TorchRec's planner made no plan (its own storage rules)
        for r in mine:
            record = AutotuneRecord.from_json(r["autotune"])
            pick = record.chosen_candidate()
            chosen_by[pick.name] = chosen_by.get(pick.name, 0) + 1
            walls.append(r["wall_s"])
            rounds.append(record.rounds)
            busy += record.busy
            if record.bound_ms:
                bound_logs.append(math.log(pick.measured_ms / record.bound_ms))
            by_name, faster = {c.name: c for c in record.candidates}, False
            for name in BASELINES:
                c = by_name.get(name)
                while c is not None and not c.kept and (c.why or "").startswith(SAME):  # measured as that plan
                    c = by_name.get(c.why.removeprefix(SAME))
                if c is not None and c.kept:
                    logs[name].append(math.log(pick.measured_ms / c.measured_ms))
                    # a baseline faster beyond the spread: its slowest round under the choice's fastest
                    faster |= c.name != pick.name and c.high_ms < pick.low_ms
                else:
                    unplanned[name] += 1
            beaten += faster  # tasks
        result["sizes"][devices] = {
            "tasks": len(mine),
            "chosen": chosen_by,
            "geo_vs": {b: round(math.exp(np.mean(v)), 4) if v else None for b, v in logs.items()},
            "worst_vs": {b: round(math.exp(max(v)), 4) if v else None for b, v in logs.items()},
            "baseline_faster_beyond_spread": beaten,
            "baseline_without_plan": unplanned,
            "wall_s": {"median": float(np.median(walls)), "max": float(max(walls))},
            "rounds_median": float(np.median(rounds)),
            "busy_kernels": busy,
            "geo_vs_bound": round(math.exp(np.mean(bound_logs)), 4) if bound_logs else None,
        }
    write_json(result, out / f"autotune-report-{tag}.json")
    for devices, s in result["sizes"].items():
        print(
            f"{devices} devices, {s['tasks']} tasks: chosen {s['chosen']}; measured step / TorchRec default "
            f"{s['geo_vs']['torchrec_default']} (worst {s['worst_vs']['torchrec_default']}), / TW+CW "
            f"{s['geo_vs']['torchrec']} (worst {s['worst_vs']['torchrec']}); a TorchRec plan faster beyond the "
            f"rounds' spread: {s['baseline_faster_beyond_spread']}; no TorchRec plan: {s['baseline_without_plan']}; "
            f"wall {s['wall_s']['median']:.0f} s median, "
            f"{s['wall_s']['max']:.0f} s max; rounds {s['rounds_median']:.0f}; busy kernels {s['busy_kernels']}; "
            f"measured step / the task's balance bound {s['geo_vs_bound']}"
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.autotune_benchmark", description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("run", "report"))
    parser.add_argument("--suite", default="foreign")
    parser.add_argument("--out", default=None, help="the suite's folder (default: its own)")
    parser.add_argument("--tasks", type=int, default=24, help="the first N/2 tasks at 4 and at 8 devices (0: all)")
    parser.add_argument("--run", "--session", default="s34")
    parser.add_argument("--model", default="neural", help="the cost model (default: this machine's)")
    parser.add_argument("--mode", default="kernels", choices=("kernels", "loop"), help="autotune's mode")
    args = parser.parse_args(argv)
    try:
        suite = suite_of(args.suite)
        out = Path(args.out or suite.out)
        out.mkdir(parents=True, exist_ok=True)
        if args.stage == "run":
            run(suite, out, chosen(suite, out, args.tasks), args.run, args.model, args.mode)
        else:
            report(out, args.run)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
