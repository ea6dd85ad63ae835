r"""What lowering a sequence table's compute costs in the step: a benchmark's plan with its heaviest device's sequence
tables cut into row blocks, priced by the model beside the plan and TorchRec's plans.

    python -m tools.sequence_tradeoff --plans outputs/bench/seq-f26m2-late/plans.jsonl --checkpoint epyc-f26m2-kinds \
        [--task d8-00] [--searcher portfolio] [--out FILE]

On a CPU, FBGEMM's backward of an unpooled (sequence) kernel costs per distinct row (``docs/results/kernel-kinds.md``):
a column-wise cut leaves every slice the whole table's distinct rows, a row-wise one divides them. But a row-wise
sequence table is an all-to-all of its own (TorchRec's ``RwSequenceEmbeddingSharding``: the ids routed to their
rows' owners and the rows sent back), beside the table-wise and column-wise one. For each task, the plan of
``--searcher`` and, for every sequence table on its device of the most predicted compute, the same plan with that
table in 2, 4 and N row blocks (its device first, then the devices of the least compute; full width), each priced by
the model as (b) prices plans: the slowest device's compute, and compute with its collectives. Nothing is measured:
what this shows is the model's trade, the reason a plan that minimises the step may keep more compute than another.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import read_records, write_json
from neuroshard_jax.core.hardware import hardware, hardware_kind
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard, row_blocks
from neuroshard_jax.costs.choice import build_cost_model, spec_of
from neuroshard_jax.costs.scoring import score_plan

BASELINES = ("torchrec", "torchrec_default")


def priced(model, plan: Plan) -> dict:
    """The slowest device's compute and step (compute + collectives) of ``plan`` by ``model``, ms."""
    costs = score_plan(model, plan)
    return {
        "compute_ms": round(float(np.max(np.asarray(costs.compute_ms))), 3),
        "step_ms": round(float(np.max(np.asarray(costs.total_ms))), 3),
    }


def row_variants(model, plan: Plan) -> list[tuple[str, Plan]]:
    """``plan`` with each sequence table of its device of the most compute in 2, 4 and N row blocks."""
    compute = np.asarray(score_plan(model, plan).compute_ms)
    heaviest = int(np.argmax(compute))
    task, rows = plan.task, plan.task.table_rows()
    tables = sorted(
        {
            s.table
            for s in plan.shards
            if s.device == heaviest and task.tables[s.table].sequence and s.whole_rows(rows[s.table])
        }
    )
    out = []
    for t in tables:
        own = sorted({s.device for s in plan.shards if s.table == t})
        others = [int(d) for d in np.argsort(compute, kind="stable") if d not in own]
        kept = tuple(s for s in plan.shards if s.table != t)
        for count in sorted({2, 4, task.num_devices} & set(range(2, task.num_devices + 1))):
            devices = (own + others)[:count]
            blocks = row_blocks(rows[t], count)
            cut = tuple(Shard(t, 0, task.tables[t].dim, d, off, n) for d, (off, n) in zip(devices, blocks))
            out.append((f"{task.tables[t].name} in {count} row blocks", dataclasses.replace(plan, shards=kept + cut)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.sequence_tradeoff", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", required=True, help="a benchmark's plans.jsonl")
    parser.add_argument("--checkpoint", required=True, help="the model that prices every plan")
    parser.add_argument("--task", default=None, help="one task (default: every task with a sequence table)")
    parser.add_argument("--searcher", default="portfolio")
    parser.add_argument("--out", default=None, help="a JSON file of the figures")
    args = parser.parse_args(argv)
    try:
        rows = read_records(Path(args.plans))
        by_task: dict[str, dict[str, Plan]] = {}
        for r in rows:
            if args.task in (None, r.get("task")) and r.get("searcher") in (args.searcher, *BASELINES):
                by_task.setdefault(r["task"], {})[r["searcher"]] = Plan.from_json(r["plan"])
        if not by_task:
            raise UserError(f"--plans: no plan of task {args.task or 'any'!r} in {args.plans}")
        result = {"hardware": hardware_kind(hardware()), "checkpoint": args.checkpoint, "tasks": {}}
        for task_id, plans in sorted(by_task.items()):
            mine = plans.get(args.searcher)
            if mine is None or not any(t.sequence for t in mine.task.tables):
                continue
            model, _ = build_cost_model(spec_of(args.checkpoint), mine.task)
            figures = {name: priced(model, plans[name]) for name in (args.searcher, *BASELINES) if name in plans}
            figures |= {name: priced(model, plan) for name, plan in row_variants(model, mine)}
            result["tasks"][task_id] = figures
            print(f"{task_id}:")
            for name, f in figures.items():
                print(f"  {name:44s} compute {f['compute_ms']:8.2f} ms  step {f['step_ms']:8.2f} ms")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        write_json(result, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
