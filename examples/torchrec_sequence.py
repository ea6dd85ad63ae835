"""A model with sequence features sharded two ways and trained on gloo processes: neuroshard_jax's planner against
TorchRec's own.

    python examples/torchrec_sequence.py                 # 2 ranks, per-rank batch 512, histories of ~30, 20 steps
    python examples/torchrec_sequence.py --history 100 --world-size 4 --steps 10

The model (DIN-style): a user's history of items and of their categories (sequence embeddings: an
``EmbeddingCollection`` whose ``item`` table is read by the target item and by the history, ``category`` by the
history's categories)
feeds an attention over the history keyed by the target item; beside it, pooled bags (the user, a multi-hot tag field
pooled by its mean) and a weighted feature (scored ids: per-id weights from the data); an MLP over all of them gives a
click logit. Every collection is sharded by each planner (ours plans each table's kernel: a sequence table's
all-to-all carries a row per id).

1. Statistics: each table's pooling factor and access histogram from generated, skewed batches (``batch_statistics``,
   at the planning batch: per-rank batch x world size; a table read by two features pools both).
2. One process per rank (gloo): each planner plans with ``collective_plan``; one ``DistributedModelParallel`` model
   per plan; ``--warmup`` steps, then ``--steps`` timed steps (SGD, the embeddings' update fused into the backward
   pass), the models' steps interleaved. A step's time is the slowest rank's; one line per planner.

Runs on this CPU (one torch thread per rank).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torchrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
)
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.modules.embedding_configs import PoolingType
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from neuroshard_jax.torchrec.planner import NeuroShardPlanner, batch_statistics
from neuroshard_jax.workloads.statistics import stats_file, zipf_ids

PLANNERS = ("neuroshard", "torchrec")


class SequenceModel(torch.nn.Module):
    """DIN-style: attention over the item history keyed by the target item, pooled bags, a weighted feature."""

    def __init__(self, args, device: torch.device):
        super().__init__()
        d = args.dim
        self.sequence = EmbeddingCollection(
            tables=[
                EmbeddingConfig(
                    name="item", embedding_dim=d, num_embeddings=args.items, feature_names=["target", "history"]
                ),
                EmbeddingConfig(
                    name="category", embedding_dim=d, num_embeddings=args.categories, feature_names=["history_cat"]
                ),
            ],
            device=device,
        )
        self.bags = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(name="user", embedding_dim=d, num_embeddings=args.users, feature_names=["user"]),
                EmbeddingBagConfig(
                    name="tags", embedding_dim=16, num_embeddings=2000, feature_names=["tags"], pooling=PoolingType.MEAN
                ),
            ],
            device=device,
        )
        self.scored = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name="scored", embedding_dim=16, num_embeddings=5000, feature_names=["scored"])],
            is_weighted=True,
            device=device,
        )
        self.mlp = torch.nn.Sequential(torch.nn.Linear(3 * d + 32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def forward(self, sequence: KeyedJaggedTensor, bags: KeyedJaggedTensor, scored: KeyedJaggedTensor, clicks):
        rows = self.sequence(sequence)
        target = rows["target"].to_padded_dense(1)[:, 0]  # [B, d]
        history = rows["history"].to_padded_dense(self.history_len)  # [B, L, d]
        categories = rows["history_cat"].to_padded_dense(self.history_len)
        mask = torch.arange(self.history_len)[None, :] < rows["history"].lengths()[:, None]
        scores = torch.where(mask, (history * target[:, None]).sum(-1), torch.finfo(history.dtype).min)
        weights = torch.softmax(scores, dim=1) * mask  # no history: no interest
        interest = (weights[..., None] * (history + categories)).sum(1)
        pooled = self.bags(bags).values()
        features = torch.cat([target, interest, pooled, self.scored(scored).values()], dim=1)
        logits = self.mlp(features)[:, 0]
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, clicks)


def make_model(args, device: torch.device) -> SequenceModel:
    model = SequenceModel(args, device)
    model.history_len = int(args.max_history)
    return model


def batches(args, count: int, batch: int, seed: int):
    """``count`` batches of ``batch`` samples: (sequence, bags, scored) KeyedJaggedTensors and click labels; ids
    Zipf-skewed, histories Poisson of mean ``--history`` (at most ``--max-history``)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        history = np.minimum(rng.poisson(args.history, batch), args.max_history)
        target = np.ones(batch, np.int64)
        items = [zipf_ids(rng, args.items, 1.1, int(n)) for n in (batch, history.sum())]
        sequence = KeyedJaggedTensor.from_lengths_sync(
            keys=["target", "history", "history_cat"],
            values=torch.from_numpy(
                np.concatenate([*items, zipf_ids(rng, args.categories, 1.0, int(history.sum()))]).astype(np.int64)
            ),
            lengths=torch.from_numpy(np.concatenate([target, history, history]).astype(np.int64)),
        )
        tags = np.minimum(rng.poisson(4.0, batch), 12)
        bags = KeyedJaggedTensor.from_lengths_sync(
            keys=["user", "tags"],
            values=torch.from_numpy(
                np.concatenate([zipf_ids(rng, args.users, 1.05, batch), zipf_ids(rng, 2000, 1.2, int(tags.sum()))])
            ),
            lengths=torch.from_numpy(np.concatenate([np.ones(batch, np.int64), tags])),
        )
        scored_lengths = np.minimum(rng.poisson(6.0, batch), 20)
        scored = KeyedJaggedTensor.from_lengths_sync(
            keys=["scored"],
            values=torch.from_numpy(zipf_ids(rng, 5000, 1.1, int(scored_lengths.sum()))),
            lengths=torch.from_numpy(scored_lengths.astype(np.int64)),
            weights=torch.from_numpy(rng.uniform(0.0, 1.0, int(scored_lengths.sum())).astype(np.float32)),
        )
        yield sequence, bags, scored, torch.from_numpy(rng.integers(0, 2, batch).astype(np.float32))


