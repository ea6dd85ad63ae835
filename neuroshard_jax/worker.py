"""The torch side of the wall: the only module that imports torch and fbgemm_gpu.

Always run as a subprocess (``python -m neuroshard_jax.worker <command>``), never imported by JAX code
and never forked from a process that imported JAX. One torch thread per process.

Commands:
  serve                 read profiling requests (JSON lines) on stdin, answer each on stdout
  comm RANK WORLD INIT REQUESTS OUT
                        one rank of an all-to-all benchmark (gloo on CPU, NCCL on CUDA)
  dlrm-to-npz IN OUT    convert a DLRM benchmark file (torch.load -> indices, offsets, lengths) to .npz
  torchrec-plan IN OUT  run TorchRec's EmbeddingShardingPlanner on a task (searchers/torchrec.py)
  torchrec-export IN OUT
                        write our plan as a TorchRec ShardingPlan (torch.save) (neuroshard_jax/export.py)
  torchrec-run RANK WORLD INIT IN OUT
                        one rank of DistributedModelParallel with an exported plan: forward + backward

A compute request: {"id", "device": "cpu"|"cuda", "pool": {...PoolSpec} (when tables name pool ids), "batch_size",
"tables": [[pool table id, dim] | {"rows", "pooling_factor", "bins", "dim", "seed"}, ...], "optimizer",
"precision", "warmup", "iters"}. A table given by its spec gets an index stream synthesised to match it
(``neuroshard_jax.streams``), the same for the same seed. A row block of a table: [pool table id, dim,
row_offset, num_rows], or its spec with "row_offset" and "num_rows": the table's stream restricted to the block.
The answer: {"id", "ok": true, "fwd_ms", "bwd_ms", "total_ms", "fwd_runs_ms", "bwd_runs_ms", "cpu_share"} (medians
over the timed iterations), or {"id", "ok": false, "error"} for a request it refuses.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.errors import UserError
from neuroshard_jax.sharding import is_legal_dim
from neuroshard_jax.streams import request_spec, restrict_rows, spec_stream
from neuroshard_jax.tables import PoolSpec, pool_streams
from neuroshard_jax.torchrec_plans import (
    TORCHREC_MISSING,
    embedding_bag_collection,
    mismatch,
    plan_shards,
    sharding_plan,
)

OPTIMIZERS = ("exact_sgd", "exact_row_wise_adagrad", "exact_adagrad", "sgd")
PRECISIONS = ("fp32", "fp16", "bf16")
LEARNING_RATE = 0.01
INIT_SCALE = 0.01  # weights start at zero on CPU; zeros would make the SGD updates denormal-heavy


class RequestError(Exception):
    """A request the worker refuses (answered, the worker keeps serving)."""


def _setup_torch(device: str):
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


def shard_inputs(request: dict) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
    """The shard's (rows, dim) specs and its tables' index streams (a pool's real ones, or synthesised from
    a table spec), concatenated table-major."""
    batch = int(request["batch_size"])
    specs, all_indices, all_offsets, base = [], [], [np.zeros(1, dtype=np.int64)], 0
    for i, table in enumerate(request["tables"]):
        num_rows, dim, (indices, offsets) = _table_stream(table, request, batch, f"table {i}")
        if not is_legal_dim(dim):
            raise RequestError(f"table {i}: dim {dim} is not a legal width (a positive multiple of 4)")
        specs.append((num_rows, int(dim)))
        all_indices.append(indices)
        all_offsets.append(offsets[1:] + base)
        base += len(indices)
    return specs, np.concatenate(all_indices), np.concatenate(all_offsets)


def _table_stream(table, request: dict, batch: int, where: str):
    """(rows, dim, (indices, offsets)) of one table of a request: a pool table id or a table spec, whole or one
    row block of it (``row_offset``, ``num_rows``: the block's own lookups, ``streams.restrict_rows``)."""
    if isinstance(table, dict):
        try:
            spec, seed = request_spec(table, batch)
            rows, dim, stream = spec.rows, int(table["dim"]), spec_stream(spec, seed, where)
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
        pool_rows, streams = _pool_streams(request["pool"])
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


def profile_compute(request: dict) -> dict:
    """Time forward and backward of one fused TBE over the shard's tables (median of ``iters``)."""
    device = request.get("device", "cpu")
    torch = _setup_torch(device)
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
    from fbgemm_gpu.tbe.config.embedding_config import ComputeDevice

    optimizer = request.get("optimizer", "exact_sgd")
    precision = request.get("precision", "fp32")
    if optimizer not in OPTIMIZERS:
        raise RequestError(f"optimizer {optimizer!r}, expected one of {', '.join(OPTIMIZERS)}")
    if precision not in PRECISIONS:
        raise RequestError(f"precision {precision!r}, expected one of {', '.join(PRECISIONS)}")
    specs, indices, offsets = shard_inputs(request)
    on_gpu = device == "cuda"
    location, compute = (
        (EmbeddingLocation.DEVICE, ComputeDevice.CUDA) if on_gpu else (EmbeddingLocation.HOST, ComputeDevice.CPU)
    )
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(rows, dim, location, compute) for rows, dim in specs],
        optimizer=EmbOptimType(optimizer),
        learning_rate=LEARNING_RATE,
        weights_precision=SparseType(precision),
        pooling_mode=PoolingMode.SUM,
        device=torch.device("cuda" if on_gpu else "cpu"),
    )
    with torch.no_grad():
        for weights in tbe.split_embedding_weights():
            weights.uniform_(-INIT_SCALE, INIT_SCALE)
    target = torch.device("cuda" if on_gpu else "cpu")
    indices_t = torch.from_numpy(indices).to(target)
    offsets_t = torch.from_numpy(offsets).to(target)
    grad = None
    timer = _CudaTimer(torch) if on_gpu else _CpuTimer()
    fwd_runs, bwd_runs = [], []
    warmup = int(request.get("warmup", 5))
    for step in range(warmup + int(request.get("iters", 10))):
        if step == warmup:  # the CPU share of the timed iterations: below 1, something else took the core
            cpu0, wall0 = time.process_time(), time.perf_counter()
        timer.flush()
        timer.start()
        out = tbe(indices_t, offsets_t)
        timer.mark()
        if grad is None:
            grad = torch.full_like(out, 1e-3)
        out.backward(grad)
        fwd_ms, bwd_ms = timer.stop()
        if step >= warmup:
            fwd_runs.append(fwd_ms)
            bwd_runs.append(bwd_ms)
    cpu_share = (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)
    totals = [f + b for f, b in zip(fwd_runs, bwd_runs)]
    return {
        "ok": True,
        "fwd_ms": statistics.median(fwd_runs),
        "bwd_ms": statistics.median(bwd_runs),
        "total_ms": statistics.median(totals),
        "fwd_runs_ms": [round(x, 4) for x in fwd_runs],
        "bwd_runs_ms": [round(x, 4) for x in bwd_runs],
        "num_indices": int(len(indices)),
        **({} if on_gpu else {"cpu_share": round(cpu_share, 3)}),
    }


