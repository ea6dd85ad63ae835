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
tables below ``other_share`` of every device's compute drawn as one "other" block, so 64 devices stay readable;
beyond ``BARS_UP_TO`` devices the bars become stacked areas (matplotlib: the ``report`` extra).

A plan on many devices prints the slowest few and a summary (``core.plan_file.printed_devices``), and a plan on
far more devices than the cost model's comm was trained on says so (``far_devices_warning``). Everything here is
linear in the devices: shards are grouped by device once, and a split's variants rescore only the devices that
change, the comm of every device in one jitted call per chunk of variants.

Why one module of ~600 lines: the explanation is one record (``Explanation``) built from one scoring of the plan:
where each device's time goes, the splits' gains and the binding memory read the same per-device arrays, and the
printout and the chart read the record; apart, each would score the plan again.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np
from omegaconf import DictConfig

from neuroshard_jax.core.assignment import INPUT_TYPES, apart_arrays
from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import bounded, check_bounds, typed
from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.constraints import allowed_devices, groups, max_levels
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import NUM_FEATURES
from neuroshard_jax.core.files import read_json
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.plan_file import device_list, devices_summary, load_plan, printed_devices
from neuroshard_jax.core.sharding import Shard, replica_features, row_split_count
from neuroshard_jax.core.task import memory_words
from neuroshard_jax.costs.choice import CostModelSpec, build_cost_model, model_names, spec_of
from neuroshard_jax.costs.cost_model import (
    CostFns,
    CostModel,
    DeviceArrays,
    DeviceCosts,
    bucket,
    combine_costs,
    plan_cost_ms,
)
from neuroshard_jax.costs.coverage import far_devices_warning, out_of_depth_warning
from neuroshard_jax.costs.scoring import (
    device_input_ms,
    device_uncertainty,
    fitted_ms,
    input_taken,
    pad_plans,
    plan_dim_sums,
    score_plan,
    shard_costs,
    shard_row,
)
from neuroshard_jax.measure.chart import ChartData, chart
from neuroshard_jax.measure.diff import format_diff, plan_diff

VARIANT_CHUNK = 8  # split variants whose every device's comm is priced in one step (bounds memory at many devices)


@dataclasses.dataclass(frozen=True)
class ExplainConfig:
    """conf/explain.yaml."""

    plan: str | None = None  # the plan.json to explain
    base: str | None = None  # another plan.json of the same task: print what changed between them instead
    # the cost model whose predictions explain the plan (analytic, neural, a model's name or checkpoint folder); null:
    # the one that made it (plan.json's cost_model), where this machine has it
    model: str | None = None
    top: int = bounded(at_least=1, default=5)  # how many of the slowest device's tables to name
    chart: bool = True  # write PLAN.png beside the plan: a stacked bar per device of its tables' compute
    # tables below this share of every device's compute are drawn as "other"
    other_share: float = bounded(above=0, default=0.03)

    def __post_init__(self):
        check_bounds(self)
        if self.other_share >= 1:
            raise UserError(f"other_share: got {self.other_share}, expected a share below 1")


class Measured(NamedTuple):
    """Measured costs of a plan's devices (f64[N] each, ms) and where they came from."""

    compute_ms: np.ndarray
    total_ms: np.ndarray
    source: str


class SplitGain(NamedTuple):
    """A split table (``split_gains``): its slices and their devices, the best device to hold it whole (None: it
    fits on none of them) and the predicted gain of the split there (the plan's cost with the table whole there minus
    the plan's), and its row blocks where its slices are row blocks (None otherwise)."""

    slices: int
    devices: list[int]
    whole_on: int | None = None
    gain_ms: float | None = None
    row_blocks: int | None = None


class ExplainedDevice(NamedTuple):
    """One device of an ``Explanation``: its shards, predicted costs (ms), memory and room (GiB), relative speed,
    and its measured costs where there are some (None otherwise)."""

    device: int
    shards: int
    compute_ms: float
    fwd_comm_ms: float
    bwd_comm_ms: float
    total_ms: float
    mem_gb: float
    headroom_gb: float
    speed: float
    measured_ms: float | None = None
    measured_compute_ms: float | None = None
    # the kernels it runs, one per kind of its tables (``core.table.KERNEL_KINDS``) and data type (``sum/fp16``)
    kernels: tuple[str, ...] = ()


