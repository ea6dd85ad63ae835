"""Measured polishing: the returned plan improved on the real kernels until its devices are balanced.

    python -m neuroshard_jax searcher=beam polish=measured [polish.max_measurements=60 polish.budget_s=300]

After any searcher: every device's compute is measured with the evaluator's kernels (``repeats`` interleaved
runs of a cheaper protocol, ``warmup`` + ``iters``; a device's figure is their median). Then, step by step,
local changes that relieve the measured-slowest device are proposed (a shard moved off it, one of its shards
swapped with another device's, a table with a slice on it halved once more with the new halves placed
elsewhere, or a halving of such a table undone; equal 2^k slices and memory caps hold at every step) and
ranked by the cost model corrected by each device's measured residual (measured / predicted of the device it
changes). The best ones are measured, only on the devices they touch, together with the current slowest device
measured again, with the next ``anchors`` - 1 slowest devices (the anchors: a step's factor is the median of
their fresh / first medians, and the new figures are divided by the median of the last 3 steps' factors, so that
devices measured minutes apart compare on one scale); a change is kept when the measured slowest device
(measured compute + predicted comm) improves by more than the measured noise. It stops at
``max_measurements`` (every repeat counts, the final re-measurement included), at ``budget_s``, or when no
proposal improves. The final plan is then re-measured fresh (that figure is reported, not the best of noisy
draws) and its all-to-all measured once; so is the unpolished plan's, for the improvement.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from neuroshard_jax.core.assignment import apart_arrays, assignment, plan_of, row_blocks_in
from neuroshard_jax.core.config import bounded
from neuroshard_jax.core.errors import PlanError, UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.records import MeasuredDevice, PolishProtocol, PolishRecord, PolishStep
from neuroshard_jax.core.sharding import row_shards, split_counts
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import (
    CostModel,
    DeviceArrays,
    DeviceCosts,
    combine_costs,
    plan_cost_ms,
)
from neuroshard_jax.costs.scoring import (
    fitted_ms,
    plan_dim_sums,
    score_plan,
    score_plans_devices,
    with_costs,
)
from neuroshard_jax.kernels.executors import Executor, ExecutorConfig, open_executor, pinned
from neuroshard_jax.measure.evaluator import (
    Measuring,
    device_key,
    device_tables,
    measure_comm,
    measure_tables,
    plan_kernels,
)

MODES = ("off", "measured")
POLISHED = "+polish"  # in benchmarks, a searcher name with this suffix: its plan polished (polish=measured)
ANCHOR = "anchor/"  # the key prefix of the anchor devices among a step's measurements (device keys are hashes)
ANCHOR_WINDOW = 3  # a step's figures are divided by the median of the last this many steps' anchor factors


@dataclasses.dataclass(frozen=True)
class PolishConfig(Measuring):
    """conf/polish/*.yaml (``name``: off | measured)."""

    modes: ClassVar[tuple[str, ...]] = MODES  # what ``name`` may be

    name: str = "off"
    # device measurements, every repeat counted, the final re-measurement included
    max_measurements: int = bounded(at_least=1, default=60)
    budget_s: float = bounded(above=0, default=600.0)  # wall-clock budget of the polishing loop
    repeats: int = bounded(at_least=1, default=2)  # interleaved runs per device measurement; the figure is their median
    warmup: int = bounded(at_least=0, default=2)  # the cheaper protocol (the label protocol: 5 warm-ups, 10 iterations)
    iters: int = bounded(at_least=1, default=5)
    executor: ExecutorConfig = ExecutorConfig(workers=2)  # the main job's executor (conf/executor/)
    # local CPU workers each on a core of their own (less noise; conf/collect.yaml's protocol); null: what the
    # executor supports (pinned local workers, unpinned Ray actors)
    pin: bool | None = None
    device: str = "cpu"  # cpu (FBGEMM CPU, gloo) | cuda (FBGEMM GPU, NCCL)
    candidates: int = bounded(at_least=1, default=64)  # proposals ranked per step
    # of which the best this many are measured (best first) before polishing stops
    tries: int = bounded(at_least=1, default=8)
    # devices re-measured with each step for its drift factor: the slowest, then the next slowest
    anchors: int = bounded(at_least=1, default=3)
    min_gain: float = 0.01  # a kept change improves the measured slowest device by more than this and the noise
    timeout_s: float = bounded(above=0, default=600.0)

    def __post_init__(self):
        if self.name not in MODES:
            raise UserError(f"polish: got {self.name!r}, expected one of {', '.join(MODES)}")
        self.check_measuring("polish")  # its device and every bounded field
        if not 0 <= self.min_gain < 1:
            raise UserError(f"polish.min_gain: got {self.min_gain}, expected a number in [0, 1)")


class Meter:
    """Device measurements of one task: medians of interleaved repeats, cached by device content, counted."""

    def __init__(self, pool: Executor, plan: Plan, config: PolishConfig):
        self.pool, self.task, self.config = pool, plan.task, config
        self.evaluator = config.evaluator()
        self.cache: dict[str, tuple[float, float]] = {}  # key -> (median ms, relative noise)
        self.count = 0
        self.drift: list[float] = []  # each anchored step's factor: its anchors' median fresh / first median

    def _missing(self, plans: list[Plan], fresh: bool = False) -> dict[str, tuple[Task, list]]:
        """The kernels of the plans' devices (``plan_kernels``: a device's shards', its replicas') to measure:
        key -> (the task it runs at, its tables)."""
        out = {}
        for plan in plans:
            for device in plan_kernels(plan):
                for key, at, tables in device:
                    if fresh or key not in self.cache:
                        out[key] = (at, tables)
        return out

    def cost(self, plan: Plan, anchors: list[tuple[str, list]] = ()) -> int:
        """Measurements that ``measure([plan], anchors=anchors)`` would make (its devices not yet measured, and
        the anchors it would re-measure)."""
        missing = self._missing([plan])
        return (len(missing) + len(self._usable(anchors, missing)) * bool(missing)) * self.config.repeats

    def _usable(self, anchors: list[tuple[str, list]], jobs: dict) -> list[tuple[str, list]]:
        """The anchors (key, tables) measured before and not among the new devices ``jobs``."""
        return [(k, tables) for k, tables in anchors if k in self.cache and k not in jobs]

    def fresh_cost(self, plans: list[Plan]) -> int:
        """Measurements that ``measure(plans, fresh=True)`` would make (their distinct devices, every repeat)."""
        return len(self._missing(plans, fresh=True)) * self.config.repeats

    def measure(
        self, plans: list[Plan], fresh: bool = False, anchors: list[tuple[str, list]] = ()
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """(compute ms, relative noise) f64[N] of every plan's devices; ``fresh``: measure all their devices
        again, in one interleaved batch (the same conditions for every plan). ``anchors`` (key, tables): devices
        measured before, measured again among the new ones: the step's factor is the median of their fresh / first
        medians, and the new medians are divided by the median of the last ``ANCHOR_WINDOW`` steps' factors, so
        that devices measured minutes apart compare on one scale (this machine's speed moves by 14% between batches
        seconds apart, a device against one anchor still by 7.5%: ``tools/measure_noise.py steps``)."""
        jobs = self._missing(plans, fresh)
        anchors = self._usable(anchors, jobs) if jobs else []
        for i, (_, tables) in enumerate(anchors):
            jobs[f"{ANCHOR}{i}"] = (self.task, tables)
        answers = measure_tables(
            jobs, self.evaluator, self.pool, self.config.repeats, "polish: a device measurement failed"
        )
        runs = {k: [a.total_ms for a in values] for k, values in answers.items()}
        self.count += len(jobs) * self.config.repeats
        scale = 1.0
        if anchors:
            ratios = []
            for i, (key, _) in enumerate(anchors):
                now, first = statistics.median(runs.pop(f"{ANCHOR}{i}")), self.cache[key][0]
                if first > 0:
                    ratios.append(now / first)
            self.drift.append(round(statistics.median(ratios), 4) if ratios else 1.0)
            # the speed moves over minutes, one anchor's median of 2 by its noise (one read 1.48 among 0.96-1.02):
            # the median of the last few anchors, so that no single outlier makes a change look better than it is
            scale = statistics.median(self.drift[-ANCHOR_WINDOW:])
        for k, values in runs.items():
            raw = statistics.median(values)
            self.cache[k] = (raw / scale, (max(values) - min(values)) / 2 / raw if raw > 0 else 0.0)
        out = []
        speed = self.task.speeds()  # heterogeneous devices: measured on identical ones, divided by their speeds
        for plan in plans:
            compute, noise = np.zeros(self.task.num_devices), np.zeros(self.task.num_devices)
            for d, device in enumerate(plan_kernels(plan)):
                kernels = [self.cache[key] for key, _, _ in device]  # its kernels add up
                compute[d] = sum(ms for ms, _ in kernels)
                noise[d] = max((n for _, n in kernels), default=0.0)
            out.append((compute / speed, noise))
        return out


def proposals(plan: Plan, slow: int, rng: np.random.Generator, count: int) -> list[tuple[str, Plan]]:
    """Up to ``count`` distinct valid local changes of ``plan`` that take work off device ``slow``: its column
    slices moved, swapped, halved or merged, and (on several hosts) a row-split table with a block on it laid out
    again over every device or within another host (TorchRec runs row blocks in rank order: ``row_wise`` or
    ``table_row_wise``, so a block is never moved alone)."""
    task = plan.task
    n = task.num_devices
    _, devices = assignment(plan)
    blocks = row_blocks_in(plan)
    on_slow = [(t, i) for t, devs in enumerate(devices) for i, d in enumerate(devs) if d == slow]
    others = [d for d in range(n) if d != slow]
    moves: list[tuple[str, tuple]] = []
    for t, i in on_slow:
        for d in others:
            moves.append(("move", _set(devices, t, i, d)))
            for u, devs in enumerate(devices):
                for j, e in enumerate(devs):
                    if e == d and (u, j) != (t, i):
                        moves.append(("swap", _set(_set(devices, t, i, d), u, j, slow)))
        if 2 * len(devices[t]) in split_counts(task.tables[t].dim):
            for d in others:  # halve every slice of t; the new half of each slice on ``slow`` goes to d
                halves = [h for e in devices[t] for h in (e, d if e == slow else e)]
                moves.append(("halve", _replace(devices, t, halves)))
        if len(devices[t]) > 1:  # undo a halving: each merged pair goes where one of its halves is, off slow
            pairs = [devices[t][2 * j : 2 * j + 2] for j in range(len(devices[t]) // 2)]
            merged = [p[1] if p[0] == slow else p[0] for p in pairs]
            moves.append(("merge", _replace(devices, t, merged)))
    moves = [(kind, changed, blocks) for kind, changed in moves] + [
        ("rows", devices, layout) for layout in _row_layouts(task, blocks, slow)
    ]
    # devices interchangeable for a plan's cost: of one cap, speed and comm scale (hosts), and (where tables are
    # pinned or exclude devices) only each device with itself
    placed_by_user = any(t.constraints.pin is not None or t.constraints.exclude for t in task.tables)
    alike = zip(task.caps_gb(), task.speeds(), task.comm_scale())
    kinds = [(cap, speed, scale, d if placed_by_user else -1) for d, (cap, speed, scale) in enumerate(alike)]
    seen, out = {(_contents(devices, kinds), _placed(blocks))}, []
    for k in rng.permutation(len(moves)):
        kind, changed, laid = moves[k]
        key = (_contents(changed, kinds), _placed(laid))
        if key in seen:  # the same devices up to their order (and blocks where they were): the same measured plan
            continue
        try:
            out.append((kind, plan_of(task, changed, laid, plan.data_parallel, plan.merge_column_wise).validate()))
        except PlanError:  # over a device's memory, or a constraint
            continue
        seen.add(key)
        if len(out) == count:
            break
    return out


def _row_layouts(task, blocks: tuple, slow: int) -> list[tuple]:
    """The row blocks with one whole-width row-split table that has a block on ``slow`` laid out over every device
    or over another host's devices (``Task.host_groups``); none on one host."""
    groups = task.host_groups()
    if groups is None:
        return []
    out = []
    for t in sorted({s.table for s in blocks if s.device == slow}):
        table, mine = task.tables[t], [s for s in blocks if s.table == t]
        if any(s.col_offset != 0 or s.dim != table.dim for s in mine):  # row blocks of column slices: not exported
            continue
        rest = tuple(s for s in blocks if s.table != t)
        for group in [list(range(task.num_devices)), *groups]:
            if sorted(s.device for s in mine) != group and table.rows >= len(group):
                out.append(rest + row_shards(t, table.rows, table.dim, group))
    return out


def _placed(blocks: tuple) -> tuple:
    return tuple(sorted((s.table, s.device, s.col_offset, s.row_offset) for s in blocks))


def _contents(devices: tuple, kinds: list) -> tuple:
    """The plan's devices as an unordered collection of contents (each device's kind: (cap, speed, index or -1),
    then per table: its slice count, slices here): plans that differ only by the labels of devices of one kind cost
    the same."""
    per_device = [
        (kind, *((t, len(devs), devs.count(d)) for t, devs in enumerate(devices) if d in devs))
        for d, kind in enumerate(kinds)
    ]
    return tuple(sorted(per_device))


def _set(devices: tuple, t: int, i: int, d: int) -> tuple:
    return _replace(devices, t, [*devices[t][:i], d, *devices[t][i + 1 :]])


def _replace(devices: tuple, t: int, new) -> tuple:
    return (*devices[:t], tuple(int(x) for x in new), *devices[t + 1 :])


def corrected(model: CostModel, base: Plan, measured: np.ndarray, candidates: list[Plan], meter: Meter) -> np.ndarray:
    """Estimated compute f64[C, N] of candidate plans: per device, the measured compute where its content was
    measured, else the model's prediction times the measured / predicted ratio of the device it replaces (of the
    whole plan where that device was empty)."""
    base_pred = score_plan(model, base).compute_ms
    busy = base_pred > 0
    overall = measured[busy].sum() / base_pred[busy].sum() if busy.any() else 1.0  # for a device empty in ``base``
    ratio = np.where(busy, measured / np.maximum(base_pred, 1e-9), overall)
    costs, _ = score_plans_devices(model, candidates, uncertainty=False)
    estimate = costs.compute_ms * ratio[None, :]
    speeds = base.task.speeds()
    for c, plan in enumerate(candidates):
        for d, device in enumerate(plan_kernels(plan)):
            keys = [key for key, _, _ in device]
            if all(key in meter.cache for key in keys):  # raw kernel ms: divided by the device's speed like ``measure``
                estimate[c, d] = sum(meter.cache[key][0] for key in keys) / speeds[d]  # 0 for an empty device
    return estimate


def step_anchors(plan: Plan, straggling: np.ndarray, count: int) -> list[tuple[str, list]]:
    """A step's anchors: the ``count`` busiest devices of ``plan`` by ``straggling`` (measured compute + predicted
    backward comm, f64[N]; the straggler first), each as (key, tables) of its content now (a change may alter it:
    its old content measured again still reads the machine's speed); empty devices are never anchors."""
    out = []
    for d in np.argsort(-straggling, kind="stable")[:count]:
        tables = device_tables(plan.task, plan.device_shards(int(d)))
        if tables:
            out.append((device_key(plan.task, tables), tables))
    return out


def simulate(model: CostModel, plans: list[Plan], compute: np.ndarray) -> DeviceCosts:
    """The simulator formula (``combine_costs``) on given compute f64[K, N]: predicted comm, each device's
    straggler wait from the given compute. DeviceCosts of f64[K, N]."""
    dim_sums = np.stack([plan_dim_sums(p, model) for p in plans])
    apart = np.stack([apart_arrays(p, model.prices_rows) for p in plans])
    devices = DeviceArrays(dim_sums, np.ones_like(dim_sums, bool), None, fitted_ms(model, plans), apart)
    costs = _combine(model.fns, model.params, jnp.asarray(compute, jnp.float32), devices)
    return DeviceCosts(*(np.asarray(c, np.float64) for c in costs))


_combine = jax.jit(combine_costs, static_argnums=0)


def polish_plan(plan: Plan, model: CostModel, config: PolishConfig, seed: int = 0) -> Plan:
    """``plan`` polished on the real kernels (``config``), its costs re-predicted by ``model`` and its
    ``polish`` record set (measured per-device costs, measurements, time, the measured improvement)."""
    model = model.expected
    started = time.perf_counter()
    rng = np.random.default_rng([seed, 4441])
    n = plan.task.num_devices
    steps = []
    pin = pinned(config.pin, config.executor)
    with open_executor(config.executor, config.device, config.timeout_s, pin=pin) as pool:
        meter = Meter(pool, plan, config)
        [(measured, noise)] = meter.measure([plan])
        current = plan
        while time.perf_counter() - started < config.budget_s:
            costs = simulate(model, [current], measured[None])
            before = float(plan_cost_ms(costs)[0])
            slow = int(np.argmax(costs.compute_ms[0] + costs.bwd_comm_ms[0]))  # the straggler everyone waits for
            anchors = step_anchors(current, costs.compute_ms[0] + costs.bwd_comm_ms[0], config.anchors)
            candidates = proposals(current, slow, rng, config.candidates)
            if not candidates:
                break
            plans = [p for _, p in candidates]
            estimates = plan_cost_ms(simulate(model, plans, corrected(model, current, measured, plans, meter)))
            order = [c for c in np.argsort(estimates, kind="stable") if estimates[c] < before]
            kept = False
            for c in order[: config.tries]:
                kind, candidate = candidates[c]
                # its own devices, then the final fresh re-measurement of the unpolished plan and this one
                need = meter.cost(candidate, anchors) + meter.fresh_cost([plan, candidate])
                if meter.count + need > config.max_measurements:
                    break
                [(new, new_noise)] = meter.measure([candidate], anchors=anchors)
                new_costs = simulate(model, [candidate], new[None])
                after = float(plan_cost_ms(new_costs)[0])
                new_slow = int(np.argmax(new_costs.compute_ms[0] + new_costs.bwd_comm_ms[0]))
                # noise in ms of the two slowest devices' measured compute; the gain is in ms of the step
                margin = max(
                    config.min_gain * before,
                    float(noise[slow] * measured[slow]),
                    float(new_noise[new_slow] * new[new_slow]),
                )
                steps.append(
                    PolishStep(
                        change=kind,
                        estimated_ms=round(float(estimates[c]), 4),
                        measured_ms=round(after, 4),
                        before_ms=round(before, 4),
                        kept=before - after > margin,
                    )
                )
                if steps[-1].kept:
                    current, measured, noise, kept = candidate, new, new_noise, True
                    break
            if not kept:
                break
        # both plans re-measured fresh, interleaved: no best-of-noisy-draws, the same conditions for both
        changed = set(current.shards) != set(plan.shards)  # slices moved or row blocks laid out again
        fresh = meter.measure([plan, current] if changed else [plan], fresh=True)
        (initial, initial_noise), (final, final_noise) = fresh[0], fresh[-1]
        evaluator = config.evaluator()
        fwd, bwd = measure_comm([plan, current] if changed else [plan], [list(initial), list(final)], evaluator, pool)
        fwd, bwd = (fwd[0], fwd[-1]), (bwd[0], bwd[-1])
    compute_before, compute_after = float(initial.max()), float(final.max())
    before_ms = float(max(c + f + b for c, f, b in zip(initial, fwd[0], bwd[0])))
    after_ms = float(max(c + f + b for c, f, b in zip(final, fwd[1], bwd[1])))
    # Never worse: when the fresh measurement puts the changed plan's slowest device above the plan as it came
    # (the kept changes relieved a device that was slow only by noise), the plan as it came is returned.
    rejected = compute_after if changed and compute_after > compute_before else None
    if rejected is not None:
        current, final, final_noise, fwd, bwd = plan, initial, initial_noise, (fwd[0],) * 2, (bwd[0],) * 2
        compute_after, after_ms = compute_before, before_ms
    record = PolishRecord(
        mode="measured",
        measurements=meter.count,
        time_s=round(time.perf_counter() - started, 2),
        changes_kept=sum(s.kept for s in steps),
        reverted=rejected is not None,
        rejected_measured_compute_ms=rejected,
        steps=tuple(steps),
        protocol=PolishProtocol(
            warmup=config.warmup, iters=config.iters, repeats=config.repeats, pin=pin, anchors=config.anchors
        ),
        drift=tuple(meter.drift),
        unpolished_measured_ms=before_ms,
        measured_ms=after_ms,
        improvement=1 - after_ms / before_ms if before_ms > 0 else 0.0,
        unpolished_measured_compute_ms=compute_before,
        measured_compute_ms=compute_after,
        compute_improvement=1 - compute_after / compute_before if compute_before > 0 else 0.0,
        devices=tuple(
            MeasuredDevice(
                device=d,
                compute=float(final[d]),
                noise=float(final_noise[d]),
                fwd_comm=float(fwd[1][d]),
                bwd_comm=float(bwd[1][d]),
                total=float(final[d] + fwd[1][d] + bwd[1][d]),
            )
            for d in range(n)
        ),
    )
    scored = with_costs(model, current)
    scored = dataclasses.replace(scored, searcher=plan.searcher, seed=plan.seed, search_time_s=plan.search_time_s)
    return scored.with_record(PolishRecord, record)
