"""What the host and a kernel worker say to each other, as typed records: a ``ComputeRequest`` (time one fused TBE,
fwd+bwd, over a set of tables) and its ``ComputeAnswer``. JSON only on the worker's pipe: the host sends
``request.to_json()`` and reads ``ComputeAnswer.from_json(line)``; the worker reads ``ComputeRequest.from_json(line)``
and writes ``answer.to_json()``. Both sides import this module (no torch, no JAX). A request's ``tags`` are the
caller's own (a benchmark's key, repeat or task): kept beside it on the host, never written to a worker's pipe (a Ray
actor gets the request whole, pickled: tags must pickle).

The JSON forms are the ones collected labels keep: a label is its request's ``id``, ``tables`` and ``batch_size``
beside its answer's fields (``learn.cost_labels``), so both forms are stable."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from neuroshard_jax.core.constants import BYTES_PER_ELEMENT, MIN_CPU_SHARE
from neuroshard_jax.core.files import JSONDoc

TIMED_FIELDS = ("warmup_ms", "measure_ms", "max_iters")  # a protocol other than ``fixed``: how long it warms, measures


class MessageError(ValueError):
    """A message that is not what its type says (the worker answers it with ``ok: False`` and this text)."""


CACHE_WORD = "cache="  # a pool table reference's tiered memory, named as a word: "cache=0.2"


def ref_words(ref: list) -> tuple[list, dict[str, str]]:
    """A pool table reference (``processes.PoolTableRef``'s worker form) split: its leading numbers, and its trailing
    words by what they name (``kernel``, ``precision``: a data type's name, ``cache_load_factor``: ``CACHE_WORD``
    and the number, as text), the first of a kind kept."""
    ref, named = list(ref), {}
    while ref and isinstance(ref[-1], str):
        word = ref.pop()
        if word.startswith(CACHE_WORD):
            named["cache_load_factor"] = word.removeprefix(CACHE_WORD)
        else:
            named["precision" if word in BYTES_PER_ELEMENT else "kernel"] = word
    return ref, named


@dataclasses.dataclass(frozen=True)
class ComputeRequest:
    """Time one fused TBE (forward and backward, with its fused optimizer) over ``tables``, in the worker's form:
    ``[pool table id, dim(, row_offset, num_rows)]`` of the ``pool`` (a ``PoolSpec``'s JSON), or table specs
    ``{rows, pooling_factor, bins, dim, seed(, row_offset, num_rows)(, stream_batch)}`` (``processes.SpecTableRef``).
    ``protocol``: ``fixed`` (``warmup`` iterations, ``iters`` timed), ``timed`` (``warmup_ms`` of kernel time, then
    ``measure_ms`` of it, at least ``iters`` and at most ``max_iters`` iterations), and on CUDA ``queued`` and
    ``graph`` (the worker's ``timed_runs``). ``memory``: also report what the kernels held. ``tags``: the caller's."""

    id: int | str
    tables: tuple[list | dict, ...]
    batch_size: int
    pool: dict | None = None
    device: str = "cpu"
    optimizer: str = "exact_sgd"
    precision: str = "fp32"
    warmup: int = 5
    iters: int = 10
    protocol: str = "fixed"
    warmup_ms: float | None = None
    measure_ms: float | None = None
    max_iters: int | None = None
    memory: bool = False
    # the kernel's kind (``core.table.kernel_kind``): FBGEMM's pooling (sum, mean; none: sequence lookups, one output
    # row per id, every table of one dim) and per-id weights in the forward
    pooling: str = "sum"
    weighted: bool = False
    # the batches the iterations take in turn (the worker's ``streams.next_batches``: bags in another order, cold
    # rows elsewhere, the statistics kept), as a training step takes one after another; 1: one batch every time
    batches: int = 1
    # FBGEMM's managed caching (a GPU's tiered memory, TorchRec's ``fused_uvm_caching``): the tables in host memory
    # reached through UVM, this share of their rows cached in the GPU's (``cache_load_factor``); None: in the GPU's
    cache_load_factor: float | None = None
    tags: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def to_json(self) -> JSONDoc:
        """The line the worker reads: the protocol's fields only where it is not ``fixed``, ``memory`` only where
        asked; the tags stay here."""
        out = {
            "id": self.id,
            "device": self.device,
            "pool": self.pool,
            "batch_size": self.batch_size,
            "tables": list(self.tables),
            "optimizer": self.optimizer,
            "precision": self.precision,
            "warmup": self.warmup,
            "iters": self.iters,
        }
        if self.protocol != "fixed":
            out.update(protocol=self.protocol, **{k: getattr(self, k) for k in TIMED_FIELDS})
        if self.memory:
            out["memory"] = True
        if self.pooling != "sum":  # a sum-pooled unweighted request's line is as it always was (labels keep it)
            out["pooling"] = self.pooling
        if self.weighted:
            out["weighted"] = True
        if self.batches != 1:  # a request of one batch reads as requests always did
            out["batches"] = self.batches
        if self.cache_load_factor is not None:
            out["cache_load_factor"] = self.cache_load_factor
        return out

    @classmethod
    def from_json(cls, obj: Any) -> ComputeRequest:
        """The request a worker reads (MessageError naming what is missing or malformed)."""
        if not isinstance(obj, Mapping):
            raise MessageError(f"request: got {type(obj).__name__}, expected a JSON object")
        try:
            tables, batch_size = obj["tables"], obj["batch_size"]
        except KeyError as err:
            raise MessageError(f"request: no {err.args[0]!r}, expected tables and batch_size") from None
        if not isinstance(tables, list):
            raise MessageError(f"request.tables: got {tables!r:.60}, expected a list of tables")
        protocol = str(obj.get("protocol", "fixed"))
        timed = {}
        if protocol != "fixed":
            missing = [k for k in TIMED_FIELDS if obj.get(k) is None]
            if missing:
                raise MessageError(f"request: protocol {protocol!r} without {missing[0]!r}, expected {TIMED_FIELDS}")
            timed = {k: _number(obj, k, float if k != "max_iters" else int) for k in TIMED_FIELDS}
        pool = obj.get("pool")
        if pool is not None and not isinstance(pool, Mapping):
            raise MessageError(f"request.pool: got {pool!r:.60}, expected a pool spec or null")
        return cls(
            id=obj.get("id"),
            tables=tuple(tables),
            batch_size=_number({"batch_size": batch_size}, "batch_size", int),
            pool=dict(pool) if pool is not None else None,
            device=str(obj.get("device", "cpu")),
            optimizer=str(obj.get("optimizer", "exact_sgd")),
            precision=str(obj.get("precision", "fp32")),
            warmup=_number(obj, "warmup", int, 5),
            iters=_number(obj, "iters", int, 10),
            protocol=protocol,
            memory=bool(obj.get("memory", False)),
            pooling=str(obj.get("pooling", "sum")),
            weighted=_flag(obj, "weighted"),
            batches=_batches(obj),
            cache_load_factor=_load_factor(obj),
            **timed,
        )

    def tagged(self, request_id: int | str | None = None, **tags: Any) -> ComputeRequest:
        """This request with the caller's ``tags`` added (and another ``id``, where given)."""
        changes = {} if request_id is None else {"id": request_id}
        return dataclasses.replace(self, tags={**self.tags, **tags}, **changes)

    def tag(self, name: str) -> Any:
        """The caller's tag ``name`` (KeyError where it was not given)."""
        return self.tags[name]


def _load_factor(obj: Mapping) -> float | None:
    if obj.get("cache_load_factor") is None:
        return None
    value = _number(obj, "cache_load_factor", float)
    if not 0.0 < value <= 1.0:
        raise MessageError(f"request.cache_load_factor: got {value}, expected a share of the rows in (0, 1]")
    return value


def _batches(obj: Mapping) -> int:
    value = _number(obj, "batches", int, 1)
    if value < 1:
        raise MessageError(f"request.batches: got {value}, expected a count >= 1")
    return value


def _flag(obj: Mapping, key: str) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise MessageError(f"request.{key}: got {value!r:.40}, expected true or false")
    return value


def _number(obj: Mapping, key: str, kind: type, default: Any = None) -> Any:
    value = obj.get(key, default)
    try:
        if isinstance(value, bool) or value is None:
            raise TypeError
        return kind(value)
    except (TypeError, ValueError, OverflowError):
        raise MessageError(f"request.{key}: got {value!r:.40}, expected a number") from None


@dataclasses.dataclass(frozen=True)
class ComputeAnswer:
    """A worker's answer to a ``ComputeRequest`` (``id``): ``ok`` with the medians of its timed iterations
    (``fwd_ms``, ``bwd_ms``, ``total_ms``), a spread of them (``fwd_runs_ms``, ``bwd_runs_ms``), the ids looked up,
    the optimizer the kernels ran and the bytes of its state; on a CPU the share of its core the worker held while
    timing (``cpu_share``, below 1: something else ran there); for a protocol other than ``fixed`` its name and the
    iterations timed (``queued``: the share of batches the host stayed ahead in, ``ahead``); ``memory`` where asked.
    Not ``ok``: ``error`` says why (a refused request, a crash or a timeout: the worker restarts)."""

    id: int | str | None
    ok: bool
    error: str | None = None
    fwd_ms: float | None = None
    bwd_ms: float | None = None
    total_ms: float | None = None
    fwd_runs_ms: tuple[float, ...] = ()
    bwd_runs_ms: tuple[float, ...] = ()
    num_indices: int | None = None
    optimizer: str | None = None
    state_bytes: int | None = None
    cpu_share: float | None = None
    protocol: str | None = None
    timed_iters: int | None = None
    ahead: float | None = None
    memory: dict | None = None
    retries: int | None = None  # host side: the times a Ray actor died under this request before it was answered

    @classmethod
    def failed(cls, request_id: int | str | None, error: str) -> ComputeAnswer:
        return cls(request_id, False, error)

    def to_json(self, with_id: bool = True) -> JSONDoc:
        """The worker's line (and, ``with_id`` False, a label's answer fields): the fields it has, in this order."""
        out: dict[str, Any] = {"ok": self.ok}
        if self.error is not None:
            out["error"] = self.error
        for field in dataclasses.fields(self)[3:]:
            value = getattr(self, field.name)
            if value is not None and value != ():
                out[field.name] = list(value) if isinstance(value, tuple) else value
        if with_id:
            out["id"] = self.id
        return out

    @classmethod
    def from_json(cls, obj: Any) -> ComputeAnswer:
        """The answer the host reads (an unexpected line: not ``ok``, saying what came)."""
        if not isinstance(obj, Mapping) or "ok" not in obj:
            return cls(None, False, f"the worker answered {obj!r:.80}, expected an answer object")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in obj.items() if k in names}
        for key in ("fwd_runs_ms", "bwd_runs_ms"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**{"id": obj.get("id"), **values, "ok": bool(obj["ok"])})

    @property
    def core_share(self) -> float:
        """The share of its core the worker held while timing: 1 where none is recorded (a CUDA answer)."""
        return 1.0 if self.cpu_share is None else float(self.cpu_share)

    @property
    def quiet(self) -> bool:
        """Timed on a quiet machine: the worker held at least MIN_CPU_SHARE of its core."""
        return self.core_share >= MIN_CPU_SHARE


@dataclasses.dataclass(frozen=True)
class CommRequest:
    """One training step's collectives on every rank of a world (the rank processes' ``worker.comm.run_rank``): each
    rank's all-to-all width ``dim_sums`` (of which ``column_wise`` and ``row_wise``, sequence tables' row blocks, are
    all-to-alls of their own after the table-wise one), the bag tables' row-split ``row_groups`` ((width, ranks): a
    reduce-scatter forward, an all-gather backward), the input distributions before them (``inputs``: per sharding
    type, each rank's features' ids per sample), each rank's straggler delay before the forward (``delays_ms``), at
    ``batch_size``; ``warmup`` steps, then ``iters`` timed."""

    id: int | str
    batch_size: int
    dim_sums: tuple[int, ...]
    delays_ms: tuple[float, ...]
    column_wise: tuple[int, ...] = ()
    row_groups: tuple[tuple[int, tuple[int, ...]], ...] = ()
    inputs: tuple[list, ...] = ()
    warmup: int = 3
    iters: int = 10
    device: str = "cpu"
    row_wise: tuple[int, ...] = ()

    @classmethod
    def of(
        cls, layout: Mapping, request_id: int | str, batch_size: int, delays_ms, warmup: int = 3, iters: int = 10
    ) -> CommRequest:
        """The request of a comm layout (``core.assignment.comm_layout``, or a comm sample: ``dim_sums`` and, where
        the plan has them, ``column_wise``, ``row_wise``, ``row_groups``, ``inputs``)."""
        return cls(
            request_id,
            int(batch_size),
            tuple(int(d) for d in layout["dim_sums"]),
            tuple(float(d) for d in delays_ms),
            tuple(int(c) for c in layout.get("column_wise", ())),
            tuple((int(w), tuple(int(r) for r in ranks)) for w, ranks in layout.get("row_groups", ())),
            tuple(layout.get("inputs", ())),
            int(warmup),
            int(iters),
            row_wise=tuple(int(c) for c in layout.get("row_wise", ())),
        )

    def to_json(self) -> JSONDoc:
        """The line the rank processes read (the parts a step does not run left out)."""
        out: dict[str, Any] = {"id": self.id, "dim_sums": list(self.dim_sums), "delays_ms": list(self.delays_ms)}
        if self.column_wise:
            out["column_wise"] = list(self.column_wise)
        if self.row_wise:
            out["row_wise"] = list(self.row_wise)
        if self.row_groups:
            out["row_groups"] = [[w, list(ranks)] for w, ranks in self.row_groups]
        if self.inputs:
            out["inputs"] = list(self.inputs)
        out.update(batch_size=self.batch_size, warmup=self.warmup, iters=self.iters, device=self.device)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> CommRequest:
        """The request a rank reads (MessageError naming what is missing or malformed)."""
        if not isinstance(obj, Mapping):
            raise MessageError(f"comm request: got {type(obj).__name__}, expected a JSON object")
        try:
            request = cls.of(
                obj, obj.get("id"), obj["batch_size"], obj["delays_ms"], obj.get("warmup", 3), obj.get("iters", 10)
            )
        except KeyError as err:
            raise MessageError(f"comm request: no {err.args[0]!r}, expected dim_sums, delays_ms, batch_size") from None
        except (TypeError, ValueError) as err:
            raise MessageError(f"comm request {obj.get('id')!r}: {err}") from None
        if len(request.delays_ms) != len(request.dim_sums):
            raise MessageError(
                f"comm request {request.id!r}: {len(request.delays_ms)} delays for {len(request.dim_sums)} ranks"
            )
        return dataclasses.replace(request, device=str(obj.get("device", "cpu")))


@dataclasses.dataclass(frozen=True)
class CommAnswer:
    """One rank's times of a ``CommRequest`` (medians over its timed steps): the forward (input distributions, the
    wait for the latest peer, the all-to-alls, the row groups' reduce-scatters) and the backward; of which the row
    groups' collectives (``fwd_rows_ms``, ``bwd_rows_ms``) and the input distributions (``fwd_inputs_ms``)."""

    id: int | str
    rank: int
    fwd_ms: float
    bwd_ms: float
    fwd_rows_ms: float = 0.0
    bwd_rows_ms: float = 0.0
    fwd_inputs_ms: float = 0.0

    def to_json(self) -> JSONDoc:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping) -> CommAnswer:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in names})


