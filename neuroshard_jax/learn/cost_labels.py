"""Collect cost labels on real kernels.

    python -m neuroshard_jax.collect kind=compute num_samples=5000 executor.workers=2
    python -m neuroshard_jax.collect kind=compute num_samples=5000 executor=ray executor.address=auto
    python -m neuroshard_jax.collect kind=comm num_samples=1000
    python -m neuroshard_jax.collect source=specs num_samples=3000 out_dir=datasets/cpu-specs
    python -m neuroshard_jax.collect kind=plans num_samples=30 plans.round=0 out_dir=datasets/cpu-plans

``source=pool`` measures shards of the calibrated pool's tables at ``batch_size``; ``source=specs`` measures
shards of table specs drawn over the whole range users bring (``SpecSamplerConfig``), each sample at a batch
size of its own (recorded in its row). ``kind=plans`` labels the devices of the plans searchers produce on
tasks of the training side (``plan_labels.py``): ``num_samples`` tasks per round.

Where the kernels run is the executor (``executor=local``, processes on this host, or ``executor=ray``, actors
on a Ray cluster: neuroshard_jax/kernels/executors.py); either way the driver alone writes the dataset.

Resumable: rerun the same command after a stop (even kill -9) and it continues where it was; samples
are drawn per (seed, index), written one fsynced JSONL line each, and skipped once present.
A sample whose worker crashes, runs out of memory or times out is recorded with the reason and the
worker is restarted. Settings live in conf/collect.yaml.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import time
from collections.abc import Iterable
from pathlib import Path

from omegaconf import DictConfig

from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import bounded, check_bounds, typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, JsonlLog
from neuroshard_jax.core.folders import one_writer
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.manifests import git_commit, write_manifest
from neuroshard_jax.core.memory import Training, kernel_optimizer
from neuroshard_jax.core.progress import progress_bar
from neuroshard_jax.core.table import kernel_parts
from neuroshard_jax.kernels.executors import (
    Executor,
    ExecutorConfig,
    connected,
    map_requests,
    open_executor,
    pinned,
    protocol,
)
from neuroshard_jax.kernels.messages import CommRequest, ComputeAnswer, ComputeRequest
from neuroshard_jax.kernels.processes import (
    BATCHES,
    Timing,
    WorkerFailure,
    compute_request,
    timing_fields,
    worker_versions,
)
from neuroshard_jax.learn.plan_labels import PlanLabelConfig, collect_plans
from neuroshard_jax.measure.evaluator import EvaluateConfig
from neuroshard_jax.workloads.pool import PoolSpec, pool_streams
from neuroshard_jax.workloads.samplers import (
    SPEC_EXTENSIONS,
    SUM_ONLY,
    CommSamplerConfig,
    ComputeSamplerConfig,
    SpecSamplerConfig,
    sample_comm,
    sample_kernel,
    sample_shard,
    sample_spec_shard,
)

KINDS = ("compute", "comm", "plans")


@dataclasses.dataclass(frozen=True)
class CollectConfig:
    # compute: fused TBE fwd+bwd of sampled shards | comm: all-to-all of sampled dim sums | plans: the devices of
    # searched plans and their variants (plans:, below)
    kind: str = "compute"
    # compute shards of: pool (the calibrated pool, at batch_size) | specs (table specs, see specs:)
    source: str = "pool"
    num_samples: int = bounded(at_least=1, default=100)
    seed: int = bounded(at_least=0, default=0)
    device: str = "cpu"  # cpu (fbgemm-gpu-cpu, gloo) | cuda (fbgemm-gpu, NCCL)
    executor: ExecutorConfig = ExecutorConfig()  # where the kernels run (conf/executor/): local or ray
    timeout_s: float = bounded(above=0, default=300.0)  # per compute sample; a comm launch gets a share per request
    out_dir: str = "datasets/cpu-b4096"
    batch_size: int = bounded(at_least=1, default=4096)
    pool: PoolSpec = PoolSpec()
    optimizer: str = "exact_sgd"  # exact_sgd (the paper) | exact_row_wise_adagrad | exact_adagrad | sgd
    precision: str = "fp32"  # weights: fp32 | fp16 | bf16
    warmup: int = bounded(at_least=0, default=5)
    iters: int = bounded(at_least=1, default=10)  # timed iterations; the label is the median
    # fixed: warmup, then iters timed | timed: warm up until warmup_ms of kernel time has run, then time iterations
    # until measure_ms is filled (at least iters, at most max_iters): sub-millisecond GPU shards get ~100 of them |
    # queued (device=cuda): timed, the GPU's own time, the host enqueueing each batch of iterations ahead of it |
    # graph (device=cuda): timed over CUDA-graph replays (FBGEMM 1.6's backward cannot be captured) |
    # null: the device's own, fixed on a CPU, queued on a GPU (kernels/processes.py: default_protocol)
    protocol: str | None = None
    warmup_ms: float = bounded(above=0, default=25.0)
    measure_ms: float = bounded(above=0, default=100.0)
    max_iters: int = bounded(at_least=1, default=1000)
    # compute labels: the batches the iterations take in turn, as a training step takes them (another order of the
    # bags, other cold rows); 1: the same batch every time, as the labels before 2026-11-30 (28c6a8b) were timed
    # (datasets of those resume with batches=1)
    batches: int = bounded(at_least=1, default=BATCHES)
    # compute shards: min..max table configs, dims augmented, total within memory
    sampler: ComputeSamplerConfig = ComputeSamplerConfig()
    # source=specs: table specs over the whole range, each sample at its own batch size
    specs: SpecSamplerConfig = SpecSamplerConfig()
    # comm samples: N devices, dim sums of 10..60 tables at varied balance, delays
    comm: CommSamplerConfig = CommSamplerConfig()
    # kind=plans: num_samples tasks per round of the training side, searched and measured
    plans: PlanLabelConfig = PlanLabelConfig()
    comm_chunk: int = bounded(at_least=1, default=20)  # comm requests per launch of the rank processes
    progress: bool = True
    # each local CPU kernel worker on a core of its own (13% less label noise at no cost); null: what the
    # executor supports (pinned local workers, unpinned Ray actors: Ray places them on logical CPUs, not cores)
    pin: bool | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UserError(f"kind: got {self.kind!r}, expected one of {', '.join(KINDS)}")
        if self.source not in ("pool", "specs"):
            raise UserError(f"source: got {self.source!r}, expected 'pool' or 'specs'")
        check_bounds(self)
        self.timing()  # refuses an unknown protocol, or queued/graph on a CPU
        if self.protocol not in (None, "fixed") and self.kind == "comm":
            raise UserError(f"protocol: got {self.protocol!r} with kind=comm, expected fixed (timed is for compute)")
        if self.device not in ("cpu", "cuda"):
            raise UserError(f"device: got {self.device!r}, expected 'cpu' or 'cuda'")
        object.__setattr__(self, "optimizer", kernel_optimizer(self.optimizer, self.device).name)
        if self.pin and self.device == "cpu" and self.executor.name == "ray":
            raise UserError(
                "pin: got true with executor=ray, expected pin=false (Ray places actors on logical CPUs, not cores;"
                " a dataset keeps one protocol, so a Ray collection is an unpinned one)"
            )

    def pinned(self) -> bool:
        return pinned(self.pin, self.executor)

    def timing(self) -> Timing:
        """The compute requests' protocol beyond warmup and iters (``fixed`` for comm)."""
        fields = timing_fields(self.protocol, self.warmup_ms, self.measure_ms, self.max_iters, self.device)
        return Timing() if self.kind == "comm" else fields


