"""Our shards as a TorchRec ``ShardingPlan``, and a ``ShardingPlan``'s shards read back: the one conversion that
``Plan.to_torchrec``, the export worker and the TorchRec adapter (``torchrec_planner``) share.

A shard list per table is ``[{col_offset, dim, rank}]`` in column order: one shard is ``table_wise(rank)``,
2^k equal column slices are ``column_wise(ranks)`` (TorchRec cuts equal slices in rank-list order, ours are
equal by construction). torch and torchrec are imported inside the functions: they run in a torch process (the
worker, or a user's), and importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

TORCHREC_MISSING = "torchrec is not installed"


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
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan, table_wise

    per_table = {}
    for name, table_shards in shards.items():
        ranks = [int(s["rank"]) for s in sorted(table_shards, key=lambda s: s["col_offset"])]
        if len(ranks) == 1:
            per_table[name] = table_wise(rank=ranks[0], compute_kernel=kernel)
        else:
            per_table[name] = column_wise(ranks=ranks, compute_kernel=kernel)
    return construct_module_sharding_plan(
        module,
        per_param_sharding=per_table,
        sharder=sharder,
        local_size=local_size or world_size,
        world_size=world_size,
        device_type=device_type,
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


def embedding_bag_collection(tables: Sequence[Mapping], device: str = "meta"):
    """An EmbeddingBagCollection of the tables ({name, rows, dim}), one feature per table named like it."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    configs = [
        EmbeddingBagConfig(
            name=t["name"], embedding_dim=int(t["dim"]), num_embeddings=int(t["rows"]), feature_names=[t["name"]]
        )
        for t in tables
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device(device))


def plan_shards(plan) -> dict[str, list[dict]]:
    """Per table name of a TorchRec ShardingPlan (every module): its shards [{col_offset, dim, rank}], by column
    offset."""
    out: dict[str, list[dict]] = {}
    for module_plan_ in plan.plan.values():
        for name, sharding in module_plan_.items():
            out[name] = sorted(
                (
                    {
                        "col_offset": int(shard.shard_offsets[1]),
                        "dim": int(shard.shard_sizes[1]),
                        "rank": int(str(shard.placement).split("rank:")[1].split("/")[0]),
                    }
                    for shard in sharding.sharding_spec.shards
                ),
                key=lambda s: s["col_offset"],
            )
    return out


def mismatch(plan, shards: Mapping[str, Sequence[Mapping]]) -> str | None:
    """None if ``plan`` holds exactly ``shards`` (per table name), else a line naming the first table that differs."""
    written = plan_shards(plan)
    for name, table_shards in shards.items():
        want = sorted(
            ({k: int(s[k]) for k in ("col_offset", "dim", "rank")} for s in table_shards), key=lambda s: s["col_offset"]
        )
        if written.get(name) != want:
            return f"table {name}: TorchRec made shards {written.get(name)}, expected {want}"
    return None
