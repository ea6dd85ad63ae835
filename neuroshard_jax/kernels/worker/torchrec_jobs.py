"""TorchRec's planner on a task, our plan exported as its ShardingPlan, one DistributedModelParallel rank running an
exported plan (checked), one rank timing training steps of several exported plans of one task, and one rank
measuring the memory of its sharded modules while they train."""

from __future__ import annotations

import dataclasses
import gc
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from neuroshard_jax.kernels.messages import (
    ExportAnswer,
    ExportJob,
    MemoryReport,
    PlanAnswer,
    PlanJob,
    RunJob,
    RunReport,
    StepsJob,
    StepsReport,
    TorchRecTable,
)
from neuroshard_jax.kernels.torchrec_format import (
    TORCHREC_MISSING,
    collection_paths,
    collection_shards,
    mismatch,
    model_loss,
    plan_shards,
    sharding_plan,
    task_model,
)
from neuroshard_jax.kernels.worker.comm import leave_rank
from neuroshard_jax.kernels.worker.tbe import setup_torch, table_stream


def torchrec_plan(request: PlanJob) -> PlanAnswer:
    """TorchRec's EmbeddingShardingPlanner on a task: tables on the meta device, N ranks with the task's
    memory caps (per device), pooling factors as constraints, the allowed sharding types, the fused kernel.
    Returns per table its shards [{col_offset, dim, rank}], or an error."""
    try:
        from torchrec.distributed.embedding import EmbeddingCollectionSharder
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
        from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
        from torchrec.distributed.planner.types import CustomTopologyData, PlannerError
    except ImportError as err:
        return PlanAnswer(error=f"{TORCHREC_MISSING} ({err})")
    tables = [dataclasses.replace(t, name=f"t{i}") for i, t in enumerate(request.tables)]
    constraints = {
        f"t{i}": ParameterConstraints(
            sharding_types=list(t.sharding_types or request.sharding_types),
            # the fused kernel; dense is the only one TorchRec's sharder offers data_parallel, and only it; where the
            # devices' memory is short, tiered memory (its planner picks the tables, at its load factor, 0.2)
            compute_kernels=["fused", "dense", *(["fused_uvm_caching"] if request.uvm_caching else [])],
            pooling_factors=[float(t.pooling_factor)],
            **({"min_partition": t.min_partition} if t.min_partition is not None else {}),
        )
        for i, t in enumerate(tables)
    }
    world_size = request.num_devices
    caps = [int(c) for c in request.mem_caps_bytes]
    links = request.links  # devices in hosts: TorchRec's local world size and bandwidths (bytes per ms)
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
    if request.reservation == "percent":
        reservation = FixedPercentageStorageReservation(0.15)
    planner = EmbeddingShardingPlanner(
        topology=topology, constraints=constraints, batch_size=request.batch_size, storage_reservation=reservation
    )
    # a collection per kernel TorchRec groups apart (sequence tables in EmbeddingCollections, each with its sharder)
    model = task_model(tables, "meta", request.precision)
    start = time.perf_counter()
    try:
        plan = planner.plan(model, [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()])
    except PlannerError as err:
        return PlanAnswer(error=f"torchrec planner: {str(err).splitlines()[0]}", infeasible=True)
    planner_s = time.perf_counter() - start
    by_name = plan_shards(plan)
    return PlanAnswer(tuple(by_name[f"t{i}"] for i in range(len(tables))), planner_s)


def torchrec_export(request: ExportJob, out_path: str) -> ExportAnswer:
    """Our plan as a TorchRec ShardingPlan, written with torch.save; the plan is read back and its shards
    checked against the request (``ExportJob``)."""
    try:
        import torch
        import torchrec  # noqa: F401 (a missing torchrec is reported, not raised)
    except ImportError as err:
        return ExportAnswer(error=f"{TORCHREC_MISSING} ({err})")
    shards = {t.name: list(s) for t, s in zip(request.tables, request.shards)}
    modules = collection_shards(request.tables, shards, request.module_path)  # a collection per kernel kind
    try:
        plan = sharding_plan(
            modules,
            request.world_size,
            request.device,
            request.compute_kernel,
            local_size=request.local_size,
        )
    except ValueError as err:  # a row split TorchRec does not run (``torchrec_plans.row_split_host``)
        return ExportAnswer(error=str(err))
    torch.save(plan, out_path)
    error = mismatch(torch.load(out_path, weights_only=False), shards)
    return ExportAnswer(error=error) if error else ExportAnswer(plan=str(plan))


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
    request = RunJob.from_json(json.loads(Path(request_path).read_text()))
    torch = setup_torch("cpu")
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    plan = torch.load(request.plan, weights_only=False)
    model, collection = _distributed_model(plan, task_model(request.tables, "meta"), request.module_path)
    local = _write_pattern(model)
    loss, error, shape = _checked_forward(collection, request.tables, request.batch_size, rank)
    loss.backward()
    Path(out_path).write_text(json.dumps(RunReport(rank, sorted(local), shape, error).to_json()))
    leave_rank()


