"""Every config composes; the searcher registry and conf/searcher agree; YAML defaults match the code."""

import dataclasses

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from neuroshard_jax.core import constants as C
from neuroshard_jax.core.cli import group_options
from neuroshard_jax.costs.analytic import AnalyticConfig
from neuroshard_jax.costs.registry import make_cost_model
from neuroshard_jax.workloads.tasks import task_config
from searchers import make_searcher, searcher_names

from .conftest import make_table, make_task


def _compose(*overrides):
    with initialize_config_module(config_module="neuroshard_jax.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_registry_matches_config_files():
    assert group_options("searcher") == searcher_names()


@pytest.mark.parametrize("name", group_options("searcher"))
def test_every_searcher_config_builds_its_searcher(name):
    cfg = OmegaConf.to_container(_compose(f"searcher={name}"), resolve=True)
    assert cfg["searcher"]["name"] == name
    make_searcher(name, {k: v for k, v in cfg["searcher"].items() if k != "name"})


@pytest.mark.parametrize("name", group_options("task"))
def test_every_task_config_composes(name):
    cfg = OmegaConf.to_container(_compose(f"task={name}"), resolve=True)
    config = task_config(cfg["task"])
    assert config.num_devices >= 1 and cfg["task"]["seed"] == cfg["seed"]


@pytest.mark.parametrize("name", group_options("cost_model"))
def test_every_cost_model_config_builds(name, tiny_checkpoint):
    cfg = OmegaConf.to_container(_compose(f"cost_model={name}"), resolve=True)
    options = {k: v for k, v in cfg["cost_model"].items() if k != "name"}
    if name == "neural":
        options["checkpoint"] = str(tiny_checkpoint[1])  # the shipped one is covered by test_neural
    make_cost_model(name, make_task([make_table()], batch_size=256), options)


def test_analytic_yaml_equals_constants():
    cfg = OmegaConf.to_container(_compose("cost_model=analytic"))["cost_model"]
    # calibration: every cost model's option (models.split_calibration), not the roofline's
    assert {k: v for k, v in cfg.items() if k not in ("name", "calibration")} == dataclasses.asdict(AnalyticConfig())
    assert AnalyticConfig().mem_bw_gbps == C.ANALYTIC_MEM_BW_GBPS


def test_dreamshard_task_overlay():
    task = _compose("task=dreamshard").task
    assert task.split == "train" and task.precision == "fp32" and task.num_devices == 4
