"""A small DLRM sharded two ways and trained on gloo processes: neuroshard_jax's planner against TorchRec's own.

    python examples/torchrec_dlrm.py            # 12 tables, 2 ranks, per-rank batch 1024, 30 timed steps
    python examples/torchrec_dlrm.py --tables 4 --rows 2000 --steps 3 --warmup 1 --batch-size 256   # quick
    python examples/torchrec_dlrm.py --hot-pooling 300 --world-size 4   # the 100-row table looked up 300 times a sample

1. Statistics: each table's pooling factor and access histogram from generated, skewed KeyedJaggedTensor batches
   (``batch_statistics``, at the planning batch: per-rank batch x world size).
2. One process per rank (gloo): each planner (ours: ``NeuroShardPlanner``; TorchRec's: ``EmbeddingShardingPlanner``)
   plans with ``collective_plan`` (rank 0 plans, every rank gets the plan) on one Topology (``TopologyFactory``;
   memory per rank: TorchRec's default, 128 GiB, the ``cap`` our planner prints); one ``DistributedModelParallel`` model
   per plan; ``--warmup`` steps, then ``--steps`` timed steps (SGD, the embeddings' update fused into the backward
   pass), the models' steps interleaved so that the machine's drifts hit both alike. A step's time is the slowest
   rank's; the line printed per planner gives the median step.

Runs on this CPU (one torch thread per rank); on a GPU host, pass ``--device cuda`` with nccl (not tested here).
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
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.datasets.utils import Batch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from neuroshard_jax.torchrec.planner import NeuroShardPlanner, batch_statistics
from neuroshard_jax.workloads.statistics import stats_file, zipf_ids

DENSE_FEATURES = 13
PLANNERS = ("neuroshard", "torchrec")


def table_configs(args) -> list[EmbeddingBagConfig]:
    """``--tables`` tables of dim ``--dim``, rows log-spaced from 100 to ``--rows``, one feature each."""
    rows = np.geomspace(100, args.rows, args.tables).astype(int)
    return [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=args.dim, num_embeddings=int(r), feature_names=[f"f{i}"])
        for i, r in enumerate(rows)
    ]


def pooling_factors(args) -> np.ndarray:
    """Skewed lookups per sample: a few tables looked up tens of times, most a few times; with ``--hot-pooling``,
    the smallest table (100 rows) that many times (a small, very hot table: whichever rank holds it whole does all
    its lookups)."""
    out = np.geomspace(1, args.max_pooling, args.tables)[np.random.default_rng(7).permutation(args.tables)]
    if args.hot_pooling:
        out[0] = args.hot_pooling
    return out


def batches(configs, args, count: int, batch: int, seed: int):
    """``count`` Batches of ``batch`` samples: Poisson bag lengths, Zipf(1.1) ids scattered over each table."""
    rng = np.random.default_rng(seed)
    pooling = pooling_factors(args)
    scatter = [np.random.default_rng(100 + i).permutation(c.num_embeddings) for i, c in enumerate(configs)]
    for _ in range(count):
        lengths = rng.poisson(pooling[:, None], size=(len(configs), batch))
        values = [
            scatter[i][zipf_ids(rng, c.num_embeddings, 1.1, int(lengths[i].sum()))] for i, c in enumerate(configs)
        ]
        yield Batch(
            dense_features=torch.from_numpy(rng.random((batch, DENSE_FEATURES), dtype=np.float32)),
            sparse_features=KeyedJaggedTensor.from_lengths_sync(
                keys=[c.feature_names[0] for c in configs],
                values=torch.from_numpy(np.concatenate(values)),
                lengths=torch.from_numpy(lengths.reshape(-1)),
            ),
            labels=torch.from_numpy(rng.integers(0, 2, size=batch)),
        )


def dlrm(configs, dim: int) -> DLRMTrain:
    """TorchRec's DLRM over the tables (on the meta device until DistributedModelParallel places the shards)."""
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    return DLRMTrain(DLRM(ebc, DENSE_FEATURES, [64, dim], [64, 1], dense_device=torch.device("cpu")))


def trainer(configs, args, plan, sharders):
    """A DLRM wrapped in DistributedModelParallel with ``plan``, and its optimizer (SGD; the embeddings' update
    fused into the backward pass)."""
    model = dlrm(configs, args.dim)
    apply_optimizer_in_backward(torch.optim.SGD, model.model.sparse_arch.parameters(), {"lr": 0.01})
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda params: torch.optim.SGD(params, lr=0.01)
    )
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense])