def _distributed_model(plan, root, module_path: str = ""):
    """(DistributedModelParallel, the sharded ``root``) of a task's model ``root`` (``task_model``: a collection, or a
    collection per kernel kind), placed at the plan's ``module_path`` in a model (e.g.
    sparse_arch.embedding_bag_collection; empty: ``root`` is the model)."""
    import torch
    import torch.distributed as dist
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    path = [p for p in module_path.split(".") if p]
    for name in reversed(path):
        parent = torch.nn.Module()
        parent.add_module(name, root)
        root = parent
    model = DistributedModelParallel(
        module=root,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"),
        plan=plan,
        sharders=[EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()],
    )
    collection = model.module
    for name in path:
        collection = getattr(collection, name)
    return model, collection


def _write_pattern(model) -> list[list]:
    """Set every local shard's weights to ``_pattern`` of its global rows and columns; returns the local
    shards as [table name, col_offset, dim, row_offset, num_rows]. A data-parallel table is a plain tensor, whole
    on every rank."""
    import torch

    local = []
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if key.endswith(".weight") and not hasattr(value, "local_shards") and value.dim() == 2:
                n_rows, n_cols = value.shape
                value.copy_(torch.from_numpy(_pattern(np.arange(n_rows), np.arange(n_cols)).astype(np.float32)))
                local.append([key.split(".")[-2], 0, int(n_cols), 0, int(n_rows)])
                continue
            for shard in getattr(value, "local_shards", lambda: [])():
                r0, c0 = shard.metadata.shard_offsets
                n_rows, n_cols = shard.metadata.shard_sizes
                weights = _pattern(np.arange(r0, r0 + n_rows), np.arange(c0, c0 + n_cols))
                shard.tensor.copy_(torch.from_numpy(weights.astype(np.float32)))
                local.append([key.split(".")[-2], int(c0), int(n_cols), int(r0), int(n_rows)])
    return local


