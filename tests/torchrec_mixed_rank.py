"""One rank of a live gloo group that plans a model of every module kind TorchRec shards (``test_torchrec_planner``):
python tests/torchrec_mixed_rank.py RANK WORLD INIT OUT. Rank 0 plans it with ``NeuroShardPlanner`` (broadcast by
``collective_plan``), every rank builds it in DistributedModelParallel with that plan and trains two steps (forward,
backward, the fused optimizer's update) on its own batches; each rank writes what its sharded modules hold."""

import json
import os
import sys

rank, world, init, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank % len(os.sched_getaffinity(0))]})

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torchrec.distributed.model_parallel import DistributedModelParallel  # noqa: E402
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig  # noqa: E402
from torchrec.distributed.sharding_plan import get_default_sharders  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from neuroshard_jax.kernels.worker.comm import leave_rank  # noqa: E402
from neuroshard_jax.torchrec.planner import NeuroShardPlanner  # noqa: E402
from tests.torchrec_models import MixedModel, mixed_batches  # noqa: E402

dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
topology = TopologyFactory.create_topology(TrainerConfig(world_size=world), kernel_config=KernelConfig("cpu"))
planner = NeuroShardPlanner(
    topology, mem_cap_gb=1.0, batch_size=64, cost_model="analytic", verbose=False,
    pooling_factors={"history": 12.0, "clicks": 4.0, "tags": 3.0},
)  # fmt: skip
sharders = get_default_sharders()
model = MixedModel(torch.device("meta"))
plan = planner.collective_plan(model, sharders)
dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
losses = []
for batch in mixed_batches(64, 2, seed=rank):
    loss = dmp(*batch)
    loss.backward()  # the embeddings' fused optimizer updates in the backward
    losses.append(float(loss.detach()))
held = {}
for path, module in dmp.named_modules():
    kind = type(module).__name__
    if kind.startswith("Sharded"):
        held[path.removeprefix("_dmp_wrapped_module.")] = kind
with open(out, "w") as f:
    plan_json = {p: {t: [s.sharding_type, s.ranks] for t, s in m.items()} for p, m in plan.plan.items()}
    json.dump({"plan": plan_json, "losses": losses, "sharded": held}, f)
leave_rank()  # the results written: leave as every rank of the project's distributed jobs does
