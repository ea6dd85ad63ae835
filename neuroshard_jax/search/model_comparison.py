"""Two cost models on the in-pool suite's tasks, measured side by side: is a new default a regression?

    python -m neuroshard_jax.compare_models models=[xeon-union,cpu-b4096] [devices=[8] tasks=10 repeats=3 \
        searcher=beam workers=2 out=outputs/compare_models.json]

Plans the suite's held-out tasks (conf/experiment/compare.yaml: seeds 20000.., the pool's test half, 10-59 tables)
with ``searcher`` under each model, then measures every plan with the evaluator (each device's compute on the
FBGEMM kernels, the all-to-all on gloo ranks, workers pinned as the labels were), ``repeats`` interleaved times
(repeat r of every plan before r + 1: drift hits every model alike). Per task the figure is each plan's median
measured step; the report gives, per model, the mean ratio of its step to the first model's, its wins, and the
measurements' own noise (one repeat against its plan's median), so a difference can be read against it. Run it
with nothing else running.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time

import numpy as np

from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import bounded, check_bounds, typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.costs.choice import CostModelSpec
from neuroshard_jax.kernels.executors import ExecutorConfig
from neuroshard_jax.measure.evaluator import EvaluateConfig, measured_steps
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.search.suite import SuiteConfig
from neuroshard_jax.workloads.builders import TaskConfig, generate_task
from neuroshard_jax.workloads.pool import load_pool
from searchers import make_searcher

logger = logging.getLogger(__name__)

FIRST_SEED = SuiteConfig().first_seed  # the suite's held-out tasks (experiment=compare)


@dataclasses.dataclass(frozen=True)
class ModelComparisonConfig:
    """conf/compare_models.yaml."""

    models: tuple[str, ...] = ()  # two cost models or more (shipped names or checkpoints); the first is the base
    devices: tuple[int, ...] = (8,)  # device counts of the tasks
    tasks: int = bounded(at_least=1, default=10)  # suite tasks per device count
    repeats: int = bounded(at_least=1, default=3)  # interleaved measurements of every plan
    searcher: str = "beam"
    workers: int = bounded(at_least=1, default=2)  # local kernel workers, pinned as the labels were
    out: str = "outputs/compare_models.json"

    def __post_init__(self):
        if len(self.models) < 2:
            raise UserError(f"models: got {list(self.models)}, expected two cost models or more")
        check_bounds(self)
        if not self.devices or min(self.devices) < 1:
            raise UserError(f"devices: got {list(self.devices)}, expected device counts >= 1")


def app_config(cfg) -> ModelComparisonConfig:
    return typed(ModelComparisonConfig, resolved(cfg))


def compare_models(config: ModelComparisonConfig) -> JSONDoc:
    """Plan the suite's held-out tasks under each model, measure every plan interleaved; the report."""
    models = list(config.models)
    searcher = make_searcher(config.searcher)
    specs = {model: CostModelSpec(model) for model in models}
    pool = load_pool(TaskConfig().pool, TaskConfig().batch_size)
    plans, index = [], []
    for n in config.devices:
        for seed in range(FIRST_SEED, FIRST_SEED + config.tasks):
            task = generate_task(pool, TaskConfig(num_tables=None, num_devices=n, split="test"), seed)
            for model in models:
                plans.append(search_plan(task, searcher, specs[model].for_task(task), 0))
                index.append((n, seed, model))
        logger.info("%s devices: %s tasks planned", n, config.tasks)
    evaluator = EvaluateConfig(executor=ExecutorConfig(workers=config.workers), pin=True)
    runs = measured_steps(plans, evaluator, config.repeats)
    step = {key: statistics.median(r) for key, r in zip(index, runs)}
    noise = [abs(x - statistics.median(r)) / statistics.median(r) for r in runs for x in r]
    summary = {}
    for n in sorted({k[0] for k in index}):
        seeds = sorted({k[1] for k in index if k[0] == n})
        base = models[0]
        summary[n] = {"tasks": len(seeds), "noise_one_repeat_vs_median": round(float(np.mean(noise)), 4)}
        for model in models:
            ratios = [step[(n, s, model)] / step[(n, s, base)] for s in seeds]
            best = sum(step[(n, s, model)] <= min(step[(n, s, m)] for m in models) for s in seeds)
            summary[n][model] = {
                f"step_vs_{base}": round(float(np.mean(ratios)), 4),
                "mean_step_ms": round(float(np.mean([step[(n, s, model)] for s in seeds])), 3),
                "best": int(best),
            }
    return {
        "what": f"{config.searcher} plans of the suite's held-out tasks under each model, measured interleaved",
        "machine": hardware(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": dataclasses.asdict(config),
        "summary": summary,
        "plans": [{"devices": n, "seed": s, "model": m, "runs_ms": r} for (n, s, m), r in zip(index, runs)],
    }