class TopTable(NamedTuple):
    """A table of the slowest device: its predicted share of the device's compute, in ms and as a fraction."""

    table: str
    compute_ms: float
    share: float


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Everything the printout and the chart say of a plan (``explanation``). ``table_compute_ms`` f64[N, T]: each
    table's share of each device's compute (N x T floats are too many for lists at 100,000 devices); ``hosts``,
    ``inputs``: a line on how a multi-host task's comm is scaled and on TorchRec's input distribution (None where
    they do not apply)."""

    cost_model: str
    devices: list[ExplainedDevice]
    speeds_differ: bool
    critical_device: int
    max_over_mean: float
    spread_ms: float
    top_tables: list[TopTable]
    splits: dict[str, SplitGain]  # by table name
    binds: list[str]
    table_compute_ms: np.ndarray
    tables: list[str]
    hosts: str | None = None
    inputs: str | None = None
    memory: str | None = None  # the fullest device's memory by part (weights, optimizer state, step buffers)

    @property
    def measured(self) -> bool:
        """Whether the devices carry measured costs."""
        return self.devices[0].measured_ms is not None


def shards_by_device(plan: Plan) -> list[list[Shard]]:
    """Each device's shards in plan order: ``Plan.device_shards`` of every device in one pass (O(S + N), not
    O(S x N))."""
    out: list[list[Shard]] = [[] for _ in range(plan.task.num_devices)]
    for s in plan.shards:
        out[s.device].append(s)
    return out


def _compute_ms(model: CostModel, rows: list[list[tuple[np.ndarray, bool]]]) -> np.ndarray:
    """f64[K]: the predicted compute of K devices, each holding ``rows[k]`` (features and mask of its shards) before
    the devices' speeds; one batched call, padded to power-of-two buckets (few compilations)."""
    width = bucket(max(len(r) for r in rows))
    feats = np.zeros((bucket(len(rows)), width, NUM_FEATURES), np.float32)
    mask = np.zeros(feats.shape[:2], bool)
    for k, row in enumerate(rows):
        for j, (f, m) in enumerate(row):
            feats[k, j], mask[k, j] = f, m
    return np.asarray(shard_costs(model.fns, model.params, feats, mask), np.float64)[: len(rows)]


def table_compute_ms(model: CostModel, plan: Plan, compute_ms: np.ndarray) -> np.ndarray:
    """f64[N, T]: each table's share of each device's predicted compute (its shards' cost alone, scaled to add up
    to the device's compute). Each shard is priced once, a data-parallel table's part once for every device."""
    model = model.for_task(plan.task)  # a cached table's misses are its own
    task = plan.task
    task_feats = task.features()
    alone_rows = [[shard_row(task, task_feats, s)] for s in plan.shards]
    alone_rows += [[(replica_features(task_feats[t], task.num_devices), True)] for t in plan.data_parallel]
    alone = _compute_ms(model, alone_rows)
    out = np.zeros((task.num_devices, task.num_tables))
    count = len(plan.shards)
    if count:
        index = np.array([(s.device, s.table) for s in plan.shards]).T
        np.add.at(out, (index[0], index[1]), alone[:count])
    for j, t in enumerate(plan.data_parallel):  # each device's part of a replica
        out[:, t] += alone[count + j]
    totals = out.sum(axis=1, keepdims=True)
    return np.divide(out * compute_ms[:, None], totals, out=np.zeros_like(out), where=totals > 0)


@functools.partial(jax.jit, static_argnums=0)
def _plan_costs_ms(fns: CostFns, params, compute_ms, devices: DeviceArrays, device_mask, speed):
    """Plan costs f32[B] of B plans of one task that differ on a few devices: their compute f32[B, N] (before the
    speeds), all-to-all widths, row groups' collectives f32[B, N] and all-to-alls apart f32[B, G, N]; one plan at a
    time (memory O(N))."""

    def one(args):
        compute, devices = args
        return plan_cost_ms(combine_costs(fns, params, compute, devices._replace(device_mask=device_mask, speed=speed)))

    return jax.lax.map(one, (compute_ms, devices))


