"""``python -m neuroshard_jax searcher=<name> [task.num_tables=40 task.num_devices=8 seed=3 | task.path=FILE]``.

Searches a sharding plan, prints a per-device table (beyond 32 devices: the slowest few and a summary) and writes
plan.json in the Hydra run directory; a plan on far more devices than the cost model was trained on, or of tables
past its labels, says so.
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

from neuroshard_jax.core.cli import fail, one_line_errors, resumable, run_app
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.plan_file import format_plan
from neuroshard_jax.costs.choice import NO_CALIBRATION
from neuroshard_jax.costs.coverage import far_devices_warning
from neuroshard_jax.measure.breakdown import ExplainConfig, explain_file
from neuroshard_jax.search.job import MainConfig, main_config
from neuroshard_jax.search.suite import run_suite
from neuroshard_jax.workloads.builders import make_task

WITH_PATH = ("path", "optimizer", "mem_reserve")  # the task keys a task file's run takes from the command line


def check_beside_path(overrides: list[str], path: str | None) -> None:
    """UserError where ``task.*`` overrides a task file's run would ignore (``task.mem_cap_gb=2`` beside
    ``task.path``: the file's caps were planned, silently)."""
    if not path:
        return
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    ignored = [k for k in keys if k.startswith("task.") and k.split(".")[1] not in WITH_PATH]
    if ignored:
        raise UserError(
            f"{ignored[0]}: given beside task.path, whose file's task is planned as it is; expected one of them (the "
            "file's values are changed in the file; task.optimizer and task.mem_reserve apply to it)"
        )


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="config")
@one_line_errors
def main(cfg: DictConfig) -> None:
    out_dir = HydraConfig.get().runtime.output_dir
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    config = main_config(cfg)
    check_beside_path(list(HydraConfig.get().overrides.task), config.task.path)
    if config.suite is not None:
        run_suite_job(config, out_dir, multirun)
        return
    task = None
    try:
        task = make_task(config.task, config.task.seed, config.task.path)
        options = config.planner
        if options.autotune.name != "off" and options.autotune.readings is None:  # kept in the run folder: resumable
            readings = str(Path(out_dir) / "autotune-readings.jsonl")
            options = dataclasses.replace(options, autotune=dataclasses.replace(options.autotune, readings=readings))
            resumable(
                f"autotune's readings are kept in {out_dir}: the same command with hydra.run.dir={out_dir} resumes"
            )
        elif options.autotune.name != "off":
            resumable(f"autotune's readings are kept in {options.autotune.readings}: the same command resumes")
        planned = options.planner().run(task)
        choice = planned.choice
        if choice.instead:
            print(f"warning: {choice.instead}", file=sys.stderr)
        print(choice.line(), file=sys.stderr)
        far = far_devices_warning(task.num_devices, choice.name, choice.options)
        depth = planned.depth_warning()
        for warning in (w for w in (far, depth) if w):
            print(f"warning: {warning}", file=sys.stderr)
        result = planned.plan.to_json()
    except InfeasibleError as err:
        if not multirun:
            fail(err)
        # A sweep goes on: the infeasible run is recorded, to be counted, never dropped.
        record = {"searcher": config.planner.searcher, "seed": config.planner.seed, "infeasible": str(err)}
        keep_result({**record, "task": task.to_json() if task else None}, Path(out_dir) / "plan.json")
        print(f"infeasible: {err}", file=sys.stderr)
        return
    print(format_plan(result, config.output))
    written = keep_result(result, Path(out_dir) / config.output)
    print(f"plan written to {written}")
    if config.explain:
        print(explain_file(ExplainConfig(plan=str(written)), planned.cost_model))


def keep_result(result: dict, path: Path) -> Path:
    """Write ``result`` to ``path``; if that fails, to a file in the temporary folder, and fail in one line
    saying where it is (a finished search is never lost)."""
    try:
        return write_json(result, path)
    except UserError as err:  # write_json's one line: the path and the OS's reason (a full disk, no permission)
        spare = Path(tempfile.gettempdir()) / f"neuroshard-{path.stem}-{os.getpid()}{path.suffix}"
        try:
            write_json(result, spare)
        except UserError:
            fail(UserError(f"output: {err}; nor could it be kept in {spare}"))
        fail(UserError(f"output: {err}; the result is in {spare}"))


def job_overrides() -> list[str]:
    """This job's command-line overrides, less the suite, evaluator and Hydra settings (neuroshard_jax.compare
    names a run by its searcher plus the overrides that differ between the runs of a sweep)."""
    skip = ("searcher=", "experiment=", "suite.", "evaluate", "evaluator.", "executor", "hydra.", "hydra/")
    return [o for o in HydraConfig.get().overrides.task if not o.lstrip("+~").startswith(skip)]


def run_suite_job(config: MainConfig, out_dir: str, multirun: bool) -> None:
    task_options = {k: v for k, v in dataclasses.asdict(config.task).items() if k not in ("seed", "num_devices")}
    options = config.planner
    settings = {
        "overrides": job_overrides(),
        "searcher": options.searcher,
        "searcher_options": dict(options.searcher_options),
        "cost_model": options.cost_model,
        # the default calibration left out: suites started before it existed resume
        "cost_model_options": {
            k: v for k, v in options.cost_model_options.items() if not (k == "calibration" and v == NO_CALIBRATION)
        },
        "task": task_options,
    }
    try:
        sweep_dir = HydraConfig.get().sweep.dir if multirun else out_dir
        done = run_suite(out_dir, config.suite, settings, config.evaluator if config.evaluate else None, sweep_dir)
    except UserError as err:
        fail(err)
    name = " ".join([settings["searcher"], *settings["overrides"]])
    print(f"{name}: {done.tasks} tasks, {done.infeasible} infeasible, {done.measured} measured; results in {out_dir}")


def run() -> None:
    """Console-script entry point (also ``python -m neuroshard_jax``)."""
    run_app(main, "config", main_config)


if __name__ == "__main__":
    run()