def _settings(config: CollectConfig) -> JSONDoc:
    """What must not change within one dataset (checked on resume)."""
    common = {
        "kind": config.kind,
        "seed": config.seed,
        "device": config.device,
        "batch_size": config.batch_size,
        "pool": config.pool.to_json(),
        "pool_id": config.pool.pool_id,
        "warmup": config.warmup,
        "iters": config.iters,
        **protocol(config.executor, config.pinned(), config.device),  # no "pin": the unpinned protocol
        **config.timing().to_json(),  # none for the fixed protocol: older datasets resume
        **({"batches": config.batches} if config.kind != "comm" and config.batches != 1 else {}),
    }
    if config.kind == "plans":  # its devices are a compute dataset (any round, any model)
        return {
            **common,
            "kind": "compute",
            "source": "plans",
            "optimizer": config.optimizer,
            "specs": spec_settings(config.specs),
        }
    if config.kind == "compute" and config.source == "specs":
        return {
            **common,
            "source": "specs",
            "optimizer": config.optimizer,
            "precision": config.precision,
            "specs": spec_settings(config.specs),
        }
    if config.kind == "compute":
        return {
            **common,
            "optimizer": config.optimizer,
            "precision": config.precision,
            "sampler": dataclasses.asdict(config.sampler),
        }
    return {**common, "comm": _without_unset(dataclasses.asdict(config.comm), "row_share", "input_share")}


