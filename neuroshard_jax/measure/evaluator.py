"""The evaluator: plans measured on the real kernels (``evaluate.py`` is its command line).

Each device's shards run as one fused TBE (fwd+bwd, the collection protocol) replaying the tables'
index streams from the task's pool; the plan's dim sums go through the all-to-all benchmark, backward
first, then forward with each device's straggler delay = (compute + bwd comm) - min over devices, so
the forward time includes waiting for the slowest peer, exactly as the simulator's formula does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from neuroshard_jax.core.assignment import CommLayout, comm_layout, crosses_hosts
from neuroshard_jax.core.config import bounded, check_bounds
from neuroshard_jax.core.constants import MIN_CPU_SHARE
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.memory import kernel_optimizer
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.plan_file import load_plan
from neuroshard_jax.core.sharding import Shard
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import DeviceCosts, plan_cost_ms
from neuroshard_jax.kernels.executors import Executor, ExecutorConfig, opened
from neuroshard_jax.kernels.messages import CommRequest, ComputeAnswer, ComputeRequest
from neuroshard_jax.kernels.processes import (
    BATCHES,
    PoolTableRef,
    SpecTableRef,
    TableRef,
    Timing,
    WorkerFailure,
    compute_request,
    timing_fields,
    worker_tables,
    worker_versions,
)

DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    """conf/evaluator/default.yaml (``plan``: the plan.json that ``python -m neuroshard_jax.evaluate`` measures)."""

    plan: str | None = None
    device: str = "cpu"  # cpu (fbgemm-gpu-cpu + gloo) | cuda (fbgemm-gpu + NCCL)
    executor: ExecutorConfig = ExecutorConfig()  # where the kernels run (conf/executor/): local processes or Ray
    timeout_s: float = bounded(above=0, default=600.0)
    optimizer: str | None = None  # the fused optimizer measured; None: the task's (``Task.training``)
    warmup: int = bounded(at_least=0, default=5)
    iters: int = bounded(at_least=1, default=10)
    comm_warmup: int = bounded(at_least=0, default=3)
    comm_iters: int = bounded(at_least=1, default=10)
    pin: bool = False  # each CPU kernel worker on a core of its own (collection pins; see conf/collect.yaml)
    # as collect's: fixed (warmup, iters) | timed, queued, graph (warmup_ms, measure_ms, max_iters) | null: the
    # device's own (fixed on a CPU, queued on a GPU)
    protocol: str | None = None
    warmup_ms: float = bounded(above=0, default=25.0)
    measure_ms: float = bounded(above=0, default=100.0)
    max_iters: int = bounded(at_least=1, default=1000)
    # the batches a device's iterations take in turn, as a training step takes them (``ComputeRequest.batches``);
    # 1: the same batch every time, as plans were measured before 2026-11-30 (28c6a8b)
    batches: int = bounded(at_least=1, default=BATCHES)

    def __post_init__(self):
        if self.device not in DEVICES:
            raise UserError(f"device: got {self.device!r}, expected one of {', '.join(DEVICES)}")
        check_bounds(self)
        self.timing()

    def timing(self) -> Timing:
        """The device requests' protocol beyond warmup and iters."""
        return timing_fields(self.protocol, self.warmup_ms, self.measure_ms, self.max_iters, self.device)


class Measuring:
    """The methods of a stage's config that measures devices itself (``calibrate``, ``polish``): its fields
    ``device``, ``executor``, ``timeout_s``, ``warmup`` and ``iters`` checked, and the evaluator they make."""

    def check_measuring(self, stage: str) -> None:
        """``device`` is one of ``DEVICES`` and every ``bounded`` field of the stage's config within its bounds."""
        if self.device not in DEVICES:
            raise UserError(f"{stage}.device: got {self.device!r}, expected one of {', '.join(DEVICES)}")
        check_bounds(self, f"{stage}.")

    def evaluator(self) -> EvaluateConfig:
        return EvaluateConfig(
            device=self.device, executor=self.executor, timeout_s=self.timeout_s, warmup=self.warmup, iters=self.iters
        )


HOSTS_NOTE = (
    "the task's devices sit in several hosts: the all-to-all was measured between processes of this one machine and "
    "each device's transfer time scaled by the task's links (Task.comm_scale: an analytic model, not a measurement)"
)
SPEED_NOTE = (
    "the task's devices have relative speeds: each device's compute was measured on this machine's identical devices "
    "and divided by its speed (the comm is measured as is)"
)