def split_gains(model: CostModel, plan: Plan, costs: DeviceCosts | None = None) -> dict[int, SplitGain]:
    """Per split table: the predicted plan cost if it were whole on the best device holding one of its slices (that
    has the memory), and the gain of the split (that cost minus the plan's; ``None`` if it fits nowhere whole).

    A variant changes the compute of the devices that held the table's slices only: those are rescored, the rest
    keep the plan's (``costs``: the plan's ``score_plan``, if the caller has it); every device's comm is priced
    again (the widths change), variants in chunks."""
    model = model.for_task(plan.task)
    task, n = plan.task, plan.task.num_devices
    by_table: dict[int, list[Shard]] = {}
    for s in plan.shards:
        by_table.setdefault(s.table, []).append(s)
    out, variants = {}, []
    mem, caps = plan.mem_bytes(), task.cap_bytes()
    for table in sorted(t for t, slices in by_table.items() if len(slices) > 1):
        slices = by_table[table]
        devices = sorted({s.device for s in slices})
        rows = task.tables[table].rows
        blocks = row_split_count(slices, rows) if any(not s.whole_rows(rows) for s in slices) else None
        out[table] = SplitGain(len(slices), devices, row_blocks=blocks)
        held = dict.fromkeys(devices, 0)  # bytes of the table's slices on each of its devices
        for s in slices:
            held[s.device] += task.rows_memory(table, s.rows(rows), s.dim).total
        for device in devices:
            if mem[device] - held[device] + task.table_mem_bytes(table) <= caps[device]:
                variants.append((table, device))
    if not variants:
        return out
    by_device = shards_by_device(plan)
    task_feats = task.features()
    replicas = [(replica_features(task_feats[t], n), True) for t in plan.data_parallel]
    changed_rows, changed_at = [], []
    plans = []
    for table, device in variants:
        whole = Shard(table, 0, task.tables[table].dim, device)
        plans.append(dataclasses.replace(plan, shards=(*[s for s in plan.shards if s.table != table], whole)))
        slice_devices = sorted({s.device for s in by_table[table]})
        changed_at.append(slice_devices)
        for d in slice_devices:
            kept = [s for s in by_device[d] if s.table != table] + ([whole] if d == device else [])
            changed_rows.append([shard_row(task, task_feats, s) for s in kept] + replicas)
    changed = iter(_compute_ms(model, changed_rows))
    costs = score_plan(model, plan) if costs is None else costs
    base = np.asarray(costs.compute_ms) * task.speeds()  # the plan's compute before the speeds
    computes = [base]
    for slice_devices in changed_at:
        compute = base.copy()
        compute[slice_devices] = [next(changed) for _ in slice_devices]
        computes.append(compute)
    totals = _variant_costs(model, plan, [plan, *plans], computes)
    for (table, device), cost in zip(variants, totals[1:]):
        gain = float(cost - totals[0])
        if out[table].gain_ms is None or gain < out[table].gain_ms:
            out[table] = out[table]._replace(whole_on=device, gain_ms=gain)
    return out


def _variant_costs(model: CostModel, plan: Plan, plans: list[Plan], computes: list[np.ndarray]) -> np.ndarray:
    """f64[K]: the predicted costs of ``plans`` (of ``plan``'s task) from their devices' compute f64[N] (before the
    speeds), their widths and row groups' collectives worked out here; chunks of ``VARIANT_CHUNK``."""
    n = plan.task.num_devices
    mask, speed = np.ones(n, bool), plan.task.speeds().astype(np.float32)
    out = []
    for start in range(0, len(plans), VARIANT_CHUNK):
        chunk = plans[start : start + VARIANT_CHUNK]
        compute = np.stack(computes[start : start + VARIANT_CHUNK]).astype(np.float32)
        dims = np.stack([plan_dim_sums(p, model) for p in chunk]).astype(np.float32)
        apart = np.stack([apart_arrays(p, model.prices_rows) for p in chunk])
        devices = DeviceArrays(dims, None, None, fitted_ms(model, chunk), apart)  # mask and speed: the task's
        compute, devices = pad_plans((compute, devices), VARIANT_CHUNK)  # one padded shape: one compilation
        out.append(np.asarray(_plan_costs_ms(model.fns, model.params, compute, devices, mask, speed)))
    return np.concatenate(out)[: len(plans)].astype(np.float64)


