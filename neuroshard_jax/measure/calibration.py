"""Calibration: the cost model scaled to the machine that measures, from a few measurements of the task's own tables.

    python -m neuroshard_jax searcher=beam calibrate=measured [calibrate.samples=8]
    python -m neuroshard_jax searcher=beam cost_model.calibration=0.91     # a factor measured before

A cost model predicts the label protocol's kernel time on the machine its labels came from. Machines of one
kind drift 5-14% from one day to the next, and a user's tables may sit where the model is off by a steady
factor: either way every device is predicted too fast or too slow by about the same ratio. ``calibrate=measured``
draws ``samples`` devices' worth of the task's own tables (whole tables, shuffled and dealt to the devices by
memory, each group within the smallest device's cap), measures them on the real kernels with the evaluator's
protocol and scales every device's predicted compute by the median of measured / predicted (the
``calibration`` option of the cost model; plan.json records it). One factor changes no ranking of compute; it
makes predicted costs the ones this machine measures and weighs compute against the all-to-all (whose model is
not scaled) as measured. A factor far from 1 says the model is not a model of this machine (``FAR``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import ClassVar

import numpy as np

from neuroshard_jax.core.config import bounded
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.records import (
    CalibrationProtocol,
    CalibrationRatios,
    CalibrationRecord,
    PlanDevices,
    ratio_errors,
)
from neuroshard_jax.core.sharding import Shard
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import CostModel, device_compute_ms
from neuroshard_jax.costs.scoring import score_plan
from neuroshard_jax.kernels.executors import Executor, ExecutorConfig
from neuroshard_jax.measure.evaluator import Measuring, plan_kernels, quiet_devices, quiet_kernels

MODES = ("off", "measured")
ON = ("tables", "plan")  # what is measured: groups of the task's own tables, or the devices of the search's plans
FAR = 0.5  # |log factor| past this (x0.61 .. x1.65): the model measures another machine; the plan says so


@dataclasses.dataclass(frozen=True)
class CalibrateConfig(Measuring):
    """conf/calibrate/*.yaml (``name``: off | measured)."""

    modes: ClassVar[tuple[str, ...]] = MODES  # what ``name`` may be

    name: str = "off"
    # tables: ``samples`` groups of the task's own tables, before the search; plan: the devices of the plan the search
    # returns and of its candidates (a portfolio's), after it, then the search again with the calibrated model
    on: str = "tables"
    samples: int = bounded(at_least=1, default=8)  # devices' worth of the task's tables measured (on=tables)
    warmup: int = bounded(at_least=0, default=5)  # the label protocol, which the models predict
    iters: int = bounded(at_least=1, default=10)
    # readings of a device at most: one read while the machine was busy is measured again
    tries: int = bounded(at_least=1, default=3)
    executor: ExecutorConfig = ExecutorConfig(workers=2)  # the main job's executor (conf/executor/)
    device: str = "cpu"  # cpu (FBGEMM CPU) | cuda (FBGEMM GPU)
    timeout_s: float = bounded(above=0, default=600.0)

    def __post_init__(self):
        if self.name not in MODES:
            raise UserError(f"calibrate: got {self.name!r}, expected one of {', '.join(MODES)}")
        if self.on not in ON:
            raise UserError(f"calibrate.on: got {self.on!r}, expected one of {', '.join(ON)}")
        self.check_measuring("calibrate")  # its device and every bounded field


def sample_devices(task: Task, samples: int, seed: int) -> list[list[int]]:
    """Up to ``samples`` distinct groups of the task's table indices, each one device's worth: the tables that fit
    the smallest device (whole), shuffled and dealt to ``num_devices`` groups, each table to the group with the
    least memory where it fits; as many shuffles as ``samples`` needs (a few more where groups recur), empty groups
    skipped."""
    cap = int(task.cap_bytes().min())
    sizes = np.array([task.table_mem_bytes(t) for t in range(task.num_tables)], np.int64)
    fitting = np.flatnonzero(sizes <= cap)
    if not fitting.size:
        raise UserError(
            "calibrate: no table of the task fits a device whole, expected at least one to measure; plan with "
            "calibrate=off, or give a factor measured before (cost_model.calibration=F)"
        )
    rng = np.random.default_rng([seed, 7127])
    groups: dict[tuple[int, ...], None] = {}
    for _ in range(4 * samples):
        dealt: list[list[int]] = [[] for _ in range(task.num_devices)]
        used = np.zeros(task.num_devices, np.int64)
        for t in rng.permutation(fitting):
            room = np.flatnonzero(used + sizes[t] <= cap)
            if room.size:
                d = room[np.argmin(used[room])]
                dealt[d].append(int(t))
                used[d] += sizes[t]
        groups.update((tuple(sorted(g)), None) for g in dealt if g)
        if len(groups) >= samples:
            break
    return [list(g) for g in list(groups)[:samples]]


def predicted_compute_ms(model: CostModel, task: Task, groups: list[list[int]]) -> np.ndarray:
    """f64[G]: the model's expected compute of each group of whole tables on one device."""
    feats = task.features().astype(np.float32)
    width = max(len(g) for g in groups)
    index = np.zeros((len(groups), width), np.int32)
    mask = np.zeros((len(groups), width), bool)
    for i, g in enumerate(groups):
        index[i, : len(g)], mask[i, : len(g)] = g, True
    expected = model.expected
    return np.asarray(device_compute_ms(expected.fns, expected.params, feats[index], mask), np.float64)


def whole(task: Task, group: list[int]) -> list[Shard]:
    """The tables of ``group``, whole, as one device's shards."""
    return [Shard(t, 0, task.tables[t].dim, 0) for t in group]


def calibrate(
    task: Task, model: CostModel, config: CalibrateConfig, seed: int = 0, executor: Executor | None = None
) -> CalibrationRecord:
    """Measure ``config.samples`` devices' worth of ``task``'s tables (on ``executor``, or kernel workers opened as
    ``config.executor`` says; a reading taken while the machine was busy is taken again, ``config.tries`` in all)
    and compare with ``model`` (uncalibrated): the record plan.json keeps (``factor``: the median measured /
    predicted, the ratios' spread, what was measured, how many devices stayed busy, the seconds it took)."""
    started = time.perf_counter()
    groups = sample_devices(task, config.samples, seed)
    predicted = predicted_compute_ms(model, task, groups)
    measured, busy = quiet_devices(task, [whole(task, g) for g in groups], config.evaluator(), executor, config.tries)
    sizes = [len(g) for g in groups]
    return measured_record(measured, predicted, sizes, config, started, busy, "tables")


def measured_record(measured, predicted, sizes, config: CalibrateConfig, started: float, busy: int, on: str):
    """The ``CalibrationRecord`` of devices measured (ms) and predicted by the uncalibrated model: the factor (their
    median measured / predicted, four significant digits: never rounded to 0), its spread, the devices and their
    tables (``sizes``: tables per device), the protocol, the seconds since ``started``, the busy devices."""
    ratios = np.asarray(measured) / np.maximum(predicted, 1e-9)
    factor = float(f"{np.median(ratios):.4g}")
    return CalibrationRecord(
        factor=factor,
        ratios=CalibrationRatios(
            **{q: float(f"{np.quantile(ratios, p):.4g}") for q, p in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))}
        ),
        devices=len(measured),
        tables_per_device=round(float(np.mean(sizes)), 1),
        measured_ms=tuple(round(float(m), 3) for m in measured),
        predicted_ms=tuple(round(float(p), 3) for p in predicted),
        protocol=CalibrationProtocol(
            device=config.device, warmup=config.warmup, iters=config.iters, tries=config.tries
        ),
        seconds=round(time.perf_counter() - started, 1),
        far=bool(abs(np.log(factor)) > FAR),
        busy=busy,
        on=on,
    )


def calibrated(
    task: Task, model: CostModel, config: CalibrateConfig, seed: int = 0
) -> tuple[CostModel, CalibrationRecord]:
    """``model`` (built for ``task``, a feasible one: ``Planner.run`` checks it before building the model) with its
    compute scaled by the factor measured on ``task`` (the model as trained is what is calibrated), and the record
    plan.json keeps."""
    record = calibrate(task, model.with_compute_scale(1.0, task.comm_scale()), config, seed)
    return model.with_compute_scale(record.factor, task.comm_scale()), record


class PlanReadings:
    """Plans' devices measured on the kernels (``plan_kernels``: a device's kernels summed, divided by its speed),
    every distinct kernel read once (``quiet_kernels``: a reading on a busy machine taken again) and kept, so a later
    plan of the same task measures only the kernels it adds."""

    def __init__(self, config: CalibrateConfig, executor: Executor):
        self.config, self.executor = config, executor
        self.ms: dict[str, float] = {}
        self.busy: set[str] = set()  # kernels with no quiet reading after every try

    def read(self, plans: list[Plan]) -> None:
        """Measure the kernels of ``plans`` not read yet, together (the workers share them out)."""
        kernels = [device for plan in plans for device in plan_kernels(plan)]
        jobs = {key: (task, tables) for device in kernels for key, task, tables in device if key not in self.ms}
        if jobs:
            ms, busy = quiet_kernels(jobs, self.config.evaluator(), self.executor, self.config.tries)
            self.ms.update(ms)
            self.busy |= busy

    def devices(self, plan: Plan) -> np.ndarray:
        """f64[N]: each device's measured compute (0 for an empty device), its kernels read first where not yet."""
        self.read([plan])
        kernels = plan_kernels(plan)
        speeds = plan.task.speeds()
        return np.array([sum(self.ms[key] for key, _, _ in device) / speeds[d] for d, device in enumerate(kernels)])


def calibrate_on_plans(plans: list[Plan], model: CostModel, readings: PlanReadings) -> CalibrationRecord:
    """``calibrate`` on the devices of ``plans`` (the search's plan first, then its candidates; one task): each
    distinct non-empty device measured (``readings``) and predicted by ``model`` (uncalibrated), the factor their
    median measured / predicted."""
    started = time.perf_counter()
    expected = model.expected
    readings.read(plans)
    seen, measured, predicted, sizes, busy = set(), [], [], [], 0
    for plan in plans:
        got = readings.devices(plan)
        guess = np.asarray(score_plan(expected, plan).compute_ms, np.float64)
        for d, kernels in enumerate(plan_kernels(plan)):  # a device two plans share counts once
            key = tuple(k for k, _, _ in kernels)
            if key and key not in seen and got[d] > 0:
                seen.add(key)
                measured.append(got[d])
                predicted.append(guess[d])
                sizes.append(len({s.table for s in plan.device_shards(d)}) + len(plan.data_parallel))
                busy += any(k in readings.busy for k in key)
    if not measured:
        raise UserError("calibrate.on=plan: the plan has no device with tables to measure")
    return measured_record(measured, predicted, sizes, readings.config, started, busy, "plan")


def checked_on_plan(plan: Plan, model: CostModel, readings: PlanReadings, searched_again: bool, changed: bool):
    """``PlanDevices``: the returned ``plan``'s non-empty devices measured (``readings``: only the kernels not read
    yet) against the calibrated ``model``'s predictions."""
    got = readings.devices(plan)
    guess = np.asarray(score_plan(model.expected, plan).compute_ms, np.float64)
    used = got > 0
    kernels = plan_kernels(plan)
    return PlanDevices(
        measured_ms=tuple(round(float(m), 3) for m in got[used]),
        predicted_ms=tuple(round(float(p), 3) for p in guess[used]),
        **ratio_errors(np.maximum(guess[used], 1e-9), got[used]),
        searched_again=searched_again,
        changed=changed,
        busy=sum(any(k in readings.busy for k, _, _ in kernels[d]) for d in np.flatnonzero(used)),
    )
