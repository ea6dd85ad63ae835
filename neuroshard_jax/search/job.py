"""The main job's config (conf/config.yaml): one task or a suite of them, planned by the ``Planner``."""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig

from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.kernels.executors import ExecutorConfig
from neuroshard_jax.measure.calibration import CalibrateConfig
from neuroshard_jax.measure.plans import EvaluateConfig
from neuroshard_jax.measure.polish import PolishConfig
from neuroshard_jax.search.planner import Planner
from neuroshard_jax.search.row_split import check_mode
from neuroshard_jax.search.suite import SuiteConfig
from neuroshard_jax.workloads.tasks import TaskGroupConfig


@dataclasses.dataclass(frozen=True)
class MainConfig:
    """conf/config.yaml. ``searcher`` and ``cost_model`` hold ``name`` plus that option's own fields."""

    seed: int = 0  # drives the task draw (task.seed) and the searcher's randomness
    output: str = "plan.json"  # written in the Hydra run directory
    searcher: dict = dataclasses.field(default_factory=lambda: {"name": "beam"})
    task: TaskGroupConfig = TaskGroupConfig()
    cost_model: dict = dataclasses.field(default_factory=lambda: {"name": "neural"})
    evaluator: EvaluateConfig = EvaluateConfig()
    executor: ExecutorConfig = ExecutorConfig(workers=2)  # where the evaluator and polishing run kernels
    # a task suite instead of one task: -m experiment=compare (conf/experiment/compare.yaml)
    suite: SuiteConfig | None = None
    evaluate: bool = False  # suite runs: measure every plan on the real kernels (the evaluator, as below)
    polish: PolishConfig = PolishConfig()
    calibrate: CalibrateConfig = CalibrateConfig()
    explain: bool = False  # after the plan: where each device's time goes, the splits' gains, what binds (+ plan.png)
    row_split: str = "fit"  # tables larger than every device: row blocks tried beside column slices (row_split.py)

    def __post_init__(self):
        check_mode(self.row_split)
        if self.seed < 0:
            raise UserError(f"seed: got {self.seed}, expected an integer >= 0")
        if not self.output:
            raise UserError("output: got '', expected a file name")
        if self.evaluate and self.suite is None:
            raise UserError(
                "evaluate: true needs a suite (-m experiment=compare); measure one plan with "
                "python -m neuroshard_jax.evaluate plan=PATH"
            )
        if self.suite is not None and self.calibrate.name != "off":
            raise UserError(
                "calibrate: a suite's plans are measured as they come (evaluate=true); expected calibrate=off with "
                "a suite, or cost_model.calibration=F"
            )
        if self.suite is not None and self.task.path:
            raise UserError("task.path: a suite generates its tasks from seeds, expected task.path=null")

    def options(self, group: str) -> dict:
        """The options of the searcher or cost model (its group's fields less ``name``)."""
        return {k: v for k, v in getattr(self, group).items() if k != "name"}


def main_config(cfg: DictConfig) -> MainConfig:
    """The typed config of a run; the searcher and the cost model are built once to check their options."""
    options = resolved(cfg)
    seed = options.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed < 0:  # before task.seed (= seed) says it
        raise UserError(f"seed: got {seed}, expected an integer >= 0")
    config = typed(MainConfig, options)
    config = dataclasses.replace(
        config,
        evaluator=dataclasses.replace(config.evaluator, executor=config.executor),
        polish=dataclasses.replace(config.polish, executor=config.executor),
        calibrate=dataclasses.replace(config.calibrate, executor=config.executor),
    )
    planner_of(config)  # the searcher's and the cost model's options checked before any work
    return config


def planner_of(config: MainConfig) -> Planner:
    """The run's planner: its searcher and cost model made from their names once, its row splits, calibration and
    polishing."""
    return Planner.named(
        config.searcher["name"],
        config.cost_model["name"],
        searcher_options=config.options("searcher"),
        cost_model_options=config.options("cost_model"),
        seed=config.seed,
        row_split=config.row_split,
        calibrate=config.calibrate,
        polish=config.polish,
    )
