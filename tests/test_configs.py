"""Every config composes; the searcher registry and conf/searcher agree; YAML defaults match the code."""

import dataclasses
import importlib
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from neuroshard_jax.core import constants as C
from neuroshard_jax.core.cli import group_options
from neuroshard_jax.costs.analytic import AnalyticConfig
from neuroshard_jax.costs.choice import make_cost_model
from neuroshard_jax.workloads.builders import task_config
from searchers import make_searcher, searcher_names

from .conftest import REPO, make_table, make_task

CONF = REPO / "conf"
conf = importlib.import_module("neuroshard_jax.conf")


def _compose(*overrides):
    with initialize_config_module(config_module="neuroshard_jax.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_registry_matches_config_files():
    assert group_options("searcher") == searcher_names()


@pytest.mark.fast
@pytest.mark.parametrize("name", group_options("searcher"))
def test_every_searcher_config_builds_its_searcher(name):
    cfg = OmegaConf.to_container(_compose(f"searcher={name}"), resolve=True)
    assert cfg["searcher"]["name"] == name
    make_searcher(name, {k: v for k, v in cfg["searcher"].items() if k != "name"})


@pytest.mark.fast
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


@pytest.mark.fast
def test_analytic_defaults_are_the_constants():
    cfg = OmegaConf.to_container(_compose("cost_model=analytic"))["cost_model"]
    # calibration: every cost model's option (registry.split_calibration), not the roofline's
    assert {k: v for k, v in cfg.items() if k not in ("name", "calibration")} == dataclasses.asdict(AnalyticConfig())
    assert AnalyticConfig().mem_bw_gbps == C.ANALYTIC_MEM_BW_GBPS


def _values(node, prefix=()):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _values(value, (*prefix, key))
        else:
            yield (*prefix, key), value


@pytest.mark.parametrize("path", sorted(str(p.relative_to(CONF)) for p in CONF.rglob("*.yaml")))
def test_no_yaml_file_repeats_a_default(path):
    """Defaults live in the dataclasses (conf/__init__.py registers them): a YAML file sets only what differs."""
    parts = Path(path).with_suffix("").parts
    if parts[0] in ("hydra", "experiment"):
        return
    schemas = {(group, name): node for group, name, node in conf.schemas()}
    if len(parts) == 2:
        node = schemas.get((parts[0], "_schema")) or schemas.get((parts[0], f"_{parts[1]}"))
    else:
        node = schemas.get((None, f"_schema_{parts[0]}")) or schemas[("evaluator", "_schema")]
    text = yaml.safe_load((CONF / path).read_text()) or {}
    own = {k: v for k, v in text.items() if k not in ("defaults", "hydra") and not (len(parts) == 2 and k == "name")}
    for key, value in _values(own):
        default = node
        for k in key:
            default = default.get(k, {}) if isinstance(default, dict) else {}
        assert default != value, f"{path}: {'.'.join(key)}: {value!r} repeats its dataclass default"


@pytest.mark.fast
def test_every_key_of_a_dataclass_can_be_set_on_the_command_line():
    """The schemas make every field a key of the composed config, so ``polish.anchors=1`` needs no ``+``."""
    cfg = _compose("polish=measured", "polish.anchors=1", "searcher=beam", "searcher.k=5", "executor=ray")
    assert cfg.polish.anchors == 1 and cfg.searcher.k == 5
    cfg = _compose("executor=ray", "executor.max_retries=1", "autotune=kernels", "autotune.rounds=3")
    assert cfg.executor.max_retries == 1 and cfg.autotune.rounds == 3 and list(cfg.searcher.searchers)[0] == "beam"
    assert cfg.executor.workers == 2 and cfg.polish.budget_s == 600.0  # ray's own, and PolishConfig's
    suite = _compose("experiment=compare", "suite.tasks=3").suite
    assert suite.tasks == 3 and list(suite.devices) == [4, 8]


@pytest.mark.fast
def test_dreamshard_task_overlay():
    task = _compose("task=dreamshard").task
    assert task.split == "train" and task.precision == "fp32" and task.num_devices == 4