# ---------------------------------------------------------------------------------------------------------------------
# TorchRec's jobs: one request file in, one result file out per run of the worker (``torchrec-plan``, ``-export``,
# ``-run``, ``-steps``, ``-memory``), each a record below; the worker reads ``Job.from_json`` and the host writes
# ``job.to_json()``.


def _fields_json(record) -> JSONDoc:
    """A record's fields as JSON: nested records by their own ``to_json``, tuples as lists, None left out."""
    out: JSONDoc = {}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if value is None:
            continue
        if isinstance(value, tuple):
            value = [v.to_json() if hasattr(v, "to_json") else v for v in value]
        out[field.name] = value
    return out


def _record_of(cls, obj: Any, where: str, nested: Mapping[str, type] | None = None):
    """``cls`` from its JSON (``_fields_json``): lists back to tuples, ``nested`` fields' elements by their type's
    ``from_json``; MessageError naming ``where`` and what is missing."""
    if not isinstance(obj, Mapping):
        raise MessageError(f"{where}: got {type(obj).__name__}, expected a JSON object")
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in obj.items() if k in names}
    for key, value in values.items():
        if isinstance(value, list):
            kind = (nested or {}).get(key)
            values[key] = tuple(kind.from_json(v) if kind else v for v in value)
    try:
        return cls(**values)
    except TypeError as err:
        raise MessageError(f"{where}: {err}") from None


