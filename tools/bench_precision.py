"""A plan of tables of two data types, read against the kernels: the main job's task (50 pool tables) with every
other table fp16, planned by beam with a neural model that prices fp16 by its kind's factor
(``costs/precision.py``), and the same task all fp32; each plan's devices measured ``--rounds`` times on the real
worker. Prints and writes, per plan, the predicted and the measured compute per device, MAPE, bias and the rounds'
spread; for the mixed plan also the model's prices without the factor (its tables priced as fp32).

    python -m tools.bench_precision --model epyc-f25m17 --rounds 3 --out outputs/precision/mixed-plan.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from neuroshard_jax.core.hardware import hardware, hardware_kind
from neuroshard_jax.costs.choice import CostModelSpec
from neuroshard_jax.costs.scoring import score_plan
from neuroshard_jax.measure.evaluator import EvaluateConfig, measure_plans
from neuroshard_jax.search.sharding_planner import PlannerOptions
from neuroshard_jax.workloads.builders import TaskConfig, make_task


def errors(predicted: np.ndarray, measured: np.ndarray) -> dict:
    signed = (predicted - measured) / measured
    return {"mape": round(float(np.abs(signed).mean()), 4), "bias": round(float(signed.mean()), 4)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="epyc-f25m17")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    base = make_task(TaskConfig(), 0)
    halves = tuple(dataclasses.replace(t, precision="fp16") if i % 2 else t for i, t in enumerate(base.tables))
    out: dict = {"machine": hardware_kind(hardware()), "model": args.model, "rounds": args.rounds, "plans": {}}
    for name, task in (("fp32", base), ("mixed", dataclasses.replace(base, tables=halves))):
        plan = PlannerOptions("beam", cost_model=args.model).planner().run(task).plan
        predicted = np.asarray(plan.costs.compute_ms)
        rounds = [
            np.array([d["compute"] for d in measure_plans([plan], EvaluateConfig())[0]["devices"]])
            for _ in range(args.rounds)
        ]
        measured = np.median(rounds, axis=0)
        row = {
            "predicted": predicted.round(3).tolist(),
            "measured": measured.round(3).tolist(),
            **errors(predicted, measured),
            "spread": round(float(np.mean((np.max(rounds, 0) - np.min(rounds, 0)) / measured)), 4),
        }
        if name == "mixed":  # the same plan priced as if its tables were fp32 (no factor)
            model = CostModelSpec(args.model).for_task(base).expected
            as_fp32 = np.asarray(score_plan(model, dataclasses.replace(plan, task=base)).compute_ms)
            row["predicted_as_fp32"] = as_fp32.round(3).tolist()
            row["as_fp32"] = errors(as_fp32, measured)
        out["plans"][name] = row
        print(name, json.dumps(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
