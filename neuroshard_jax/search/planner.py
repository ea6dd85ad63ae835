"""One planner: calibrate -> row split -> search -> polish, the pipeline the main job, ``neuroshard_jax.plan`` and
the TorchRec adapter all run (TorchRec's ``EmbeddingShardingPlanner``, built once from its parts and asked to plan
many times, is the model).

    planner = Planner(make_searcher("beam"), CostModelSpec("analytic"), polish=PolishConfig(name="measured"))
    planner = Planner.named("beam", "neural")   # names turned into parts once: the model chosen for this machine
    planned = planner.run(task)        # Planned(plan, cost_model, choice): the cost model the plan was scored with
    plan = planner.plan(task)          # the plan alone

A ``Planner`` is a frozen value built from its parts (a ``Searcher``, a ``CostModelSpec``, the measured stages'
configs), each checked when it was made: an unknown searcher option or cost model is a ``UserError`` before any
work, and planning never changes it.
"""

from __future__ import annotations

import dataclasses

from neuroshard_jax.core.config import check_seed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.types import Plan, Task
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.costs.coverage import out_of_depth_warning
from neuroshard_jax.costs.registry import (
    CostModelSpec,
    ModelChoice,
    choose_cost_model,
    for_task_of_kind,
    model_choice,
)
from neuroshard_jax.measure.calibration import CalibrateConfig, calibrated
from neuroshard_jax.measure.polish import PolishConfig, polish_plan
from neuroshard_jax.search.pipeline import keep_compiled_kernels, search_plan
from neuroshard_jax.search.row_split import check_mode
from neuroshard_jax.workloads.tasks import check_feasible
from searchers import Searcher, make_searcher


@dataclasses.dataclass(frozen=True)
class Planned:
    """What one planning run returns: the plan (validated, its costs predicted, its calibration and polishing
    recorded) and the cost model that scored it (calibrated where calibration ran), for explaining or re-scoring."""

    plan: Plan
    cost_model: CostModel
    choice: ModelChoice  # which model planned, trained on what, and whether it matches this machine (``line()``)

    def depth_warning(self) -> str | None:
        """One line where the plan lies past what its model learned (``costs.coverage.out_of_depth_warning``)."""
        choice = self.choice
        return out_of_depth_warning(self.plan.task, self.plan, choice.name, choice.options, device=choice.device)


