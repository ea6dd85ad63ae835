"""Measure a plan on the real kernels.

    python -m neuroshard_jax.evaluate plan=outputs/.../plan.json [device=cpu workers=1]
    python -m neuroshard_jax.evaluate sweep=multirun/compare/...   # every unmeasured plan of a suite sweep

Writes evaluation.json beside the plan: measured and predicted costs per device (neuroshard_jax/measure/evaluator.py
says how a plan is measured).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from neuroshard_jax.core.cli import one_line_errors, resolved, run_app
from neuroshard_jax.core.config import typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.measure.evaluator import EvaluateConfig, evaluate_file
from neuroshard_jax.search.suite import measure_sweep


def app_config(cfg: DictConfig) -> tuple[EvaluateConfig, str | None]:
    """The evaluator's settings and the sweep to measure (None: measure ``plan``)."""
    options = resolved(cfg)
    sweep = options.get("sweep")
    if sweep is not None and not isinstance(sweep, str):
        raise UserError(f"sweep: got {sweep!r}, expected the path of a suite sweep directory")
    config = typed(EvaluateConfig, options, ignore=("sweep",))
    if not sweep and not config.plan:
        raise UserError("plan: missing, expected plan=PATH of a plan.json (or sweep=DIR of a suite sweep)")
    return config, sweep


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="evaluate")
@one_line_errors
def main(cfg: DictConfig) -> None:
    config, sweep = app_config(cfg)
    if sweep:
        count = measure_sweep(sweep, config)
        print(f"{count} plans measured; measured.jsonl in each run of {sweep}", file=sys.stderr)
        return
    result = evaluate_file(config.plan, config)
    print(f"{'device':>6} {'compute':>9} {'fwd_comm':>9} {'bwd_comm':>9} {'total':>9} {'predicted':>9}")
    for d in result["devices"]:
        pred = d["predicted"]["total"] if d["predicted"] else float("nan")
        print(
            f"{d['device']:>6} {d['compute']:>9.3f} {d['fwd_comm']:>9.3f} {d['bwd_comm']:>9.3f} "
            f"{d['total']:>9.3f} {pred:>9.3f}"
        )
    print(
        f"measured cost: {result['cost_ms']:.3f} ms (predicted {result['predicted_cost_ms']:.3f} ms by "
        f"{result['cost_model']}); written to {Path(result['plan']).with_name('evaluation.json')}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    run_app(main, "evaluate", app_config)
