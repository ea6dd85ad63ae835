"""``python -m neuroshard_jax searcher=<name> [task.num_tables=40 task.num_devices=8 seed=3 | task.path=FILE]``.

Searches a sharding plan, prints a per-device table and writes plan.json in the Hydra run directory.
With a ``suite`` (``-m experiment=compare``) a run searches a whole task suite instead
(neuroshard_jax/search/suite.py), measuring every plan when ``evaluate=true``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from neuroshard_jax.core.cli import fail, resolved, run_app
from neuroshard_jax.core.config import typed
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.plan_file import format_plan
from neuroshard_jax.kernels.executors import ExecutorConfig
from neuroshard_jax.measure.calibration import CalibrateConfig
from neuroshard_jax.measure.explain import ExplainConfig, explain_file
from neuroshard_jax.measure.plans import EvaluateConfig
from neuroshard_jax.measure.polish import PolishConfig
from neuroshard_jax.search.planner import Planner
from neuroshard_jax.search.row_split import check_mode
from neuroshard_jax.search.suite import SuiteConfig, run_suite
from neuroshard_jax.workloads.tasks import TaskGroupConfig, make_task


@dataclasses.dataclass(frozen=True)
class MainConfig:
    """conf/config.yaml. ``searcher`` and ``cost_model`` hold ``name`` plus that option's own fields."""

    seed: int = 0
    output: str = "plan.json"
    searcher: dict = dataclasses.field(default_factory=lambda: {"name": "beam"})
    task: TaskGroupConfig = TaskGroupConfig()
    cost_model: dict = dataclasses.field(default_factory=lambda: {"name": "neural"})
    evaluator: EvaluateConfig = EvaluateConfig()
    executor: ExecutorConfig = ExecutorConfig(workers=2)  # where the evaluator and polishing run kernels
    suite: SuiteConfig | None = None
    evaluate: bool = False
    polish: PolishConfig = PolishConfig()
    calibrate: CalibrateConfig = CalibrateConfig()
    explain: bool = False
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
    """The run's planner: its searcher, cost model, row splits, calibration and polishing."""
    return Planner(
        searcher=config.searcher["name"],
        cost_model=config.cost_model["name"],
        seed=config.seed,
        searcher_options=config.options("searcher"),
        cost_model_options=config.options("cost_model"),
        row_split=config.row_split,
        calibrate=config.calibrate,
        polish=config.polish,
    )


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="config")
def main(cfg: DictConfig) -> None:
    out_dir = HydraConfig.get().runtime.output_dir
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        config = main_config(cfg)
    except UserError as err:
        fail(err)
    if config.suite is not None:
        run_suite_job(config, out_dir, multirun)
        return
    task = None
    try:
        task = make_task(config.task, config.task.seed, config.task.path)
        planned = planner_of(config).run(task)
        result = planned.plan.to_json()
    except InfeasibleError as err:
        if not multirun:
            fail(err)
        # A sweep goes on: the infeasible run is recorded, to be counted, never dropped.
        record = {"searcher": config.searcher["name"], "seed": config.seed, "infeasible": str(err)}
        write_json({**record, "task": task.to_json() if task else None}, f"{out_dir}/plan.json")
        print(f"infeasible: {err}", file=sys.stderr)
        return
    except UserError as err:
        fail(err)
    print(format_plan(result))
    written = keep_result(result, Path(out_dir) / config.output)
    print(f"plan written to {written}")
    if config.explain:
        try:
            print(explain_file(ExplainConfig(plan=str(written)), planned.cost_model))
        except UserError as err:
            fail(err)


def keep_result(result: dict, path: Path) -> Path:
    """Write ``result`` to ``path``; if that fails, to a file in the temporary folder, and fail in one line
    saying where it is (a finished search is never lost)."""
    try:
        return write_json(result, path)
    except OSError as err:
        spare = Path(tempfile.gettempdir()) / f"neuroshard-{path.stem}-{os.getpid()}{path.suffix}"
        write_json(result, spare)
        fail(UserError(f"output: could not write {str(path)!r} ({err.strerror or err}); the result is in {spare}"))


def job_overrides() -> list[str]:
    """This job's command-line overrides, less the suite, evaluator and Hydra settings (tools/compare.py
    names a run by its searcher plus the overrides that differ between the runs of a sweep)."""
    skip = ("searcher=", "experiment=", "suite.", "evaluate", "evaluator.", "executor", "hydra.", "hydra/")
    return [o for o in HydraConfig.get().overrides.task if not o.lstrip("+~").startswith(skip)]


def run_suite_job(config: MainConfig, out_dir: str, multirun: bool) -> None:
    task_options = {k: v for k, v in dataclasses.asdict(config.task).items() if k not in ("seed", "num_devices")}
    settings = {
        "overrides": job_overrides(),
        "searcher": config.searcher["name"],
        "searcher_options": config.options("searcher"),
        "cost_model": config.cost_model["name"],
        # the default calibration left out: suites started before it existed resume
        "cost_model_options": {
            k: v for k, v in config.options("cost_model").items() if not (k == "calibration" and v == 1.0)
        },
        "task": task_options,
    }
    try:
        sweep_dir = HydraConfig.get().sweep.dir if multirun else out_dir
        done = run_suite(out_dir, config.suite, settings, config.evaluator if config.evaluate else None, sweep_dir)
    except UserError as err:
        fail(err)
    name = " ".join([settings["searcher"], *settings["overrides"]])
    print(
        f"{name}: {done['tasks']} tasks, {done['infeasible']} infeasible, {done['measured']} measured; "
        f"results in {out_dir}"
    )


def run() -> None:
    """Console-script entry point (also ``python -m neuroshard_jax``)."""
    run_app(main, "config", main_config)


if __name__ == "__main__":
    run()