def trainer(args, plan, sharders):
    """The model in DistributedModelParallel with ``plan`` and its optimizer (SGD; the embeddings' fused in the
    backward pass)."""
    model = make_model(args, torch.device("meta"))
    for collection in (model.sequence, model.bags, model.scored):
        apply_optimizer_in_backward(torch.optim.SGD, collection.parameters(), {"lr": 0.01})
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda params: torch.optim.SGD(params, lr=0.01)
    )
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense])


def run_rank(rank: int, world: int, init: str, planners: list[str], args, stats_path: str, out: str) -> None:
    """One rank: every planner plans (rank 0, broadcast), one DistributedModelParallel model per plan, their steps
    interleaved."""
    quiet()
    logging.basicConfig(format="%(message)s")
    logging.getLogger("neuroshard_jax").setLevel(logging.INFO)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    sharders = get_default_sharders()
    topology = TopologyFactory.create_topology(TrainerConfig(world_size=world), kernel_config=KernelConfig("cpu"))
    runs = {}
    for name in planners:
        if name == "neuroshard":
            planner = NeuroShardPlanner(topology, batch_size=args.batch_size, stats=stats_path, verbose=rank == 0)
        else:
            planner = EmbeddingShardingPlanner(topology=topology, batch_size=args.batch_size)
        start = time.perf_counter()
        plan = planner.collective_plan(make_model(args, torch.device("meta")), sharders, dist.GroupMember.WORLD)
        types = {}
        for module_plan in plan.plan.values():
            for sharding in module_plan.values():
                types[sharding.sharding_type] = types.get(sharding.sharding_type, 0) + 1
        runs[name] = {"plan_s": time.perf_counter() - start, "types": types, "step_s": [], "losses": []}
        runs[name]["model"] = trainer(args, plan, sharders)
    for i, batch in enumerate(batches(args, args.warmup + args.steps, args.batch_size, seed=rank)):
        for run in runs.values():
            dmp, optimizer = run["model"]
            dist.barrier()
            t0 = time.perf_counter()
            optimizer.zero_grad()
            loss = dmp(*batch)
            loss.backward()
            optimizer.step()
            if i >= args.warmup:
                run["step_s"].append(time.perf_counter() - t0)
                run["losses"].append(float(loss.detach()))
    results = []
    for name, run in runs.items():
        every = [None] * world
        dist.all_gather_object(every, run["step_s"])
        slowest = [max(ranks) for ranks in zip(*every)]
        results.append(
            {
                "planner": name,
                "plan_s": run["plan_s"],
                "step_ms": 1e3 * statistics.median(slowest),
                "step_ms_q1_q3": [1e3 * float(q) for q in np.quantile(slowest, [0.25, 0.75])],
                "types": dict(sorted(run["types"].items())),
                "loss": float(np.mean(run["losses"])),
            }
        )
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # past a library thread that can abort the interpreter's teardown (examples/torchrec_dlrm.py)


def quiet() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    logging.getLogger("torch").setLevel(logging.ERROR)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--categories", type=int, default=2_000)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--history", type=float, default=30.0, help="mean history length")
    parser.add_argument("--max-history", type=int, default=100)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=512, help="per rank, as in TorchRec")
    parser.add_argument("--stats-batches", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--planners", default=",".join(PLANNERS))
    args = parser.parse_args(argv)
    quiet()
    planning_batch = args.batch_size * args.world_size
    with tempfile.TemporaryDirectory(prefix="neuroshard-sequence-") as tmp:
        model = make_model(args, torch.device("meta"))
        kjts = (  # the statistics read the embedding features of the planning batches
            kjt
            for sequence, bags, scored, _ in batches(args, args.stats_batches, planning_batch, 99)
            for kjt in (sequence, bags, scored)
        )
        stats = batch_statistics(model, kjts, planning_batch, progress=False)
        stats_path = Path(tmp) / "tables.json"
        stats_path.write_text(json.dumps(stats_file(stats, planning_batch, "generated batches")))
        out = Path(tmp) / "results.json"
        init = f"file://{Path(tmp) / 'init'}"
        planners = args.planners.split(",")
        mp.spawn(run_rank, (args.world_size, init, planners, args, str(stats_path), str(out)), nprocs=args.world_size)
        results = json.loads(out.read_text())
        for result in results:
            q1, q3 = result["step_ms_q1_q3"]
            types = ", ".join(f"{k} {v}" for k, v in result["types"].items())
            print(
                f"{result['planner']:>10}: median step {result['step_ms']:8.2f} ms (quartiles {q1:.2f}-{q3:.2f}; "
                f"slowest of {args.world_size} ranks, {args.steps} steps interleaved), planned in "
                f"{result['plan_s']:.1f} s, mean loss {result['loss']:.4f}; tables: {types}"
            )
    return results


if __name__ == "__main__":
    main()