def measure_plans(plans: list[Plan], config: EvaluateConfig) -> list[JSONDoc]:
    """Measured per-device costs (ms) of many plans: compute, fwd_comm, bwd_comm, total; and their max.

    Every device's compute of every plan goes through one executor of ``config.executor.workers`` kernel
    workers; the all-to-alls of all plans with the same number of devices share one set of rank processes
    (backward for all of them first, then forward with each plan's straggler delays).
    """
    with opened(None, config.executor, config.device, config.timeout_s, config.pin) as executor:
        compute, kernels = measure_compute(plans, config, executor)
        fwd, bwd = measure_comm(plans, compute, config, executor)
    results = []
    for i, plan in enumerate(plans):
        total = [c + f + b for c, f, b in zip(compute[i], fwd[i], bwd[i])]
        cost_ms = float(plan_cost_ms(DeviceCosts(*(np.asarray(x) for x in (compute[i], fwd[i], bwd[i], total)))))
        devices = [
            {
                "device": d,
                "compute": compute[i][d],
                "fwd_comm": fwd[i][d],
                "bwd_comm": bwd[i][d],
                "total": total[d],
                "kernel": kernels[i][d],
            }
            for d in range(plan.task.num_devices)
        ]
        result = {"devices": devices, "cost_ms": cost_ms}
        if plan.task.has_speeds:
            result["speed_note"] = SPEED_NOTE
        if plan.task.multi_host:
            result["hosts_note"] = HOSTS_NOTE
        results.append(result)
    return results


def measure_compute(
    plans: list[Plan], config: EvaluateConfig, executor: Executor | None = None
) -> tuple[list[list[float]], list[list[dict | None]]]:
    """Measured fused-kernel ms of every device of every plan ([plan][device]; 0 for an empty device), and
    the fwd / bwd split of each kernel. One executor (``executor``, or one opened as ``config.executor`` says)
    serves all plans; a device that recurs (the same shards in plans of several searchers) is measured once. The
    kernels run on this machine's identical devices: a heterogeneous task's device gets the measured ms divided by
    its speed (the plan's record says so)."""
    compute = [[0.0] * p.task.num_devices for p in plans]
    kernels: list[list[dict | None]] = [[None] * p.task.num_devices for p in plans]
    jobs: dict[str, tuple[Task, list]] = {}
    users: dict[str, list[tuple[int, int]]] = {}  # kernel key -> the (plan, device) pairs that run it
    for i, plan in enumerate(plans):
        for d, device in enumerate(plan_kernels(plan)):
            for key, task, tables in device:
                jobs.setdefault(key, (task, tables))
                users.setdefault(key, []).append((i, d))
    answers = measure_tables(jobs, config, executor, what="evaluation failed")
    for key, pairs in users.items():
        answer = answers[key][0]
        for i, d in pairs:  # a device that runs two kernels (its shards', the data-parallel tables') sums them
            speed = plans[i].task.speeds()[d]
            compute[i][d] += answer.total_ms / speed
            was = kernels[i][d] or {"fwd_ms": 0.0, "bwd_ms": 0.0}
            kernels[i][d] = {
                "fwd_ms": was["fwd_ms"] + answer.fwd_ms / speed,
                "bwd_ms": was["bwd_ms"] + answer.bwd_ms / speed,
            }
    return compute, kernels


def measure_tables(
    jobs: dict[str, tuple[Task, list]],
    config: EvaluateConfig,
    executor: Executor | None = None,
    repeats: int = 1,
    what: str = "a device measurement failed",
    others: dict[str, ComputeRequest] | None = None,
    done: Callable[[], None] | None = None,
) -> dict[str, list[ComputeAnswer]]:
    """Each job (key -> (task, its ``device_tables``)) measured as one device ``repeats`` times, interleaved (repeat
    r of every job before r + 1), on ``executor`` or one opened as ``config.executor`` says: key -> the worker's
    answers in repeat order. ``others``: ready worker requests (key -> request) measured alongside in the same
    interleaved repeats, e.g. reference records that track the machine's drift. A failed measurement is a
    UserError: ``what``, and the worker's error. ``done``: called after each answer (a progress bar's step)."""
    others = others or {}
    answers: dict[str, list[ComputeAnswer]] = {key: [] for key in [*jobs, *others]}
    requests = [
        (others[key] if key in others else device_request(None, *jobs[key], config)).tagged(f"{key}/{r}", key=key)
        for r in range(repeats)
        for key in [*jobs, *others]
    ]

    def record(request: ComputeRequest, answer: ComputeAnswer) -> None:
        if not answer.ok:
            raise UserError(f"{what}: {answer.error}")
        answers[request.tag("key")].append(answer)
        if done is not None:
            done()

    with opened(executor, config.executor, config.device, config.timeout_s, config.pin) as pool:
        pool.map(requests, record)
    return answers


