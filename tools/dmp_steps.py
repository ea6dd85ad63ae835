"""Time plans of one task in TorchRec's DistributedModelParallel on this machine (gloo, one process per device).

    python -m tools.dmp_steps outputs/a/plan.json outputs/b/plan.json [--warmup 3 --steps 20 --out FILE]
    python -m tools.dmp_steps 'outputs/bench/foreign-s19/plans.jsonl:d8-09:beam' \\
        'outputs/bench/foreign-s19/plans.jsonl:d8-09:torchrec_default' --repeats 2

A plan is a plan.json, or ``FILE.jsonl:TASK:SEARCHER`` (a foreign-benchmark ``plans.jsonl`` line). The plans must be
of one task; their steps are interleaved (``neuroshard_jax/measure/training_steps.py`` says how a step is timed).
``--repeats`` starts the ranks that many times (fresh processes, the plans' order rotated) and reports each run and
the median of the runs' medians. The ranks build every plan's modules at once (so that their steps interleave):
where they would not fit this machine's memory together the run is refused before anything starts, and
``--apart`` times one plan's modules at a time instead (a fresh set of ranks per plan, its memory freed before the
next; the machine's drift then falls between plans, not evenly on all). A rank that fails is named, and why (one
killed by the kernel's out-of-memory killer before the peers that lost it).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import read_jsonl, write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.plan_file import load_plan
from neuroshard_jax.measure.training_steps import dmp_steps


def read_plan(spec: str) -> Plan:
    """A plan.json, or one line of a plans.jsonl chosen by ``FILE:TASK:SEARCHER``."""
    path, _, rest = spec.partition(":")
    if not rest:
        return load_plan(path)
    task, _, searcher = rest.partition(":")
    rows = read_jsonl(path)  # a FIFO, a corrupt line: one line naming the file
    found = [r for r in rows if r.get("task") == task and r.get("searcher") == searcher and "plan" in r]
    if len(found) != 1:
        what = "no plan" if not found else f"{len(found)} plans (models {sorted({r.get('model') for r in found})})"
        raise UserError(f"plan: {path!r} has {what} of task {task!r} by {searcher!r}, expected one")
    return Plan.from_json(found[0]["plan"])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plans", nargs="+", help="plan.json files, or FILE.jsonl:TASK:SEARCHER")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1, help="fresh sets of rank processes, the order rotated")
    parser.add_argument("--apart", action="store_true", help="one plan's modules at a time (each its own ranks)")
    parser.add_argument("--out", help="write the results here (JSON)")
    args = parser.parse_args(argv)
    plans = [read_plan(spec) for spec in args.plans]
    runs: list[list[dict]] = []
    for r in range(args.repeats):
        order = [(i + r) % len(plans) for i in range(len(plans))]
        if args.apart:
            results = [dmp_steps([plans[i]], args.warmup, args.steps)[0] for i in order]
        else:
            results = dmp_steps([plans[i] for i in order], args.warmup, args.steps)
        runs.append([results[order.index(i)] for i in range(len(plans))])
        for spec, result in zip(args.plans, runs[-1]):
            q1, q3 = result["step_ms_q1_q3"]
            print(
                f"run {r}: step {result['step_ms']:8.2f} ms (quartiles {q1:.2f}-{q3:.2f}), busiest rank's CPU "
                f"{result['busiest_cpu_ms']:7.2f} ms  {spec}",
                flush=True,
            )
    summary = {
        "hardware": hardware(),
        "warmup": args.warmup,
        "steps": args.steps,
        "apart": args.apart,
        "plans": [
            {
                "plan": spec,
                "searcher": plan.searcher,
                "step_ms": statistics.median(run[i]["step_ms"] for run in runs),
                "busiest_cpu_ms": statistics.median(run[i]["busiest_cpu_ms"] for run in runs),
                "runs": [run[i] for run in runs],
            }
            for i, (spec, plan) in enumerate(zip(args.plans, plans))
        ],
    }
    if args.repeats > 1:
        for entry in summary["plans"]:
            print(
                f"median of {args.repeats} runs: step {entry['step_ms']:8.2f} ms, busiest rank's CPU "
                f"{entry['busiest_cpu_ms']:7.2f} ms  {entry['plan']}"
            )
    if args.out:
        write_json(summary, args.out)
    return summary


if __name__ == "__main__":
    try:
        main()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
