"""``python -m neuroshard_jax searcher=<name> [task.num_tables=40 task.num_devices=8 seed=3 | task.path=FILE]``.

Searches a sharding plan, prints a per-device table and writes plan.json in the Hydra run directory.
With a ``suite`` (``-m experiment=compare``) a run searches a whole task suite instead
(neuroshard_jax/suite.py), measuring every plan when ``evaluate=true``.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from neuroshard_jax.cli import check_group_overrides, fail, task_config
from neuroshard_jax.errors import InfeasibleError, UserError


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from neuroshard_jax.plans import format_plan
    from neuroshard_jax.search import shard_task, write_json
    from neuroshard_jax.tasks import make_task

    out_dir = HydraConfig.get().runtime.output_dir
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    options = OmegaConf.to_container(cfg, resolve=True)
    searcher_options = {k: v for k, v in options["searcher"].items() if k != "name"}
    cost_options = {k: v for k, v in options["cost_model"].items() if k != "name"}
    if options.get("suite"):
        run_suite_job(options, searcher_options, cost_options, out_dir, multirun)
        return
    if options.get("evaluate"):
        fail(
            UserError(
                "evaluate: true needs a suite (-m experiment=compare); measure one plan with "
                "python -m neuroshard_jax.evaluate plan=PATH"
            )
        )
    task = None
    try:
        task = make_task(task_config(options["task"]), options["task"]["seed"], options["task"]["path"])
        result = shard_task(task, cfg.searcher.name, cfg.cost_model.name, cfg.seed, searcher_options, cost_options)
    except InfeasibleError as err:
        if not multirun:
            fail(err)
        # A sweep goes on: the infeasible run is recorded, to be counted, never dropped.
        record = {"searcher": cfg.searcher.name, "seed": cfg.seed, "infeasible": str(err)}
        write_json({**record, "task": task.to_json() if task else None}, f"{out_dir}/plan.json")
        print(f"infeasible: {err}", file=sys.stderr)
        return
    except UserError as err:
        fail(err)
    path = write_json(result, f"{out_dir}/{cfg.output}")
    print(format_plan(result))
    print(f"plan written to {path}")


def job_overrides() -> list[str]:
    """This job's command-line overrides, less the suite, evaluator and Hydra settings (tools/compare.py
    names a run by its searcher plus the overrides that differ between the runs of a sweep)."""
    skip = ("searcher=", "experiment=", "suite.", "evaluate", "evaluator.", "hydra.", "hydra/")
    return [o for o in HydraConfig.get().overrides.task if not o.lstrip("+~").startswith(skip)]


def run_suite_job(options: dict, searcher_options: dict, cost_options: dict, out_dir: str, multirun: bool) -> None:
    from neuroshard_jax.evaluate import EvaluateConfig
    from neuroshard_jax.suite import SuiteConfig, run_suite

    settings = {
        "overrides": job_overrides(),
        "searcher": options["searcher"]["name"],
        "searcher_options": searcher_options,
        "cost_model": options["cost_model"]["name"],
        "cost_model_options": cost_options,
        "task": {k: v for k, v in options["task"].items() if k not in ("seed", "num_devices")},
    }
    try:
        if options["task"].get("path"):
            raise UserError("task.path: a suite generates its tasks from seeds, expected task.path=null")
        suite = SuiteConfig(**options["suite"])
        evaluate = EvaluateConfig(**options["evaluator"]) if options.get("evaluate") else None
        sweep_dir = HydraConfig.get().sweep.dir if multirun else out_dir
        done = run_suite(out_dir, suite, settings, evaluate, sweep_dir)
    except TypeError as err:
        fail(UserError(f"suite/evaluator config: {err}"))
    except UserError as err:
        fail(err)
    name = " ".join([settings["searcher"], *settings["overrides"]])
    print(
        f"{name}: {done['tasks']} tasks, {done['infeasible']} infeasible, {done['measured']} measured; "
        f"results in {out_dir}"
    )


def run() -> None:
    """Console-script entry point (also ``python -m neuroshard_jax``)."""
    check_group_overrides(sys.argv[1:])
    main()


if __name__ == "__main__":
    run()