class _CpuTimer:
    def flush(self):
        pass

    def start(self):
        self.t0 = time.perf_counter()

    def mark(self):
        self.t1 = time.perf_counter()

    def stop(self):
        t2 = time.perf_counter()
        return (self.t1 - self.t0) * 1e3, (t2 - self.t1) * 1e3


class _CudaTimer:
    """CUDA events around fwd and bwd, with the L2 cache flushed by writing a buffer on the GPU itself."""

    def __init__(self, torch):
        self.torch = torch
        l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 * 2**20)
        self.flush_buffer = torch.empty(2 * l2_bytes // 4, dtype=torch.float32, device="cuda")
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]

    def flush(self):
        self.flush_buffer.zero_()

    def start(self):
        self.events[0].record()

    def mark(self):
        self.events[1].record()

    def stop(self):
        self.events[2].record()
        self.torch.cuda.synchronize()
        return self.events[0].elapsed_time(self.events[1]), self.events[1].elapsed_time(self.events[2])


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
    """Answer compute requests, one JSON line in, one JSON line out, until stdin closes."""
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        _inject_fault(request.get("id"))
        try:
            answer = profile_compute(request)
        except RequestError as err:
            answer = {"ok": False, "error": str(err)}
        except Exception as err:  # e.g. an allocation failure in torch: report it, keep serving
            answer = {"ok": False, "error": f"{type(err).__name__}: {err}"[:500]}
        answer["id"] = request.get("id")
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def batch_splits(batch_size: int, world: int) -> list[int]:
    """Rows of the batch each rank owns after the forward all-to-all (the batch split evenly)."""
    return [batch_size // world + (r < batch_size % world) for r in range(world)]


def run_rank(rank: int, world: int, init: str, requests_path: str, out_path: str) -> None:
    """One rank of the comm benchmark; writes one JSON line per request to ``out_path``.

    Forward: sleep this rank's straggler delay, then all_to_all_single of the pooled outputs
    [B, dim_sum_rank] split along the batch; the time includes waiting for the slowest peer.
    Backward: the gradients go the other way, no delay. Raw collectives on preallocated buffers.
    A request's ``row_groups`` ([[width, [ranks]], ...]: the row-split tables, TorchRec's row_wise and
    table_row_wise) add, for each group this rank is in, a reduce-scatter of its partial pooled sums [B, width]
    over the group to the forward (each rank keeps its batch slice) and the mirror all-gather of the gradients to
    the backward, after the all-to-all, in the group's order (the same on every rank); their time is also
    reported apart (``fwd_rows_ms``, ``bwd_rows_ms``).
    """
    requests = [json.loads(line) for line in open(requests_path) if line.strip()]
    device = requests[0].get("device", "cpu") if requests else "cpu"
    torch = _setup_torch(device)
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    target = torch.device(f"cuda:{rank}" if device == "cuda" else "cpu")
    # a rank sends B x its dim sum and receives its batch slice of every peer's outputs: ceil(B / world) x the sum
    # of the dim sums, which is more than B x the largest dim sum when the batch does not split evenly
    largest = max(
        (
            max(r["batch_size"] * max(r["dim_sums"]), batch_splits(r["batch_size"], world)[0] * sum(r["dim_sums"]))
            for r in requests
        ),
        default=1,
    )
    send_buf = torch.full((largest,), 1e-3, device=target)
    recv_buf = torch.zeros(largest, device=target)
    sync = (lambda: torch.cuda.synchronize(target)) if device == "cuda" else (lambda: None)
    # every rank creates every subgroup, in one order (torch.distributed's rule); the whole world is the default group
    members = sorted({tuple(g[1]) for r in requests for g in r.get("row_groups", ()) if len(g[1]) < world})
    subgroups = {ranks: dist.new_group(list(ranks)) for ranks in members}
    with open(out_path, "w") as out:
        for request in requests:
            dims = [int(d) for d in request["dim_sums"]]
            rows = batch_splits(int(request["batch_size"]), world)
            mine = dims[rank]
            fwd_in = [rows[j] * mine for j in range(world)]  # my pooled outputs, one batch slice per peer
            fwd_out = [rows[rank] * dims[j] for j in range(world)]  # my batch slice of every peer's outputs
            reduced = _row_group_buffers(torch, request, rank, world, subgroups, target)
            delay_s = float(request["delays_ms"][rank]) / 1e3
            fwd_runs, bwd_runs, fwd_rows, bwd_rows = [], [], [], []
            for step in range(int(request.get("warmup", 3)) + int(request.get("iters", 10))):
                dist.barrier()
                time.sleep(delay_s)
                t0 = time.perf_counter()
                dist.all_to_all_single(recv_buf[: sum(fwd_out)], send_buf[: sum(fwd_in)], fwd_out, fwd_in)
                sync()
                ta = time.perf_counter()
                for partial, slice_, group in reduced:
                    dist.reduce_scatter_tensor(slice_, partial, group=group)
                sync()
                t1 = time.perf_counter()
                dist.barrier()
                t2 = time.perf_counter()
                dist.all_to_all_single(send_buf[: sum(fwd_in)], recv_buf[: sum(fwd_out)], fwd_in, fwd_out)
                sync()
                tb = time.perf_counter()
                for partial, slice_, group in reduced:
                    dist.all_gather_into_tensor(partial, slice_, group=group)
                sync()
                t3 = time.perf_counter()
                if step >= int(request.get("warmup", 3)):
                    fwd_runs.append((t1 - t0) * 1e3)
                    bwd_runs.append((t3 - t2) * 1e3)
                    fwd_rows.append((t1 - ta) * 1e3)
                    bwd_rows.append((t3 - tb) * 1e3)
            out.write(
                json.dumps(
                    {
                        "id": request["id"],
                        "rank": rank,
                        "fwd_ms": statistics.median(fwd_runs),
                        "bwd_ms": statistics.median(bwd_runs),
                        # of which the row groups' reduce-scatters and all-gathers (0 without row groups)
                        "fwd_rows_ms": statistics.median(fwd_rows),
                        "bwd_rows_ms": statistics.median(bwd_rows),
                    }
                )
                + "\n"
            )
            out.flush()
    dist.destroy_process_group()


def _row_group_buffers(torch, request: dict, rank: int, world: int, subgroups: dict, target) -> list[tuple]:
    """(partial sums [k x ceil(B / k) x width], this rank's slice, process group) of each row group of ``request``
    that holds ``rank``; the batch is padded to a multiple of the group's size k."""
    out = []
    for width, ranks in request.get("row_groups", ()):
        ranks = tuple(int(r) for r in ranks)
        if rank not in ranks:
            continue
        rows = -(-int(request["batch_size"]) // len(ranks))
        partial = torch.full((len(ranks) * rows * int(width),), 1e-3, device=target)
        out.append((partial, torch.zeros(rows * int(width), device=target), subgroups.get(ranks)))
    return out


def dlrm_to_npz(src: str, dst: str) -> None:
    import torch

    data = torch.load(src, map_location="cpu", weights_only=True)
    if not isinstance(data, (tuple, list)) or len(data) != 3:
        raise SystemExit(f"expected (indices, offsets, lengths), got {type(data).__name__}")
    indices, offsets, lengths = (torch.as_tensor(x).cpu().numpy() for x in data)
    np.savez(dst, indices=indices.astype(np.int64), offsets=offsets.astype(np.int64), lengths=lengths.astype(np.int64))


def torchrec_plan(request: dict) -> dict:
    """TorchRec's EmbeddingShardingPlanner on a task: tables on the meta device, N ranks with the task's
    memory caps (per device), pooling factors as constraints, the allowed sharding types, the fused kernel.
    Returns per table its shards [{col_offset, dim, rank}] or {"error": ...}."""
    try:
        import torch
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
        from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
        from torchrec.distributed.planner.types import CustomTopologyData, PlannerError
        from torchrec.modules.embedding_configs import DataType
    except ImportError as err:
        return {"error": f"{TORCHREC_MISSING} ({err})"}
    data_type = {"fp32": DataType.FP32, "fp16": DataType.FP16, "bf16": DataType.BF16, "int8": DataType.INT8}
    tables = request["tables"]
    configs = [
        EmbeddingBagConfig(
            name=f"t{i}",
            embedding_dim=int(t["dim"]),
            num_embeddings=int(t["rows"]),
            feature_names=[f"f{i}"],
            data_type=data_type[request["precision"]],
        )
        for i, t in enumerate(tables)
    ]
    constraints = {
        f"t{i}": ParameterConstraints(
            sharding_types=list(t.get("sharding_types", request["sharding_types"])),
            compute_kernels=["fused"],
            pooling_factors=[float(t["pooling_factor"])],
            **({"min_partition": int(t["min_partition"])} if "min_partition" in t else {}),
        )
        for i, t in enumerate(tables)
    }
    world_size = int(request["num_devices"])
    caps = [int(c) for c in request["mem_caps_bytes"]]
    links = request.get("links")  # devices in hosts: TorchRec's local world size and bandwidths (bytes per ms)
    hosts = (
        {
            "local_world_size": int(links["local_size"]),
            "intra_host_bw": links["intra_host_gbps"] * 1024**3 / 1000,
            "inter_host_bw": links["inter_host_gbps"] * 1024**3 / 1000,
        }
        if links
        else {}
    )
    topology = Topology(
        world_size=world_size,
        compute_device="cuda",
        hbm_cap=max(caps),
        custom_topology_data=CustomTopologyData(data={"hbm_cap": caps}, world_size=world_size),
        **hosts,
    )
    reservation = None  # TorchRec's default: HeuristicalStorageReservation(0.15), inputs and dense parts included
    if request.get("reservation", "heuristic") == "percent":
        reservation = FixedPercentageStorageReservation(0.15)
    planner = EmbeddingShardingPlanner(
        topology=topology, constraints=constraints, batch_size=request["batch_size"], storage_reservation=reservation
    )
    model = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    start = time.perf_counter()
    try:
        plan = planner.plan(model, [EmbeddingBagCollectionSharder()])
    except PlannerError as err:
        return {"error": f"torchrec planner: {str(err).splitlines()[0]}", "infeasible": True}
    planner_s = time.perf_counter() - start
    by_name = plan_shards(plan)
    return {"shards": [by_name[f"t{i}"] for i in range(len(tables))], "planner_s": planner_s}


def torchrec_export(request: dict, out_path: str) -> dict:
    """Our plan as a TorchRec ShardingPlan, written with torch.save; the plan is read back and its shards
    checked against the request. request: {tables: [{name, rows, dim}], shards: per table [{col_offset,
    dim, rank} (and row_offset, num_rows: a row block)], world_size, device, compute_kernel, module_path}."""
    try:
        import torch
        import torchrec  # noqa: F401 (a missing torchrec is reported, not raised)
    except ImportError as err:
        return {"error": f"{TORCHREC_MISSING} ({err})"}
    shards = {t["name"]: s for t, s in zip(request["tables"], request["shards"])}
    module = embedding_bag_collection(request["tables"], "meta")
    world = int(request["world_size"])
    try:
        plan = sharding_plan(
            {request["module_path"]: (module, shards)},
            world,
            request["device"],
            request["compute_kernel"],
            local_size=request.get("local_size"),
        )
    except ValueError as err:  # a row split TorchRec does not run (``torchrec_plans.row_split_host``)
        return {"error": str(err)}
    torch.save(plan, out_path)
    error = mismatch(torch.load(out_path, weights_only=False), shards)
    return {"error": error} if error else {"ok": True, "plan": str(plan)}


def _pattern(rows, cols):
    """The weights the DMP check writes: w[r, c] = ((r % 97) + 1) * 1e-3 + c * 1e-5 (exact in fp32 sums)."""
    return ((rows % 97) + 1)[:, None] * 1e-3 + cols[None, :] * 1e-5


def torchrec_run(rank: int, world: int, init: str, request_path: str, out_path: str) -> None:
    """One rank of DistributedModelParallel (gloo, CPU) over an exported ShardingPlan.

    Every rank builds the request's EmbeddingBagCollection on the meta device and wraps it with the plan;
    the weights of its local shards are set to a known pattern (``_pattern`` of the global row and
    column), then a forward pass on this rank's batch (random bags) is checked against the pooled sums
    computed from the pattern, and a backward pass runs. Writes {rank, local_shards, output_shape,
    max_abs_error} to ``out_path``.
    """
    request = json.loads(Path(request_path).read_text())
    torch = _setup_torch("cpu")
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model, collection = _distributed_model(request, torch.load(request["plan"], weights_only=False))
    local = _write_pattern(model)
    out, expected = _forward(collection, request["tables"], int(request["batch_size"]), rank)
    error = float(np.abs(out.detach().numpy() - expected).max())
    out.sum().backward()
    Path(out_path).write_text(
        json.dumps(
            {"rank": rank, "local_shards": sorted(local), "output_shape": list(out.shape), "max_abs_error": error}
        )
    )
    # Every rank is done; leave without the interpreter's teardown, where a still-joinable C++ thread of
    # the distributed stack occasionally aborts the process (SIGABRT, "terminate called without an active
    # exception") after the work succeeded.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _distributed_model(request: dict, plan):
    """(DistributedModelParallel, its EmbeddingBagCollection) of the request's tables, with the collection at
    the plan's module path (e.g. sparse_arch.embedding_bag_collection)."""
    import torch
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    path = [p for p in request.get("module_path", "").split(".") if p]
    root = embedding_bag_collection(request["tables"], "meta")
    for name in reversed(path):
        parent = torch.nn.Module()
        parent.add_module(name, root)
        root = parent
    model = DistributedModelParallel(
        module=root,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"),
        plan=plan,
        sharders=[EmbeddingBagCollectionSharder()],
    )
    collection = model.module
    for name in path:
        collection = getattr(collection, name)
    return model, collection


def _write_pattern(model) -> list[list]:
    """Set every local shard's weights to ``_pattern`` of its global rows and columns; returns the local
    shards as [table name, col_offset, dim, row_offset, num_rows]."""
    import torch

    local = []
    with torch.no_grad():
        for key, value in model.state_dict().items():
            for shard in getattr(value, "local_shards", lambda: [])():
                r0, c0 = shard.metadata.shard_offsets
                n_rows, n_cols = shard.metadata.shard_sizes
                weights = _pattern(np.arange(r0, r0 + n_rows), np.arange(c0, c0 + n_cols))
                shard.tensor.copy_(torch.from_numpy(weights.astype(np.float32)))
                local.append([key.split(".")[-2], int(c0), int(n_cols), int(r0), int(n_rows)])
    return local


def _forward(collection, tables: list[dict], batch: int, rank: int):
    """The pooled outputs f32[B, sum dims] of a random batch of bags (this rank's seed), in table order, and
    the sums the pattern weights should give."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    rng = np.random.default_rng(1000 + rank)
    lengths = rng.integers(0, 4, size=(len(tables), batch))
    values = [rng.integers(0, t["rows"], size=int(lengths[i].sum())) for i, t in enumerate(tables)]
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=[t["name"] for t in tables],
        values=torch.from_numpy(np.concatenate(values)).long(),
        lengths=torch.from_numpy(lengths.reshape(-1)).int(),
    )
    pooled = collection(features)  # a KeyedTensor; its column order groups tables by sharding type
    out = torch.cat([pooled[t["name"]] for t in tables], dim=1)
    expected = []
    for i, t in enumerate(tables):
        bags = np.split(values[i], np.cumsum(lengths[i])[:-1])
        cols = np.arange(t["dim"])
        expected.append(np.stack([_pattern(b, cols).sum(0) if len(b) else np.zeros(t["dim"]) for b in bags]))
    return out, np.concatenate(expected, axis=1)


def die_with_parent() -> None:
    """On Linux, ask to be killed when the process (strictly: the thread) that started this worker ends, so a
    collection or evaluation killed with kill -9 leaves no kernel workers or rank processes behind; exit at once
    if that parent is already gone."""
    parent = os.environ.get("NEUROSHARD_PARENT_PID")
    if not parent or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):
        raise SystemExit("the process that started this worker is gone")


def main(argv: list[str]) -> None:
    die_with_parent()
    if argv == ["serve"]:
        serve()
        return
    if len(argv) == 6 and argv[0] == "comm":
        run_rank(int(argv[1]), int(argv[2]), argv[3], argv[4], argv[5])
        return
    if len(argv) == 3 and argv[0] == "dlrm-to-npz":
        try:
            dlrm_to_npz(argv[1], argv[2])
        except (OSError, RuntimeError, ValueError) as err:
            raise SystemExit(f"{type(err).__name__}: {err}") from None
        return
    if len(argv) == 3 and argv[0] == "torchrec-export":
        result = torchrec_export(json.loads(Path(argv[1]).read_text()), argv[2])
        print(json.dumps(result))
        return
    if len(argv) == 6 and argv[0] == "torchrec-run":
        torchrec_run(int(argv[1]), int(argv[2]), argv[3], argv[4], argv[5])
        return
    if len(argv) == 3 and argv[0] == "torchrec-plan":
        result = torchrec_plan(json.loads(Path(argv[1]).read_text()))
        Path(argv[2]).write_text(json.dumps(result))
        return
    raise SystemExit(
        "usage: python -m neuroshard_jax.worker serve | comm ... | dlrm-to-npz IN OUT | torchrec-plan IN OUT | "
        "torchrec-export IN OUT | torchrec-run RANK WORLD INIT IN OUT "
        f"(got {argv})"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
