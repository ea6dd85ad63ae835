"""Fused table-batched embedding kernels (FBGEMM TBE) timed fwd+bwd on one table set: the serve loop's job."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import sys
import time
import zlib
from importlib.metadata import PackageNotFoundError, version

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.memory import kernel_optimizer
from neuroshard_jax.core.sharding import is_legal_dim
from neuroshard_jax.core.table import KERNEL_KINDS, kernel_kind, kernel_parts
from neuroshard_jax.kernels.messages import ComputeAnswer, ComputeRequest, MessageError, ref_words
from neuroshard_jax.kernels.worker.timing import (
    GPU_PROTOCOLS,
    MAX_KEPT_RUNS,
    CpuTimer,
    CudaTimer,
    RequestError,
    graphed_step,
    queued_runs,
    timed_runs,
)
from neuroshard_jax.workloads.pool import PoolSpec, pool_streams
from neuroshard_jax.workloads.streams import next_batches, request_spec, restrict_rows, spec_stream

PRECISIONS = ("fp32", "fp16", "bf16")
POOLING_MODES = {"sum": "SUM", "mean": "MEAN", "none": "NONE"}  # core.table.POOLINGS -> FBGEMM's PoolingMode
WEIGHT_SEED = 7  # per-id weights of a weighted request: uniform in [0.5, 1.5), the same on every run
LEARNING_RATE = 0.01
INIT_SCALE = 0.01  # weights start at zero on CPU; zeros would make the SGD updates denormal-heavy
MAX_BATCHES_BYTES = 512 << 20  # a request's further batches (``KernelInputs.batches``) hold at most this much


def setup_torch(device: str):
    import torch

    torch.set_num_threads(1)
    if device == "cuda" and not torch.cuda.is_available():
        raise RequestError("device 'cuda' requested but torch sees no CUDA device")
    return torch


_STREAMS: dict = {}


def _pool_streams(pool: dict):
    """(rows i64[P], StreamSource) of a pool, cached for the life of the worker."""
    key = json.dumps(pool, sort_keys=True)
    if key not in _STREAMS:
        _STREAMS[key] = pool_streams(PoolSpec.from_json(pool))
    return _STREAMS[key]


def shard_inputs(request: ComputeRequest) -> list[KernelInputs]:
    """The request's kernels, as TorchRec runs a device's tables: one fused TBE per kernel kind (its tables' own
    ``kernel``, else the request's pooling and weights) and data type (their own ``precision``, else the request's),
    a sequence kernel per dim; each with its tables' (rows, dim) specs and index streams (a pool's real ones, or
    synthesised from a table spec), concatenated table-major, in the order the kernels first appear."""
    batch = request.batch_size
    default = _request_kind(request)
    if request.precision not in PRECISIONS:
        raise RequestError(f"precision {request.precision!r}, expected one of {', '.join(PRECISIONS)}")
    groups: dict[tuple[str, str, int, float | None], KernelInputs] = {}
    for i, table in enumerate(request.tables):
        kind, precision, cached, table = _table_kind(table, default, request.precision, f"table {i}")
        cached = request.cache_load_factor if cached is None else cached
        num_rows, dim, (indices, offsets) = table_stream(table, request.pool, batch, f"table {i}")
        stream_key = _stream_key(table)
        if int(dim) < 1 or (request.device == "cuda" and not is_legal_dim(dim)):
            want = "a positive multiple of 4 on CUDA" if request.device == "cuda" else "a positive width"
            raise RequestError(f"table {i}: dim {dim}, expected {want}")
        # FBGEMM's kernels take widths that are multiples of 4 (its rows are 4-aligned): a table of another width,
        # which TorchRec takes, is timed at the next multiple of 4
        dim = -(-int(dim) // 4) * 4
        key = (kind, precision, int(dim) if kind == "sequence" else 0, cached)
        groups.setdefault(key, KernelInputs(kind, precision, cached)).tables.append(
            (num_rows, int(dim), indices, offsets, stream_key)
        )
    return list(groups.values())


def _stream_key(table) -> int:
    """A number naming a table's stream: tables of one stream (the column slices of one table: the same spec and
    seed, or the same pool table, and row block) get the same further batches (``streams.next_batches``)."""
    if isinstance(table, dict):
        named = ("dim", "kernel", "precision", "cache_load_factor")
        key = json.dumps({k: v for k, v in table.items() if k not in named}, sort_keys=True)
    else:
        key = json.dumps([x for j, x in enumerate(table) if j != 1 and not isinstance(x, str)])
    return zlib.crc32(key.encode())


@dataclasses.dataclass
class KernelInputs:
    """One kernel of a request: its kind (``core.table.KERNEL_KINDS``) and data type, and its tables in order, each
    (rows, dim, indices, its own offsets, stream key): its index stream and what its further batches are drawn from."""

    kind: str
    precision: str = "fp32"  # its weights' data type (``PRECISIONS``)
    cache_load_factor: float | None = None  # tiered memory: FBGEMM's managed caching at this load factor
    tables: list = dataclasses.field(default_factory=list)

    @property
    def specs(self) -> list[tuple[int, int]]:
        return [(rows, dim) for rows, dim, *_ in self.tables]

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The tables' index streams concatenated table-major (``offsets`` as FBGEMM takes them)."""
        return _concatenated([(ids, offsets) for _, _, ids, offsets, _ in self.tables])

    def batches(self, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The kernel's first ``count`` batches (``streams.next_batches`` per table, concatenated as ``arrays``),
        the first ``arrays()``; fewer where ``count`` of them would hold more than ``MAX_BATCHES_BYTES``."""
        size = sum(len(ids) + len(offsets) for _, _, ids, offsets, _ in self.tables)
        count = max(1, min(count, MAX_BATCHES_BYTES // (8 * size)))
        if count <= 1:
            return [self.arrays()]
        per_table = [next_batches(ids, offsets, rows, count, key) for rows, _, ids, offsets, key in self.tables]
        return [_concatenated([batches[k] for batches in per_table]) for k in range(count)]


def _concatenated(streams: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Tables' (indices, offsets from 0) as one kernel's: the indices table-major, the offsets shifted to match."""
    offsets, base = [np.zeros(1, dtype=np.int64)], 0
    for _, offs in streams:
        offsets.append(offs[1:] + base)
        base += int(offs[-1])
    return np.concatenate([ids for ids, _ in streams]), np.concatenate(offsets)


# FBGEMM's releases and the torch each is built for (FBGEMM's compatibility table); a pair outside it does not load
FBGEMM_TORCH = {"1.8": "2.13", "1.9": "2.14"}


def fbgemm_mismatch(torch, err: Exception) -> str:
    """One line on an FBGEMM that does not load beside this torch: the pair, the one it needs, the cause."""
    found = "unknown"
    for name in ("fbgemm-gpu-cpu", "fbgemm-gpu"):
        try:
            found = version(name)
            break
        except PackageNotFoundError:
            continue
    line = ".".join(found.split(".")[:2])
    need = FBGEMM_TORCH.get(line)
    pairs = ", ".join(f"{f} with torch {t}" for f, t in FBGEMM_TORCH.items())
    return (
        f"fbgemm_gpu {found} does not load beside torch {torch.__version__}"
        + (f" (it is built for torch {need})" if need else "")
        + f"; expected a pair FBGEMM releases together ({pairs}): {str(err).splitlines()[0][:160]}"
    )


def _request_kind(request: ComputeRequest) -> str:
    """The kernel kind of the request's tables that name none (RequestError for an unknown pooling or a weighted
    sequence request)."""
    if request.pooling not in POOLING_MODES:
        raise RequestError(f"pooling {request.pooling!r}, expected one of {', '.join(POOLING_MODES)}")
    try:
        return kernel_kind(request.pooling, request.weighted)
    except ValueError as err:
        raise RequestError(f"request {err}") from None


def _table_kind(table, default: str, precision: str, where: str):
    """(kind, precision, cache load factor, the table without them) of a request's table: a spec's ``kernel``,
    ``precision`` and ``cache_load_factor`` keys, a pool reference's trailing names (``processes.PoolTableRef``), else
    ``default``, the request's ``precision`` and None (the request's cache)."""
    kind, cached = default, None
    if isinstance(table, dict):
        table = dict(table)
        kind = table.pop("kernel", kind)
        precision = table.pop("precision", precision)
        cached = table.pop("cache_load_factor", None)
    elif isinstance(table, list):
        table, named = ref_words(table)
        kind, precision = named.get("kernel", kind), named.get("precision", precision)
        cached = named.get("cache_load_factor")
    if kind not in KERNEL_KINDS:
        raise RequestError(f"{where}: kernel {kind!r}, expected one of {', '.join(KERNEL_KINDS)}")
    if precision not in PRECISIONS:
        raise RequestError(f"{where}: precision {precision!r}, expected one of {', '.join(PRECISIONS)}")
    if cached is not None:
        try:
            cached = float(cached)
        except (TypeError, ValueError):
            cached = None
        if cached is None or not 0 < cached <= 1:
            raise RequestError(f"{where}: cache_load_factor {cached!r}, expected a share of the rows in (0, 1]")
    return kind, precision, cached, table


def table_stream(table, pool: dict | None, batch: int, where: str):
    """(rows, dim, (indices, offsets)) of one table of a request: a pool table id (of ``pool``) or a table spec,
    whole or one row block of it (``row_offset``, ``num_rows``: the block's own lookups, ``streams.restrict_rows``)."""
    if isinstance(table, dict):
        try:
            # stream_batch: the batch the spec's histogram describes, of which this request runs the first ``batch``
            # bags (a data-parallel table: each device's slice of the batch)
            stream_batch = int(table.get("stream_batch", batch))
            if stream_batch < batch:
                raise RequestError(f"{where}: stream_batch {stream_batch}, expected at least the batch size {batch}")
            spec, seed = request_spec(table, stream_batch)
            rows, dim, stream = spec.rows, int(table["dim"]), spec_stream(spec, seed, where)
            if stream_batch != batch:
                indices, offsets = stream
                stream = indices[: offsets[batch]], offsets[: batch + 1]
            block = (int(table["row_offset"]), int(table["num_rows"])) if "num_rows" in table else None
        except UserError as err:
            raise RequestError(str(err)) from None
        except (KeyError, TypeError, ValueError):
            raise RequestError(f"{where}: got {table!r:.80}, expected rows, pooling_factor, bins, dim") from None
    else:
        try:
            table_id, dim, *block = (int(x) for x in table)
        except (TypeError, ValueError):
            raise RequestError(
                f"{where}: got {table!r:.80}, expected [pool table id, dim(, row_offset, num_rows)]"
            ) from None
        if pool is None:
            raise RequestError(f"{where}: pool table {table_id}, but the request names no pool")
        pool_rows, streams = _pool_streams(pool)
        if not 0 <= table_id < len(pool_rows):
            raise RequestError(f"table id {table_id} is not in the pool (0..{len(pool_rows) - 1})")
        if len(block) not in (0, 2):
            raise RequestError(f"{where}: got {table!r:.80}, expected [pool table id, dim(, row_offset, num_rows)]")
        rows, stream, block = int(pool_rows[table_id]), streams.stream(table_id, batch), block or None
    if block is None:
        return rows, dim, stream
    offset, count = block
    if not (0 <= offset and 0 < count and offset + count <= rows):
        raise RequestError(f"{where}: row block [{offset}, {offset + count}), expected rows within [0, {rows})")
    return count, dim, restrict_rows(*stream, offset, count)


def profile_compute(request: ComputeRequest) -> ComputeAnswer:
    """Time forward and backward of one fused TBE over the shard's tables: the medians of the timed iterations of
    the request's protocol (``timed_runs``)."""
    device = request.device
    torch = setup_torch(device)
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
    except (ImportError, OSError) as err:  # a build of FBGEMM for another torch: an undefined symbol
        raise RequestError(fbgemm_mismatch(torch, err)) from None

    devices = compute_device_enum()
    try:  # the optimizers FBGEMM 1.8's TBE runs on this device (core.memory.OPTIMIZERS)
        optimizer = kernel_optimizer(request.optimizer, device).name
    except UserError as err:
        raise RequestError(str(err)) from None
    groups = shard_inputs(request)
    on_gpu = device == "cuda"
    location, compute = (EmbeddingLocation.DEVICE, devices.CUDA) if on_gpu else (EmbeddingLocation.HOST, devices.CPU)
    cached = next((g.cache_load_factor for g in groups if g.cache_load_factor is not None), None)
    if cached is not None and not on_gpu:  # tiered memory: host rows through UVM, a share cached on the GPU
        raise RequestError(
            f"cache_load_factor: got {cached} on device {device!r}, expected device 'cuda' "
            "(FBGEMM's managed caching keeps a GPU's cache of host rows; a CPU's tables are in host memory)"
        )
    timer = CudaTimer(torch) if on_gpu else CpuTimer()  # before the count starts: its flush buffer is the timer's
    base = _allocated(torch) if on_gpu and request.memory else None
    target = torch.device("cuda" if on_gpu else "cpu")
    kernels = []
    for group in groups:
        pooling, weighted = kernel_parts(group.kind)
        where, caching = location, {}
        if group.cache_load_factor is not None:  # TorchRec runs a rank's cached tables in a TBE of their own
            where, caching = EmbeddingLocation.MANAGED_CACHING, {"cache_load_factor": group.cache_load_factor}
        tbe = SplitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(rows, dim, where, compute) for rows, dim in group.specs],
            optimizer=EmbOptimType(optimizer),
            learning_rate=LEARNING_RATE,
            weights_precision=SparseType(group.precision),
            pooling_mode=getattr(PoolingMode, POOLING_MODES[pooling]),
            device=target,
            **caching,
        )
        with torch.no_grad():
            for weights in tbe.split_embedding_weights():
                weights.uniform_(-INIT_SCALE, INIT_SCALE)
        drawn = group.batches(request.batches)
        batches = [tuple(torch.from_numpy(a).to(target) for a in arrays) for arrays in drawn]
        indices, offsets = (a.copy() for a in drawn[0])  # the inputs, which the later batches are copied into
        per_id = None
        if weighted:  # per-id weights, as a weighted feature's KeyedJaggedTensor carries them (no gradient)
            per_id = np.random.default_rng(WEIGHT_SEED).uniform(0.5, 1.5, len(indices)).astype(np.float32)
            per_id = torch.from_numpy(per_id).to(target)
        inputs = (torch.from_numpy(indices).to(target), torch.from_numpy(offsets).to(target))
        dims = tuple(dim for _, dim in group.specs)
        kernels.append(_Kernel(tbe, *inputs, per_id, dims, pooling == "none", batches))
    tbe = _Kernels(torch, kernels)
    grad = []

    def step() -> tuple[float, float]:
        tbe.advance()
        timer.flush()
        timer.start()
        out = tbe.forward()
        timer.mark()
        if not grad:
            grad.append(tbe.grads(out))
        tbe.backward(out, grad[0])
        return timer.stop()

    protocol = request.protocol
    if protocol in GPU_PROTOCOLS and not on_gpu:
        raise RequestError(f"protocol {protocol!r} ({GPU_PROTOCOLS[protocol]}) needs device 'cuda'")
    ahead = None
    if protocol == "graph":
        step = graphed_step(torch, tbe, timer)
    if protocol == "queued":
        runs, ahead = queued_runs(torch, tbe, timer, request)
        cpu_share = 1.0
    else:
        runs, cpu_share = timed_runs(step, request)
    fwd_runs, bwd_runs = [f for f, _ in runs], [b for _, b in runs]
    totals = [f + b for f, b in runs]
    memory = _memory(torch, tbe, tbe.inputs(), tbe.outputs(request.batch_size), base) if request.memory else None
    kept = np.unique(np.linspace(0, len(runs) - 1, min(len(runs), MAX_KEPT_RUNS)).round().astype(int))
    return ComputeAnswer(
        request.id,
        True,
        fwd_ms=statistics.median(fwd_runs),
        bwd_ms=statistics.median(bwd_runs),
        total_ms=statistics.median(totals),
        fwd_runs_ms=tuple(round(fwd_runs[i], 4) for i in kept),
        bwd_runs_ms=tuple(round(bwd_runs[i], 4) for i in kept),
        num_indices=int(sum(len(k.indices) for k in kernels)),
        optimizer=optimizer,  # with the bytes of the state its kernels keep (the allocator's count)
        state_bytes=sum(t.numel() * t.element_size() for state in tbe.split_optimizer_states() for t in state),
        cpu_share=None if on_gpu else round(cpu_share, 3),
        protocol=protocol if protocol != "fixed" else None,
        timed_iters=len(runs) if protocol != "fixed" else None,
        ahead=round(ahead, 3) if ahead is not None else None,
        memory=memory,
    )