def spec_settings(specs: SpecSamplerConfig) -> JSONDoc:
    """The spec sampler's settings as a dataset records them: the extensions a dataset from before them lacks
    (``SPEC_EXTENSIONS``) only where they are on, ``many_tables`` only with ``many_share``, so that older datasets
    resume."""
    settings = _without_unset(dataclasses.asdict(specs), *SPEC_EXTENSIONS)
    if not specs.many_share:
        settings.pop("many_tables")
    if tuple(specs.kernels) == SUM_ONLY:  # the datasets from before kernel kinds
        settings.pop("kernels")
    else:
        settings["kernels"] = list(specs.kernels)
    if "sequence" not in specs.kernels:
        settings.pop("max_sequence_elems")
    return settings


def _without_unset(settings: JSONDoc, *keys: str) -> JSONDoc:
    """``settings`` without those of ``keys`` that are 0 (off): the settings of datasets from before they existed,
    which resume as they were."""
    return {k: v for k, v in settings.items() if k not in keys or v}


def collect(config: CollectConfig, ids: Iterable[int] | None = None, until: float | None = None) -> JSONDoc:
    """Collect up to ``num_samples`` records of ``kind`` into ``out_dir``; returns a summary. ``ids`` (compute):
    the samples to measure instead, in this order (drawn lazily: an order may be long or chosen as it goes);
    ``until``: a ``time.monotonic()`` deadline after which no sample (comm: no chunk; plans: no task's search, no
    device) is started (those started finish).

    The executor is reached first (a Ray address where nothing answers fails before anything is written), then
    ``out_dir`` is held for this writer alone (``one_writer``: a second collect into it is refused in one line)."""
    with connected(config.executor), one_writer(config.out_dir):
        return _collect_plans(config, until) if config.kind == "plans" else _collect(config, ids, until)


def _collect(config: CollectConfig, ids: Iterable[int] | None, until: float | None) -> JSONDoc:
    out = Path(config.out_dir)
    versions = worker_versions()
    log = JsonlLog(out / f"{config.kind}.jsonl")
    manifest_extra = {
        "hardware": hardware(),
        "versions": versions,
        "git_commit": git_commit(),
        "how": f"python -m neuroshard_jax.collect kind={config.kind}"
        + (" source=specs" if config.kind == "compute" and config.source == "specs" else "")
        + (f" seed={config.seed}" if config.seed else "")
        + f" num_samples={config.num_samples}"
        + (f" comm.row_share={config.comm.row_share}" if config.kind == "comm" and config.comm.row_share else "")
        + (f" comm.input_share={config.comm.input_share}" if config.kind == "comm" and config.comm.input_share else "")
        + "".join(
            f" specs.{key}={getattr(config.specs, key)}"
            for key in SPEC_EXTENSIONS
            if config.kind == "compute" and config.source == "specs" and getattr(config.specs, key)
        )
        + (
            f" 'specs.kernels=[{','.join(config.specs.kernels)}]'"
            if config.kind == "compute" and config.source == "specs" and tuple(config.specs.kernels) != SUM_ONLY
            else ""
        )
        + " (conf/collect.yaml)",
    }
    write_manifest(out / f"manifest-{config.kind}.json", _settings(config), manifest_extra)
    if ids is None:
        todo = [i for i in range(config.num_samples) if i not in log.ids]
        bar = progress_bar(
            total=config.num_samples,
            initial=config.num_samples - len(todo),
            desc=config.kind,
            enabled=config.progress,
            smoothing=0.05,
        )
    elif config.kind == "compute":
        todo = (i for i in ids if i not in log.ids)
        bar = progress_bar(initial=len(log.ids), desc="labels", unit=" labels", enabled=config.progress, mininterval=2)
    else:
        raise ValueError("collect: ids are for kind=compute")
    if until is not None and config.kind == "compute":
        todo = itertools.takewhile(lambda _: time.monotonic() < until, todo)
    run = _collect_compute if config.kind == "compute" else functools.partial(_collect_comm, until=until)

    def count() -> JSONDoc:
        """The manifest counts what the file holds."""
        records = list(log.records())
        failed = sum(1 for r in records if not r.get("ok", True))
        counts = {"num_records": len(records), "num_failed": failed}
        write_manifest(out / f"manifest-{config.kind}.json", _settings(config), {**manifest_extra, **counts})
        return {"records": len(records), "failed": failed, "path": str(log.path)}

    try:
        run(config, log, todo, bar)
    except BaseException:  # also Ctrl-C / SIGTERM; a count that fails too (a full disk) does not hide the cause
        bar.close()
        with contextlib.suppress(UserError):
            count()
        raise
    bar.close()
    return count()


