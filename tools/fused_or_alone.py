"""One device of a benchmark's plan re-timed as its plan runs it (its tables fused in one kernel) and table by table
(each alone, one device holding it), beside a model's predictions of each: whether a model's error on a device is
its tables' or their fusion's.

    python -m tools.fused_or_alone --plans outputs/bench/sealed-5/plans.jsonl --task d4-02 --device 1 \
        [--searcher portfolio] [--checkpoint epyc-f26m2] [--repeats 3] [--batches 16]

One pinned worker (the other core idle), the label protocol (``--batches``: a training step's batches in turn; 1:
one batch every time, as labels before 2026-11-30), ``--repeats`` interleaved rounds, the median. Prints
the fused kernel and the sum of its tables alone, measured and predicted, then each table.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.choice import CostModelSpec, build_cost_model, checkpoint_path
from neuroshard_jax.costs.scoring import score_plan
from neuroshard_jax.kernels.executors import ExecutorConfig
from neuroshard_jax.kernels.processes import BATCHES
from neuroshard_jax.measure.evaluator import EvaluateConfig, measure_tables, plan_kernels
from tools.worker_contention import plans_of


def fused_or_alone(
    plan: Plan, device: int, checkpoint: str, repeats: int, batches: int = BATCHES
) -> list[tuple[str, float, float]]:
    """(what, predicted ms, measured ms): the device's fused kernel, then each of its shards alone."""
    one = Task.uniform(1, 64.0, plan.task.batch_size, plan.task.tables)  # one device holding them, as measured
    shards = [dataclasses.replace(s, device=0) for s in plan.shards if s.device == device]
    if not shards:
        raise UserError(f"--device: device {device} of this plan holds no shard, expected one that does")
    plans = [Plan(one, tuple(shards))] + [Plan(one, (s,)) for s in shards]
    model, _ = build_cost_model(CostModelSpec("neural", {"checkpoint": checkpoint_path(checkpoint)}), one)
    predicted = [float(score_plan(model.expected, p).compute_ms[0]) for p in plans]
    keys, jobs = [], {}
    for p in plans:
        ((key, task, tables),) = plan_kernels(p)[0]
        jobs[key] = (task, tables)
        keys.append(key)
    answers = measure_tables(
        jobs, EvaluateConfig(executor=ExecutorConfig(workers=1), pin=True, batches=batches), repeats=repeats
    )
    measured = [float(np.median([a.total_ms for a in answers[k]])) for k in keys]
    names = ["fused"] + [plan.task.tables[s.table].name or f"t{s.table}" for s in shards]
    return list(zip(names, predicted, measured))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fused_or_alone", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", required=True, help="a benchmark's plans.jsonl")
    parser.add_argument("--task", required=True)
    parser.add_argument("--device", type=int, required=True)
    parser.add_argument("--searcher", default="portfolio")
    parser.add_argument("--checkpoint", default="epyc-f26m2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=BATCHES, help="batches in turn (1: one batch every time)")
    args = parser.parse_args(argv)
    try:
        for name in ("repeats", "batches"):
            if getattr(args, name) < 1:
                raise UserError(f"--{name}: got {getattr(args, name)}, expected >= 1")
        found = [p for t, p in plans_of(Path(args.plans), args.searcher, args.checkpoint, 0) if t == args.task]
        if not found:
            raise UserError(f"--task: no {args.searcher} plan of {args.task!r} in {args.plans!r}")
        rows = fused_or_alone(found[0], args.device, args.checkpoint, args.repeats, args.batches)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    (_, fp, fm), alone = rows[0], rows[1:]
    ap, am = sum(p for _, p, _ in alone), sum(m for _, _, m in alone)
    print(
        f"{args.task} device {args.device}: fused predicted {fp:.3f} ms, measured {fm:.3f} ({fp / fm:.2f}); its "
        f"{len(alone)} tables alone, summed: predicted {ap:.3f}, measured {am:.3f} ({ap / am:.2f}); fused / alone: "
        f"predicted {fp / ap:.2f}x, measured {fm / am:.2f}x"
    )
    for name, p, m in alone:
        print(f"  {name:36s} predicted {p:7.3f} measured {m:7.3f} ({p / m:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