def measured_devices(plan_path: Path, plan: Plan) -> Measured | None:
    """Measured per-device costs from evaluation.json beside the plan or the plan's polishing record (None: neither
    has them)."""
    evaluation = plan_path.with_name("evaluation.json")
    if evaluation.exists():
        obj = read_json(evaluation, str(evaluation), "an evaluation.json of python -m neuroshard_jax.evaluate")
        try:
            devices = obj["devices"]
            ours = Path(obj["plan"]).resolve() == plan_path.resolve()
            ours = ours and obj.get("predicted_cost_ms") == (plan.costs.cost_ms if plan.costs else None)
            if ours and len(devices) == plan.task.num_devices:
                compute, total = (np.array([float(d[k]) for d in devices]) for k in ("compute", "total"))
                return Measured(compute, total, "evaluation.json")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise UserError(
                f"{evaluation}: not an evaluation.json of python -m neuroshard_jax.evaluate (plan, devices with "
                "compute and total)"
            ) from None
    if plan.polish is not None:
        devices = plan.polish.devices
        compute, total = np.array([d.compute for d in devices]), np.array([d.total for d in devices])
        return Measured(compute, total, "polishing record (compute measured, comm predicted until its final check)")
    return None


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
        and (task.tables[t].constraints.no_split or task.tables[t].constraints.max_shards is not None)
    ]
    if capped:
        out.append(f"no_split/max_shards: tables {', '.join(capped[:5])} may not be split further")
    return out


def explanation(plan: Plan, model: CostModel, measured: Measured | None = None, top: int = 5) -> Explanation:
    """Everything the printout and the chart say of ``plan`` under ``model`` (and ``measured``, its devices'
    measured costs, if any)."""
    model = model.for_task(plan.task)  # the plan's tables in tiered memory priced as it caches them
    costs = score_plan(model, plan)
    compute, total = np.asarray(costs.compute_ms), np.asarray(costs.total_ms)
    per_table = table_compute_ms(model, plan, compute)
    names = plan.task.table_names()
    mem, step = plan.mem_bytes(), plan.task.step_memory().total  # the tables' bytes; what the batch adds
    caps = plan.task.cap_bytes()
    speeds = plan.task.speeds()
    critical = int(np.argmax(total))
    fastest = int(np.argmin(total))
    order = np.argsort(-per_table[critical])
    top_tables = [
        TopTable(names[t], float(per_table[critical, t]), float(per_table[critical, t] / max(compute[critical], 1e-12)))
        for t in order[:top]
        if per_table[critical, t] > 0
    ]
    binds = []
    for entry in top_tables if fastest != critical else ():  # one device (or all alike): nowhere to move to
        t = names.index(entry.table)
        moved = sum(plan.task.table_mem_bytes(t, s.dim) for s in plan.device_shards(critical) if s.table == t)
        if mem[fastest] + moved > caps[fastest]:
            binds.append(
                f"memory: table {entry.table} cannot move from device {critical} to the least loaded "
                f"device {fastest} ({(mem[fastest] + moved + step) / GIB_BYTES:.3f} GiB > "
                f"{plan.task.room_bytes()[fastest] / GIB_BYTES:.3f} GiB for training)"
            )
    binds += constraint_binds(plan, critical, fastest)
    splits = {names[t]: g for t, g in split_gains(model, plan, costs).items()}
    n = plan.task.num_devices
    columns = [  # one list per field, then a record per device: no per-device numpy indexing
        list(range(n)),
        np.bincount([s.device for s in plan.shards], minlength=n).tolist(),
        compute.tolist(),
        np.asarray(costs.fwd_comm_ms).tolist(),
        np.asarray(costs.bwd_comm_ms).tolist(),
        total.tolist(),
        ((mem + step) / GIB_BYTES).tolist(),
        ((caps - mem) / GIB_BYTES).tolist(),
        speeds.astype(np.float64).tolist(),
    ]
    if measured is not None:
        columns += [np.asarray(measured.total_ms, np.float64).tolist(), np.asarray(measured.compute_ms).tolist()]
    kinds = [tuple(sorted({_kernel_name(plan.task, s.table) for s in plan.device_shards(d)})) for d in range(n)]
    return Explanation(
        cost_model=model.name,
        devices=[ExplainedDevice(*row)._replace(kernels=k) for row, k in zip(zip(*columns), kinds)],
        speeds_differ=plan.task.has_speeds,
        critical_device=critical,
        max_over_mean=float(total.max() / max(total.mean(), 1e-12)),
        spread_ms=float(total.max() - total.min()),
        top_tables=top_tables,
        splits=splits,
        binds=binds,
        table_compute_ms=per_table,
        tables=names,
        hosts=_hosts_line(plan.task) if plan.task.multi_host else None,
        memory=_memory_line(plan, mem),
        inputs=_input_line(model, plan),
    )


