"""The main job's config (conf/config.yaml): one task or a suite of them, planned by the ``Planner``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import DictConfig

from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.kernels.executors import ExecutorConfig
from neuroshard_jax.measure.evaluator import EvaluateConfig
from neuroshard_jax.search.sharding_planner import PlannerOptions, option_names, planner_options
from neuroshard_jax.search.suite import SuiteConfig
from neuroshard_jax.workloads.builders import TaskGroupConfig


@dataclasses.dataclass(frozen=True)
class MainConfig:
    """conf/config.yaml: the planner's options (``PlannerOptions``; its fields are the command line's top-level keys:
    ``seed=3 row_split=hot``, with the ``searcher`` and ``cost_model`` config groups holding a name and its options)
    and the job's own keys."""

    planner: PlannerOptions = PlannerOptions()
    output: str = "plan.json"  # written in the Hydra run directory
    task: TaskGroupConfig = TaskGroupConfig()
    evaluator: EvaluateConfig = EvaluateConfig()
    executor: ExecutorConfig = ExecutorConfig(workers=2)  # where the evaluator and polishing run kernels
    # a task suite instead of one task: -m experiment=compare (conf/experiment/compare.yaml)
    suite: SuiteConfig | None = None
    evaluate: bool = False  # suite runs: measure every plan on the real kernels (the evaluator, as below)
    explain: bool = False  # after the plan: where each device's time goes, the splits' gains, what binds (+ plan.png)

    def __post_init__(self):
        if not self.output or Path(self.output).name != self.output or self.output in (".", ".."):
            raise UserError(
                f"output: got {self.output!r}, expected a file name (written in the run folder; hydra.run.dir=... "
                "chooses the folder)"
            )
        if self.evaluate and self.suite is None:
            raise UserError(
                "evaluate: true needs a suite (-m experiment=compare); measure one plan with "
                "python -m neuroshard_jax.evaluate plan=PATH"
            )
        if self.suite is not None and self.planner.autotune.name != "off":
            raise UserError(
                "autotune: a suite's plans are measured as they come (evaluate=true); expected autotune=off with a "
                "suite"
            )
        if self.suite is not None and self.planner.calibrate.name != "off":
            raise UserError(
                "calibrate: a suite's plans are measured as they come (evaluate=true); expected calibrate=off with "
                "a suite, or cost_model.calibration=F"
            )
        if self.suite is not None and (self.planner.device != "cpu" or self.planner.fallback):
            raise UserError(
                "device, fallback: a suite plans on CPU with the named model, expected device=cpu fallback=false "
                "with a suite"
            )
        if self.suite is not None and self.task.path:
            raise UserError("task.path: a suite generates its tasks from seeds, expected task.path=null")


def main_config(cfg: DictConfig) -> MainConfig:
    """The typed config of a run: the planner's options taken off the top level (``planner_options``), the rest the
    job's; the searcher and the cost model are built once to check their options."""
    options = resolved(cfg)
    seed = options.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed < 0:  # before task.seed (= seed) says it
        raise UserError(f"seed: got {seed}, expected an integer >= 0")
    planner = planner_options({k: options.pop(k) for k in option_names() if k in options})
    config = typed(MainConfig, options)
    executor = config.executor
    planner = dataclasses.replace(
        planner,
        polish=dataclasses.replace(planner.polish, executor=executor),
        calibrate=dataclasses.replace(planner.calibrate, executor=executor),
        autotune=dataclasses.replace(planner.autotune, executor=executor),
    )
    config = dataclasses.replace(
        config, planner=planner, evaluator=dataclasses.replace(config.evaluator, executor=executor)
    )
    planner.planner()  # the searcher's and the cost model's options checked before any work
    return config
