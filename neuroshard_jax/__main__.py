"""``python -m neuroshard_jax searcher=<name> [task.num_tables=40 task.num_devices=8 seed=3 | task.path=FILE]``.

Searches a sharding plan, prints a per-device table and writes plan.json in the Hydra run directory.
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
    try:
        task = make_task(task_config(options["task"]), options["task"]["seed"], options["task"]["path"])
        result = shard_task(task, cfg.searcher.name, cfg.cost_model.name, cfg.seed, searcher_options, cost_options)
    except InfeasibleError as err:
        if not multirun:
            fail(err)
        # A sweep goes on: the infeasible run is recorded, to be counted, never dropped.
        from neuroshard_jax.search import write_json

        write_json({"searcher": cfg.searcher.name, "seed": cfg.seed, "infeasible": str(err)}, f"{out_dir}/plan.json")
        print(f"infeasible: {err}", file=sys.stderr)
        return
    except UserError as err:
        fail(err)
    path = write_json(result, f"{out_dir}/{cfg.output}")
    print(format_plan(result))
    print(f"plan written to {path}")


def run() -> None:
    """Console-script entry point (also ``python -m neuroshard_jax``)."""
    check_group_overrides(sys.argv[1:])
    main()


if __name__ == "__main__":
    run()