def _kernel_name(task, index: int) -> str:
    """The kernel table ``index`` runs in: its kind, and its data type where it is not the task's (``sum/fp16``: a
    kernel apart, as TorchRec groups a device's tables by data type)."""
    table = task.tables[index]
    own = task.table_precision(index)
    return table.kernel if own == task.precision else f"{table.kernel}/{own}"


def _input_line(model: CostModel, plan: Plan) -> str | None:
    """The share of the forward comm that is TorchRec's input distribution, if priced (None otherwise)."""
    n = plan.task.num_devices
    if model.input_dist is None or n < 2:
        return None
    taken = input_taken(plan)
    ms = device_input_ms(model.input_dist, [plan], taken[None])[0]
    kinds = [kind.replace("_", "-") for kind, row in zip(INPUT_TYPES, taken) if row.sum() > 0]
    return (
        f"of fwd_comm, TorchRec's input distribution ({' and '.join(kinds)}: {len(kinds)} ids' all-to-all"
        f"{'s' if len(kinds) > 1 else ''}): {ms.min():.3f}..{ms.max():.3f} ms per device (fit {model.input_dist.name})"
    )


def _hosts_line(task) -> str:
    """How a multi-host task's comm is scaled, in one line."""
    scale, links = task.comm_scale(), task.links
    return (
        f"{len(set(task.hosts()))} hosts ({links.intra_host_gbps:g} GB/s within, {links.inter_host_gbps:g} GB/s "
        f"between): comm predicted on one host and scaled x{scale.min():.2f}..{scale.max():.2f} by the devices' "
        "off-host peers (an analytic extrapolation)"
    )


def _memory_line(plan: Plan, mem: np.ndarray) -> str:
    """The fullest device's memory by part, against its room (cap less the reserve)."""
    fullest = int(np.argmax(mem))
    room = plan.task.room_bytes()[fullest] / GIB_BYTES
    words = memory_words(plan.task, plan.memory()[fullest])
    return f"memory: the fullest device {fullest} holds {words} of {room:.3f} GiB for training"