def run_rank(rank: int, world: int, init: str, planners: list[str], args, stats_path: str, out: str) -> None:
    """One rank: every planner plans (on rank 0, broadcast); one DistributedModelParallel model per plan; their
    training steps interleaved (step i of every model before step i + 1), so drifts of the machine hit all alike."""
    quiet()
    logging.basicConfig(format="%(message)s")
    logging.getLogger("neuroshard_jax").setLevel(logging.INFO)  # rank 0's planner (verbose) logs its plan at INFO
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    configs = table_configs(args)
    sharders = [EmbeddingBagCollectionSharder()]
    # memory per rank: TorchRec's default (128 GiB of DDR on cpu), far more than the tables need, for both planners
    topology = TopologyFactory.create_topology(
        TrainerConfig(world_size=world), kernel_config=KernelConfig(compute_device="cpu")
    )
    runs = {}
    for name in planners:
        if name == "neuroshard":
            planner = NeuroShardPlanner(topology, batch_size=args.batch_size, stats=stats_path, verbose=rank == 0)
        else:
            planner = EmbeddingShardingPlanner(topology=topology, batch_size=args.batch_size)
        start = time.perf_counter()
        plan = planner.collective_plan(dlrm(configs, args.dim), sharders, dist.GroupMember.WORLD)
        runs[name] = {"plan_s": time.perf_counter() - start, "plan": str(plan), "step_s": [], "losses": []}
        runs[name]["types"] = sharding_types(plan)
        runs[name]["model"] = trainer(configs, args, plan, sharders)
    for i, batch in enumerate(batches(configs, args, args.warmup + args.steps, args.batch_size, seed=rank)):
        for run in runs.values():
            dmp, optimizer = run["model"]
            dist.barrier()
            t0 = time.perf_counter()
            optimizer.zero_grad()
            loss, _ = dmp(batch)
            loss.backward()
            optimizer.step()
            if i >= args.warmup:
                run["step_s"].append(time.perf_counter() - t0)
                run["losses"].append(float(loss.detach()))
    results = []
    for name, run in runs.items():
        every = [None] * world
        dist.all_gather_object(every, run["step_s"])
        slowest = [max(ranks) for ranks in zip(*every)]  # a step waits for its slowest rank
        results.append(
            {
                "planner": name,
                "plan_s": run["plan_s"],
                "step_ms": 1e3 * statistics.median(slowest),
                # the spread of the slowest rank's step over the timed steps: its quartiles
                "step_ms_q1_q3": [1e3 * float(q) for q in np.quantile(slowest, [0.25, 0.75])],
                "types": run["types"],
                "loss": float(np.mean(run["losses"])),
                "plan": run["plan"],
            }
        )
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
    # done: leave without the interpreter's teardown, where a library thread still joinable at exit aborts the rank
    # now and then ("terminate called without an active exception", SIGABRT) after all of its work is done
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def sharding_types(plan) -> dict[str, int]:
    """How many tables of the plan each sharding type holds."""
    out: dict[str, int] = {}
    for module_plan in plan.plan.values():
        for sharding in module_plan.values():
            out[sharding.sharding_type] = out.get(sharding.sharding_type, 0) + 1
    return dict(sorted(out.items()))


def quiet() -> None:
    """TorchRec's deprecation notices (its own defaults trigger them) would bury the two lines this prints."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    logging.getLogger("torch").setLevel(logging.ERROR)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=12)
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the largest table")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--max-pooling", type=float, default=40.0)
    parser.add_argument("--hot-pooling", type=float, default=0.0, help="the smallest table's pooling factor (0: drawn)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024, help="per rank, as in TorchRec")
    parser.add_argument("--stats-batches", type=int, default=4, help="planning batches the statistics read")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--planners", default=",".join(PLANNERS))
    args = parser.parse_args(argv)
    quiet()
    configs = table_configs(args)
    planning_batch = args.batch_size * args.world_size
    with tempfile.TemporaryDirectory(prefix="neuroshard-dlrm-") as tmp:
        stats = batch_statistics(
            dlrm(configs, args.dim),
            batches(configs, args, args.stats_batches, planning_batch, seed=99),
            planning_batch,
            progress=False,
        )
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
