"""Plans that explain themselves: where each device's time goes, what binds, and what changed between two plans.

    python -m neuroshard_jax.explain plan=PLAN.json   # per device, the slowest device's tables, splits
    python -m neuroshard_jax.explain plan=A.json base=B.json   # which tables moved or were split, side by side
    python -m neuroshard_jax explain=true             # after a run, on its plan.json

Predicted costs come from a cost model (``model=``: the shipped default unless given; the plan's own
predictions are printed as they are). Measured costs come from ``evaluation.json`` beside the plan or from the
plan's polishing record, where present. A table's share of a device's compute is the cost of its shards on their
own, scaled so that the shares add up to the device's predicted compute (the model is not additive: shards on one
device share the kernel's fixed costs). A split's predicted gain is how much the plan's predicted cost would grow
if the table were whole again, on the best device that holds one of its slices and has the memory for it.

``chart=true`` (the default) writes PLAN.png beside the plan: a stacked bar per device of its tables' compute,
tables below ``other_share`` of every device's compute drawn as one "other" block, so 64 devices stay readable
(matplotlib: the ``report`` extra).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import above_zero, at_least, typed
from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.constraints import allowed_devices, groups, max_levels
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.plan_file import load_plan
from neuroshard_jax.core.sharding import Shard, row_split_count
from neuroshard_jax.core.types import Plan
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.costs.registry import expected_cost_model, make_cost_model, usable_cost_model
from neuroshard_jax.costs.scoring import plan_arrays, score_plan, score_plans, shard_costs


@dataclasses.dataclass(frozen=True)
class ExplainConfig:
    """conf/explain.yaml."""

    plan: str | None = None  # the plan.json to explain
    base: str | None = None  # another plan.json of the same task: print what changed between them instead
    model: str = "neural"  # the cost model whose predictions explain the plan (analytic, neural or a shipped name)
    top: int = 5  # how many of the slowest device's tables to name
    chart: bool = True  # write PLAN.png beside the plan: a stacked bar per device of its tables' compute
    other_share: float = 0.03  # tables below this share of every device's compute are drawn as "other"

    def __post_init__(self):
        at_least(self, 1, ("top",))
        above_zero(self, ("other_share",))
        if self.other_share >= 1:
            raise UserError(f"other_share: got {self.other_share}, expected a share below 1")


def table_compute_ms(model: CostModel, plan: Plan, compute_ms: np.ndarray) -> np.ndarray:
    """f64[N, T]: each table's share of each device's predicted compute (its shards' cost alone, scaled to add up
    to the device's compute)."""
    feats, mask, _, _ = plan_arrays(plan)
    alone = np.asarray(shard_costs(model.fns, model.params, feats[..., None, :], mask[..., None]), dtype=np.float64)
    alone = np.where(mask, alone, 0.0)
    n, t = plan.task.num_devices, plan.task.num_tables
    out = np.zeros((n, t))
    for d in range(n):
        shards = plan.device_shards(d)
        for j, s in enumerate(shards):
            out[d, s.table] += alone[d, j]
        for j, t in enumerate(plan.data_parallel, start=len(shards)):  # each device's part of a replica
            out[d, t] += alone[d, j]
    totals = out.sum(axis=1, keepdims=True)
    return np.divide(out * compute_ms[:, None], totals, out=np.zeros_like(out), where=totals > 0)


def split_gains(model: CostModel, plan: Plan) -> dict[int, dict]:
    """Per split table: the predicted plan cost if it were whole on the best device holding one of its slices (that
    has the memory), and the gain of the split (that cost minus the plan's; ``None`` if it fits nowhere whole). All
    variants are scored in one batched call."""
    out, variants = {}, []
    for table in sorted({s.table for s in plan.shards}):
        slices = [s for s in plan.shards if s.table == table]
        if len(slices) == 1:
            continue
        devices = sorted({s.device for s in slices})
        rows = plan.task.tables[table].rows
        out[table] = {"slices": len(slices), "devices": devices, "whole_on": None, "gain_ms": None}
        if any(not s.whole_rows(rows) for s in slices):
            out[table]["row_blocks"] = row_split_count(slices, rows)
        others = [s for s in plan.shards if s.table != table]
        for device in devices:
            whole = Shard(table, 0, plan.task.tables[table].dim, device)
            variant = dataclasses.replace(plan, shards=(*others, whole))  # only this table changes
            if variant.mem_bytes()[device] <= plan.task.cap_bytes()[device]:
                variants.append((table, device, variant))
    if not variants:
        return out
    costs = score_plans(model, [plan, *(v for _, _, v in variants)])
    for (table, device, _), cost in zip(variants, costs[1:]):
        gain = float(cost - costs[0])
        if out[table]["gain_ms"] is None or gain < out[table]["gain_ms"]:
            out[table].update(whole_on=device, gain_ms=gain)
    return out


def measured_devices(plan_path: Path, plan: Plan) -> tuple[list[dict] | None, str | None]:
    """Measured per-device costs ({compute, fwd_comm, bwd_comm, total}) from evaluation.json beside the plan or the
    plan's polishing record, and where they came from."""
    evaluation = plan_path.with_name("evaluation.json")
    if evaluation.exists():
        try:
            obj = json.loads(evaluation.read_text())
            devices = obj["devices"]
            ours = Path(obj["plan"]).resolve() == plan_path.resolve()
            ours = ours and obj.get("predicted_cost_ms") == (plan.costs.cost_ms if plan.costs else None)
            if ours and len(devices) == plan.task.num_devices:
                return [{k: float(d[k]) for k in ("compute", "total")} for d in devices], "evaluation.json"
        except (ValueError, KeyError, TypeError, AttributeError):
            raise UserError(
                f"{evaluation}: not an evaluation.json of python -m neuroshard_jax.evaluate (plan, devices with "
                "compute and total)"
            ) from None
    if plan.polish and "devices" in plan.polish:
        return plan.polish["devices"], "polishing record (compute measured, comm predicted until its final check)"
    return None, None


def constraint_binds(plan: Plan, critical: int, fastest: int) -> list[str]:
    """The user's constraints that hold work on the critical device: tables pinned there, tables that may not go
    to the least loaded device, colocation groups there, tables at their split limit."""
    task, names = plan.task, plan.task.table_names()
    here = sorted({s.table for s in plan.device_shards(critical)})
    allowed = allowed_devices(task.tables, task.num_devices)
    levels = max_levels(task.tables)
    out = []
    pinned = [names[t] for t in here if allowed[t].sum() == 1]
    if pinned:
        out.append(f"pin: tables {', '.join(pinned[:5])} may only be on device {critical}")
    kept = [names[t] for t in here if allowed[t].sum() > 1 and not allowed[t, fastest]]
    if kept:
        out.append(f"exclude: tables {', '.join(kept[:5])} may not move to the least loaded device {fastest}")
    for group, members in groups(task.tables).items():
        if members[0] in here:
            out.append(f"colocate: group {group!r} ({len(members)} tables) stays together on device {critical}")
    capped = [
        names[t]
        for t in here
        if len(plan.shards_of(t)) >= 1 << int(levels[t])
        and (task.tables[t].no_split or task.tables[t].max_shards is not None)
    ]
    if capped:
        out.append(f"no_split/max_shards: tables {', '.join(capped[:5])} may not be split further")
    return out


def explanation(plan: Plan, model: CostModel, measured: list[dict] | None = None, top: int = 5) -> dict:
    """Everything the printout and the chart say, as a JSON-able dict."""
    costs = score_plan(model, plan)
    compute, total = np.asarray(costs.compute_ms), np.asarray(costs.total_ms)
    per_table = table_compute_ms(model, plan, compute)
    names = plan.task.table_names()
    mem = plan.mem_bytes()
    caps = plan.task.cap_bytes()
    speeds = plan.task.speeds()
    critical = int(np.argmax(total))
    fastest = int(np.argmin(total))
    order = np.argsort(-per_table[critical])
    top_tables = [
        {
            "table": names[t],
            "compute_ms": float(per_table[critical, t]),
            "share": float(per_table[critical, t] / max(compute[critical], 1e-12)),
        }
        for t in order[:top]
        if per_table[critical, t] > 0
    ]
    binds = []
    for entry in top_tables:
        t = names.index(entry["table"])
        moved = sum(plan.task.table_mem_bytes(t, s.dim) for s in plan.device_shards(critical) if s.table == t)
        if mem[fastest] + moved > caps[fastest]:
            binds.append(
                f"memory: table {entry['table']} cannot move from device {critical} to the least loaded "
                f"device {fastest} ({(mem[fastest] + moved) / GIB_BYTES:.3f} GiB > cap "
                f"{plan.task.caps_gb()[fastest]} GiB)"
            )
    binds += constraint_binds(plan, critical, fastest)
    splits = {names[t]: g for t, g in split_gains(model, plan).items()}
    return {
        "cost_model": model.name,
        "devices": [
            {
                "device": d,
                "shards": len(plan.device_shards(d)),
                "compute_ms": float(compute[d]),
                "fwd_comm_ms": float(costs.fwd_comm_ms[d]),
                "bwd_comm_ms": float(costs.bwd_comm_ms[d]),
                "total_ms": float(total[d]),
                "mem_gb": float(mem[d] / GIB_BYTES),
                "headroom_gb": float((caps[d] - mem[d]) / GIB_BYTES),
                "speed": float(speeds[d]),
                **(
                    {"measured_ms": float(measured[d]["total"]), "measured_compute_ms": float(measured[d]["compute"])}
                    if measured
                    else {}
                ),
            }
            for d in range(plan.task.num_devices)
        ],
        "speeds_differ": plan.task.has_speeds,
        **({"hosts": _hosts_line(plan.task)} if plan.task.multi_host else {}),
        "critical_device": critical,
        "max_over_mean": float(total.max() / max(total.mean(), 1e-12)),
        "spread_ms": float(total.max() - total.min()),
        "top_tables": top_tables,
        "splits": splits,
        "binds": binds,
        "table_compute_ms": per_table.tolist(),
        "tables": names,
    }


def _hosts_line(task) -> str:
    """How a multi-host task's comm is scaled, in one line."""
    scale, links = task.comm_scale(), task.links
    return (
        f"{len(set(task.hosts()))} hosts ({links.intra_host_gbps:g} GB/s within, {links.inter_host_gbps:g} GB/s "
        f"between): comm predicted on one host and scaled x{scale.min():.2f}..{scale.max():.2f} by the devices' "
        "off-host peers (an analytic extrapolation)"
    )


def format_explanation(expl: dict, measured_from: str | None = None) -> str:
    has_measured = "measured_ms" in expl["devices"][0]
    speeds = expl.get("speeds_differ", False)
    head = (
        (
            f"{'device':>6} {'shards':>6} {'compute':>9} {'fwd_comm':>9} {'bwd_comm':>9} {'total_ms':>9} "
            f"{'mem_GB':>7} {'free_GB':>7}"
        )
        + (f" {'speed':>6}" if speeds else "")
        + (f" {'measured':>9}" if has_measured else "")
    )
    lines = [
        f"predicted by cost_model={expl['cost_model']}"
        + (f"; measured: {measured_from}" if has_measured else "")
        + ("; compute divided by each device's relative speed" if speeds else ""),
        *([expl["hosts"]] if "hosts" in expl else []),
        head,
    ]
    for d in expl["devices"]:
        mark = " <- slowest" if d["device"] == expl["critical_device"] else ""
        lines.append(
            f"{d['device']:>6} {d['shards']:>6} {d['compute_ms']:>9.3f} {d['fwd_comm_ms']:>9.3f} "
            f"{d['bwd_comm_ms']:>9.3f} {d['total_ms']:>9.3f} {d['mem_gb']:>7.3f} {d['headroom_gb']:>7.3f}"
            + (f" {d['speed']:>6.2f}" if speeds else "")
            + (f" {d['measured_ms']:>9.3f}" if has_measured else "")
            + mark
        )
    lines.append(
        f"imbalance: max/mean {expl['max_over_mean']:.3f}, spread {expl['spread_ms']:.3f} ms, "
        f"critical device {expl['critical_device']}"
    )
    tops = ", ".join(f"{t['table']} {t['compute_ms']:.2f} ms ({100 * t['share']:.0f}%)" for t in expl["top_tables"])
    lines.append(f"device {expl['critical_device']}'s costliest tables: {tops}")
    if expl["splits"]:
        lines.append("split tables (predicted gain: how much slower the plan would be with the table whole):")
        for name, s in expl["splits"].items():
            gain = (
                "fits on none of its devices whole"
                if s["gain_ms"] is None
                else f"gain {s['gain_ms']:+.3f} ms (whole on device {s['whole_on']})"
            )
            kind = f"{s['slices']} slices" if "row_blocks" not in s else f"{s['row_blocks']} row blocks (row-wise)"
            lines.append(f"  {name}: {kind} on devices {s['devices']}, {gain}")
    else:
        lines.append("no table is split")
    lines.extend(f"binds: {b}" for b in expl["binds"]) if expl["binds"] else lines.append(
        "binds: nothing (the memory cap leaves room to move the slowest device's top tables)"
    )
    return "\n".join(lines)


def plan_diff(plan: Plan, base: Plan, model: CostModel) -> dict:
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
                {
                    "table": names[t],
                    "change": kind,
                    "base": [d for _, d in old[t]],
                    "plan": [d for _, d in new[t]],
                    "slices": [len(old[t]), len(new[t])],
                }
            )
    a, b = score_plan(model, plan), score_plan(model, base)
    return {
        "changes": changes,
        "plan_total_ms": np.asarray(a.total_ms).tolist(),
        "base_total_ms": np.asarray(b.total_ms).tolist(),
    }


