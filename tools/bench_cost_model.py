"""Accuracy of the cost models against real measurements: held-out shards and evaluator-measured plans.

    python tools/bench_cost_model.py [--checkpoint DIR] [--tasks 20] [--searchers size_lookup_greedy,random]
                                     [--out bench/cost_model]

1. Shards: the checkpoint's held-out test split of its compute dataset (the split is re-derived from
   the seed and fractions saved in the checkpoint), neural vs analytic: MAPE, RMSE, Kendall tau.
2. Plans: ``--tasks`` held-out tasks (conf/task/neuroshard.yaml, seeds from ``--first-seed``), each
   sharded by every searcher in ``--searchers`` (scored with the neural model), every plan measured by
   the evaluator (fused TBE per device + all-to-all with straggler delays, as
   ``python -m neuroshard_jax.evaluate``). Reports the rank correlation of predicted vs measured plan
   cost for both models. Measurements are appended to ``OUT/plans.jsonl`` so a stopped run resumes.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from neuroshard_jax.checkpoints import read_meta
from neuroshard_jax.cost_models import SHIPPED_CHECKPOINT, make_cost_model, score_plan
from neuroshard_jax.datasets import JsonlLog
from neuroshard_jax.evaluate import EvaluateConfig, measure_plans
from neuroshard_jax.plans import plan_from_json
from neuroshard_jax.search import shard_task, write_json
from neuroshard_jax.tasks import TaskConfig, make_task
from neuroshard_jax.training import (
    TrainConfig,
    analytic_shard_ms,
    compute_arrays,
    kendall_tau,
    metrics,
    predict_shard_ms,
    resolve_dataset,
    split_indices,
)


def shipped_checkpoint() -> str:
    from importlib import resources

    return str(resources.files("neuroshard_jax") / SHIPPED_CHECKPOINT)


def shard_metrics(checkpoint: str, dataset: str | None) -> dict:
    meta = read_meta(checkpoint)
    train = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in meta["train_config"].items()})
    dataset = resolve_dataset(dataset or meta["dataset_dir"])
    feats, mask, target, manifest = compute_arrays(dataset)
    _, _, test = split_indices(len(target), train.split, train.seed)
    settings = manifest["settings"]
    neural = predict_shard_ms(checkpoint, feats[test], mask[test])
    analytic = analytic_shard_ms(feats[test], mask[test], settings["batch_size"], settings.get("precision", "fp32"))
    return {
        "dataset": str(dataset),
        "test_shards": int(len(test)),
        "neural": metrics(neural, target[test]),
        "analytic": metrics(analytic, target[test]),
    }


def spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def plan_metrics(args, checkpoint: str) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = JsonlLog(out / "plans.jsonl")
    done = {(r["task_seed"], r["searcher"]): r for r in log.records()}
    task_config = TaskConfig(num_tables=None, batch_size=args.batch_size)  # 10..59 tables: costs vary
    evaluate = EvaluateConfig(workers=args.workers)
    todo = [(args.first_seed + i, s) for i in range(args.tasks) for s in args.searchers]
    todo = [key for key in todo if key not in done]
    for start in range(0, len(todo), args.chunk):  # measured in chunks, appended: a stopped run resumes
        chunk, plans, records = todo[start : start + args.chunk], [], []
        for seed, searcher in chunk:
            task = make_task(task_config, seed)
            plan_json = shard_task(task, searcher, "neural", seed, cost_model_options={"checkpoint": checkpoint})
            plans.append(plan_from_json(plan_json))
            analytic = float(score_plan(make_cost_model("analytic", task), plans[-1]).total_ms.max())
            records.append(
                {
                    "id": f"{seed}/{searcher}",
                    "task_seed": seed,
                    "searcher": searcher,
                    "num_tables": len(task.tables),
                    "neural_ms": plan_json["cost_ms"],
                    "analytic_ms": analytic,
                }
            )
        for record, measured in zip(records, measure_plans(plans, evaluate)):
            record.update(measured_ms=measured["cost_ms"], measured_devices=measured["devices"])
            log.append(record)
            done[(record["task_seed"], record["searcher"])] = record
            print(
                f"task {record['task_seed']} {record['searcher']}: measured {record['measured_ms']:.2f} ms, "
                f"neural {record['neural_ms']:.2f}, analytic {record['analytic_ms']:.2f}",
                flush=True,
            )
    rows = [done[(args.first_seed + i, s)] for i in range(args.tasks) for s in args.searchers]
    measured = np.array([r["measured_ms"] for r in rows])
    result = {"plans": len(rows), "tasks": args.tasks, "searchers": args.searchers}
    for name in ("neural", "analytic"):
        pred = np.array([r[f"{name}_ms"] for r in rows])
        result[name] = {
            "kendall_tau": kendall_tau(pred, measured),
            "spearman": spearman(pred, measured),
            "mape": float(np.mean(np.abs(pred - measured) / measured)),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="default: the checkpoint shipped in the package")
    parser.add_argument("--dataset", default=None, help="default: the dataset the checkpoint was trained on")
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=10_000, help="task seeds; the searches never saw them")
    parser.add_argument("--searchers", type=lambda s: s.split(","), default=["size_lookup_greedy"])
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=10, help="plans measured per batch (and appended)")
    parser.add_argument("--out", default="bench/cost_model")
    args = parser.parse_args()
    checkpoint = os.path.abspath(args.checkpoint or shipped_checkpoint())
    summary = {"checkpoint": checkpoint, "shards": shard_metrics(checkpoint, args.dataset)}
    print(json.dumps(summary["shards"], indent=1), flush=True)
    if args.tasks:
        summary["plans"] = plan_metrics(args, checkpoint)
        print(json.dumps(summary["plans"], indent=1))
    write_json(summary, Path(args.out) / "summary.json")


if __name__ == "__main__":
    main()