def device_request(request_id, task: Task, tables: list, config: EvaluateConfig) -> ComputeRequest:
    """The worker request that measures one device holding ``tables`` (``device_tables``) of ``task``, with the
    task's optimizer (or ``config.optimizer``); UserError where the device's kernels do not run it."""
    where = "evaluator.optimizer" if config.optimizer else "task.optimizer"
    optimizer = kernel_optimizer(config.optimizer or task.training.optimizer, config.device, where)
    return compute_request(
        request_id,
        tables,
        task.pool,
        task.batch_size,
        config.device,
        optimizer.name,
        task.precision,
        config.warmup,
        config.iters,
        config.timing(),
        batches=config.batches,
    )


def device_tables(task: Task, shards: list[Shard]) -> list[TableRef]:
    """A device's tables as the worker measures them, in a canonical order: ``PoolTableRef``s when the task has a
    pool (its real streams), else ``SpecTableRef``s whose streams are synthesised (seeded by the table id); each
    names the kernel it runs in and its weights' data type where not the task's (the worker runs a kernel per kind
    and data type, as TorchRec does). A row
    block has its row_offset and num_rows (the worker restricts the table's stream to it); a block whose own
    statistics the table carries (``Table.block_stats``) is the spec of those, as the cost model scores it; an
    empty block (the tail of TorchRec's row layout) holds nothing to measure."""
    out = []
    for s in shards:
        t = task.tables[s.table]
        block = () if s.whole_rows(t.rows) else (s.row_offset, s.rows(t.rows))
        if block and block[1] == 0:
            continue
        own = {"kernel": t.kernel, "precision": t.precision if t.precision != task.precision else None}
        own["cache_load_factor"] = t.cache_load_factor  # tiered memory: a TBE of managed caching on the GPU
        if task.pool is not None:
            out.append(PoolTableRef(t.id, s.dim, *block, **own))
        elif block and (stats := t.block_stats(*block)) is not None:
            out.append(SpecTableRef(block[1], stats[0], tuple(stats[1]), s.dim, t.id, **own))
        else:
            out.append(SpecTableRef(t.rows, t.pooling_factor, tuple(t.bins), s.dim, t.id, *block, **own))
    if task.pool is not None:
        return sorted(out, key=PoolTableRef.order)
    return sorted(out, key=lambda x: (x.seed, x.dim, x.row_offset or 0, x.rows))