def format_diff(diff: dict) -> str:
    lines = [f"{len(diff['changes'])} tables changed"]
    for c in diff["changes"]:
        lines.append(
            f"  {c['table']}: {c['change']}, devices {c['base']} -> {c['plan']}"
            + (f" ({c['slices'][0]} -> {c['slices'][1]} slices)" if c["change"] != "moved" else "")
        )
    lines.append(f"{'device':>6} {'base_ms':>9} {'plan_ms':>9} {'change':>8}")
    for d, (b, a) in enumerate(zip(diff["base_total_ms"], diff["plan_total_ms"])):
        lines.append(f"{d:>6} {b:>9.3f} {a:>9.3f} {a - b:>+8.3f}")
    lines.append(
        f"{'max':>6} {max(diff['base_total_ms']):>9.3f} {max(diff['plan_total_ms']):>9.3f} "
        f"{max(diff['plan_total_ms']) - max(diff['base_total_ms']):>+8.3f}"
    )
    return "\n".join(lines)


def write_chart(expl: dict, path: Path, other_share: float) -> Path:
    """A stacked bar per device of its tables' predicted compute; small tables grouped as "other"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    costs = np.asarray(expl["table_compute_ms"])  # [N, T]
    share = costs / np.maximum(costs.sum(axis=1, keepdims=True), 1e-12)
    shown = [t for t in np.argsort(-costs.max(axis=0)) if share[:, t].max() >= other_share][:12]
    n = costs.shape[0]
    fig, ax = plt.subplots(figsize=(max(7.0, 0.22 * n + 4), 4.5))
    bottom = np.zeros(n)
    colors = plt.get_cmap("tab20").colors
    for i, t in enumerate(shown):
        ax.bar(range(n), costs[:, t], bottom=bottom, color=colors[i % len(colors)], label=expl["tables"][t])
        bottom += costs[:, t]
    other = costs.sum(axis=1) - bottom
    ax.bar(range(n), other, bottom=bottom, color="lightgrey", label="other")
    comm = np.array([d["fwd_comm_ms"] + d["bwd_comm_ms"] for d in expl["devices"]])
    ax.bar(range(n), comm, bottom=bottom + other, color="white", edgecolor="grey", hatch="//", label="comm")
    ax.set_xlabel("device")
    ax.set_ylabel("predicted ms")
    ax.set_xticks(range(n) if n <= 32 else range(0, n, max(1, n // 16)))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"predicted cost per device ({expl['cost_model']}); slowest: device {expl['critical_device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def explain_file(config: ExplainConfig, model: CostModel | None = None) -> str:
    """The printout for ``config`` (and the chart beside the plan); ``model``: the cost model to explain with
    (default: ``config.model``, or a model trained at the plan's batch size, with a warning)."""
    path = Path(config.plan)
    plan = load_plan(path)
    warning = None
    if model is None:
        name, options, warning = usable_cost_model(config.model, None, plan.task)
        if plan.calibration and name == config.model:  # the factor the plan was searched with
            options = {**(options or {}), "calibration": plan.calibration["factor"]}
        model = make_cost_model(name, plan.task, options)
    model = expected_cost_model(model)
    if config.base:
        text = format_diff(plan_diff(plan, load_plan(config.base, key="base"), model))
    else:
        measured, source = measured_devices(path, plan)
        expl = explanation(plan, model, measured, config.top)
        text = format_explanation(expl, source)
        if config.chart:
            text += "\n" + chart(expl, path.with_suffix(".png"), config.other_share)
    return (f"warning: {warning}\n" if warning else "") + text


def chart(expl: dict, path: Path, other_share: float) -> str:
    """``write_chart``; a failure is a warning line, so the explanation is never lost to it."""
    try:
        return f"chart written to {write_chart(expl, path, other_share)}"
    except ImportError as err:
        return f"warning: chart not written: matplotlib is missing ({err}); install the report extra"
    except OSError as err:
        return f"warning: chart not written: cannot write {str(path)!r} ({err.strerror or err})"


def app_config(cfg: DictConfig) -> ExplainConfig:
    return typed(ExplainConfig, resolved(cfg))