def _checked_forward(model, tables: Sequence[TorchRecTable], batch: int, rank: int):
    """(loss, max abs error, output shape) of a forward pass of a task's sharded model (``task_model``) on a random
    batch of this rank (ids, 0-3 a bag, per-id weights for weighted tables): every output checked against what the
    pattern weights give, as each kernel reduces its lookups (a sum, a mean, weighted, or a row per id). The shape
    is a task of bags' pooled outputs [batch, sum of dims], else the number of output values."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    rng = np.random.default_rng(1000 + rank)
    paths = collection_paths(tables)
    loss, error, count = 0.0, 0.0, 0
    for path, members in paths.items():
        chosen = [tables[i] for i in members]
        lengths = rng.integers(0, 4, size=(len(chosen), batch))
        values = [rng.integers(0, t.rows, size=int(lengths[i].sum())) for i, t in enumerate(chosen)]
        weights = [rng.uniform(0.5, 1.5, size=len(v)) for v in values]
        weighted = path == "weighted"
        features = KeyedJaggedTensor.from_lengths_sync(
            keys=[t.name for t in chosen],
            values=torch.from_numpy(np.concatenate(values)).long(),
            lengths=torch.from_numpy(lengths.reshape(-1)).int(),
            weights=torch.from_numpy(np.concatenate(weights).astype(np.float32)) if weighted else None,
        )
        module = getattr(model, path) if path else model
        out = module(features)
        for i, t in enumerate(chosen):
            cols = np.arange(t.dim)
            rows = _pattern(values[i], cols) * (weights[i][:, None] if weighted else 1.0)
            if t.kernel == "sequence":  # a row per id
                got, want = out[t.name].values(), rows
            else:  # a pooled row per bag: summed, or averaged over the bag's ids
                ends = np.cumsum(lengths[i])
                running = np.concatenate([np.zeros((1, t.dim)), np.cumsum(rows, axis=0)])
                want = running[ends] - running[ends - lengths[i]]
                if t.kernel.startswith("mean"):
                    want = want / np.maximum(lengths[i], 1)[:, None]
                got = out[t.name]
            error = max(error, float(np.abs(got.detach().numpy() - want).max(initial=0.0)))
            count += int(np.prod(got.shape))
            loss = loss + got.sum()
    shape = [batch, sum(t.dim for t in tables)] if "" in paths else [count]
    return loss, error, shape


def torchrec_steps(rank: int, world: int, init: str, request_path: str, out_path: str) -> None:
    """One rank of timed DistributedModelParallel training steps (gloo, CPU), for every exported plan of one task.

    The request (``StepsJob``): its tables' streams at the global batch are cut into one slice of bags per rank. One
    EmbeddingBagCollection per plan, SGD fused into the backward pass (a data-parallel table's gradient all-reduced
    by DDP, then its SGD step); per step, every plan's step in turn (after a barrier: fwd, loss = sum of the pooled
    outputs, bwd), so drifts of the machine hit all plans alike. Writes {rank, step_s: [[s per timed step] per
    plan], cpu_s: (the same in this process's CPU time: its own work, its communication threads' included, without
    the time it waited for other ranks or for a core), local_bytes: [per plan]} to ``out_path``.
    """
    request = StepsJob.from_json(json.loads(Path(request_path).read_text()))
    torch = setup_torch("cpu")
    import torch.distributed as dist
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    features = rank_inputs(request.tables, request.pool, request.batch_size, rank, world)
    models, dense = [], []
    for path in request.plans:
        root = task_model(request.tables, "meta")
        apply_optimizer_in_backward(torch.optim.SGD, root.parameters(), {"lr": 0.01})
        model, _ = _distributed_model(torch.load(path, weights_only=False), root)
        models.append(model)
        # a data-parallel table is a dense parameter of DMP (its gradient all-reduced by DDP in the backward pass):
        # the fused update does not reach it, so it gets SGD here, as a training loop's dense optimizer does
        params = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
        dense.append(torch.optim.SGD(params, lr=0.01) if params else None)
    step_s: list[list[float]] = [[] for _ in models]
    cpu_s: list[list[float]] = [[] for _ in models]
    for i in range(request.warmup + request.steps):
        for p, (model, optimizer) in enumerate(zip(models, dense)):
            dist.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            model_loss(model, features).backward()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad()
            if i >= request.warmup:
                step_s[p].append(time.perf_counter() - start)
                cpu_s[p].append(time.process_time() - start_cpu)
    local = [sum(v.numel() * v.element_size() for v in _local_tensors(m)) for m in models]
    Path(out_path).write_text(json.dumps(StepsReport(rank, step_s, cpu_s, local).to_json()))
    leave_rank()


def rank_inputs(tables: Sequence[TorchRecTable], pool: dict | None, batch: int, rank: int, world: int):
    """This rank's inputs of a task's model (``task_model``): one KeyedJaggedTensor (``rank_features``) for a task of
    bags, else one per collection path, a weighted collection's with per-id weights."""
    paths = collection_paths(tables)
    if "" in paths:
        return rank_features(tables, pool, batch, rank, world)
    return {
        path: rank_features([tables[i] for i in members], pool, batch, rank, world, weighted=path == "weighted")
        for path, members in paths.items()
    }


WEIGHTS_SEED = 11  # per-id weights of a weighted collection's steps: uniform in [0.5, 1.5)