def _collect_plans(config: CollectConfig, until: float | None = None) -> JSONDoc:
    out = Path(config.out_dir)
    path = out / "manifest-compute.json"
    extra = {
        "hardware": hardware(),
        "versions": worker_versions(),
        "git_commit": git_commit(),
        "how": "python -m neuroshard_jax.collect kind=plans (conf/collect.yaml)",
    }
    manifest = write_manifest(path, _settings(config), extra)
    evaluate = EvaluateConfig(
        device=config.device,
        executor=config.executor,
        timeout_s=config.timeout_s,
        optimizer=config.optimizer,
        warmup=config.warmup,
        iters=config.iters,
        pin=config.pinned(),
        protocol=config.protocol,
        warmup_ms=config.warmup_ms,
        measure_ms=config.measure_ms,
        max_iters=config.max_iters,
        batches=config.batches,
    )

    summary = collect_plans(
        config.plans,
        config.specs,
        config.pool,
        config.batch_size,
        config.seed,
        config.num_samples,
        out,
        evaluate,
        config.progress,
        Training(config.optimizer),
        until,
    )
    before = manifest.get("rounds", {}).get(str(config.plans.round), {})
    added = ("search_s", "compute_s", "comm_s", "devices_measured", "comm_measured")  # a resumed round adds up
    total = {**summary, **{k: round(summary[k] + before.get(k, 0), 1) for k in added}}
    this_round = {**total, "plans": dataclasses.asdict(config.plans)}
    rounds = {**manifest.get("rounds", {}), str(config.plans.round): this_round}
    records = list(JsonlLog(out / "compute.jsonl").records())
    failed = sum(1 for r in records if not r.get("ok", True))
    write_manifest(
        path, _settings(config), {**extra, "rounds": rounds, "num_records": len(records), "num_failed": failed}
    )
    return {"records": len(records), "failed": failed, "path": str(out / "compute.jsonl"), **summary}  # this call's


def _collect_compute(config: CollectConfig, log: JsonlLog, todo: Iterable[int], bar) -> None:
    pool_rows = pool_streams(config.pool)[0] if config.source == "pool" else None

    def request(i: int) -> ComputeRequest:
        pooling, weighted = "sum", False
        if config.source == "specs":
            batch_size, tables = sample_spec_shard(config.specs, config.seed, i)
            pooling, weighted = kernel_parts(sample_kernel(config.specs, config.seed, i))
            pool = None
        else:
            batch_size, pool = config.batch_size, config.pool
            tables = sample_shard(pool_rows, config.sampler, config.seed, i)
        return compute_request(
            i,
            tables,
            pool,
            batch_size,
            config.device,
            config.optimizer,
            config.precision,
            config.warmup,
            config.iters,
            config.timing(),
            pooling,
            weighted,
            config.batches,
        )

    def record(request: ComputeRequest, answer: ComputeAnswer) -> None:
        row = {"id": request.id, "tables": list(request.tables)}
        if config.source == "specs":
            row["batch_size"] = request.batch_size
        row.update({"pooling": request.pooling} if request.pooling != "sum" else {})
        row.update({"weighted": True} if request.weighted else {})
        # when the label came in (unix seconds): how fast labels flow here (adapt's budget), drift over a run
        log.write_record({**row, **answer.to_json(with_id=False), "at": round(time.time(), 3)})
        bar.update(1)

    requests = (request(i) for i in todo)

    map_requests(
        requests, record, config.executor, config.device, config.timeout_s, Path(config.out_dir), pin=config.pinned()
    )


