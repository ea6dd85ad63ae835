"""Export a plan to TorchRec.

    python -m neuroshard_jax.export plan=PATH/plan.json format=torchrec [output=FILE device=cuda
        module_path=sparse_arch.embedding_bag_collection table_names='t{index}' check=false]

Writes a TorchRec ``ShardingPlan`` (``torch.save``; load it with ``torch.load(path, weights_only=False)``
and pass it as ``DistributedModelParallel(..., plan=plan)``) for an EmbeddingBagCollection whose tables
are the task's tables, named by ``table_names`` ({index}: position in the task, {id}: pool id). A
table-wise shard becomes ``table_wise(rank)``, a table split into 2^k equal column shards
``column_wise(ranks)`` in column order, a table's row blocks over every rank in order ``row_wise()``, a
data-parallel table ``data_parallel()`` (TorchRec's dense kernel, its gradients all-reduced). The
plan is built in the torch worker subprocess (torch is never imported here) and read back there: its shards
must equal ours.

``check=true`` (with ``device=cpu``) then loads the plan into DistributedModelParallel on this machine,
one gloo process per device, and runs a forward pass checked against the expected pooled sums, and a
backward pass; it allocates the task's full tables, so it is meant for small tasks.
"""

from __future__ import annotations

from omegaconf import DictConfig

from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import typed
from neuroshard_jax.kernels.torchrec_export import ExportConfig


def app_config(cfg: DictConfig) -> ExportConfig:
    return typed(ExportConfig, resolved(cfg))
