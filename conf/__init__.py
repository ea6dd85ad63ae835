"""The Hydra configs of every command, shipped as ``neuroshard_jax.conf``.

The dataclasses are the one source of every default: the library (``nsj.plan``, ``Planner``, the TorchRec adapter,
tests) builds them without Hydra, and the commands compose the same values. Each dataclass is registered here as a
schema node: ``_schema`` in a group (``polish/_schema``: ``PolishConfig()``), ``_<option>`` where each option has
its own class (``searcher/_beam``), ``_schema_<command>`` for a command's own keys. A YAML file lists its schema in
``defaults`` and holds only what it chooses or changes: an option's ``name``, interpolations, a command's group
choices and Hydra settings. Importing this package (Hydra does, to read the YAML files) registers the nodes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hydra.core.config_store import ConfigStore

from neuroshard_jax.costs.choice import COST_MODELS, NO_CALIBRATION
from neuroshard_jax.kernels.executors import ExecutorConfig
from neuroshard_jax.kernels.torchrec_export import ExportConfig
from neuroshard_jax.learn.cost_labels import CollectConfig
from neuroshard_jax.learn.feedback_loop import LoopConfig
from neuroshard_jax.learn.fine_tune import AdaptConfig
from neuroshard_jax.learn.policy_training import TrainPolicyAppConfig
from neuroshard_jax.learn.train_job import TrainAppConfig
from neuroshard_jax.measure.autotune import AutotuneConfig
from neuroshard_jax.measure.breakdown import ExplainConfig
from neuroshard_jax.measure.calibration import CalibrateConfig
from neuroshard_jax.measure.evaluator import EvaluateConfig
from neuroshard_jax.measure.hardware_probe import ProbeConfig
from neuroshard_jax.measure.polish import PolishConfig
from neuroshard_jax.measure.searcher_comparison import CompareConfig
from neuroshard_jax.search.job import MainConfig
from neuroshard_jax.search.model_comparison import ModelComparisonConfig
from neuroshard_jax.search.sharding_planner import GROUPED, PlannerOptions
from neuroshard_jax.search.suite import SuiteConfig
from neuroshard_jax.workloads.builders import TaskGroupConfig
from neuroshard_jax.workloads.statistics import StatsConfig
from searchers import registered

# One class per group (every option of the group starts from its defaults).
GROUPS = {
    "autotune": AutotuneConfig,
    "calibrate": CalibrateConfig,
    "polish": PolishConfig,
    "executor": ExecutorConfig,
    "evaluator": EvaluateConfig,
    "task": TaskGroupConfig,
}
# A command's own keys; the keys its groups compose are left to them (a field of a group's class keeps only what
# the command's default changes, e.g. the main job's executor.workers).
COMMANDS = {
    "config": MainConfig,
    "collect": CollectConfig,
    "loop": LoopConfig,
    "train": TrainAppConfig,
    "train_policy": TrainPolicyAppConfig,
    "explain": ExplainConfig,
    "export": ExportConfig,
    "stats": StatsConfig,
    "compare": CompareConfig,
    "probe": ProbeConfig,
    "compare_models": ModelComparisonConfig,
    "adapt": AdaptConfig,
}
COMPOSED = {"config": ("searcher", "cost_model", *GROUPS), "collect": ("executor",), "loop": ("executor",)}
COMPOSED["train_policy"] = ("executor",)
COMPOSED["adapt"] = ("executor",)


def plain(value) -> Any:
    """A default as Hydra takes it: dataclasses as dicts, tuples as lists."""
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def defaults(cls) -> dict:
    """A dataclass's field defaults as Hydra takes them, read off its fields (a class may refuse to be built with
    its defaults alone, e.g. one that needs two cost models named)."""
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = plain(f.default_factory())
    return out


def changed(value, default) -> dict:
    """The fields of dataclass ``value`` that differ from ``default`` (of the same class), nested."""
    out = {}
    for f in dataclasses.fields(value):
        mine, theirs = getattr(value, f.name), getattr(default, f.name)
        if dataclasses.is_dataclass(mine) and dataclasses.is_dataclass(theirs):
            inner = changed(mine, theirs)
            if inner:
                out[f.name] = inner
        elif mine != theirs:
            out[f.name] = plain(mine)
    return out


def command_schema(name: str, cls) -> dict:
    composed = COMPOSED.get(name, ())
    node = {k: v for k, v in defaults(cls).items() if k not in composed}
    if "planner" in node:  # the planner's options are top-level keys (the searcher's and cost model's: groups)
        del node["planner"]
        grouped = set(composed) | set(GROUPED.values())
        node = {**{k: v for k, v in defaults(PlannerOptions).items() if k not in grouped}, **node}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in composed:
        value = fields[key].default if key in fields else None
        if dataclasses.is_dataclass(value):
            diff = changed(value, type(value)())
            if diff:
                node[key] = diff
    return node


def schemas() -> list[tuple[str | None, str, dict]]:
    """(group, name, node) of every schema."""
    out: list[tuple[str | None, str, dict]] = [(g, "_schema", defaults(cls)) for g, cls in GROUPS.items()]
    out += [("searcher", f"_{name}", defaults(cls)) for name, cls in registered().items()]
    out += [
        ("cost_model", f"_{name}", {**defaults(cls), "calibration": NO_CALIBRATION})
        for name, (_, cls) in COST_MODELS.items()
    ]
    out += [(None, f"_schema_{name}", command_schema(name, cls)) for name, cls in COMMANDS.items()]
    out.append((None, "_suite", defaults(SuiteConfig)))  # experiment=compare's suite
    return out


def register() -> None:
    store = ConfigStore.instance()
    for group, name, node in schemas():
        store.store(group=group, name=name, node=node)


register()