class _Job:
    """A TorchRec job's record: its JSON both ways, the nested ``tables`` as ``TorchRecTable``s (``WHERE`` names it in
    errors)."""

    WHERE: ClassVar[str] = "torchrec job"

    def to_json(self) -> JSONDoc:
        return _fields_json(self)

    @classmethod
    def from_json(cls, obj: Any):
        return _record_of(cls, obj, cls.WHERE, {"tables": TorchRecTable})


@dataclasses.dataclass(frozen=True)
class TorchRecTable:
    """A table as TorchRec's jobs take it: ``rows`` x ``dim``, its ``name`` in the ShardingPlan (the planner's job
    names its own); for the planner its ``pooling_factor`` and constraints (``sharding_types``, ``min_partition``); for
    training steps the ``stream`` its ids come from (a table in the compute worker's form: a spec or a pool id); the
    ``kernel`` it runs in (``core.table.KERNEL_KINDS``: which collection of the task's model holds it,
    ``torchrec_format.task_collections``); its weights' ``precision`` where not the job's."""

    rows: int
    dim: int
    name: str | None = None
    pooling_factor: float | None = None
    sharding_types: tuple[str, ...] | None = None
    min_partition: int | None = None
    stream: list | dict | None = None
    kernel: str = "sum"
    precision: str | None = None

    def to_json(self) -> JSONDoc:
        return _fields_json(self)

    @classmethod
    def from_json(cls, obj: Any) -> TorchRecTable:
        return _record_of(cls, obj, "torchrec table")


