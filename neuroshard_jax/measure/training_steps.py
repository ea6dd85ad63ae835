"""Plans of one task timed as TorchRec runs them: DistributedModelParallel training steps on gloo, one process per
device, every plan's steps interleaved.

The evaluator (``measure/evaluator.py``) prices a plan from its parts, each device's fused kernel and the all-to-all
benchmark; this is the whole step as a TorchRec user's job runs it (TorchRec's input distribution, its kernels, the
pooled-embedding all-to-all, a data-parallel table's gradient all-reduce, the fused SGD update), so it can settle
what the parts cannot see. Each plan is exported (``plan_export.export_torchrec``, device cpu, fused kernel) and loaded
into its own DistributedModelParallel on every rank; rank r looks up bags [r * b, (r + 1) * b) of every table's
stream at the task's batch (b = batch / devices); a step (after a barrier) is forward, the sum of the pooled
outputs, backward; a step's time is its slowest rank's. The ranks allocate every plan's shards, so the task's tables
must fit this machine's memory once per plan.

With fewer cores than ranks (8 ranks on this project's 2-core machines) the wall time of a step is the work of every
rank shared out over the cores, not the slowest device's: it rewards the plan with the least total work and cannot
see balance. Each rank's CPU time per step (its kernels and its communication threads, not its waits) is recorded
beside it; the busiest rank's is the figure that stands for the slowest device there, with the caches and memory
bandwidth still shared. Where the machine has a core per rank, ``cores`` runs each rank alone on its own
(``tools/dmp_cores.py``, on a lent machine's 16 cores).

``dmp_memory`` runs one plan the same way with the task's optimizer fused into the backward pass and reads what each
rank's sharded module holds (its resident memory when built and at its peak over a few steps, and the allocator's
count of its shards and optimizer state), beside ``Plan.memory``'s prediction.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.hardware import MEMORY_SHARE, available_bytes, check_rank_room
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard
from neuroshard_jax.kernels.messages import MemoryReport, StepsJob, StepsReport, TorchRecTable
from neuroshard_jax.kernels.processes import WorkerFailure, run_ranks
from neuroshard_jax.kernels.torchrec_export import ExportConfig, export_torchrec
from neuroshard_jax.measure.evaluator import device_tables


def check_room(plans: Sequence[Plan]) -> None:
    """UserError where the ranks' modules of ``plans``, built together, would not fit this machine's memory (every
    rank's predicted ``Plan.memory``, every plan's, and its process: ``hardware.check_rank_room``; ``MEMORY_SHARE`` of
    what is available)."""
    room = available_bytes()
    need = sum(part.total for plan in plans for part in plan.memory())
    if room is not None and need > MEMORY_SHARE * room:
        raise UserError(
            f"plans: their ranks' modules need {need / GIB_BYTES:.1f} GiB together, this machine has "
            f"{room / GIB_BYTES:.1f} GiB available; expected fewer plans at a time (tools.dmp_steps --apart)"
        )
    check_rank_room(max(p.task.num_devices for p in plans), need, "plans")  # and the rank processes themselves


def torchrec_tables(plan: Plan, names: list[str]) -> tuple[TorchRecTable, ...]:
    """The tables, named as the exported plans name them, each with its ``stream``: the worker's form of the whole
    table, as the evaluator's kernels take it (``measure.evaluator.device_tables``: a pool id, or its spec seeded by
    its id)."""
    task = plan.task
    return tuple(
        TorchRecTable(t.rows, t.dim, name, stream=_stream(task, i), kernel=t.kernel, precision=t.precision)
        for i, (name, t) in enumerate(zip(names, task.tables))
    )


def _stream(task, index: int):
    """Table ``index``'s stream in the worker's form (its kernel is the TorchRec table's, not the stream's)."""
    ref = device_tables(task, [Shard(index, 0, task.tables[index].dim, 0)])[0]
    return dataclasses.replace(ref, kernel="sum").to_json()


def _check_runnable(task) -> None:
    """UserError unless the ranks can build ``task``'s tables (fp32) and slice its batch evenly."""
    if task.precisions != ("fp32",):
        got = " and ".join(task.precisions)
        raise UserError(f"task.precision: got tables of {got}, expected fp32 (the ranks build fp32 tables)")
    if task.batch_size % task.num_devices:
        raise UserError(
            f"task.batch_size: got {task.batch_size}, expected a multiple of the {task.num_devices} devices "
            "(each rank looks up an equal slice)"
        )


def _run_ranks(
    command: str,
    request: StepsJob,
    world: int,
    tmp: Path,
    timeout_s: float,
    what: str,
    cores: Sequence[int] | None = None,
) -> list[JSONDoc]:
    """Write ``request`` into ``tmp``, run the worker's ``command`` on ``world`` gloo ranks (rank r on core
    ``cores[r]`` alone, where given), and read each rank's output; UserError naming ``what`` if a rank fails."""
    (tmp / "request.json").write_text(json.dumps(request.to_json()))
    try:
        run_ranks([command, str(tmp / "request.json"), str(tmp / "out.{rank}")], world, tmp, timeout_s, cores)
    except WorkerFailure as failure:
        raise UserError(f"DistributedModelParallel {what} failed: {failure.reason}") from None
    return [json.loads((tmp / f"out.{rank}").read_text()) for rank in range(world)]