def rank_features(
    tables: Sequence[TorchRecTable],
    pool: dict | None,
    batch: int,
    rank: int,
    world: int,
    keys: Sequence[str] = (),
    weighted: bool = False,
):
    """This rank's KeyedJaggedTensor: bags [rank * b, (rank + 1) * b) of every table's stream at the global batch
    (b = batch / world), the slice the evaluator's data-parallel kernel also measures for rank 0; keyed by ``keys``
    (one per table; default the tables' names); ``weighted``: with per-id weights (seeded by the rank)."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    local = batch // world
    values, lengths = [], []
    for i, table in enumerate(tables):
        _, _, (indices, offsets) = table_stream(table.stream, pool, batch, f"table {i}")
        lo, hi = offsets[rank * local], offsets[(rank + 1) * local]
        values.append(indices[lo:hi])
        lengths.append(np.diff(offsets[rank * local : (rank + 1) * local + 1]))
    ids = np.concatenate(values).astype(np.int64)
    weights = np.random.default_rng([WEIGHTS_SEED, rank]).uniform(0.5, 1.5, len(ids)).astype(np.float32)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(keys) or [t.name for t in tables],
        values=torch.from_numpy(ids),
        lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int32)),
        weights=torch.from_numpy(weights) if weighted else None,
    )


def _local_tensors(model) -> list:
    """The tensors of the model's embedding weights this rank holds (local shards, or a data-parallel table whole)."""
    out = []
    for value in model.state_dict().values():
        shards = getattr(value, "local_shards", None)
        out.extend([s.tensor for s in shards()] if shards else [value])
    return out


def optimizer_class(name: str):
    """The optimizer class ``apply_optimizer_in_backward`` takes for FBGEMM's ``name`` (TorchRec maps it back)."""
    import torch
    from torchrec import optim as trec_optim

    classes = {
        "exact_sgd": torch.optim.SGD,
        "exact_row_wise_adagrad": trec_optim.RowWiseAdagrad,
        "exact_adagrad": torch.optim.Adagrad,
        "adam": torch.optim.Adam,
        "partial_row_wise_adam": trec_optim.PartialRowWiseAdam,
        "lamb": trec_optim.LAMB,
        "partial_row_wise_lamb": trec_optim.PartialRowWiseLAMB,
        "lars_sgd": trec_optim.LarsSGD,
    }
    if name not in classes:
        raise ValueError(f"optimizer {name!r}, expected one of {', '.join(classes)}")
    return classes[name]


def _resident_bytes() -> tuple[int, int]:
    """(this process's resident memory now, its high-water mark), from /proc/self/status (Linux)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return tuple(int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM"))


def torchrec_memory(rank: int, world: int, init: str, request_path: str, out_path: str) -> None:
    """One rank of DistributedModelParallel (gloo, CPU) measuring the memory of its sharded embedding modules.

    The request (``StepsJob``): one exported ShardingPlan in ``plans``, its ``optimizer`` (FBGEMM's name) fused into
    the backward pass with ``apply_optimizer_in_backward``. The rank reads its resident
    memory before the model is built, after DistributedModelParallel has built and placed its shards, and its
    high-water mark after ``steps`` training steps (fwd, loss = sum of the pooled outputs, bwd with the fused
    update); beside them the allocator's own count of what it holds: its shards' weights and the fused optimizer's
    state tensors. Writes {rank, before, built, peak, weights_bytes, state_bytes} (bytes) to ``out_path``.
    """
    request = StepsJob.from_json(json.loads(Path(request_path).read_text()))
    torch = setup_torch("cpu")
    import torch.distributed as dist
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    features = rank_inputs(request.tables, request.pool, request.batch_size, rank, world)
    root = task_model(request.tables, "meta")
    apply_optimizer_in_backward(optimizer_class(request.optimizer), root.parameters(), {"lr": 0.01})
    [plan_path] = request.plans
    plan = torch.load(plan_path, weights_only=False)
    gc.collect()
    try:  # the high-water mark from here on (Linux: "5" resets it to the resident memory now)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    dist.barrier()
    before, _ = _resident_bytes()
    model, _ = _distributed_model(plan, root)
    built, _ = _resident_bytes()
    for _ in range(request.steps):
        model_loss(model, features).backward()
    _, peak = _resident_bytes()
    weights = sum(v.numel() * v.element_size() for v in _local_tensors(model))
    state = 0
    for per_param in model.fused_optimizer.state_dict()["state"].values():
        for value in per_param.values():
            shards = getattr(value, "local_shards", None)
            tensors = [s.tensor for s in shards()] if shards else [value] if torch.is_tensor(value) else []
            state += sum(t.numel() * t.element_size() for t in tensors)
    Path(out_path).write_text(json.dumps(MemoryReport(rank, before, built, peak, weights, state).to_json()))
    leave_rank()