def replica_kernel(plan: Plan) -> tuple[Task, list] | None:
    """The kernel of the plan's data-parallel tables, which every device runs: each table whole, looked up by the
    device's slice of the batch (ceil(batch / N)), in a fused kernel of their own (TorchRec runs data-parallel tables
    apart from the sharded ones, with its dense kernel; the labels' fused one stands in for it). (task at that
    batch size, its ``device_tables``); None without data-parallel tables."""
    if not plan.data_parallel:
        return None
    task = plan.task
    local = dataclasses.replace(task, batch_size=-(-task.batch_size // task.num_devices))
    tables = device_tables(local, [Shard(t, 0, task.tables[t].dim, 0) for t in plan.data_parallel])
    if task.pool is None:  # a spec's histogram describes the task's batch: the first bags of that batch's stream
        tables = [dataclasses.replace(spec, stream_batch=task.batch_size) for spec in tables]
    return local, tables


def plan_kernels(plan: Plan) -> list[list[tuple[str, Task, list]]]:
    """Per device of ``plan``, the kernels it runs, each (content key ``device_key``, the task it is measured at, its
    ``device_tables``): its shards' fused kernel (none for an empty device) and the data-parallel tables'
    (``replica_kernel``, the same on every device). A device's compute is the sum of its kernels'."""
    replicas = replica_kernel(plan)
    shared = [] if replicas is None else [(device_key(*replicas), *replicas)]
    out = []
    for d in range(plan.task.num_devices):
        tables = device_tables(plan.task, plan.device_shards(d))
        out.append(([(device_key(plan.task, tables), plan.task, tables)] if tables else []) + shared)
    return out


class Readings(NamedTuple):
    """Devices' kernel ms (``ms`` f64[G]) and how many of them are ``busy``: read while the machine took the
    worker's core (a CPU share below MIN_CPU_SHARE), after every try."""

    ms: np.ndarray
    busy: int


def quiet_devices(
    task: Task, devices: list[list[Shard]], config: EvaluateConfig, executor: Executor | None = None, tries: int = 3
) -> Readings:
    """Kernel ms of each list of ``task``'s shards measured as one device (this machine's, no speed applied), on
    ``executor`` or one opened for them as ``config.executor`` says; each reading taken while the machine was busy
    (the worker held less than MIN_CPU_SHARE of its core, ``kernels.processes.quiet``) measured again, up to
    ``tries`` readings in all, on that executor: each device's quiet reading, or where none was quiet its least
    disturbed one (the highest CPU share), and how many had none. A busy machine stretched single 0.6 ms readings
    up to 9x here; a CUDA reading (no CPU share) is quiet."""
    if tries < 1:
        raise UserError(f"quiet_devices: tries {tries}, expected at least 1")
    jobs = {str(i): (task, device_tables(task, shards)) for i, shards in enumerate(devices)}
    ms, busy = quiet_kernels(jobs, config, executor, tries)
    return Readings(np.array([ms[str(i)] for i in range(len(devices))], np.float64), len(busy))


def quiet_kernels(
    jobs: dict[str, tuple[Task, list]], config: EvaluateConfig, executor: Executor | None = None, tries: int = 3
) -> tuple[dict[str, float], set[str]]:
    """``quiet_devices`` of kernels given as jobs (key -> (task, its ``device_tables``), ``plan_kernels``' form):
    key -> its quiet (or least disturbed) reading in ms, and the keys that had no quiet one."""
    if tries < 1:
        raise UserError(f"quiet_kernels: tries {tries}, expected at least 1")
    ms, share = dict.fromkeys(jobs, 0.0), dict.fromkeys(jobs, -1.0)
    with opened(executor, config.executor, config.device, config.timeout_s, config.pin) as pool:
        for _ in range(tries):
            busy = [k for k in jobs if share[k] < MIN_CPU_SHARE]
            if not busy:
                break
            answers = measure_tables({k: jobs[k] for k in busy}, config, pool)
            for key in busy:
                answer = answers[key][0]
                if answer.core_share > share[key]:
                    ms[key], share[key] = answer.total_ms, answer.core_share
    return ms, {key for key, s in share.items() if s < MIN_CPU_SHARE}


def device_key(task: Task, tables: list[TableRef]) -> str:
    """A device's content key (``device_tables``): what its kernel measures, the tables (in the worker's form), the
    batch size, the precision, and the pool whose streams a pool task replays."""
    content = [task.batch_size, task.precision, worker_tables(tables)]
    if task.pool is not None:
        content.insert(0, task.pool.pool_id)
    return hashlib.sha1(json.dumps(content, sort_keys=True).encode()).hexdigest()[:20]


BY_TYPE = ("column_wise", "row_wise", "inputs")  # what ``comm_layout`` adds to one all-to-all of every width


def _by_type(layout: CommLayout, by_type: bool) -> CommLayout:
    """``layout``, or without ``BY_TYPE`` (one all-to-all of every width, no input distribution)."""
    return layout if by_type else dataclasses.replace(layout, **{k: [] for k in BY_TYPE})


def measure_comm(
    plans: list[Plan],
    compute: list[list[float]],
    config: EvaluateConfig,
    executor: Executor | None = None,
    by_type: bool = True,
) -> tuple[list[list[float]], list[list[float]]]:
    """Measured fwd and bwd all-to-all ms of every device of every plan ([plan][device]). The plans with the
    same number of devices share one set of rank processes (on one node of the executor): backward for all of
    them first, then forward with each plan's straggler delays ((compute + bwd comm) - min over devices, from
    ``compute``). ``by_type``: as TorchRec runs them (``comm_layout``), the column-wise tables' all-to-all apart from
    the table-wise one and each sharding type's input distribution before them; else one all-to-all of every width
    and no input distribution (an all-to-all label, as ``collect kind=comm``)."""
    fwd = [[0.0] * p.task.num_devices for p in plans]
    bwd = [[0.0] * p.task.num_devices for p in plans]
    worlds = sorted({p.task.num_devices for p in plans} - {1})
    if worlds:
        with opened(executor, config.executor, config.device, config.timeout_s, config.pin) as pool:
            for n in worlds:
                _measure_comm_group(plans, compute, config, pool, n, fwd, bwd, by_type)
    return fwd, bwd


def _measure_comm_group(
    plans: list[Plan], compute: list[list[float]], config: EvaluateConfig, pool: Executor, n: int, fwd, bwd, by_type
) -> None:
    """``measure_comm`` for the plans of ``n`` devices (fills ``fwd`` and ``bwd`` in place)."""
    group = [i for i, p in enumerate(plans) if p.task.num_devices == n]
    # rank processes of one machine: a multi-host task's transfers are scaled to its links (Task.comm_scale)
    scales = {i: plans[i].task.comm_scale() for i in group}
    base = {
        i: CommRequest.of(
            _by_type(comm_layout(plans[i]), by_type).to_json(),
            i,
            plans[i].task.batch_size,
            [0.0] * n,
            config.comm_warmup,
            config.comm_iters,
        )
        for i in group
    }
    row_scales = {i: rows_scale(plans[i], base[i].row_groups, scales[i]) for i in group}
    try:
        first = pool.comm([base[i] for i in group], n, config.timeout_s)
        second_requests = []
        delays = {}
        for i in group:
            bwd[i] = [
                (r.bwd_ms - r.bwd_rows_ms) * s + r.bwd_rows_ms * rs
                for r, s, rs in zip(first[i], scales[i], row_scales[i])
            ]
            ready = [c + b for c, b in zip(compute[i], bwd[i])]
            delays[i] = [r - min(ready) for r in ready]
            second_requests.append(dataclasses.replace(base[i], delays_ms=tuple(delays[i])))
        second = pool.comm(second_requests, n, config.timeout_s)
    except WorkerFailure as failure:
        raise UserError(f"evaluation failed in the all-to-all benchmark: {failure.reason}") from None
    for i in group:
        # the wait for the latest peer takes no bandwidth: only the transfer after it is scaled
        waits = [max(delays[i]) - own for own in delays[i]]
        fwd[i] = [
            w + max(r.fwd_ms - r.fwd_rows_ms - w, 0.0) * s + r.fwd_rows_ms * rs
            for r, w, s, rs in zip(second[i], waits, scales[i], row_scales[i])
        ]


def rows_scale(plan: Plan, groups, scale: np.ndarray) -> np.ndarray:
    """f64[N]: the scale of each device's row-group collectives (``groups``: (width, devices), a comm request's
    ``row_groups``): its ``comm_scale`` where one of its groups spans hosts, 1 where they all stay within its host
    (table_row_wise)."""
    out = np.ones(plan.task.num_devices)
    for _, devices in groups:
        if crosses_hosts(plan, devices):
            out[list(devices)] = scale[list(devices)]
    return out


def measured_steps(plans: list[Plan], config: EvaluateConfig, repeats: int) -> list[list[float]]:
    """Each plan's measured step (``measure_plans``' cost_ms, the slowest device) in ``repeats`` runs, interleaved
    (every plan once per run: the machine's drift hits every plan alike)."""
    runs: list[list[float]] = [[] for _ in plans]
    for _ in range(repeats):
        for i, measured in enumerate(measure_plans(plans, config)):
            runs[i].append(measured["cost_ms"])
    return runs


def measure_plan(plan: Plan, config: EvaluateConfig) -> JSONDoc:
    """``measure_plans`` of one plan."""
    return measure_plans([plan], config)[0]


def evaluate_file(path: str | Path, config: EvaluateConfig) -> JSONDoc:
    """Measure the plan at ``path`` and write evaluation.json beside it."""
    path = Path(path)
    plan = load_plan(path)
    predicted = plan.to_json()  # the file as parsed and validated (costs and provenance kept), not read twice
    measured = measure_plan(plan, config)
    by_device = {d["device"]: d["cost_ms"] for d in predicted.get("devices", [])}
    result = {
        "plan": str(path),
        "searcher": predicted.get("searcher"),
        "cost_model": predicted.get("cost_model"),
        "cost_ms": measured["cost_ms"],
        "predicted_cost_ms": predicted.get("cost_ms"),
        "devices": [{**d, "predicted": by_device.get(d["device"])} for d in measured["devices"]],
        **({"speed_note": measured["speed_note"]} if "speed_note" in measured else {}),
        "measurement": {
            **dataclasses.asdict(config),
            "batch_size": plan.task.batch_size,
            "hardware": hardware(),
            "versions": worker_versions(),
        },
    }
    write_json(result, path.with_name("evaluation.json"))
    return result