@dataclasses.dataclass
class _Kernel:
    """One fused TBE of a request and its inputs (``per_id``: a weighted kernel's per-id weights)."""

    tbe: object
    indices: object
    offsets: object
    per_id: object = None
    dims: tuple[int, ...] = ()
    sequence: bool = False  # unpooled: a row per id
    # the batches its iterations take in turn (``KernelInputs.batches``: the first is the inputs'), each copied into
    # the inputs before an iteration (a CUDA graph replays the inputs it captured); one: the same batch every time
    batches: list = dataclasses.field(default_factory=list)
    turn: int = 0

    def advance(self) -> None:
        """The next batch into the inputs (their shapes stay: the batches have one length), outside the timing."""
        if len(self.batches) > 1:
            self.turn = (self.turn + 1) % len(self.batches)
            indices, offsets = self.batches[self.turn]
            self.indices.copy_(indices)
            self.offsets.copy_(offsets)

    def __call__(self):
        if self.per_id is None:
            return self.tbe(self.indices, self.offsets)
        return self.tbe(self.indices, self.offsets, per_sample_weights=self.per_id)


class _Kernels:
    """A request's kernels run as a device runs them: every forward, then every backward (one autograd call); what
    the module holds, summed over them. A request of one kind is one kernel, as labels always were."""

    def __init__(self, torch, kernels: list[_Kernel]):
        self.torch, self.kernels = torch, kernels

    def forward(self) -> tuple:
        return tuple(k() for k in self.kernels)

    def advance(self) -> None:
        for k in self.kernels:
            k.advance()

    def grads(self, outs) -> tuple:
        return tuple(self.torch.full_like(out, 1e-3) for out in outs)

    def backward(self, outs, grads) -> None:
        self.torch.autograd.backward(outs, grads)

    def parameters(self):
        return [t for k in self.kernels for t in k.tbe.parameters()]

    def buffers(self):
        return [t for k in self.kernels for t in k.tbe.buffers()]

    def split_optimizer_states(self):
        return [state for k in self.kernels for state in k.tbe.split_optimizer_states()]

    def inputs(self) -> list:
        return [t for k in self.kernels for t in (k.indices, k.offsets) + ((k.per_id,) if k.per_id is not None else ())]

    def outputs(self, batch_size: int) -> int:
        """Output elements: a row per bag of each pooled table, a row per id of a sequence kernel."""
        return sum(len(k.indices) * k.dims[0] if k.sequence else batch_size * sum(k.dims) for k in self.kernels)


