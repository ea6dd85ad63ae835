"""The modules of a TorchRec model that its planner shards, found as it finds them: ``EmbeddingBagCollection`` (sum
and mean pooling, weighted or not), ``EmbeddingCollection`` (sequence embeddings),
``FeatureProcessedEmbeddingBagCollection`` and the managed-collision wrappers, nested anywhere, each keyed by its
module path as TorchRec's planner keys it; their tables, the kernel each runs in, and the fused optimizer the model
declares. A module TorchRec shards that this planner cannot plan is refused by name, never skipped. torch is
imported: this module sits behind the adapter's wall."""

from __future__ import annotations

import dataclasses

import torch
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.utils import optimizer_type_to_emb_opt_type
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

from neuroshard_jax.core.errors import UserError

try:  # the managed-collision wrappers, where the installed TorchRec has them
    from torchrec.modules.mc_embedding_modules import (
        ManagedCollisionEmbeddingBagCollection,
        ManagedCollisionEmbeddingCollection,
    )

    _MANAGED: tuple[type, ...] = (ManagedCollisionEmbeddingBagCollection, ManagedCollisionEmbeddingCollection)
except ImportError:  # pragma: no cover - every TorchRec this package supports has them
    _MANAGED = ()


def declared_optimizer(module: torch.nn.Module, sharders: list | None = None) -> str | None:
    """The fused optimizer the model trains its tables with, as TorchRec finds it: the one
    ``apply_optimizer_in_backward`` put on the tables' weights (``_optimizer_classes``), else a sharder's
    ``fused_params["optimizer"]`` (of a module kind the model holds); None where neither says. UserError where
    tables declare different ones, or an optimizer class no fused kernel runs."""
    found = set()
    held = set()
    for found_collection in collections(module):
        held.add(type(found_collection.module))
        for name, param in found_collection.module.named_parameters():
            for cls in getattr(param, "_optimizer_classes", None) or ():
                try:
                    found.add(optimizer_type_to_emb_opt_type(cls).value)
                except ValueError:
                    raise UserError(
                        f"module: {found_collection.path}.{name} trains with {cls.__name__}, which no fused embedding "
                        "kernel runs; expected an optimizer of torchrec.optim or SGD, Adagrad, Adam"
                    ) from None
    if not found:
        for sharder in sharders or ():
            fused = getattr(sharder, "fused_params", None) or {}
            if getattr(sharder, "module_type", None) in held and "optimizer" in fused:
                found.add(str(fused["optimizer"]))
    if len(found) > 1:
        raise UserError(f"module: tables train with {sorted(found)}, expected one fused optimizer for all")
    return found.pop() if found else None


@dataclasses.dataclass(frozen=True)
class Collection:
    """A module of the model that TorchRec shards, as its planner keys it: ``path`` (``""`` for the model itself),
    ``module`` (what the sharder takes: an EmbeddingBagCollection, EmbeddingCollection, feature-processed or
    managed-collision collection), ``tables`` (the collection of configs inside it: the module, or the one it wraps),
    whether its lookups are ``sequence`` (unpooled: an EmbeddingCollection's) and ``weighted`` (per-id weights)."""

    path: str
    module: torch.nn.Module
    tables: torch.nn.Module
    sequence: bool
    weighted: bool

    def configs(self) -> list:
        """Its tables' configs (``EmbeddingBagConfig``s, or an EmbeddingCollection's ``EmbeddingConfig``s)."""
        return list(self.tables.embedding_configs() if self.sequence else self.tables.embedding_bag_configs())

    def pooling(self, config) -> str:
        """A table's pooling (``core.table.POOLINGS``): none for sequence lookups, else its config's."""
        if self.sequence:
            return "none"
        name = getattr(config.pooling, "name", str(config.pooling)).lower()
        if name not in ("sum", "mean"):
            raise UserError(
                f"module: table {config.name!r} of {self.path or 'the model'} pools with {name!r}, expected sum or mean"
            )
        return name


