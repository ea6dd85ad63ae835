"""First contact: on a machine kind no model was trained on, the closest model scaled to this machine before the first
plan, once, and every later run reuses the scale at no cost.

A model predicts its labels' machine. On another kind of machine every kernel runs faster or slower by about one
factor (an Intel Xeon of another generation ran the shipped model's kernels about twice as slowly: 45-56% fast read),
which no ranking of compute shows but which weighs compute against the collectives (priced by their own fits) wrongly
and makes every printed millisecond wrong. ``calibrate=measured`` scales the model from the task's own tables, each
run; first contact measures a fixed set of spec kernels instead, drawn once from the spec sampler that made the
models' labels (so they spread over the model's feature space: few to many tables, narrow to wide, cold to hot), the
cheap ones by the model's own prediction, so that it takes seconds: its factor is the median measured / predicted
over them. The collectives are priced by the model's own fits, of its labels' machine, too: first contact also
measures a few fixed two-rank exchanges (narrow to wide all-to-alls, TorchRec's input distributions where the model
prices them) on gloo ranks, and scales every collective the model prices by their median measured / predicted
(``with_comm_factor``), so that compute and collectives are weighed as this machine runs them. The record is kept
in the user's cache (``cache_dir()/first-contact``), keyed by the machine's kind, the torch and FBGEMM release lines,
the model and the protocol; a later run of any task reads it back. It runs only
where the model was chosen for this machine (nobody named one), the chosen model is of another kind, the plan is for
this machine's CPU (planning for ``device=cuda`` never measures the host) and no calibration was asked for;
``first_contact=false`` turns it off.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import time

import jax.numpy as jnp
import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, write_json
from neuroshard_jax.core.hardware import hardware, hardware_kind, installed_stack, release
from neuroshard_jax.core.paths import cache_folder
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.records import CalibrationRatios, CalibrationRecord, CommCalibration
from neuroshard_jax.core.sharding import Shard
from neuroshard_jax.core.table import Table
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import (
    CostModel,
    combine_costs,
)
from neuroshard_jax.costs.scoring import plan_arrays, score_plan
from neuroshard_jax.measure.calibration import CalibrateConfig, measured_record
from neuroshard_jax.measure.evaluator import measure_comm, plan_kernels, quiet_kernels
from neuroshard_jax.workloads.samplers import SpecSamplerConfig, sample_spec_shard

logger = logging.getLogger(__name__)

SEED = 760_001  # the first-contact specs' own stream (no label set of the project was drawn from it)
DRAWN = 64  # spec devices drawn; of them, the SAMPLES spread over the cheap ones' predicted times are measured
SAMPLES = 12
MAX_PREDICTED_MS = 40.0  # a kernel the model prices above this is not measured (the time budget)
BATCH = 4096
COMM_WORLDS = (2, 4)  # the ranks of the exchanges measured for the collectives' factors
COMM_SAMPLES = 4  # exchanges measured at each
VERSION = 4  # what a cached record holds (2: devices of 4-16 tables; 4: collectives at 2 and 4 ranks); else measured


@functools.cache
def contact_tasks(batch_size: int = BATCH) -> tuple[Task, ...]:
    """The spec devices first contact may measure: ``DRAWN`` one-device tasks of 4-16 whole tables (no slices, no row
    blocks) drawn by the spec sampler from its own seed, the same for every machine and run (drawn once a process:
    the spec kernels and every world's exchanges are picked from them)."""
    # a plan's device fuses several tables: 4-16 a device, as plans of tens of tables on a few devices hold
    config = SpecSamplerConfig(
        min_tables=4, max_tables=16, batch_sizes=(batch_size,), split_share=0.0, row_share=0.0, mem_cap_gb=0.5
    )
    tasks = []
    for index in range(DRAWN):
        batch, specs = sample_spec_shard(config, SEED, index)
        tables = tuple(
            Table(i, s["rows"], s["dim"], s["pooling_factor"], tuple(s["bins"]), name=f"fc{index}.{i}")
            for i, s in enumerate(specs)
        )
        if tables:
            tasks.append(Task.uniform(1, 64.0, batch, tables))
    return tuple(tasks)


def _device_plan(task: Task) -> Plan:
    return Plan(task, tuple(Shard(t, 0, table.dim, 0) for t, table in enumerate(task.tables)))


def chosen_specs(model: CostModel) -> tuple[list[Plan], np.ndarray]:
    """The ``SAMPLES`` spec devices measured, and their predicted compute by ``model`` (as trained): of the drawn ones
    the model prices at most ``MAX_PREDICTED_MS``, the ones at evenly spaced ranks of their predicted times (cheap
    to dear, so the factor is not one corner's)."""
    expected = model.with_compute_scale(1.0, np.ones(1)).expected
    plans = [_device_plan(task) for task in contact_tasks()]
    predicted = np.array([float(score_plan(expected, p).compute_ms[0]) for p in plans])
    cheap = np.flatnonzero(predicted <= MAX_PREDICTED_MS)
    if len(cheap) < SAMPLES:
        cheap = np.argsort(predicted)[:SAMPLES]
    order = cheap[np.argsort(predicted[cheap])]
    picks = order[np.unique(np.round(np.linspace(0, len(order) - 1, SAMPLES)).astype(int))]
    return [plans[i] for i in picks], predicted[picks]


def comm_plans(world: int) -> list[Plan]:
    """The exchanges first contact measures at ``world`` ranks: ``COMM_SAMPLES`` of the drawn spec devices' tables
    dealt table-wise over ``world`` devices, the ones at evenly spaced ranks of their all-to-all width (narrow to
    wide), the same for every machine and run."""
    tasks = contact_tasks()
    widths = np.array([sum(t.dim for t in task.tables) for task in tasks])
    order = np.argsort(widths, kind="stable")
    picks = order[np.unique(np.round(np.linspace(0, len(order) - 1, COMM_SAMPLES)).astype(int))]
    plans = []
    for i in picks:
        task = Task.uniform(world, 64.0, tasks[i].batch_size, tasks[i].tables)
        plans.append(Plan(task, tuple(Shard(t, 0, table.dim, t % world) for t, table in enumerate(task.tables))))
    return plans


def predicted_comm(model: CostModel, plan: Plan) -> np.ndarray:
    """f64[N]: each device's fwd + bwd collectives of ``plan`` by ``model`` (its risk term off), with no compute
    before them: as ``measure_comm`` times them with none (the forward waits on the backward's stragglers)."""
    expected = model.expected
    zero = jnp.zeros(plan.task.num_devices, jnp.float32)
    costs = combine_costs(expected.fns, expected.params, zero, plan_arrays(plan, expected).devices)
    return np.asarray(costs.fwd_comm_ms, np.float64) + np.asarray(costs.bwd_comm_ms, np.float64)


def contact_comm(model: CostModel, config: CalibrateConfig, worlds: tuple[int, ...] = COMM_WORLDS) -> CommCalibration:
    """This machine's collectives against ``model``'s: the ``comm_plans`` of each of ``worlds`` measured on gloo
    ranks (as the evaluator measures a plan's collectives, TorchRec's input distributions among them where the model
    prices them; no compute before them) and predicted; a world's factor is the median measured / predicted over its
    devices."""
    started = time.perf_counter()
    plans = [plan for world in worlds for plan in comm_plans(world)]
    zero = [[0.0] * p.task.num_devices for p in plans]  # no compute before them: the delays are the backward's own
    fwd, bwd = measure_comm(plans, zero, config.evaluator(), by_type=model.input_dist is not None)
    measured = [np.add(f, b) for f, b in zip(fwd, bwd)]
    predicted = [predicted_comm(model, p) for p in plans]
    factors = []
    for world in worlds:
        mine = [i for i, p in enumerate(plans) if p.task.num_devices == world]
        ratios = np.concatenate([measured[i] for i in mine]) / np.maximum(
            np.concatenate([predicted[i] for i in mine]), 1e-9
        )
        factors.append(float(f"{np.median(ratios):.4g}"))
    measured, predicted = np.concatenate(measured), np.concatenate(predicted)
    ratios = measured / np.maximum(predicted, 1e-9)
    return CommCalibration(
        worlds=worlds,
        factors=tuple(factors),
        ratios=CalibrationRatios(
            **{q: float(f"{np.quantile(ratios, p):.4g}") for q, p in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))}
        ),
        devices=len(measured),
        measured_ms=tuple(round(float(m), 3) for m in measured),
        predicted_ms=tuple(round(float(p), 3) for p in predicted),
        seconds=round(time.perf_counter() - started, 1),
    )


