"""Our shards as a TorchRec ``ShardingPlan``, and a ``ShardingPlan``'s shards read back: the one conversion that
``to_torchrec``, the export worker and the TorchRec adapter (``neuroshard_jax.torchrec.planner``) share.

A shard list per table is ``[{col_offset, dim, rank}]`` in column order: one shard is ``table_wise(rank)`` (or
``column_wise([rank])`` where it carries ``column_wise: 1``: a whole table in a plan's column-wise group), 2^k equal
column slices are ``column_wise(ranks)`` (TorchRec cuts equal slices in rank-list order, ours are
equal by construction). A row-split table's shards also carry ``row_offset, num_rows`` (``sharding.row_blocks``,
TorchRec's own layout): its blocks in rank order over every rank are ``row_wise()``, over the ranks of one host
``table_row_wise(host)``; row blocks of column slices (TorchRec's grid sharding) are not exported. A data-parallel
table's list is ``[{data_parallel: 1}]`` (``data_parallel()``: every rank holds it, TorchRec's dense kernel). A table in
tiered memory carries ``cache_load_factor`` on its shards: its kernel is ``fused_uvm_caching`` and its sharding's
``cache_params`` ``CacheParams(load_factor=...)``, as TorchRec's planner writes them. torch and
torchrec are imported inside the functions: they run in a torch process (the worker, or a user's), and importing
this module costs nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.kernels.messages import TorchRecTable

TORCHREC_MISSING = "torchrec is not installed"
SHARD_KEYS = ("col_offset", "dim", "rank", "row_offset", "num_rows", "data_parallel", "column_wise")
UVM_CACHING = "fused_uvm_caching"  # TorchRec's kernel of a table in tiered memory (a shard's ``cache_load_factor``)
TORCHREC_LOAD_FACTOR = 0.2  # TorchRec's planner's load factor where a plan's cache_params name none (UVM_CACHING_RATIO)


def module_plan(
    module,
    shards: Mapping[str, Sequence[Mapping]],
    world_size: int,
    device_type: str,
    kernel: str,
    sharder=None,
    local_size: int | None = None,
):
    """The ``EmbeddingModuleShardingPlan`` of one EmbeddingBagCollection: ``shards`` per table name of the module.
    ``sharder``: the module's sharder (default: TorchRec's default for its type); ``local_size``: ranks per host
    (rank r's device is ``cuda:{r % local_size}``; default: one host)."""
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_row_wise,
        table_wise,
    )

    local_size = local_size or world_size
    per_table = {}
    for name, table_shards in shards.items():
        if table_shards and table_shards[0].get("data_parallel"):
            per_table[name] = data_parallel()
            continue
        ordered = sorted(table_shards, key=lambda s: (s["col_offset"], s.get("row_offset", 0)))
        ranks = [int(s["rank"]) for s in ordered]
        load_factor = ordered[0].get("cache_load_factor")
        own = kernel if load_factor is None else UVM_CACHING
        if "num_rows" in ordered[0]:
            host = row_split_host(name, ordered, world_size, local_size)
            per_table[name] = row_wise(compute_kernel=own) if host is None else table_row_wise(host_index=host)
        elif len(ranks) == 1 and not ordered[0].get("column_wise"):
            per_table[name] = table_wise(rank=ranks[0], compute_kernel=own)
        else:
            per_table[name] = column_wise(ranks=ranks, compute_kernel=own)
        if load_factor is not None:
            per_table[name] = cached(per_table[name], float(load_factor))
    return construct_module_sharding_plan(
        module,
        per_param_sharding=per_table,
        sharder=sharder,
        local_size=local_size,
        world_size=world_size,
        device_type=device_type,
    )


def cached(generator, load_factor: float):
    """A TorchRec ``ParameterShardingGenerator`` whose sharding carries ``CacheParams(load_factor=...)``: the table in
    tiered memory (``fused_uvm_caching``: host rows, that share of them cached on the GPU)."""
    from torchrec.distributed.types import CacheParams

    def made(*args, **kwargs):  # the kernel too: TorchRec's table_row_wise takes none
        sharding = generator(*args, **kwargs)
        return dataclasses.replace(
            sharding, compute_kernel=UVM_CACHING, cache_params=CacheParams(load_factor=load_factor)
        )

    return made


def row_split_host(name: str, shards: Sequence[Mapping], world_size: int, local_size: int) -> int | None:
    """How TorchRec runs a row-split table's shards (column then row order): None for ``row_wise`` (block i on rank
    i of every rank), host h for ``table_row_wise`` (block i on rank i of host h); ValueError otherwise."""
    ranks = [int(s["rank"]) for s in shards]
    if any(s["col_offset"] != shards[0]["col_offset"] for s in shards):
        raise ValueError(
            f"table {name}: row blocks of column slices (TorchRec's grid sharding) cannot be exported; expected the "
            "row blocks of the whole width"
        )
    if ranks == list(range(world_size)):
        return None
    host = ranks[0] // local_size
    if len(ranks) == local_size and ranks == list(range(host * local_size, (host + 1) * local_size)):
        return host
    raise ValueError(
        f"table {name}: row blocks on ranks {ranks}; TorchRec runs row blocks in rank order over every rank "
        f"(row_wise) or over the {local_size} ranks of one host (table_row_wise)"
    )


def sharding_plan(
    modules: Mapping[str, tuple], world_size: int, device_type: str, kernel: str, local_size: int | None = None
):
    """A ``ShardingPlan`` of several collections: per module path, (the module, its shards per table name)."""
    from torchrec.distributed.types import ShardingPlan

    return ShardingPlan(
        {
            path: module_plan(module, shards, world_size, device_type, kernel, local_size=local_size)
            for path, (module, shards) in modules.items()
        }
    )


def _data_type(precision: str):
    from torchrec.modules.embedding_configs import DataType

    return {"fp32": DataType.FP32, "fp16": DataType.FP16, "bf16": DataType.BF16, "int8": DataType.INT8}[precision]


def embedding_bag_collection(
    tables: Sequence[TorchRecTable], device: str = "meta", weighted: bool = False, precision: str = "fp32"
):
    """An EmbeddingBagCollection of the (named) tables, one feature per table named like it, each pooled as its
    kernel says (sum or mean), of its own data type where it has one (else ``precision``); ``weighted``: its features
    carry per-id weights."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.modules.embedding_configs import PoolingType

    configs = [
        EmbeddingBagConfig(
            name=t.name,
            embedding_dim=t.dim,
            num_embeddings=t.rows,
            feature_names=[t.name],
            pooling=PoolingType.MEAN if t.kernel.startswith("mean") else PoolingType.SUM,
            data_type=_data_type(t.precision or precision),
        )
        for t in tables
    ]
    return EmbeddingBagCollection(tables=configs, is_weighted=weighted, device=torch.device(device))


def embedding_collection(tables: Sequence[TorchRecTable], device: str = "meta", precision: str = "fp32"):
    """An EmbeddingCollection (sequence embeddings) of the (named) tables, one feature per table named like it."""
    import torch
    from torchrec import EmbeddingCollection, EmbeddingConfig

    configs = [
        EmbeddingConfig(
            name=t.name,
            embedding_dim=t.dim,
            num_embeddings=t.rows,
            feature_names=[t.name],
            data_type=_data_type(t.precision or precision),
        )
        for t in tables
    ]
    return EmbeddingCollection(tables=configs, device=torch.device(device))


def collection_paths(tables: Sequence[TorchRecTable]) -> dict[str, list[int]]:
    """Where a model of a task's tables holds each table (path -> the tables' indices), one collection per kernel
    TorchRec groups apart: ``bags`` (sum and mean pooled), ``weighted`` (per-id weights), ``sequence_d{dim}`` (an
    EmbeddingCollection per dim: its tables share one). A task of bags alone is one collection at "" (the model)."""
    if all(t.kernel in ("sum", "mean") for t in tables):
        return {"": list(range(len(tables)))}
    paths: dict[str, list[int]] = {}
    for i, t in enumerate(tables):
        if t.kernel == "sequence":
            path = f"sequence_d{t.dim}"
        else:
            path = "weighted" if t.kernel.endswith("_weighted") else "bags"
        paths.setdefault(path, []).append(i)
    return paths


def task_collections(
    tables: Sequence[TorchRecTable], device: str = "meta", precision: str = "fp32"
) -> dict[str, object]:
    """The collections of a model of the tables (path -> module, ``collection_paths``)."""
    out = {}
    for path, members in collection_paths(tables).items():
        chosen = [tables[i] for i in members]
        if path.startswith("sequence"):
            out[path] = embedding_collection(chosen, device, precision)
        else:
            out[path] = embedding_bag_collection(chosen, device, path == "weighted", precision)
    return out


def collection_shards(
    tables: Sequence[TorchRecTable], shards: Mapping[str, Sequence[Mapping]], module_path: str = ""
) -> dict[str, tuple[object, dict[str, Sequence[Mapping]]]]:
    """``sharding_plan``'s modules for a model of the (named) tables: per collection (``collection_paths``, under
    ``module_path``), the collection on the meta device and its tables' ``shards`` (per table name)."""
    collections, modules = task_collections(tables), {}
    for path, members in collection_paths(tables).items():
        where = ".".join(p for p in (module_path, path) if p)
        modules[where] = (collections[path], {tables[i].name: shards[tables[i].name] for i in members})
    return modules


def task_model(tables: Sequence[TorchRecTable], device: str = "meta", precision: str = "fp32"):
    """A model of the tables: the one collection of a task of bags (called on one KeyedJaggedTensor, it returns
    TorchRec's KeyedTensor), else a ``TaskModel`` holding each collection at its path (``collection_paths``)."""
    collections = task_collections(tables, device, precision)
    if "" in collections:
        return collections[""]
    return _task_model_class()(collections)


@functools.cache
def _task_model_class():
    """``TaskModel``, defined on first use (torch is imported by the caller's process only)."""
    import torch

    class TaskModel(torch.nn.Module):
        """Collections of a task's tables, one per kernel kind, at their paths; called on one KeyedJaggedTensor per
        path, it returns the sum of every output (pooled bags, and every row of its sequence lookups): a loss whose
        backward reaches every table."""

        def __init__(self, collections: dict):
            super().__init__()
            for path, module in collections.items():
                self.add_module(path, module)

        def forward(self, inputs: dict):
            loss = None
            for path, module in self.named_children():
                out = module(inputs[path])
                if path.startswith("sequence"):  # a JaggedTensor of rows per feature
                    part = sum(jagged.values().sum() for jagged in out.values())
                else:  # a KeyedTensor of pooled bags
                    part = out.values().sum()
                loss = part if loss is None else loss + part
            return loss

    return TaskModel


def model_loss(model, inputs):
    """The sum of every output of a task's model (``task_model``) on ``inputs`` (``rank_inputs``' form: one
    KeyedJaggedTensor for a task of bags, else one per collection path)."""
    out = model(inputs)
    return out.values().sum() if not isinstance(inputs, dict) else out


def plan_shards(plan) -> dict[str, list[JSONDoc]]:
    """Per table name of a TorchRec ShardingPlan (every module): its shards [{col_offset, dim, rank}] by column
    offset; a row-split table's (row-wise, table-row-wise) also carry row_offset, num_rows, in row order; a
    data-parallel table's is [{data_parallel: 1}]; a table in tiered memory's carry its ``cache_load_factor``."""
    out: dict[str, list[JSONDoc]] = {}
    for module_plan_ in plan.plan.values():
        for name, sharding in module_plan_.items():
            if sharding.sharding_type == "data_parallel":  # no shards: every rank holds the whole table
                out[name] = [{"data_parallel": 1}]
                continue
            row_split = sharding.sharding_type in ("row_wise", "table_row_wise", "grid_shard")
            shards = []
            for shard in sharding.sharding_spec.shards:
                one = {
                    "col_offset": int(shard.shard_offsets[1]),
                    "dim": int(shard.shard_sizes[1]),
                    "rank": int(str(shard.placement).split("rank:")[1].split("/")[0]),
                }
                if row_split:
                    one.update(row_offset=int(shard.shard_offsets[0]), num_rows=int(shard.shard_sizes[0]))
                shards.append(one)
            if sharding.sharding_type == "column_wise" and len(shards) == 1:  # a whole table declared column-wise
                shards[0]["column_wise"] = 1
            load_factor = getattr(sharding.cache_params, "load_factor", None)
            if sharding.compute_kernel == UVM_CACHING:  # tiered memory (TorchRec's default load factor where unset)
                for one in shards:
                    one["cache_load_factor"] = float(TORCHREC_LOAD_FACTOR if load_factor is None else load_factor)
            out[name] = sorted(shards, key=_order)
    return out


def _order(shard: Mapping) -> tuple[int, int]:
    return int(shard.get("col_offset", 0)), int(shard.get("row_offset", 0))


def _shard_keys(shard: Mapping) -> JSONDoc:
    """A shard's geometry (``SHARD_KEYS``, ints) and its cache's load factor where it has one."""
    out: JSONDoc = {k: int(v) for k, v in shard.items() if k in SHARD_KEYS}
    if shard.get("cache_load_factor") is not None:
        out["cache_load_factor"] = float(shard["cache_load_factor"])
    return out


def mismatch(plan, shards: Mapping[str, Sequence[Mapping]]) -> str | None:
    """None if ``plan`` holds exactly ``shards`` (per table name), else a line naming the first table that differs."""
    written = plan_shards(plan)
    for name, table_shards in shards.items():
        want = sorted((_shard_keys(s) for s in table_shards), key=_order)
        if written.get(name) != want:
            return f"table {name}: TorchRec made shards {written.get(name)}, expected {want}"
    return None


def to_torchrec(
    plan,
    module_path: str = "",
    device: str = "cuda",
    compute_kernel: str = "fused",
    module=None,
    local_size: int | None = None,
):
    """A ``Plan`` as a TorchRec ``ShardingPlan`` for ``DistributedModelParallel`` (torch and torchrec are imported
    by this call only). Tables are named by their names, else ``t{index}``. ``module``: your
    EmbeddingBagCollection, found at ``module_path`` in your model (default: one built on the meta device
    from the task's tables, one feature per table); ``local_size``: ranks per host (default: the task's hosts',
    else one host)."""
    local_size = local_size or plan.task.local_size()
    names = plan.torchrec_names()
    tables = [
        TorchRecTable(t.rows, t.dim, n, kernel=t.kernel, precision=t.precision) for n, t in zip(names, plan.task.tables)
    ]
    shards = dict(zip(names, plan.torchrec_shards()))
    # your collection, or a collection per kernel kind (``collection_paths``) under ``module_path``
    modules = {module_path: (module, shards)} if module is not None else collection_shards(tables, shards, module_path)
    return sharding_plan(modules, plan.task.num_devices, device, compute_kernel, local_size)
