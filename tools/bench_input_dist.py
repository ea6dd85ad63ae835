"""The input distribution on searched plans: each device's forward comm as the evaluator measures it (TorchRec's
``KJTAllToAll`` per sharding type, then the pooled all-to-alls) against the model's price with and without its input
distribution fit.

    python -m tools.bench_input_dist outputs/bench/foreign-s21/plans.jsonl --searchers beam,torchrec \\
        --checkpoint epyc-f26m2 [--repeats 2]

For every plan of the chosen searchers in a foreign-benchmark ``plans.jsonl``: the model's per-device forward comm
with the fit (``model.input_dist``) and without it, and the evaluator's measurement (``measure_comm``, the devices'
straggler delays from the model's compute), the median of ``--repeats`` runs. Reports the mean absolute percentage
error over devices and its bias (mean of predicted / measured - 1), per device count. Run it with nothing else
running. Writes outputs/bench/input_dist/input_dist.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.costs.choice import make_cost_model
from neuroshard_jax.costs.scoring import score_plan
from neuroshard_jax.measure.evaluator import EvaluateConfig, measure_comm

OUT = Path(__file__).resolve().parents[1] / "outputs" / "bench" / "input_dist"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plans", help="a foreign benchmark's plans.jsonl")
    parser.add_argument("--searchers", default="beam,torchrec")
    parser.add_argument("--checkpoint", default="epyc-f26m2")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    wanted = args.searchers.split(",")
    rows = [json.loads(line) for line in Path(args.plans).read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("searcher") in wanted and "plan" in r]
    plans = [Plan.from_json(r["plan"]) for r in rows]
    if not plans:
        raise UserError(f"plans: no plan of {wanted} in {args.plans!r}")
    priced, unpriced = [], []
    for plan in plans:
        model = make_cost_model(args.checkpoint, plan.task)
        if model.input_dist is None:
            raise UserError(f"checkpoint {args.checkpoint!r} has no input distribution fit of its hardware kind")
        priced.append(score_plan(model, plan))
        unpriced.append(score_plan(dataclasses.replace(model, input_dist=None), plan))
    compute = [c.compute_ms.tolist() for c in priced]
    runs = [measure_comm(plans, compute, EvaluateConfig())[0] for _ in range(args.repeats)]
    out = {"hardware": hardware(), "checkpoint": args.checkpoint, "plans": [], "by_devices": {}}
    for i, row in enumerate(rows):
        measured = np.median([run[i] for run in runs], axis=0)
        out["plans"].append(
            {
                "task": row["task"],
                "searcher": row["searcher"],
                "measured_fwd_ms": np.round(measured, 3).tolist(),
                "priced_fwd_ms": np.round(priced[i].fwd_comm_ms, 3).tolist(),
                "unpriced_fwd_ms": np.round(unpriced[i].fwd_comm_ms, 3).tolist(),
            }
        )
    for n in sorted({p.task.num_devices for p in plans}):
        of_n = [p for p, plan in zip(out["plans"], plans) if plan.task.num_devices == n]
        measured = np.concatenate([p["measured_fwd_ms"] for p in of_n])
        figures = {}
        for key in ("priced", "unpriced"):
            ratio = np.concatenate([p[f"{key}_fwd_ms"] for p in of_n]) / measured
            figures[key] = {
                "mape": round(float(np.mean(np.abs(ratio - 1))), 3),
                "bias": round(float(np.mean(ratio - 1)), 3),
            }
        out["by_devices"][str(n)] = {"plans": len(of_n), "devices": int(measured.size), **figures}
        print(
            f"{n} devices, {len(of_n)} plans: forward comm per device, measured against the model's price "
            f"with the fit {figures['priced']}, without {figures['unpriced']}",
            flush=True,
        )
    write_json(out, OUT / "input_dist.json")
    return out


if __name__ == "__main__":
    main()