def cache_key(model_label: str, config: CalibrateConfig) -> JSONDoc:
    """What a first-contact record is valid for: this machine's kind, its torch and FBGEMM release lines, the model
    and the protocol."""
    stack = installed_stack()
    return {
        "kind": hardware_kind(hardware(), "cpu"),
        "torch": release(stack.get("torch", "none")),
        "fbgemm_gpu": release(stack.get("fbgemm_gpu", "none")),
        "model": model_label,
        "protocol": [config.warmup, config.iters],
        "version": VERSION,
    }


def _path(key: dict):
    folder = cache_folder("first-contact", "first-contact calibrations")
    if folder is None:
        return None
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"{digest}.json"


def cached_record(key: dict) -> CalibrationRecord | None:
    """The record kept for ``key``, or None (none kept, or one that cannot be read: measured again)."""
    path = _path(key)
    if path is None or not path.is_file():
        return None
    try:
        kept = json.loads(path.read_text())
        if kept.get("key") != key:
            return None
        return CalibrationRecord.from_json(kept["record"], str(path))
    except (ValueError, KeyError, TypeError, UserError, OSError):
        logger.warning(f"first contact: {path} cannot be read; measured again")
        return None


def first_contact(
    model: CostModel, model_label: str, task: Task, config: CalibrateConfig
) -> tuple[CostModel, CalibrationRecord, bool]:
    """``model`` scaled to this machine (its compute by the first-contact factor, the task's comm scale kept), the
    record, and whether it was read from the cache (else measured now and kept there)."""
    key = cache_key(model_label, config)
    record = cached_record(key)
    cached = record is not None
    if record is None:
        started = time.perf_counter()
        plans, predicted = chosen_specs(model)
        kernels = [plan_kernels(p)[0] for p in plans]
        jobs = {k: (at, tables) for device in kernels for k, at, tables in device}
        ms, busy = quiet_kernels(jobs, config.evaluator(), tries=config.tries)
        measured = [sum(ms[k] for k, _, _ in device) for device in kernels]
        busy_devices = sum(any(k in busy for k, _, _ in device) for device in kernels)
        sizes = [p.task.num_tables for p in plans]
        record = measured_record(measured, predicted, sizes, config, started, busy_devices, "first_contact")
        record = dataclasses.replace(record, comm=contact_comm(model, config))
        record = dataclasses.replace(record, seconds=round(time.perf_counter() - started, 1))
        path = _path(key)
        if path is not None and not busy_devices:  # a busy reading is not kept: the next run measures again
            write_json({"key": key, "record": record.to_json()}, path)
    return model.calibrated(record, task), record, cached


def contact_line(record: CalibrationRecord, cached: bool) -> str:
    """The model line's part on first contact: the factor, what it came from, and that later runs reuse it."""
    how = "kept from an earlier run" if cached else f"measured now in {record.seconds:.0f} s, kept for later runs"
    busy = ""
    if record.busy:  # not kept: the next run measures again
        how = f"measured now in {record.seconds:.0f} s"
        busy = f", {record.busy} read on a busy machine: not kept, the next run measures again"
    comm = ""
    if record.comm is not None:
        worlds = ", ".join(f"x{f:.3g} at {w}" for w, f in zip(record.comm.worlds, record.comm.factors))
        comm = f", collectives {worlds} ranks (of {record.comm.devices} devices' exchanges)"
    return (
        f"scaled to this machine by first contact: compute x{record.factor:.3g} (the median of {record.devices} spec "
        f"kernels measured / predicted{busy}){comm}; {how}; first_contact=false turns it off"
    )