@dataclasses.dataclass(frozen=True)
class PlanJob(_Job):
    """``torchrec-plan``: TorchRec's EmbeddingShardingPlanner over ``tables`` on ``num_devices`` ranks of
    ``mem_caps_bytes`` each, at TorchRec's per-rank ``batch_size``, ``precision``, the allowed ``sharding_types``,
    a storage ``reservation`` (heuristic: TorchRec's default; percent: a fixed 15%), where the devices sit in hosts
    their ``links`` (local_size, intra_host_gbps, inter_host_gbps), and whether tables may go to tiered memory
    (``uvm_caching``: TorchRec's ``fused_uvm_caching`` among the kernels)."""

    tables: tuple[TorchRecTable, ...]
    num_devices: int
    mem_caps_bytes: tuple[int, ...]
    batch_size: int
    precision: str
    sharding_types: tuple[str, ...]
    reservation: str = "heuristic"
    links: dict | None = None
    uvm_caching: bool = False  # TorchRec's fused_uvm_caching offered beside the fused kernel (tiered memory)

    WHERE: ClassVar[str] = "torchrec-plan request"


@dataclasses.dataclass(frozen=True)
class ExportJob(_Job):
    """``torchrec-export``: a plan as TorchRec's ShardingPlan: ``tables`` (named), each table's ``shards`` in
    TorchRec's terms ({rank, col_offset, dim(, row_offset, num_rows)} or {data_parallel}), ``world_size`` ranks of
    ``local_size`` a host, for ``device`` and ``compute_kernel``, the collection at ``module_path`` of the model."""

    tables: tuple[TorchRecTable, ...]
    shards: tuple[list, ...]
    world_size: int
    local_size: int
    device: str
    compute_kernel: str
    module_path: str

    WHERE: ClassVar[str] = "torchrec-export request"