def _collection(path: str, module: torch.nn.Module) -> Collection | None:
    """The module at ``path`` as a ``Collection`` where it is a kind TorchRec shards and this planner plans. A
    feature-processed or managed-collision collection is keyed at the wrapper (as TorchRec's planner keys it), its
    tables those of the collection it wraps (its child module of that type)."""
    if isinstance(module, FeatureProcessedEmbeddingBagCollection):  # its inner EBC's lookups carry the FP's weights
        return Collection(path, module, _wrapped(module, EmbeddingBagCollection), False, True)
    if _MANAGED and isinstance(module, _MANAGED):
        inner = _wrapped(module, (EmbeddingBagCollection, EmbeddingCollection))
        sequence = isinstance(inner, EmbeddingCollection)
        return Collection(path, module, inner, sequence, (not sequence) and inner.is_weighted())
    if isinstance(module, EmbeddingBagCollection):
        return Collection(path, module, module, False, module.is_weighted())
    if isinstance(module, EmbeddingCollection):
        return Collection(path, module, module, True, False)
    return None


def _wrapped(module: torch.nn.Module, kinds) -> torch.nn.Module:
    """The collection a wrapper holds: its child module of type ``kinds``."""
    found = next((child for child in module.children() if isinstance(child, kinds)), None)
    if found is None:
        raise UserError(f"module: {type(module).__name__} holds no embedding collection, expected one it wraps")
    return found


def collections(module: torch.nn.Module, sharders: list | None = None) -> list[Collection]:
    """Every module of ``module`` that TorchRec's planner would shard, outermost first, as it keys them (a collection
    inside another, as an FP module's EBC, is the outer one's). A module TorchRec shards (by its default sharders, or
    by one of ``sharders``) that this planner cannot plan is refused by name, never skipped; UserError where there is
    none at all."""
    found: list[Collection] = []
    shardable = tuple(_shardable_types(sharders))
    for path, child in module.named_modules():
        if any(c.path == "" or path.startswith(f"{c.path}.") for c in found):
            continue  # inside a collection already found: TorchRec shards the outer one
        collection = _collection(path, child)
        if collection is not None:
            found.append(collection)
        elif shardable and isinstance(child, shardable):
            raise UserError(
                f"module: {path or 'the model'} is a {type(child).__module__}.{type(child).__name__}, which TorchRec "
                "shards and this planner "
                "cannot plan; expected EmbeddingBagCollection, EmbeddingCollection, FeatureProcessedEmbeddingBag"
                "Collection or a managed-collision collection (or plan it with TorchRec's planner)"
            )
    if not found:
        raise UserError(
            f"module: no embedding collection in {type(module).__name__}, expected at least one "
            "EmbeddingBagCollection, EmbeddingCollection or FeatureProcessedEmbeddingBagCollection"
        )
    return found


def _shardable_types(sharders: list | None) -> list[type]:
    """The module types TorchRec shards: its default sharders' and ``sharders``'."""
    types = [s.module_type for s in get_default_sharders()]
    return types + [getattr(s, "module_type", None) for s in sharders or () if getattr(s, "module_type", None)]


def table_configs(module: torch.nn.Module) -> list[tuple[str, str, object]]:
    """(collection path, our table name, config) of every table; a name shared by two collections is qualified by
    its collection's path (path/name)."""
    return [(path, name, config) for path, name, config, _ in tables_of(module)]


def tables_of(module: torch.nn.Module, sharders: list | None = None) -> list[tuple[str, str, object, Collection]]:
    """(collection path, our table name, config, its ``Collection``) of every table of every collection
    (``collections``: refused where the model holds a module TorchRec or ``sharders`` shard and this planner cannot
    plan)."""
    rows = [(c, config) for c in collections(module, sharders) for config in c.configs()]
    counts: dict[str, int] = {}
    for _, config in rows:
        counts[config.name] = counts.get(config.name, 0) + 1
    return [
        (c.path, config.name if counts[config.name] == 1 else f"{c.path}/{config.name}", config, c)
        for c, config in rows
    ]


def feature_tables(module: torch.nn.Module) -> dict[str, str]:
    """Feature name -> our table name (a feature read by tables of two collections is refused)."""
    out: dict[str, str] = {}
    for _, name, config in table_configs(module):
        for feature in config.feature_names:
            if feature in out:
                raise UserError(f"feature {feature!r}: read by tables {out[feature]!r} and {name!r}, expected one")
            out[feature] = name
    return out