def _allocated(torch) -> int:
    """The CUDA allocator's bytes in use, its high-water mark reset to them: a request's peak counts from here."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def _memory(torch, tbe, inputs, outputs: int, base: int | None) -> JSONDoc:
    """What the request's kernels held: ``held_bytes``, by the allocator's count of the module's tensors (weights,
    optimizer state, FBGEMM's bookkeeping), the ids and offsets, and the ``outputs`` pooled values (batch x the
    tables' dims) and their gradients, fp32; on CUDA also ``peak_bytes``, the allocator's high-water mark over the
    request less what was allocated before the module was built (``torch.cuda.max_memory_allocated``)."""
    module = sum(t.numel() * t.element_size() for t in (*tbe.parameters(), *tbe.buffers()))
    held = module + sum(t.numel() * t.element_size() for t in inputs) + 2 * outputs * 4
    out = {"held_bytes": int(held), "module_bytes": int(module)}
    if base is not None:
        torch.cuda.synchronize()
        out["peak_bytes"] = int(torch.cuda.max_memory_allocated() - base)
    return out


def compute_device_enum():
    """FBGEMM's ``ComputeDevice``: in ``fbgemm_gpu.tbe.config.embedding_config`` from 1.8 (the pinned release), in
    ``split_table_batched_embeddings_ops_common`` in 1.6 and 1.7 (the releases paired with torch 2.11/2.12)."""
    try:
        from fbgemm_gpu.tbe.config.embedding_config import ComputeDevice
    except ImportError:
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import ComputeDevice
    return ComputeDevice


def _inject_fault(request_id) -> None:
    """Deliberate failures, for testing crash isolation only.

    NEUROSHARD_WORKER_FAULTS="3:segfault,5:hang,7:exit" makes the request with id 3 crash the worker
    with SIGSEGV, id 5 hang, id 7 exit with code 3. Unset in normal use.
    """
    spec = os.environ.get("NEUROSHARD_WORKER_FAULTS")
    if not spec:
        return
    faults = dict(item.split(":") for item in spec.split(","))
    fault = faults.get(str(request_id))
    if fault == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif fault == "hang":
        time.sleep(3600)
    elif fault == "exit":
        os._exit(3)


def serve() -> None:
    """Answer compute requests (``ComputeRequest``), one JSON line in, one JSON line out (``ComputeAnswer``), until
    stdin closes."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as err:
            raw = None
            answer = ComputeAnswer.failed(None, f"request: not JSON ({err})")
        request_id = raw.get("id") if isinstance(raw, dict) else None
        _inject_fault(request_id)
        try:
            if raw is not None:
                answer = profile_compute(ComputeRequest.from_json(raw))
        except (RequestError, MessageError) as err:
            answer = ComputeAnswer.failed(request_id, str(err))
        except Exception as err:  # e.g. an allocation failure in torch: report it, keep serving
            answer = ComputeAnswer.failed(request_id, f"{type(err).__name__}: {err}"[:500])
        sys.stdout.write(json.dumps(answer.to_json()) + "\n")
        sys.stdout.flush()
