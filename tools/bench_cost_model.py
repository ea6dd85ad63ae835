"""Accuracy of the cost models against real measurements: held-out shards and evaluator-measured plans.

    python -m tools.bench_cost_model [--checkpoint DIR] [--sweep outputs/bench/compare/default]
        [--out outputs/bench/cost_model]

1. Shards: the checkpoint's held-out test split of its compute dataset (the split is re-derived from
   the seed and fractions saved in the checkpoint), neural vs analytic: MAPE, RMSE, Kendall tau.
2. Plans: every measured plan of a suite sweep (``-m experiment=compare``, measured with
   ``evaluate=true`` or ``python -m neuroshard_jax.evaluate sweep=DIR``; default: the shipped default
   suite, 898 plans of 9 searchers on 98 tasks), re-scored by both models. Reports Kendall tau,
   Spearman and MAPE of predicted vs measured cost over all plans, and the mean Kendall tau among the
   plans of one task (what a searcher needs: ranking candidate plans of the same task right).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from neuroshard_jax.core.constants import SHIPPED_CHECKPOINT
from neuroshard_jax.core.files import JsonlLog, write_json
from neuroshard_jax.core.paths import resolve_dataset
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.costs.checkpoints import ENSEMBLE_FORMAT, read_meta
from neuroshard_jax.costs.choice import make_cost_model
from neuroshard_jax.costs.cost_model import plan_cost_ms
from neuroshard_jax.costs.scoring import score_plan
from neuroshard_jax.learn.datasets import compute_arrays, split_indices
from neuroshard_jax.learn.metrics import kendall_tau, metrics
from neuroshard_jax.learn.neural_fit import analytic_shard_ms, predict_shard_ms
from neuroshard_jax.learn.trainer import TrainConfig


def shipped_checkpoint() -> str:
    from importlib import resources

    return str(resources.files("neuroshard_jax") / SHIPPED_CHECKPOINT)


def shard_metrics(checkpoint: str, dataset: str | None) -> dict:
    meta = read_meta(checkpoint)
    if meta.get("format") == ENSEMBLE_FORMAT:  # held-out metrics per dataset, computed at training time
        return {"datasets": meta["datasets"], "metrics": meta["metrics"]["compute"]}
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


def plan_metrics(sweep: str, checkpoint: str) -> dict:
    from neuroshard_jax.search.suite import MEASURED, RESULTS, SETTINGS, find_runs, suite_task

    rows = []
    for run in find_runs(sweep):
        settings = json.loads((run / SETTINGS).read_text())
        measured = {r["id"]: r["measured_ms"] for r in JsonlLog(run / MEASURED).records()}
        for record in JsonlLog(run / RESULTS).records():
            if record["id"] not in measured:
                continue
            task = suite_task(settings["task"], record["devices"], record["task_seed"])
            plan = Plan.from_json({"task": task.to_json(), "shards": record["shards"]})
            row = {"task": record["id"], "measured": measured[record["id"]]}
            for name, options in (("neural", {"checkpoint": checkpoint}), ("analytic", None)):
                model = make_cost_model(name, task, options).expected  # no risk term: expectations
                row[name] = float(plan_cost_ms(score_plan(model, plan)))
            rows.append(row)
    if not rows:
        raise SystemExit(f"error: {sweep!r} holds no measured suite plans, expected a measured sweep directory")
    tasks = sorted({r["task"] for r in rows})
    measured = np.array([r["measured"] for r in rows])
    result = {"sweep": sweep, "plans": len(rows), "tasks": len(tasks)}
    for name in ("neural", "analytic"):
        pred = np.array([r[name] for r in rows])
        per_task = []
        for t in tasks:
            mine = [r for r in rows if r["task"] == t]
            if len(mine) >= 3:
                per_task.append(kendall_tau(np.array([r[name] for r in mine]), np.array([r["measured"] for r in mine])))
        result[name] = {
            "kendall_tau": kendall_tau(pred, measured),
            "spearman": spearman(pred, measured),
            "mape": float(np.mean(np.abs(pred - measured) / measured)),
            "mean_bias": float(np.mean((pred - measured) / measured)),
            "mean_task_kendall_tau": float(np.mean(per_task)),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="default: the checkpoint shipped in the package")
    parser.add_argument("--dataset", default=None, help="default: the dataset the checkpoint was trained on")
    parser.add_argument(
        "--sweep", default="outputs/bench/compare/default", help="a measured suite sweep ('': shards only)"
    )
    parser.add_argument("--out", default="outputs/bench/cost_model")
    args = parser.parse_args()
    checkpoint = os.path.abspath(args.checkpoint or shipped_checkpoint())
    name = args.checkpoint or f"neuroshard_jax/{SHIPPED_CHECKPOINT}"  # as given: no machine paths in the summary
    summary = {"checkpoint": name, "shards": shard_metrics(checkpoint, args.dataset)}
    print(json.dumps(summary["shards"], indent=1), flush=True)
    if args.sweep:
        summary["plans"] = plan_metrics(args.sweep, checkpoint)
        print(json.dumps(summary["plans"], indent=1))
    write_json(summary, Path(args.out) / "summary.json")


if __name__ == "__main__":
    main()
