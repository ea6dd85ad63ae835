"""Plans: validity (columns tiled exactly, memory), the plan.json contract, and the printed summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from neuroshard_jax.constants import DIM_ALIGNMENT, GIB_BYTES
from neuroshard_jax.cost_models import DeviceCosts, plan_cost_ms
from neuroshard_jax.errors import UserError
from neuroshard_jax.types import Plan, Shard, Task


class PlanError(UserError):
    """A plan that breaks the rules (columns not tiled, memory exceeded, unknown device)."""


def validate_plan(plan: Plan) -> None:
    """Raise PlanError unless every column of every table is placed exactly once within memory.

    A table is split into 2^k column shards of equal width, each a multiple of DIM_ALIGNMENT.
    """
    task = plan.task
    by_table: dict[int, list[Shard]] = {t: [] for t in range(task.num_tables)}
    for s in plan.shards:
        if s.table not in by_table:
            raise PlanError(f"plan shard: table index {s.table} is not in the task (0..{task.num_tables - 1})")
        if not 0 <= s.device < task.num_devices:
            raise PlanError(
                f"plan shard of table {task.tables[s.table].id}: device {s.device}, expected 0..{task.num_devices - 1}"
            )
        by_table[s.table].append(s)
    for t, shards in by_table.items():
        table = task.tables[t]
        count = len(shards)
        if count == 0:
            raise PlanError(f"plan: table {table.id} has no shard, expected its {table.dim} columns placed")
        if count & (count - 1) or table.dim % count or (table.dim // count) % DIM_ALIGNMENT:
            raise PlanError(
                f"plan: table {table.id} (dim {table.dim}) has {count} shards, expected 2^k shards of equal width, "
                f"each a multiple of {DIM_ALIGNMENT}"
            )
        width = table.dim // count
        offsets = sorted(s.col_offset for s in shards)
        if any(s.dim != width for s in shards) or offsets != list(range(0, table.dim, width)):
            raise PlanError(f"plan: the shards of table {table.id} do not tile its {table.dim} columns exactly")
    mem = plan.mem_bytes()
    for d, used in enumerate(mem):
        if used > task.mem_cap_bytes:
            raise PlanError(
                f"plan: device {d} holds {used / GIB_BYTES:.3f} GiB, expected at most {task.mem_cap_gb} GiB"
            )


def plan_to_json(
    plan: Plan, costs: DeviceCosts, searcher: str, cost_model: str, seed: int, search_time_s: float
) -> dict[str, Any]:
    """The plan.json object (see README: the contract read by the evaluator and outside tools)."""
    task = plan.task
    mem = plan.mem_bytes()
    dim_sums = plan.dim_sums()
    devices = [
        {
            "device": d,
            "num_shards": len(plan.device_shards(d)),
            "mem_gb": float(mem[d] / GIB_BYTES),
            "dim_sum": int(dim_sums[d]),
            "cost_ms": {
                "compute": float(costs.compute_ms[d]),
                "fwd_comm": float(costs.fwd_comm_ms[d]),
                "bwd_comm": float(costs.bwd_comm_ms[d]),
                "total": float(costs.total_ms[d]),
            },
        }
        for d in range(task.num_devices)
    ]
    return {
        "searcher": searcher,
        "cost_model": cost_model,
        "seed": seed,
        "task": task.to_json(),
        "shards": [
            {"table": task.tables[s.table].id, "col_offset": s.col_offset, "dim": s.dim, "device": s.device}
            for s in sorted(plan.shards, key=lambda s: (s.table, s.col_offset))
        ],
        "devices": devices,
        "cost_ms": float(plan_cost_ms(costs)),
        "search_time_s": float(search_time_s),
    }


def plan_from_json(obj: Any, where: str = "plan") -> Plan:
    """Parse and validate a plan.json object."""
    if not isinstance(obj, dict) or "task" not in obj or "shards" not in obj:
        raise UserError(f"{where}: expected a plan.json object with 'task' and 'shards'")
    task = Task.from_json(obj["task"], where=f"{where}.task")
    index = {t.id: i for i, t in enumerate(task.tables)}
    shards = []
    for i, s in enumerate(obj["shards"]):
        try:
            table, col_offset, dim, device = (int(s[k]) for k in ("table", "col_offset", "dim", "device"))
        except (KeyError, TypeError, ValueError):
            raise UserError(
                f"{where}.shards[{i}]: got {s!r:.80}, expected table, col_offset, dim, device integers"
            ) from None
        if table not in index:
            raise UserError(f"{where}.shards[{i}].table: got {table}, expected a table id of the task")
        shards.append(Shard(index[table], col_offset, dim, device))
    plan = Plan(task, tuple(shards))
    validate_plan(plan)
    return plan


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"plan: {str(path)!r} does not exist, expected a plan.json file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"plan: cannot read {str(path)!r} as JSON ({err})") from None
    return plan_from_json(obj, where=f"plan {path.name}")


def format_plan(plan_json: dict[str, Any]) -> str:
    """A per-device summary table of a plan.json object."""
    task = plan_json["task"]
    lines = [
        f"searcher={plan_json['searcher']} cost_model={plan_json['cost_model']} seed={plan_json['seed']} "
        f"tables={len(task['tables'])} devices={task['num_devices']} cap={task['mem_cap_gb']} GiB "
        f"batch={task['batch_size']}",
        f"{'device':>6} {'shards':>6} {'dim_sum':>7} {'mem_GB':>7} {'compute':>9} {'fwd_comm':>9} "
        f"{'bwd_comm':>9} {'total_ms':>9}",
    ]
    for d in plan_json["devices"]:
        c = d["cost_ms"]
        lines.append(
            f"{d['device']:>6} {d['num_shards']:>6} {d['dim_sum']:>7} {d['mem_gb']:>7.3f} {c['compute']:>9.3f} "
            f"{c['fwd_comm']:>9.3f} {c['bwd_comm']:>9.3f} {c['total']:>9.3f}"
        )
    lines.append(
        f"predicted cost: {plan_json['cost_ms']:.3f} ms (max over devices); search {plan_json['search_time_s']:.2f} s"
    )
    return "\n".join(lines)