@dataclasses.dataclass(frozen=True)
class RunJob(_Job):
    """``torchrec-run``: the exported ShardingPlan at ``plan`` loaded into DistributedModelParallel on every rank,
    the collection of ``tables`` at ``module_path``, one forward and backward at ``batch_size`` checked."""

    plan: str
    tables: tuple[TorchRecTable, ...]
    module_path: str
    batch_size: int

    WHERE: ClassVar[str] = "torchrec-run request"


@dataclasses.dataclass(frozen=True)
class StepsJob(_Job):
    """``torchrec-steps`` (``plans``: exported ShardingPlans, their steps interleaved; ``warmup`` then ``steps``
    timed) and ``torchrec-memory`` (``plans``: one; ``optimizer`` fused into the backward, ``steps`` run): training
    steps of ``tables`` (each with its ``stream``; a pool table's ids from ``pool``) at ``batch_size``."""

    tables: tuple[TorchRecTable, ...]
    batch_size: int
    plans: tuple[str, ...]
    steps: int
    pool: dict | None = None
    warmup: int = 0
    optimizer: str | None = None

    WHERE: ClassVar[str] = "torchrec-steps request"


# The jobs' results, read by the host: ``torchrec-plan`` and ``-export`` write one (``to_json``), each rank of
# ``-run``, ``-steps`` and ``-memory`` one of its own; the host reads them with ``from_json``.


