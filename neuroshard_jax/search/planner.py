"""One planner: calibrate -> row split -> search -> polish, the pipeline the main job, ``neuroshard_jax.plan`` and
the TorchRec adapter all run (TorchRec's ``EmbeddingShardingPlanner``, built once from its parts and asked to plan
many times, is the model).

    planner = Planner(searcher="beam", polish=PolishConfig(name="measured"))
    planned = planner.run(task)        # Planned(plan, cost_model): the cost model the plan was scored with
    plan = planner.plan(task)          # the plan alone

A ``Planner`` is a frozen value: its settings are checked when it is made (an unknown searcher option or cost model
is a ``UserError`` before any work), and planning never changes it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.types import Plan, Task
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.costs.registry import ModelChoice, choose_cost_model, cost_model_config, make_cost_model
from neuroshard_jax.measure.calibration import CalibrateConfig, calibrated
from neuroshard_jax.measure.polish import PolishConfig, polish_plan
from neuroshard_jax.search.pipeline import enable_compilation_cache, search_plan
from neuroshard_jax.search.row_split import check_mode
from neuroshard_jax.workloads.tasks import check_feasible
from searchers import make_searcher


@dataclasses.dataclass(frozen=True)
class Planned:
    """What one planning run returns: the plan (validated, its costs predicted, its calibration and polishing
    recorded) and the cost model that scored it (calibrated where calibration ran), for explaining or re-scoring."""

    plan: Plan
    cost_model: CostModel
    choice: ModelChoice  # which model planned, trained on what, and whether it matches this machine (``line()``)


@dataclasses.dataclass(frozen=True)
class Planner:
    """The settings of a planning run. ``searcher``/``searcher_options``: a registered searcher and its options
    (conf/searcher/); ``cost_model``/``cost_model_options``: a model's name and options (conf/cost_model/);
    ``row_split``: which tables row blocks are tried for (fit | hot | off); ``calibrate``, ``polish``: the measured
    stages before and after the search (``name="off"`` skips them); ``seed``: the same seed gives the same plan;
    ``device``: the compute device the plan is for (cpu | cuda): ``neural`` is the shipped model of this machine's
    kind of hardware where there is one (``costs.registry.choose_cost_model``)."""

    searcher: str = "beam"
    cost_model: str = "neural"
    seed: int = 0
    searcher_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    cost_model_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    row_split: str = "fit"
    calibrate: CalibrateConfig = CalibrateConfig()
    polish: PolishConfig = PolishConfig()
    device: str = "cpu"

    def __post_init__(self):
        if self.device not in ("cpu", "cuda"):
            raise UserError(f"device: got {self.device!r}, expected cpu or cuda")
        check_mode(self.row_split)
        make_searcher(self.searcher, dict(self.searcher_options))
        cost_model_config(self.cost_model, dict(self.cost_model_options))

    def run(self, task: Task) -> Planned:
        """Plan ``task``: calibrate the cost model on its tables (if asked), build the model once, search (row
        splits tried first where they may pay), polish on the real kernels (if asked)."""
        check_feasible(task)  # an infeasible task is refused before any model is built or kernel measured
        enable_compilation_cache()
        choice = choose_cost_model(self.cost_model, self.cost_model_options, self.device)
        name, options, record = choice.name, dict(choice.options), None
        if self.calibrate.name == "measured":
            options, record = calibrated(task, name, options, self.calibrate, self.seed)
        model = make_cost_model(name, task, options)
        plan = search_plan(
            task, self.searcher, name, self.seed, dict(self.searcher_options), options, self.row_split, model
        )
        if self.polish.name == "measured":
            plan = polish_plan(plan, model, self.polish, self.seed)
        if record is not None:
            plan = dataclasses.replace(plan, calibration=record)
        return Planned(plan, model, choice)

    def plan(self, task: Task) -> Plan:
        """``run(task).plan``."""
        return self.run(task).plan


def stage_config(cls, value, key: str):
    """A measured stage's config (``key``: calibrate | polish) from ``True``/``False`` or the config itself."""
    if isinstance(value, cls):
        return value
    if isinstance(value, bool):
        return cls(name="measured" if value else "off")
    raise UserError(f"{key}: got {value!r:.60}, expected True, False or a {cls.__name__}")
