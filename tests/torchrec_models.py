"""A model of every module kind TorchRec shards for training, and batches for it: the adapter's tests and the
mixed-model rank script share them (torch and torchrec imported: only tests that import them load this)."""

import numpy as np
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
from torchrec.modules.embedding_configs import DataType, PoolingType
from torchrec.modules.feature_processor_ import PositionWeightedModuleCollection
from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

# (feature, rows) of each collection's tables, one feature per table named like it
BAGS = {"user": 5000, "tags": 800}  # sum and mean pooling
SEQUENCE = {"history": 20000, "clicks": 3000}  # an EmbeddingCollection: one dim for all its tables
SCORED = {"scored": 1000}  # per-id weights from the data
POSITIONS = {"pos": 500}  # weights from a feature processor (position-weighted)


class MixedModel(torch.nn.Module):
    """Bags (sum, mean), sequence embeddings, a weighted bag collection and a feature-processed one, nested at
    ``bags``, ``towers.seq``, ``scored``, ``weighted``; the loss a sum of all their outputs. The ``user`` table's
    weights are fp16, the others' fp32 (a model mixing data types)."""

    def __init__(self, device: torch.device | None = None):
        super().__init__()
        device = device or torch.device("meta")
        self.bags = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name="user",
                    embedding_dim=32,
                    num_embeddings=BAGS["user"],
                    feature_names=["user"],
                    data_type=DataType.FP16,
                ),
                EmbeddingBagConfig(
                    name="tags",
                    embedding_dim=16,
                    num_embeddings=BAGS["tags"],
                    feature_names=["tags"],
                    pooling=PoolingType.MEAN,
                ),
            ],
            device=device,
        )
        self.towers = torch.nn.ModuleDict(
            {
                "seq": EmbeddingCollection(
                    tables=[
                        EmbeddingConfig(name=n, embedding_dim=16, num_embeddings=r, feature_names=[n])
                        for n, r in SEQUENCE.items()
                    ],
                    device=device,
                )
            }
        )
        self.scored = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name="scored", embedding_dim=8, num_embeddings=1000, feature_names=["scored"])],
            is_weighted=True,
            device=device,
        )
        inner = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name="pos", embedding_dim=8, num_embeddings=500, feature_names=["pos"])],
            is_weighted=True,
            device=device,
        )
        self.weighted = FeatureProcessedEmbeddingBagCollection(inner, PositionWeightedModuleCollection({"pos": 10}))

    def forward(self, bags, sequence, scored, positions):
        loss = self.bags(bags).values().sum()
        for jagged in self.towers["seq"](sequence).values():
            loss = loss + jagged.values().sum()
        loss = loss + self.scored(scored).values().sum()
        return loss + self.weighted(positions).values().sum()


def jagged(features: dict, pooling: float, batch: int, rng, weighted: bool = False) -> KeyedJaggedTensor:
    """A KeyedJaggedTensor of ``features`` (name -> rows), Poisson lengths of mean ``pooling`` (at most 10), ids
    uniform over each table's rows, and per-id weights where ``weighted``."""
    lengths = np.minimum(rng.poisson(pooling, size=(len(features), batch)), 10)
    values = np.concatenate([rng.integers(0, rows, n) for rows, n in zip(features.values(), lengths.sum(1))])
    weights = torch.from_numpy(rng.uniform(0.5, 1.5, len(values)).astype(np.float32)) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(features),
        values=torch.from_numpy(values),
        lengths=torch.from_numpy(lengths.reshape(-1)),
        weights=weights,
    )


def mixed_batches(batch: int, count: int, seed: int = 0):
    """``count`` batches for ``MixedModel``: (bags, sequence, scored, positions) KeyedJaggedTensors."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield (
            jagged(BAGS, 3.0, batch, rng),
            jagged(SEQUENCE, 6.0, batch, rng),
            jagged(SCORED, 2.0, batch, rng, weighted=True),
            jagged(POSITIONS, 4.0, batch, rng),
        )
