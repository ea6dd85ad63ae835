"""Plan-level cost labels: the devices of the plans searchers produce, measured on the real kernels.

    python -m neuroshard_jax.collect kind=plans num_samples=30 out_dir=datasets/plans plans.round=0

Task ``i`` of round ``r`` comes from the training side only: the pool's train half and the spec sampler
(``profiling.SpecSamplerConfig``), alternating, at 4 or 8 devices; never the foreign benchmark. Every searcher
of ``plans.searchers`` plans it with the cost model ``plans.model``; each plan gets ``plans.candidates``
perturbed variants (a shard moved, two shards swapped, a table halved once more, or a halving undone: the
plan format's equal 2^k slices stay the rule), of which ``plans.variants`` per task are kept:
``select=spread`` keeps the near-best ones (predicted within ``near`` of the task's best) the ensemble is least
sure of, ``select=random`` draws them uniformly. Then:

* ``plans.jsonl``: one row per task (id ``r/i``): the task, every kept plan's shards and its predicted
  per-device compute, comm and spread, the searcher and variant that made it, and the model;
* ``compute.jsonl``: one row per distinct device (id: its content key), the label protocol's fused TBE fwd+bwd,
  in the form ``collect`` writes (``tables``, ``batch_size``), with the round, task, plan and model that
  first produced it: ``train datasets=[..., DIR]`` trains on it as on any compute dataset;
* ``comm.jsonl``: every plan's all-to-all (dims and straggler delays from its measured compute), the form of
  ``collect kind=comm``.

Searching is stage one, measuring stage two; both are resumable and exactly-once (rows are keyed; a rerun
of the same command continues). ``plan_label_report`` compares each round's predictions with its labels: the
model of round r never trained on round r's tasks, so its figures are held out.

Why one module of ~630 lines: it is one pipeline with one record format (a ``plans.jsonl`` row), written by the
search stage, read by the measuring stage and by the report; its sections follow the row's life.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from neuroshard_jax.core.assignment import assignment, plan_of, row_blocks_in, row_groups
from neuroshard_jax.core.config import bounded, check_bounds
from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.devices import Device
from neuroshard_jax.core.errors import PlanError, UserError
from neuroshard_jax.core.files import JSONDoc, JsonlLog, read_jsonl, read_records
from neuroshard_jax.core.memory import PLAIN_SGD, Training
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.progress import progress_lines
from neuroshard_jax.core.sharding import Shard, mem_bytes, split_counts
from neuroshard_jax.core.table import Table
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.choice import CostModelSpec, shipped_names
from neuroshard_jax.costs.cost_model import DeviceCosts, plan_cost_ms
from neuroshard_jax.costs.scoring import score_plans_devices
from neuroshard_jax.kernels.executors import Executor, open_executor
from neuroshard_jax.kernels.messages import ComputeAnswer, ComputeRequest
from neuroshard_jax.learn.metrics import kendall_tau
from neuroshard_jax.measure.drift import References, references
from neuroshard_jax.measure.evaluator import EvaluateConfig, device_key, device_request, device_tables, measure_comm
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.workloads.builders import TaskConfig, generate_task
from neuroshard_jax.workloads.pool import PoolSpec, load_pool
from neuroshard_jax.workloads.samplers import SpecSamplerConfig, draw_table_spec
from searchers import make_searcher

logger = logging.getLogger(__name__)

SOURCES = ("pool", "specs")
SELECTIONS = ("spread", "random")
PERTURBATIONS = ("move", "swap", "halve", "merge")


@dataclasses.dataclass(frozen=True)
class PlanLabelConfig:
    """conf/collect.yaml ``plans:``."""

    round: int = bounded(at_least=0, default=0)  # rows record it; each round draws its own tasks
    model: str = "xeon-union"  # a shipped model's name or a checkpoint directory
    searchers: tuple[str, ...] = (
        "beam",
        "grid",
        "rl",
        "size_greedy",
        "lookup_greedy",
        "dim_greedy",
        "size_lookup_greedy",
        "torchrec",
    )
    sources: tuple[str, ...] = SOURCES  # the pool's train half | the spec sampler (specs:), alternating
    num_devices: tuple[int, ...] = bounded(at_least=2, default=(4, 8))
    min_tables: int = 10
    max_tables: int = 40
    pool_mem_cap_gb: float = 4.0
    max_device_gib: float = 4.0  # spec tasks: a device's weights stay measurable beside a second worker
    candidates: int = bounded(at_least=0, default=48)  # perturbed variants drawn per searched plan
    variants: int = bounded(at_least=0, default=8)  # of which this many per task are measured
    select: str = "spread"  # spread: the near-best variants the ensemble is least sure of | random
    near: float = 0.1  # near-best: predicted within this fraction of the task's best plan
    comm: bool = True  # also each plan's all-to-all (comm.jsonl)
    # records of ``reference`` measured with every ``chunk`` devices: each label's ``speed``
    references: int = bounded(at_least=0, default=0)
    reference: str = ""  # a compute dataset of this machine's kind (drift.py)
    chunk: int = bounded(at_least=1, default=64)

    def __post_init__(self):
        check_bounds(self, "plans.")
        bad = [s for s in self.sources if s not in SOURCES]
        if bad or not self.sources:
            raise UserError(f"plans.sources: got {list(self.sources)}, expected some of {', '.join(SOURCES)}")
        if self.select not in SELECTIONS:
            raise UserError(f"plans.select: got {self.select!r}, expected one of {', '.join(SELECTIONS)}")
        if not self.num_devices:
            raise UserError("plans.num_devices: got [], expected a non-empty list of integers >= 2")
        if not 1 <= self.min_tables <= self.max_tables:
            raise UserError(
                f"plans.min_tables/max_tables: got {self.min_tables}/{self.max_tables}, expected 1 <= min <= max"
            )
        if not self.searchers:
            raise UserError("plans.searchers: got [], expected at least one searcher")
        if self.references and not self.reference:
            raise UserError(
                f"plans.reference: got none with plans.references={self.references}, expected a compute dataset "
                "of this machine's kind (e.g. neuroshard_jax/data/profiles/xeon-plans)"
            )

    def cost_model(self) -> CostModelSpec:
        """The spec of ``model``: a shipped name, else a checkpoint directory."""
        if self.model in shipped_names():
            return CostModelSpec(self.model)
        return CostModelSpec("neural", {"checkpoint": self.model})


# ---------------------------------------------------------------------------------------------
# Tasks of the training side


def label_task(
    config: PlanLabelConfig,
    specs: SpecSamplerConfig,
    pool: PoolSpec,
    batch_size: int,
    seed: int,
    index: int,
    training: Training = PLAIN_SGD,
) -> tuple[str, Task]:
    """(source, task) of task ``index`` of round ``config.round``: sources alternate, then device counts. A pool
    task replays the pool's streams at ``batch_size``; a spec task has a batch size of its own. The tables train
    with ``training`` (their plans hold its optimizer state)."""
    source = config.sources[index % len(config.sources)]
    devices = config.num_devices[(index // len(config.sources)) % len(config.num_devices)]
    task_seed = int(np.random.default_rng([seed, 5003, config.round, index]).integers(2**31))
    if source == "pool":
        task_config = TaskConfig(
            num_tables=None,
            min_tables=config.min_tables,
            max_tables=config.max_tables,
            num_devices=devices,
            mem_cap_gb=config.pool_mem_cap_gb,
            batch_size=batch_size,
            split="train",
            optimizer=training.optimizer,
            pool=pool,
        )
        return source, generate_task(load_pool(pool, batch_size), task_config, task_seed)
    return source, spec_task(config, specs, devices, task_seed, training)


def spec_task(
    config: PlanLabelConfig, specs: SpecSamplerConfig, devices: int, seed: int, training: Training = PLAIN_SGD
) -> Task:
    """Tables drawn by the spec sampler; each device's cap is roomy (2x the mean load, 1.5x the largest table's
    weights, then what the optimizer's state and the step add) and its weights within ``max_device_gib``, so every
    plan is measurable."""
    rng = np.random.default_rng([seed, 7727])
    batch_size = int(rng.choice(specs.batch_sizes))
    count = int(rng.integers(config.min_tables, config.max_tables + 1))
    largest_allowed = config.max_device_gib / 1.5 * GIB_BYTES
    total_allowed = devices * config.max_device_gib / 2 * GIB_BYTES
    tables: list[Table] = []
    total = 0.0
    for _ in range(20 * count):
        if len(tables) == count:
            break
        spec = draw_table_spec(rng, specs, batch_size)
        dim = int(rng.choice(specs.dims))
        size = float(mem_bytes(spec["rows"], dim, specs.precision))
        if size > largest_allowed or total + size > total_allowed:
            continue
        tables.append(Table(len(tables), spec["rows"], dim, spec["pooling_factor"], tuple(spec["bins"])))
        total += size
    largest = max(mem_bytes(t.rows, t.dim, specs.precision) for t in tables)
    weights_gib = min(config.max_device_gib, max(1.5 * largest, 2.0 * total / devices) / GIB_BYTES)
    task = Task.uniform(devices, 1.0, batch_size, tuple(tables), specs.precision, training=training)
    held = sum(task.table_mem_bytes(i) for i in range(task.num_tables))  # with state and buffers
    cap_gib = weights_gib * held / total + task.step_memory().total / GIB_BYTES
    return dataclasses.replace(task, devices=(Device(float(np.ceil(cap_gib * 100) / 100)),) * devices)


# ---------------------------------------------------------------------------------------------
# Perturbations


def perturb(task: Task, devices: tuple[tuple[int, ...], ...], kind: str, rng: np.random.Generator):
    """One perturbation ``kind`` of a plan's slice devices (None where it does not apply)."""
    n = task.num_devices
    out = [list(d) for d in devices]
    slices = [(t, i) for t, d in enumerate(out) for i in range(len(d))]
    if kind == "move":
        t, i = slices[rng.integers(len(slices))]
        out[t][i] = int((out[t][i] + rng.integers(1, n)) % n)
    elif kind == "swap":
        (t, i), (u, j) = (slices[k] for k in rng.choice(len(slices), 2, replace=False))
        if out[t][i] == out[u][j]:
            return None
        out[t][i], out[u][j] = out[u][j], out[t][i]
    elif kind == "halve":
        t = int(rng.integers(len(out)))
        if 2 * len(out[t]) not in split_counts(task.tables[t].dim):
            return None
        out[t] = [d for dev in out[t] for d in (dev, int(rng.integers(n)))]
    else:  # merge: undo one halving, each merged slice on the device of one of its halves
        splits = [t for t, d in enumerate(out) if len(d) > 1]
        if not splits:
            return None
        t = splits[rng.integers(len(splits))]
        out[t] = [out[t][2 * j + int(rng.integers(2))] for j in range(len(out[t]) // 2)]
    return tuple(tuple(d) for d in out)


def variants_of(plan: Plan, count: int, rng: np.random.Generator) -> list[tuple[str, Plan]]:
    """Up to ``count`` distinct valid perturbations of ``plan``: (kind, plan)."""
    _, devices = assignment(plan)
    seen = {devices}
    out = []
    for _ in range(4 * count):
        if len(out) == count:
            break
        kind = PERTURBATIONS[int(rng.choice(len(PERTURBATIONS), p=[0.4, 0.3, 0.15, 0.15]))]
        changed = perturb(plan.task, devices, kind, rng)
        if changed is None or changed in seen:
            continue
        seen.add(changed)
        try:
            out.append(
                (
                    kind,
                    plan_of(
                        plan.task, changed, row_blocks_in(plan), plan.data_parallel, plan.merge_column_wise
                    ).validate(),
                )
            )
        except PlanError:  # over a device's memory
            continue
    return out


# ---------------------------------------------------------------------------------------------
# Stage one: search, perturb, select


def plan_task(config: PlanLabelConfig, task: Task, seed: int, progress: bool = True) -> list[dict]:
    """Every searcher's plan of ``task`` and the selected variants, each with its predictions; ``progress``: say
    which searchers were skipped (step lines, ``core.progress.progress_lines``)."""
    say = progress_lines(logger, progress)
    try:
        built = config.cost_model().for_task(task)  # one model for every searcher's plan
    except UserError as err:
        say(f"  every searcher skipped: {err}")
        return []
    searched: list[tuple[str, str, Plan]] = []
    for searcher in config.searchers:
        try:
            plan = search_plan(task, make_searcher(searcher), built, seed)
        except UserError as err:  # infeasible, or e.g. rl's own model is trained at batch 4096 only
            say(f"  {searcher} skipped: {err}")
            continue
        searched.append((searcher, "searched", plan))
    rng = np.random.default_rng([seed, 31, config.round])
    candidates = [(s, kind, p) for s, _, parent in searched for kind, p in variants_of(parent, config.candidates, rng)]
    everything = searched + candidates
    if not everything:
        return []
    model = built.expected
    costs, spread = score_plans_devices(model, [p for *_, p in everything])
    plan_ms = np.asarray(plan_cost_ms(costs))
    chosen = select_variants(config, plan_ms[len(searched) :], spread, costs, len(searched), rng)
    rows = []
    for k in list(range(len(searched))) + [len(searched) + c for c in chosen]:
        searcher, kind, plan = everything[k]
        name = searcher if kind == "searched" else f"{searcher}~{kind}{k}"
        costs_k = DeviceCosts(*(c[k] for c in costs))
        rows.append(plan_entry(name, searcher, kind, plan, costs_k, None if spread is None else spread[k]))
    return rows


def plan_entry(name: str, searcher: str, variant: str, plan: Plan, costs: DeviceCosts, spread=None) -> JSONDoc:
    """A plan as plans.jsonl keeps it: who made it, its shards, its predicted per-device costs and spread."""

    def ms(values) -> list[float]:
        return [round(float(x), 5) for x in values]

    return {
        "name": name,
        "searcher": searcher,
        "variant": variant,
        "shards": [[s.table, s.col_offset, s.dim, s.device] for s in plan.shards],
        **({"data_parallel": list(plan.data_parallel)} if plan.data_parallel else {}),
        "compute": ms(costs.compute_ms),
        "fwd_comm": ms(costs.fwd_comm_ms),
        "bwd_comm": ms(costs.bwd_comm_ms),
        "spread": None if spread is None else ms(spread),
    }


def select_variants(config: PlanLabelConfig, plan_ms, spread, costs, offset: int, rng) -> list[int]:
    """Indices (into the candidates) of the variants to measure."""
    count = min(config.variants, len(plan_ms))
    if count == 0:
        return []
    if config.select == "random" or spread is None:
        return sorted(rng.choice(len(plan_ms), count, replace=False).tolist())
    searched = np.asarray(plan_cost_ms(DeviceCosts(*(c[:offset] for c in costs))))
    best = min(float(plan_ms.min()), float(searched.min()) if offset else np.inf)
    near = np.flatnonzero(plan_ms <= (1 + config.near) * best)
    unsure = spread[offset:].max(-1)
    ranked = sorted(near.tolist(), key=lambda c: -unsure[c])
    rest = sorted(set(range(len(plan_ms))) - set(ranked), key=lambda c: plan_ms[c])
    return sorted((ranked + rest)[:count])


# ---------------------------------------------------------------------------------------------
# The collection


def task_rows(log: JsonlLog) -> dict[str, JSONDoc]:
    return {r["id"]: r for r in log.records()}


def row_plans(row: dict) -> tuple[Task, list[Plan]]:
    task = Task.from_json(row["task"], where="plans.jsonl task")
    plans = [
        Plan(
            task,
            tuple(Shard(t, c, d, dev) for t, c, d, dev in p["shards"]),
            data_parallel=tuple(p.get("data_parallel", ())),
        )
        for p in row["plans"]
    ]
    return task, plans


def collect_plans(
    config: PlanLabelConfig,
    specs: SpecSamplerConfig,
    pool: PoolSpec,
    batch_size: int,
    seed: int,
    num_tasks: int,
    out: Path,
    evaluate: EvaluateConfig,
    progress: bool = True,
    training: Training = PLAIN_SGD,
    until: float | None = None,
) -> JSONDoc:
    """Stage one (search and select) then stage two (measure) for tasks 0..num_tasks-1 of ``config.round``.
    Returns counts and the wall time of each stage; ``progress``: a line per step (``core.progress.progress_lines``);
    ``until``: a ``time.monotonic()`` deadline after which no task is searched and no device measured.
    """
    say = progress_lines(logger, progress)
    plans_log = JsonlLog(out / "plans.jsonl")
    started = time.perf_counter()
    for i in range(num_tasks):
        row_id = f"{config.round}/{i}"
        if row_id in plans_log.ids:
            continue
        if until is not None and time.monotonic() >= until:
            break
        source, task = label_task(config, specs, pool, batch_size, seed, i, training)
        plans = plan_task(config, task, seed + i, progress)
        plans_log.write_record(
            {
                "id": row_id,
                "round": config.round,
                "index": i,
                "source": source,
                "model": config.model,
                "task": task.to_json(),
                "plans": plans,
            }
        )
        say(
            f"searched task {i} of round {config.round}: {len(plans)} plans ({source}, {task.num_tables} tables, "
            f"{task.num_devices} devices)"
        )
    search_s = time.perf_counter() - started
    rows = [r for r in task_rows(plans_log).values() if r["round"] == config.round and r["index"] < num_tasks]
    return {
        "tasks": len(rows),
        "plans": sum(len(r["plans"]) for r in rows),
        "search_s": round(search_s, 1),
        **label_rows(rows, out, evaluate, config.model, config.comm, progress, drift_references(config), until),
    }


def drift_references(config: PlanLabelConfig) -> tuple[References | None, int]:
    """(``config.references`` records of its reference dataset, or None; the chunk they are measured with)."""
    refs = references(config.reference, config.references) if config.references else None
    return refs, config.chunk


def label_rows(
    rows: list[dict],
    out: Path,
    evaluate: EvaluateConfig,
    model: str,
    comm: bool,
    progress: bool = True,
    drift: tuple[References | None, int] = (None, 64),
    until: float | None = None,
) -> JSONDoc:
    """Measure the devices (and with ``comm``, the all-to-alls) of the plans of plans.jsonl ``rows`` not yet in
    ``out``'s compute.jsonl (comm.jsonl); returns the counts and the wall time of each part. ``drift``: reference
    records measured with every chunk of devices, and the chunk (``label_devices``); ``until``: a
    ``time.monotonic()`` deadline after which no device is started (nor the all-to-alls)."""
    with open_executor(evaluate.executor, evaluate.device, evaluate.timeout_s, pin=evaluate.pin) as executor:
        started = time.perf_counter()
        devices = label_devices(rows, out / "compute.jsonl", evaluate, model, progress, executor, *drift, until)
        compute_s = time.perf_counter() - started
        started = time.perf_counter()
        in_time = until is None or time.monotonic() < until
        comms = measure_plan_comm(rows, out, evaluate, progress, executor) if comm and in_time else 0
    return {
        "devices_measured": devices,
        "comm_measured": comms,
        "compute_s": round(compute_s, 1),
        "comm_s": round(time.perf_counter() - started, 1),
    }


def plan_devices(row: dict) -> Iterator[tuple[str, str, Task, list]]:
    """(key, plan name, task, device tables) of every non-empty device of every plan of a task row."""
    task, plans = row_plans(row)
    for spec, plan in zip(row["plans"], plans):
        for d in range(task.num_devices):
            tables = device_tables(task, plan.device_shards(d))
            if tables:
                yield device_key(task, tables), spec["name"], task, tables


def label_devices(
    rows: list[dict],
    path: Path,
    evaluate: EvaluateConfig,
    model: str,
    progress: bool,
    executor: Executor,
    refs: References | None = None,
    chunk: int = 64,
    until: float | None = None,
) -> int:
    """Measure every distinct device of ``rows`` not yet in ``path``; returns how many were measured. With
    ``refs``, the devices go in chunks of ``chunk``, each measured together with the reference records, and a
    chunk's labels are written at its end with the machine's ``speed`` of that chunk (``drift.References``).
    ``until``: a ``time.monotonic()`` deadline after which no device (no chunk) is started."""
    say = progress_lines(logger, progress)
    log = JsonlLog(path)
    todo: dict[str, ComputeRequest] = {}
    for row in rows:
        for key, name, task, tables in plan_devices(row):
            if key not in log.ids and key not in todo:
                meta = {"round": row["round"], "task": row["id"], "plan": name, "model": model}
                todo[key] = device_request(key, task, tables, evaluate).tagged(meta=meta)
    order = np.random.default_rng([len(todo), 17]).permutation(len(todo))  # interleave tasks and plans
    requests = [list(todo.values())[i] for i in order]

    def label(request: ComputeRequest, answer: ComputeAnswer) -> JSONDoc:
        row = {"id": request.id, "tables": list(request.tables), "batch_size": request.batch_size}
        return {**row, **request.tag("meta"), **answer.to_json(with_id=False)}

    if requests:
        with_refs = f", {len(refs.requests)} references with every {chunk}" if refs else ""
        say(f"measuring {len(requests)} devices{with_refs}")
    measured = 0

    def in_time(_) -> bool:
        return until is None or time.monotonic() < until

    def keep(request: ComputeRequest, answer: ComputeAnswer) -> None:
        nonlocal measured
        log.write_record(label(request, answer))
        measured += 1

    if refs is None:
        executor.map(itertools.takewhile(in_time, requests), keep)
        return measured
    for start in itertools.takewhile(in_time, range(0, len(requests), chunk)):
        labels, speed = _with_references(executor, requests[start : start + chunk], refs, label)
        for row in labels:
            log.write_record(row | ({"speed": round(speed, 4), "reference": refs.dataset} if speed else {}))
        measured += len(labels)
    return measured


def _with_references(
    executor: Executor, requests: list[ComputeRequest], refs: References, label
) -> tuple[list[dict], float]:
    """``requests`` measured together with the reference records: their labels, and the machine's speed."""
    labels, answers = [], {}

    def record(request: ComputeRequest, answer: ComputeAnswer) -> None:
        if request.id in refs.recorded:
            answers[request.id] = answer
        else:
            labels.append(label(request, answer))

    executor.map(requests + list(refs.requests), record)
    return labels, refs.speed(answers)


def measure_plan_comm(
    rows: list[dict], out: Path, evaluate: EvaluateConfig, progress: bool, executor: Executor, chunk: int = 16
) -> int:
    """Each plan's all-to-all (backward, then forward with its straggler delays from the measured compute) into
    comm.jsonl, ``chunk`` plans per launch of the rank processes."""
    say = progress_lines(logger, progress)
    log = JsonlLog(out / "comm.jsonl")
    compute = {r["id"]: r for r in JsonlLog(out / "compute.jsonl").records()}
    pending: list[tuple[str, dict, Plan, list[float]]] = []
    for row in rows:
        task, plans = row_plans(row)
        for j, (spec, plan) in enumerate(zip(row["plans"], plans)):
            comm_id = f"{row['id']}/{j}"
            if comm_id in log.ids or row_groups(plan):  # row groups: not all-to-all labels (row_comm.py)
                continue
            per_device = []
            for d in range(task.num_devices):
                tables = device_tables(task, plan.device_shards(d))
                answer = compute.get(device_key(task, tables)) if tables else {"ok": True, "total_ms": 0.0}
                per_device.append(answer["total_ms"] if answer and answer.get("ok") else None)
            if None not in per_device:
                pending.append((comm_id, spec, plan, per_device))
    for start in range(0, len(pending), chunk):
        part = pending[start : start + chunk]
        # one all-to-all of every width: a label of the form the comm nets learn (``collect kind=comm``)
        fwd, bwd = measure_comm([p for _, _, p, _ in part], [c for *_, c in part], evaluate, executor, by_type=False)
        for (comm_id, spec, plan, compute_ms), f, b in zip(part, fwd, bwd):
            ready = [c + x for c, x in zip(compute_ms, b)]
            log.write_record(
                {
                    "id": comm_id,
                    "world": plan.task.num_devices,
                    "dim_sums": [int(x) for x in plan.dim_sums()],
                    "delays_ms": [round(r - min(ready), 4) for r in ready],
                    "batch_size": plan.task.batch_size,
                    "plan": spec["name"],
                    "ok": True,
                    "fwd_ms": f,
                    "bwd_ms": b,
                }
            )
        say(f"comm: {min(start + chunk, len(pending))}/{len(pending)} plans")
    return len(pending)


# ---------------------------------------------------------------------------------------------
# Figures


def plan_label_report(out: Path, round_: int | None = None) -> JSONDoc:
    """Per round: the searching model's predictions against the labels of that round (held out: the model never
    saw them; a label with a ``speed`` at the reference's speed, as training takes it). Device compute MAPE and
    mean signed error overall, per searcher, for variants and for devices holding split slices; the per-task
    Kendall tau of the plans' slowest-device compute."""
    measured = {r["id"]: r["total_ms"] / r.get("speed", 1.0) for r in read_records(out / "compute.jsonl")}
    rounds: dict[int, dict] = {}
    for row in read_jsonl(out / "plans.jsonl"):
        if round_ is not None and row["round"] != round_:
            continue
        task, plans = row_plans(row)
        entry = rounds.setdefault(row["round"], {"errors": {}, "taus": [], "plans": 0, "devices": set()})
        pred_max, meas_max = [], []
        for spec, plan in zip(row["plans"], plans):
            if plan.data_parallel:  # its predictions include the replicas' kernel, which plan labels do not measure
                continue
            errors, slowest = device_errors(task, spec, plan, spec["compute"], measured)
            if slowest is None:
                continue
            entry["plans"] += 1
            entry["devices"].update(errors.pop("keys"))
            for group, values in errors.items():
                entry["errors"].setdefault(group, []).extend(values)
            pred_max.append(slowest[0])
            meas_max.append(slowest[1])
        if len(meas_max) >= 3 and max(meas_max) > 1.1 * min(meas_max):
            entry["taus"].append(kendall_tau(np.asarray(pred_max), np.asarray(meas_max)))
    report = {}
    for r, entry in sorted(rounds.items()):
        groups = {
            g: {"devices": len(e), "mape": float(np.mean(np.abs(e))), "mean_signed": float(np.mean(e))}
            for g, e in sorted(entry["errors"].items())
        }
        report[str(r)] = {
            "plans_measured": entry["plans"],
            "distinct_devices": len(entry["devices"]),
            "device_error": groups,
            "per_task_tau": float(np.mean(entry["taus"])) if entry["taus"] else None,
            "tasks_with_tau": len(entry["taus"]),
        }
    return report


def device_errors(task: Task, spec: dict, plan: Plan, predicted, measured: dict[str, float]):
    """A plan's device compute errors (predicted / measured - 1) by group: all, its searcher, searched or variants,
    and split devices (holding a column slice); the measured device keys under "keys"; and its slowest device
    (predicted, measured). ({}, None) where a device of the plan is not measured."""
    errors: dict[str, list] = {"keys": []}
    values = []
    for d in range(task.num_devices):
        shards = plan.device_shards(d)
        if not shards:
            continue
        key = device_key(task, device_tables(task, shards))
        if key not in measured:
            return {}, None
        split = any(s.dim < task.tables[s.table].dim for s in shards)
        values.append((float(predicted[d]), measured[key]))
        errors["keys"].append(key)
        groups = ["all", spec["searcher"], "variants" if spec["variant"] != "searched" else "searched"]
        for g in groups + (["split devices"] if split else []):
            errors.setdefault(g, []).append(values[-1][0] / values[-1][1] - 1)
    return errors, (max(p for p, _ in values), max(m for _, m in values))
