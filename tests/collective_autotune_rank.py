"""One rank of a live gloo group that plans with ``NeuroShardPlanner.collective_plan(..., autotune="steps")``
(``test_portfolio``): python tests/collective_autotune_rank.py RANK WORLD INIT OUT. Each rank runs on a core of its
own; rank 0 adds two plans of its own: every table on rank 0 (``planted``), and a plan of other tables (``stale``)."""

import dataclasses
import json
import os
import sys

rank, world, init, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingBagCollection  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402

from neuroshard_jax.core.errors import UserError  # noqa: E402
from neuroshard_jax.core.plan import Plan  # noqa: E402
from neuroshard_jax.kernels.worker.comm import leave_rank  # noqa: E402
from neuroshard_jax.measure.autotune import AutotuneConfig  # noqa: E402
from neuroshard_jax.torchrec.group_steps import GroupSteps  # noqa: E402
from neuroshard_jax.torchrec.planner import NeuroShardPlanner, table_configs  # noqa: E402

dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
# kernels that dominate the step (4,096 bags of 10 lookups of 256 floats a table and rank), so that balance shows
configs = [
    EmbeddingBagConfig(name=f"t{i}", embedding_dim=256, num_embeddings=100_000 + 13_000 * i, feature_names=[f"f{i}"])
    for i in range(4)
]
module = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
autotune = AutotuneConfig(name="steps", rounds=3, steps=5, step_warmup=1, baselines=())
pooling = {f"f{i}": 10.0 for i in range(4)}
topology = TopologyFactory.create_topology(TrainerConfig(world_size=world), kernel_config=KernelConfig("cpu"))
planner = NeuroShardPlanner(
    topology, mem_cap_gb=2.0, batch_size=4096, pooling_factors=pooling, cost_model="analytic",
    searcher="grid", autotune=autotune, verbose=False,
)  # fmt: skip
own = None
if rank == 0:
    task = planner.task(module)
    planted = Plan.from_assignment(task, [1] * task.num_tables, [[0]] * task.num_tables)
    other = dataclasses.replace(task, tables=tuple(dataclasses.replace(t, dim=128) for t in task.tables))
    own = {"planted": planted, "stale": Plan.from_assignment(other, [1] * 4, [[0], [1], [0], [1]])}
sharding = planner.collective_plan(module, pg=None, candidates=own)
shards = {name: [p.sharding_type, p.ranks] for name, p in sharding.plan[""].items()}

# the caller's batches are checked on every rank: a batch without a table's feature is refused on all of them
kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f0"], values=torch.arange(4), lengths=torch.tensor([2, 2]))
try:
    GroupSteps(table_configs(module), None, dist.group.WORLD, torch.device("cpu"), "exact_sgd", batches=[kjt])
    refused = None
except UserError as err:
    refused = str(err)
record = planner.last_plan.autotune
with open(out, "w") as f:
    stages = list(planner.last_plan.stages)
    json.dump({"shards": shards, "autotune": record.to_json(), "refused": refused, "stages": stages}, f)
leave_rank()  # the results written: leave as every rank of the project's distributed jobs does