@dataclasses.dataclass(frozen=True)
class PlanAnswer:
    """``torchrec-plan``'s result: per table (in the request's order) its shards in TorchRec's terms
    ({col_offset, dim, rank(, row_offset, num_rows)} or {data_parallel}) and the seconds TorchRec's planner took; or
    ``error`` (``infeasible``: the planner found no plan that fits)."""

    shards: tuple[list, ...] = ()
    planner_s: float | None = None
    error: str | None = None
    infeasible: bool = False

    def to_json(self) -> JSONDoc:
        """{shards, planner_s}, or {error(, infeasible)}."""
        if self.error is not None:
            return {"error": self.error, **({"infeasible": True} if self.infeasible else {})}
        return {"shards": list(self.shards), "planner_s": self.planner_s}

    @classmethod
    def from_json(cls, obj: Any) -> PlanAnswer:
        if not isinstance(obj, Mapping):
            raise MessageError(f"torchrec-plan result: got {type(obj).__name__}, expected a JSON object")
        if "error" in obj:
            return cls(error=str(obj["error"]), infeasible=bool(obj.get("infeasible", False)))
        if not isinstance(obj.get("shards"), list):
            raise MessageError(f"torchrec-plan result: got {obj!r:.80}, expected shards or an error")
        return cls(tuple(obj["shards"]), obj.get("planner_s"))


@dataclasses.dataclass(frozen=True)
class ExportAnswer:
    """``torchrec-export``'s result: the ShardingPlan written and checked (``plan``: TorchRec's printout of it), or
    ``error``."""

    plan: str | None = None
    error: str | None = None

    def to_json(self) -> JSONDoc:
        """{ok: true, plan}, or {error}."""
        return {"error": self.error} if self.error is not None else {"ok": True, "plan": self.plan}

    @classmethod
    def from_json(cls, obj: Any) -> ExportAnswer:
        if not isinstance(obj, Mapping) or not ("error" in obj or "plan" in obj):
            raise MessageError(f"torchrec-export result: got {obj!r:.80}, expected a plan or an error")
        return cls(error=str(obj["error"])) if "error" in obj else cls(plan=str(obj["plan"]))


class _Report:
    """A rank's result record: its JSON both ways, field by field as JSON has them (``WHERE`` names it in errors)."""

    WHERE: ClassVar[str] = "rank report"

    def to_json(self) -> JSONDoc:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: Any):
        if not isinstance(obj, Mapping):
            raise MessageError(f"{cls.WHERE}: got {type(obj).__name__}, expected a JSON object")
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in obj.items() if k in names})
        except TypeError as err:
            raise MessageError(f"{cls.WHERE}: {err}") from None


@dataclasses.dataclass(frozen=True)
class RunReport(_Report):
    """A ``torchrec-run`` rank's check: the shards it holds ([table name, col_offset, dim, row_offset, num_rows],
    sorted), its forward's output shape and the largest difference from the expected outputs."""

    rank: int
    local_shards: list[list]
    output_shape: list[int]
    max_abs_error: float

    WHERE: ClassVar[str] = "torchrec-run report"


@dataclasses.dataclass(frozen=True)
class StepsReport(_Report):
    """A ``torchrec-steps`` rank's times: per plan the seconds of each timed step (``step_s``, wall; ``cpu_s``, this
    process's CPU time) and the bytes of the embedding weights it holds (``local_bytes``)."""

    rank: int
    step_s: list[list[float]]
    cpu_s: list[list[float]]
    local_bytes: list[int]

    WHERE: ClassVar[str] = "torchrec-steps report"


@dataclasses.dataclass(frozen=True)
class MemoryReport(_Report):
    """A ``torchrec-memory`` rank's memory (bytes): resident ``before`` the model was built, once ``built``, the
    ``peak`` over the training steps; the allocator's count of its shards' weights and optimizer state."""

    rank: int
    before: int
    built: int
    peak: int
    weights_bytes: int
    state_bytes: int

    WHERE: ClassVar[str] = "torchrec-memory report"