def dmp_steps(
    plans: list[Plan], warmup: int = 3, steps: int = 20, timeout_s: float = 1800.0, cores: Sequence[int] | None = None
) -> list[dict]:
    """Per plan: {step_ms (median over the timed steps of the slowest rank's wall time), step_ms_q1_q3, rank_ms (each
    rank's median), busiest_cpu_ms (median over steps of the largest rank's CPU time), rank_cpu_ms, local_gb (each
    rank's embedding weights)}, the plans' steps interleaved on one set of rank processes (rank r on core
    ``cores[r]`` alone where given: a core per rank, where the machine has them)."""
    if not plans:
        raise UserError("plans: got none, expected at least one plan of the task")
    task = plans[0].task
    for i, plan in enumerate(plans[1:], 1):
        if plan.task.to_json() != task.to_json():
            raise UserError(f"plans[{i}]: its task differs from plans[0]'s, expected plans of one task")
    _check_runnable(task)
    check_room(plans)
    if warmup < 0 or steps < 1:
        raise UserError(f"steps: got warmup {warmup}, steps {steps}; expected warmup >= 0 and steps >= 1")
    config = ExportConfig(device="cpu", compute_kernel="fused")
    world = task.num_devices
    with tempfile.TemporaryDirectory(prefix="neuroshard-steps-") as tmp:
        tmp = Path(tmp)
        paths = [str(tmp / f"plan{i}.pt") for i in range(len(plans))]
        exported = [export_torchrec(plan, path, config)[0] for plan, path in zip(plans, paths)]
        names = [t.name for t in exported[0].tables]  # the names the exported plans use
        pool = task.pool.to_json() if task.pool is not None else None
        request = StepsJob(torchrec_tables(plans[0], names), task.batch_size, tuple(paths), steps, pool, warmup)
        ranks = _run_ranks("torchrec-steps", request, world, tmp, timeout_s, "steps", cores)
    reports = [StepsReport.from_json(r) for r in ranks]
    out = []
    for p in range(len(plans)):
        wall = np.array([r.step_s[p] for r in reports]) * 1e3  # [ranks, steps] ms
        cpu = np.array([r.cpu_s[p] for r in reports]) * 1e3
        slowest = wall.max(axis=0)
        out.append(
            {
                "step_ms": float(statistics.median(slowest)),
                "step_ms_q1_q3": [float(q) for q in np.quantile(slowest, [0.25, 0.75])],
                "rank_ms": [float(np.median(r)) for r in wall],
                "busiest_cpu_ms": float(statistics.median(cpu.max(axis=0))),
                "rank_cpu_ms": [float(np.median(r)) for r in cpu],
                "local_gb": [r.local_bytes[p] / GIB_BYTES for r in reports],
            }
        )
    return out


def dmp_memory(plan: Plan, steps: int = 3, timeout_s: float = 1800.0) -> list[dict]:
    """Per rank of ``plan`` run in DistributedModelParallel (gloo, CPU, one process per device, the task's optimizer
    fused into the backward pass): {predicted (``Plan.memory``: weights, state, buffers, total), built (the
    resident memory the sharded module took when built), peak (the high-water mark over ``steps`` training steps,
    from before the build), weights_bytes and state_bytes (the allocator's count of the rank's shards and optimizer
    state)}, in bytes. One plan per set of rank processes: each rank's memory is its plan's alone."""
    task = plan.task
    optimizer = task.training.state
    if not optimizer.cpu:
        raise UserError(f"task.optimizer: {optimizer.name} does not run on FBGEMM's CPU kernels, expected another")
    _check_runnable(task)
    world = task.num_devices
    with tempfile.TemporaryDirectory(prefix="neuroshard-memory-") as tmp:
        tmp = Path(tmp)
        exported = export_torchrec(plan, str(tmp / "plan.pt"), ExportConfig(device="cpu", compute_kernel="fused"))[0]
        tables = torchrec_tables(plan, [t.name for t in exported.tables])
        pool = task.pool.to_json() if task.pool is not None else None
        request = StepsJob(tables, task.batch_size, (str(tmp / "plan.pt"),), steps, pool, optimizer=optimizer.name)
        ranks = _run_ranks("torchrec-memory", request, world, tmp, timeout_s, "memory run")
    predicted = plan.memory()
    reports = [MemoryReport.from_json(r) for r in ranks]
    return [
        {
            "predicted": {
                "weights": p.weights,
                "state": p.state,
                "buffers": p.buffers,
                "total": p.total,
            },
            "built": r.built - r.before,
            "peak": r.peak - r.before,
            "weights_bytes": r.weights_bytes,
            "state_bytes": r.state_bytes,
        }
        for p, r in zip(predicted, reports)
    ]