def format_explanation(expl: Explanation, measured_from: str | None = None) -> str:
    """The printout of ``explanation``: a row per device (beyond ``PRINTED_DEVICES``: the slowest few, the fastest
    and a summary), what binds, and the split tables' gains."""
    has_measured = expl.measured
    speeds = expl.speeds_differ
    kinds = any(k != ("sum",) and k for d in expl.devices for k in (d.kernels,))  # a column where any is not sum
    head = (
        (
            f"{'device':>6} {'shards':>6} {'compute':>9} {'fwd_comm':>9} {'bwd_comm':>9} {'total_ms':>9} "
            f"{'mem_GB':>7} {'free_GB':>7}"
        )
        + (f" {'speed':>6}" if speeds else "")
        + (f" {'measured':>9}" if has_measured else "")
        + ("  kernels" if kinds else "")
    )
    lines = [
        f"predicted by cost_model={expl.cost_model}"
        + (f"; measured: {measured_from}" if has_measured else "")
        + ("; compute divided by each device's relative speed" if speeds else ""),
        *([expl.hosts] if expl.hosts is not None else []),
        *([expl.inputs] if expl.inputs is not None else []),
        *([expl.memory] if expl.memory is not None else []),
        head,
    ]
    total_ms = [d.total_ms for d in expl.devices]
    shown = printed_devices(total_ms)
    fastest = shown[-1] if len(shown) < len(total_ms) else None  # a summarised table ends with the fastest
    for d in (expl.devices[i] for i in shown):
        mark = " <- slowest" if d.device == expl.critical_device else ""
        mark = " <- fastest" if d.device == fastest and not mark else mark
        lines.append(
            f"{d.device:>6} {d.shards:>6} {d.compute_ms:>9.3f} {d.fwd_comm_ms:>9.3f} "
            f"{d.bwd_comm_ms:>9.3f} {d.total_ms:>9.3f} {d.mem_gb:>7.3f} {d.headroom_gb:>7.3f}"
            + (f" {d.speed:>6.2f}" if speeds else "")
            + (f" {d.measured_ms:>9.3f}" if has_measured else "")
            + (f"  {'+'.join(d.kernels) or '-'}" if kinds else "")
            + mark
        )
    lines.extend(devices_summary(total_ms, shown, "not shown (plan.json holds every device's predicted cost)"))
    lines.append(
        f"imbalance: max/mean {expl.max_over_mean:.3f}, spread {expl.spread_ms:.3f} ms, "
        f"critical device {expl.critical_device}"
    )
    tops = ", ".join(f"{t.table} {t.compute_ms:.2f} ms ({100 * t.share:.0f}%)" for t in expl.top_tables)
    lines.append(f"device {expl.critical_device}'s costliest tables: {tops}")
    if expl.splits:
        lines.append("split tables (predicted gain: how much slower the plan would be with the table whole):")
        for name, s in expl.splits.items():
            gain = (
                "fits on none of its devices whole"
                if s.gain_ms is None
                else f"gain {s.gain_ms:+.3f} ms (whole on device {s.whole_on})"
            )
            kind = f"{s.slices} slices" if s.row_blocks is None else f"{s.row_blocks} row blocks (row-wise)"
            lines.append(f"  {name}: {kind} on devices {device_list(s.devices)}, {gain}")
    else:
        lines.append("no table is split")
    lines.extend(f"binds: {b}" for b in expl.binds) if expl.binds else lines.append(
        "binds: nothing (the memory cap leaves room to move the slowest device's top tables)"
    )
    return "\n".join(lines)


def why_chosen(plan: Plan) -> list[str]:
    """Why this plan and not another: the portfolio's pick (the model's score, its margin over the next distinct
    plan) and, where autotune measured the candidates, which was measured fastest, by how much, and whether that
    lead is beyond the rounds' spread."""
    lines = []
    record = plan.portfolio
    if record is not None:
        pick = record.chosen_candidate()
        others = [c for c in record.candidates if c.same_as is None and c.error is None and c.member != pick.member]
        if not others:
            lines.append(f"why this plan: every member of the portfolio made it ({pick.member}'s)")
        else:
            runner = min(others, key=lambda c: c.score_ms)
            lines.append(
                f"why this plan: the model priced {pick.member}'s plan at {pick.score_ms:.3f} ms, "
                f"{100 * record.margin:.1f}% below {runner.member}'s ({runner.score_ms:.3f} ms)"
                + (" - within the model's error; autotune=kernels measures" if record.margin < 0.05 else "")
            )
    tuned = plan.autotune
    if tuned is not None:
        kept = sorted((c for c in tuned.candidates if c.kept), key=lambda c: c.measured_ms)
        won = tuned.chosen_candidate()
        if len(kept) < 2:
            lines.append(f"measured: {won.name}'s plan alone ({won.measured_ms:.3f} ms), nothing to choose between")
        elif tuned.kept_pick:  # a candidate measured faster, but not beyond the noise: the model's pick stands
            lines.append(f"measured ({tuned.mode}, {tuned.rounds} rounds): {won.name}'s plan kept: {tuned.kept_pick}")
        else:
            runner = kept[1]
            lead = 1 - won.measured_ms / runner.measured_ms
            beyond = won.high_ms < min(c.low_ms for c in kept[1:])
            lines.append(
                f"measured ({tuned.mode}, {tuned.rounds} rounds): {won.name}'s plan {won.measured_ms:.3f} ms "
                f"({won.low_ms:.3f}-{won.high_ms:.3f}), {100 * lead:.1f}% faster than {runner.name}'s "
                f"{runner.measured_ms:.3f} ms ({runner.low_ms:.3f}-{runner.high_ms:.3f}): "
                + ("beyond the rounds' spread" if beyond else "within the rounds' spread, a near tie")
            )
        if tuned.bound_ms:
            lines.append(
                f"the task's balance bound from the measured candidates: {tuned.bound_ms:.3f} ms; this plan "
                f"{won.measured_ms / tuned.bound_ms:.3f}x it"
            )
    return lines