@dataclasses.dataclass(frozen=True)
class Planner:
    """A planning run's parts. ``searcher``: a ``Searcher`` (``make_searcher(name, options)``); ``cost_model``: a
    ``CostModelSpec`` (None: the model chosen for this machine's kind, ``costs.registry.choose_cost_model``);
    ``row_split``: which tables row blocks are tried for (fit | hot | off); ``calibrate``, ``polish``: the measured
    stages before and after the search (``name="off"`` skips them); ``seed``: the same seed gives the same plan;
    ``device``: the compute device the plan is for (cpu | cuda)."""

    searcher: Searcher = dataclasses.field(default_factory=lambda: make_searcher("beam"))
    cost_model: CostModelSpec | None = None
    seed: int = 0
    row_split: str = "fit"
    calibrate: CalibrateConfig = CalibrateConfig()
    polish: PolishConfig = PolishConfig()
    device: str = "cpu"

    def __post_init__(self):
        if self.device not in ("cpu", "cuda"):
            raise UserError(f"device: got {self.device!r}, expected cpu or cuda")
        object.__setattr__(self, "seed", check_seed(self.seed))
        if not isinstance(self.searcher, Searcher):
            raise UserError(
                f"planner.searcher: got {self.searcher!r:.60}, expected a Searcher (make_searcher(name, options), or "
                "Planner.named(searcher=name))"
            )
        if self.cost_model is None:
            object.__setattr__(self, "cost_model", choose_cost_model("neural", {}, self.device).spec)
        if not isinstance(self.cost_model, CostModelSpec):
            raise UserError(
                f"planner.cost_model: got {self.cost_model!r:.60}, expected a CostModelSpec (CostModelSpec(name, "
                "options), or Planner.named(cost_model=name))"
            )
        check_mode(self.row_split)

    @classmethod
    def named(
        cls,
        searcher: str = "beam",
        cost_model: str = "neural",
        *,
        searcher_options: dict | None = None,
        cost_model_options: dict | None = None,
        device: str = "cpu",
        **settings,
    ) -> Planner:
        """A planner from names, as configs and keyword arguments give them: a registered searcher with its
        options, and a cost model's name with its options (``neural`` without a checkpoint: the model chosen for
        this machine's kind); ``settings``: the other fields."""
        if device not in ("cpu", "cuda"):
            raise UserError(f"device: got {device!r}, expected cpu or cuda")
        algorithm = make_searcher(searcher, dict(searcher_options or {}))
        spec = choose_cost_model(cost_model, cost_model_options, device).spec
        return cls(algorithm, spec, device=device, **settings)

    def run(self, task: Task) -> Planned:
        """Plan ``task``: calibrate the cost model on its tables (if asked), build the model once, search (row
        splits tried first where they may pay), polish on the real kernels (if asked)."""
        check_feasible(task)  # an infeasible task is refused before any model is built or kernel measured
        keep_compiled_kernels()
        spec, record = for_task_of_kind(self.cost_model, self.device, task), None
        choice = model_choice(spec, self.device)
        if self.calibrate.name == "measured":
            spec, record = calibrated(task, spec, self.calibrate, self.seed)
        model = spec.for_task(task)
        plan = search_plan(task, self.searcher, spec, self.seed, self.row_split, model)
        if self.polish.name == "measured":
            plan = polish_plan(plan, model, self.polish, self.seed)
        if record is not None:
            plan = dataclasses.replace(plan, calibration=record)
        return Planned(plan, model, choice)

    def plan(self, task: Task) -> Plan:
        """``run(task).plan``."""
        return self.run(task).plan


def planner_or_keywords(
    planner: Planner | None,
    searcher: str = "beam",
    cost_model: str = "neural",
    *,
    searcher_options: dict | None = None,
    cost_model_options: dict | None = None,
    calibrate: bool | CalibrateConfig = False,
    polish: bool | PolishConfig = False,
    row_split: str = "fit",
    seed: int = 0,
    device: str = "cpu",
) -> Planner:
    """What ``nsj.plan`` and the TorchRec adapter plan with: ``planner`` where given (then a planning keyword set as
    well is refused in one line: which of the two plans would be ambiguous), else the planner the keywords build
    (``Planner.named``; ``calibrate`` and ``polish`` as ``True``/``False`` or their configs)."""
    if planner is None:
        return Planner.named(
            searcher,
            cost_model,
            searcher_options=searcher_options,
            cost_model_options=cost_model_options,
            seed=seed,
            row_split=row_split,
            calibrate=stage_config(CalibrateConfig, calibrate, "calibrate"),
            polish=stage_config(PolishConfig, polish, "polish"),
            device=device,
        )
    given = {
        "searcher": searcher != "beam",
        "cost_model": cost_model != "neural",
        "cost_model_options": bool(cost_model_options),
        "calibrate": calibrate is not False,
        "polish": polish is not False,
        "row_split": row_split != "fit",
        "seed": seed not in (0, planner.seed),
        **{name: True for name in searcher_options or {}},
    }
    clash = [name for name, set_ in given.items() if set_]
    if clash:
        raise UserError(
            f"planner: given with {clash[0]}=...; expected the planner alone (its parts say how to plan) or its "
            "settings as keywords"
        )
    return planner


def stage_config(cls, value, key: str):
    """A measured stage's config (``key``: calibrate | polish) from ``True``/``False`` or the config itself."""
    if isinstance(value, cls):
        return value
    if isinstance(value, bool):
        return cls(name="measured" if value else "off")
    raise UserError(f"{key}: got {value!r:.60}, expected True, False or a {cls.__name__}")
