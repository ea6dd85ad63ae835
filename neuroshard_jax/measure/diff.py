"""What changed between two plans of one task: the tables moved, split, merged or replicated, and both plans' device
costs by one model (``python -m neuroshard_jax.explain plan=A.json base=B.json``)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.plan_file import PRINTED_DEVICES, SLOWEST_PRINTED, device_list, devices_summary
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.costs.scoring import score_plan


class TableChange(NamedTuple):
    """A table whose layout differs: ``change`` (moved | split | merged | data-parallel | sharded), its devices in
    the base and in the plan, and its slices in each ([base, plan])."""

    table: str
    change: str
    base: list[int]
    plan: list[int]
    slices: list[int]


class PlanDiff(NamedTuple):
    """``plan_diff``: the tables that changed, and both plans' per-device total ms f64[N] by one model."""

    changes: list[TableChange]
    plan_total_ms: np.ndarray
    base_total_ms: np.ndarray


def plan_diff(plan: Plan, base: Plan, model: CostModel) -> PlanDiff:
    """Which tables moved or were split between ``base`` and ``plan`` (same tables), and both plans' device costs."""
    ours, theirs = plan.task.to_json(), base.task.to_json()
    for key in ("num_devices", "mem_cap_gb", "devices", "links", "batch_size", "precision", "tables"):
        if ours.get(key) != theirs.get(key):
            raise UserError(f"base: its task's {key} differs from the plan's, expected two plans of one task")
    names = plan.task.table_names()

    def layout(p: Plan) -> dict[int, list[tuple[int, int]]]:
        out: dict[int, list[tuple[int, int]]] = {}
        for s in sorted(p.shards, key=lambda s: (s.table, s.col_offset)):
            out.setdefault(s.table, []).append((s.dim, s.device))
        for t in p.data_parallel:  # whole on every device
            out[t] = [(p.task.tables[t].dim, d) for d in range(p.task.num_devices)]
        return out

    new, old = layout(plan), layout(base)
    changes = []
    for t in range(len(names)):
        if new[t] != old[t]:
            kind = "moved" if len(new[t]) == len(old[t]) else ("split" if len(new[t]) > len(old[t]) else "merged")
            if (t in plan.data_parallel) != (t in base.data_parallel):
                kind = "data-parallel" if t in plan.data_parallel else "sharded"
            changes.append(
                TableChange(names[t], kind, [d for _, d in old[t]], [d for _, d in new[t]], [len(old[t]), len(new[t])])
            )
    a, b = score_plan(model, plan), score_plan(model, base)
    return PlanDiff(changes, np.asarray(a.total_ms), np.asarray(b.total_ms))


def format_diff(diff: PlanDiff) -> str:
    """The printout of ``plan_diff``: the changed tables, then a row per device (beyond ``PRINTED_DEVICES``: the
    devices whose cost changed most, and a summary of the plan's)."""
    lines = [f"{len(diff.changes)} tables changed"]
    for c in diff.changes:
        lines.append(
            f"  {c.table}: {c.change}, devices {device_list(c.base)} -> {device_list(c.plan)}"
            + (f" ({c.slices[0]} -> {c.slices[1]} slices)" if c.change != "moved" else "")
        )
    lines.append(f"{'device':>6} {'base_ms':>9} {'plan_ms':>9} {'change':>8}")
    base, ours = diff.base_total_ms, diff.plan_total_ms
    shown = list(range(len(ours)))
    if len(ours) > PRINTED_DEVICES:  # the devices whose cost changed most
        shown = np.argsort(-np.abs(ours - base), kind="stable")[:SLOWEST_PRINTED].tolist()
    for d in shown:
        lines.append(f"{d:>6} {base[d]:>9.3f} {ours[d]:>9.3f} {ours[d] - base[d]:>+8.3f}")
    lines.extend(devices_summary(ours, shown, "not shown (those whose cost changed least)"))
    lines.append(f"{'max':>6} {base.max():>9.3f} {ours.max():>9.3f} {ours.max() - base.max():>+8.3f}")
    return "\n".join(lines)