def _collect_comm(config: CollectConfig, log: JsonlLog, todo: list[int], bar, until: float | None = None) -> None:
    """One launch of the ranks per chunk of ``comm_chunk`` requests of one world size, the sizes taking turns (a run
    cut short by ``until`` has labels of every size). With ``until``, a chunk is launched only where it is expected
    to end by then: as long as the last chunk of its size took (or a smaller size's, scaled by the ranks)."""
    samples = {i: sample_comm(config.comm, config.seed, i) for i in todo}
    by_world: dict[int, list[int]] = {}
    for i, s in samples.items():
        by_world.setdefault(s["world"], []).append(i)
    chunks = [
        [(world, ids[start : start + config.comm_chunk]) for start in range(0, len(ids), config.comm_chunk)]
        for world, ids in sorted(by_world.items())
    ]
    with open_executor(config.executor, config.device, config.timeout_s) as executor:
        took: dict[int, float] = {}  # seconds of the last chunk of each world size
        for world, chunk in (c for turn in itertools.zip_longest(*chunks) for c in turn if c is not None):
            started = time.monotonic()
            if until is not None:
                expected = took.get(world) or max((t * world / w for w, t in took.items()), default=0.0)
                if started + expected >= until:
                    continue
            _collect_comm_chunk(config, log, samples, chunk, world, executor)
            took[world] = time.monotonic() - started
            bar.update(len(chunk))


def _collect_comm_chunk(
    config: CollectConfig, log: JsonlLog, samples: dict, chunk: list[int], world: int, executor: Executor
) -> None:
    """One launch of ``world`` ranks for ``chunk``; after a failure, one launch per request to isolate the culprit."""
    try:
        _run_comm_chunk(config, log, samples, chunk, world, executor)
    except WorkerFailure:
        for i in chunk:  # isolate the culprit: one request per launch
            try:
                _run_comm_chunk(config, log, samples, [i], world, executor)
            except WorkerFailure as failure:
                log.write_record(
                    {"id": i, **samples[i], "batch_size": config.batch_size, "ok": False, "error": failure.reason}
                )


def _run_comm_chunk(
    config: CollectConfig, log: JsonlLog, samples: dict, chunk: list[int], world: int, executor: Executor
) -> None:
    requests = [
        CommRequest.of(samples[i], i, config.batch_size, samples[i]["delays_ms"], config.warmup, config.iters)
        for i in chunk
    ]
    results = executor.comm(requests, world, config.timeout_s * max(1, len(chunk)) / 4)
    for i in chunk:
        per_rank = results[i]
        log.write_record(
            {
                "id": i,
                **samples[i],
                "batch_size": config.batch_size,
                "ok": True,
                "fwd_ms": [r.fwd_ms for r in per_rank],
                "bwd_ms": [r.bwd_ms for r in per_rank],
                # of which the row groups' collectives (row_comm.py)
                **(
                    {k: [getattr(r, k) for r in per_rank] for k in ("fwd_rows_ms", "bwd_rows_ms")}
                    if "row_groups" in samples[i]
                    else {}
                ),
                # and the input distributions (input_dist.py)
                **({"fwd_inputs_ms": [r.fwd_inputs_ms for r in per_rank]} if "inputs" in samples[i] else {}),
            }
        )


def config_from(cfg: DictConfig) -> CollectConfig:
    return typed(CollectConfig, resolved(cfg))


def stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt
