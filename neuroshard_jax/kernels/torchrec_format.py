"""Our shards as a TorchRec ``ShardingPlan``, and a ``ShardingPlan``'s shards read back: the one conversion that
``to_torchrec``, the export worker and the TorchRec adapter (``neuroshard_jax.torchrec.planner``) share.

A shard list per table is ``[{col_offset, dim, rank}]`` in column order: one shard is ``table_wise(rank)``,
2^k equal column slices are ``column_wise(ranks)`` (TorchRec cuts equal slices in rank-list order, ours are
equal by construction). A row-split table's shards also carry ``row_offset, num_rows`` (``sharding.row_blocks``,
TorchRec's own layout): its blocks in rank order over every rank are ``row_wise()``, over the ranks of one host
``table_row_wise(host)``; row blocks of column slices (TorchRec's grid sharding) are not exported. A data-parallel
table's list is ``[{data_parallel: 1}]`` (``data_parallel()``: every rank holds it, TorchRec's dense kernel). torch and
torchrec are imported inside the functions: they run in a torch process (the worker, or a user's), and importing
this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from neuroshard_jax.kernels.messages import TorchRecTable

TORCHREC_MISSING = "torchrec is not installed"
SHARD_KEYS = ("col_offset", "dim", "rank", "row_offset", "num_rows", "data_parallel")


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
        if "num_rows" in ordered[0]:
            host = row_split_host(name, ordered, world_size, local_size)
            per_table[name] = row_wise(compute_kernel=kernel) if host is None else table_row_wise(host_index=host)
        elif len(ranks) == 1:
            per_table[name] = table_wise(rank=ranks[0], compute_kernel=kernel)
        else:
            per_table[name] = column_wise(ranks=ranks, compute_kernel=kernel)
    return construct_module_sharding_plan(
        module,
        per_param_sharding=per_table,
        sharder=sharder,
        local_size=local_size,
        world_size=world_size,
        device_type=device_type,
    )


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


def embedding_bag_collection(tables: Sequence[TorchRecTable], device: str = "meta"):
    """An EmbeddingBagCollection of the (named) tables, one feature per table named like it."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    configs = [
        EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name])
        for t in tables
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device(device))


def plan_shards(plan) -> dict[str, list[dict]]:
    """Per table name of a TorchRec ShardingPlan (every module): its shards [{col_offset, dim, rank}] by column
    offset; a row-split table's (row-wise, table-row-wise) also carry row_offset, num_rows, in row order; a
    data-parallel table's is [{data_parallel: 1}]."""
    out: dict[str, list[dict]] = {}
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
            out[name] = sorted(shards, key=_order)
    return out


def _order(shard: Mapping) -> tuple[int, int]:
    return int(shard.get("col_offset", 0)), int(shard.get("row_offset", 0))


def mismatch(plan, shards: Mapping[str, Sequence[Mapping]]) -> str | None:
    """None if ``plan`` holds exactly ``shards`` (per table name), else a line naming the first table that differs."""
    written = plan_shards(plan)
    for name, table_shards in shards.items():
        want = sorted(({k: int(v) for k, v in s.items() if k in SHARD_KEYS} for s in table_shards), key=_order)
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
    tables = [TorchRecTable(t.rows, t.dim, n) for n, t in zip(names, plan.task.tables)]
    shards = dict(zip(names, plan.torchrec_shards()))
    if module is None:
        module = embedding_bag_collection(tables)
    return sharding_plan({module_path: (module, shards)}, plan.task.num_devices, device, compute_kernel, local_size)