def explain_file(config: ExplainConfig, model: CostModel | None = None) -> str:
    """The printout for ``config`` (and the chart beside the plan); ``model``: the cost model to explain with
    (default: ``config.model``, or a model trained at the plan's batch size, with a warning; and a warning if
    the plan is on far more devices than it was trained on, or past its labels: a caller that passes ``model`` has
    said its own)."""
    path = Path(config.plan)
    plan = load_plan(path)
    warnings = []
    if model is None:
        spec, missing = explaining_spec(config.model, plan)
        model, choice = build_cost_model(spec, plan.task, fallback=True)
        far = far_devices_warning(plan.task.num_devices, choice.name, choice.options)
        if plan.calibration is not None and choice.instead is None:  # the factors the plan was searched with
            model = model.calibrated(plan.calibration, plan.task)
        unsure = device_uncertainty(model, plan)  # this model's members, not those of the model that searched
        trust = () if unsure is None else tuple(unsure[1])
        depth = out_of_depth_warning(plan.task, plan, choice.name, choice.options, trust=trust)
        warnings = [w for w in (missing, choice.instead, far, depth) if w]
    model = model.expected
    if config.base:
        text = format_diff(plan_diff(plan, load_plan(config.base, key="base"), model))
    else:
        measured = measured_devices(path, plan)
        expl = explanation(plan, model, measured, config.top)
        text = format_explanation(expl, None if measured is None else measured.source)
        if config.chart:
            comm = [d.fwd_comm_ms + d.bwd_comm_ms for d in expl.devices]
            title = f"predicted cost per device ({expl.cost_model}); slowest: device {expl.critical_device}"
            data = ChartData(np.asarray(expl.table_compute_ms), expl.tables, np.asarray(comm), title)
            text += "\n" + chart(data, path.with_suffix(".png"), config.other_share)
        text += "".join(f"\n{line}" for line in why_chosen(plan))
    return "".join(f"warning: {w}\n" for w in warnings) + text


def explaining_spec(name: str | None, plan: Plan) -> tuple[CostModelSpec, str | None]:
    """The model that explains ``plan``: ``name`` where given, else the one that made it (plan.json's
    ``cost_model``: a model's name, or its checkpoint folder); a maker this machine does not have gives way to the
    model chosen for this machine, and the warning says so (None: no warning)."""
    if name is not None:
        return spec_of(name), None
    made_by = plan.costs.cost_model if plan.costs is not None else None
    if made_by is None or made_by == "neural":  # a plan written before plans named their model
        return spec_of("neural"), None
    try:
        if made_by in model_names() or made_by == "analytic":
            return CostModelSpec(made_by), None
        if Path(made_by).is_dir():
            return CostModelSpec("neural", {"checkpoint": made_by}), None
    except (UserError, OSError):  # a folder that is not a model, a name no path can be: the one chosen here
        pass
    return spec_of(
        "neural"
    ), f"the plan's cost model {made_by!r} is not on this machine: explained with the one chosen here"


def app_config(cfg: DictConfig) -> ExplainConfig:
    return typed(ExplainConfig, resolved(cfg))
