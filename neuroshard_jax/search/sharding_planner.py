"""One planner: a sequence of stages (``search.stages``: first contact, calibrate, search, autotune, polish, the
plan's check), built once in ``Planner.stages``, the pipeline the main job, ``neuroshard_jax.plan`` and the TorchRec
adapter all run (TorchRec's ``EmbeddingShardingPlanner``, built once from its
parts and asked to plan many times, is the model).

    planner = Planner(make_searcher("beam"), CostModelSpec("analytic"), polish=PolishConfig(name="measured"))
    planner = PlannerOptions(searcher="beam", seed=3).planner()   # names turned into parts once
    planner = planner_from({"searcher": "beam", "k": 5})           # keywords as nsj.plan takes them
    planned = planner.run(task)        # Planned(plan, cost_model, choice): the cost model the plan was scored with
    plan = planner.plan(task)          # the plan alone

Every option of a planning run is a field of ``PlannerOptions``, and ``planner_from`` is the one way keywords
become a planner: the main job's command line (``seed=3 row_split=hot``), ``nsj.plan`` and the TorchRec adapter
all go through it, so an option added there is an option of all three. A ``Planner`` is a frozen value built from
its parts (a ``Searcher``, a ``CostModelSpec``, the measured stages' configs), each checked when it was made; its
cost model is built once per ``run``, at the edge, and handed to every stage as an object.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from neuroshard_jax.core.config import check_seed, nearest, typed
from neuroshard_jax.core.environment import check_jax_environment
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import check_row_split
from neuroshard_jax.core.task import Task, check_feasible, on_device
from neuroshard_jax.core.tiers import TIER_RETRIES, cached_tables, check_tiering, describe, tier_price, tiered
from neuroshard_jax.costs.choice import CostModelSpec, ModelChoice, build_cost_model, spec_of
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.costs.coverage import out_of_depth_warning
from neuroshard_jax.measure.autotune import AutotuneConfig
from neuroshard_jax.measure.calibration import CalibrateConfig
from neuroshard_jax.measure.polish import PolishConfig
from neuroshard_jax.search.pipeline import keep_compiled_kernels
from neuroshard_jax.search.stages import (
    Autotune,
    CalibratePlan,
    CalibrateTables,
    CheckOnPlan,
    FirstContact,
    PlanningState,
    Polish,
    SearchStage,
    Stage,
    run_stages,
)
from searchers import Searcher, make_searcher, searcher_names, searcher_options

logger = logging.getLogger(__name__)

DEVICES = ("cpu", "cuda")
# beam, grid and beam with row_split=hot, the cheapest by the model (searchers/portfolio.py): no single searcher wins
# every task
DEFAULT_SEARCHER = "portfolio"


@dataclasses.dataclass(frozen=True)
class Planned:
    """What one planning run returns: the plan (validated, its costs predicted, its calibration and polishing
    recorded) and the cost model that scored it (calibrated where calibration ran), for explaining or re-scoring."""

    plan: Plan
    cost_model: CostModel
    choice: ModelChoice  # which model planned, trained on what, and whether it matches this machine (``line()``)
    # a portfolio's members' own plans (member name -> plan, its costs predicted), the chosen one among them
    candidates: dict[str, Plan] = dataclasses.field(default_factory=dict)

    def depth_warning(self) -> str | None:
        """One line where the plan lies past what its model learned (``costs.coverage.out_of_depth_warning``)."""
        choice = self.choice
        return out_of_depth_warning(self.plan.task, self.plan, choice.name, choice.options, device=choice.device)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """The settings of a planning run that are not its parts, declared once for ``PlannerOptions`` (what the entry
    points take) and ``Planner`` (what runs): ``seed``: the same seed gives the same plan; ``row_split``: which tables
    row blocks are tried for (fit | hot | off); ``calibrate``, ``autotune``, ``polish``: the measured stages before the
    search, after it (the candidates measured, the fastest kept) and last (``name="off"`` skips them; ``True``,
    ``False`` or a mode's name such as ``"kernels"`` are taken too; an ``autotune`` left on its default device measures
    on the plan's); ``device``: the compute device the plan is for (cpu | cuda); ``fallback``: a cost model not trained
    at the task's batch size or precision gives way to one that is (or the roofline), with a warning, instead of
    refusing; ``first_contact``: on a machine kind no model was trained on, the model chosen for it is scaled to this
    machine from a few spec kernels measured once and kept (``measure.first_contact``); ``tiering``: where a GPU
    task's tables do not fit its devices' memory, move tables to tiered memory (host rows, a cache of them on the
    GPU: ``core.tiers``; auto) or refuse the task (off). Keyword-only, so that a subclass's parts come first."""

    seed: int = 0
    row_split: str = "fit"
    calibrate: CalibrateConfig = CalibrateConfig()
    polish: PolishConfig = PolishConfig()
    autotune: AutotuneConfig = AutotuneConfig()
    device: str = "cpu"
    fallback: bool = False
    first_contact: bool = True
    tiering: str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "seed", check_seed(self.seed))
        for stage, cls in STAGES.items():
            object.__setattr__(self, stage, stage_config(cls, getattr(self, stage), stage))
        check_row_split(self.row_split)
        check_device(self.device)
        check_tiering(self.tiering)
        if self.autotune.device == AutotuneConfig.device:  # left as it is: the plan's device (another is refused)
            object.__setattr__(self, "autotune", dataclasses.replace(self.autotune, device=self.device))

    def with_parts(self, searcher: Searcher, cost_model: CostModelSpec | None) -> Planner:
        """A ``Planner`` of these settings (the ``Settings`` fields alone) and the given parts."""
        return Planner(
            searcher=searcher,
            cost_model=cost_model,
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(Settings)},
        )


@dataclasses.dataclass(frozen=True)
class Planner(Settings):
    """A planning run's parts and its ``Settings``. ``searcher``: a ``Searcher`` (``make_searcher(name, options)``);
    ``cost_model``: a ``CostModelSpec`` (None: the model chosen for this machine's kind when a task comes,
    ``build_cost_model``)."""

    searcher: Searcher = dataclasses.field(default_factory=lambda: make_searcher(DEFAULT_SEARCHER))
    cost_model: CostModelSpec | None = None

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.searcher, Searcher):
            raise UserError(
                f"planner.searcher: got {self.searcher!r:.60}, expected a Searcher (make_searcher(name, options), or "
                "PlannerOptions(searcher=name).planner())"
            )
        if self.cost_model is None:
            object.__setattr__(self, "cost_model", spec_of("neural"))
        if not isinstance(self.cost_model, CostModelSpec):
            raise UserError(
                f"planner.cost_model: got {self.cost_model!r:.60}, expected a CostModelSpec (CostModelSpec(name, "
                "options), or PlannerOptions(cost_model=name).planner())"
            )
        if self.autotune.name != "off" and self.autotune.device != self.device:
            raise UserError(
                f"autotune.device: got {self.autotune.device!r}, expected the plan's device ({self.device!r}): "
                "autotune measures the plan's own kernels"
            )

    def stages(self) -> tuple[Stage, ...]:
        """The stages this planner runs, in order (``search.stages``): the one place the sequence is built. Every
        entry point runs it: ``run`` here (the main job, ``nsj.plan``, the TorchRec adapter's ``plan``), and the
        adapter's ``collective_plan``, which runs the stages before ``autotune`` and after it on rank 0 and
        ``autotune`` itself on every rank."""
        search = SearchStage(self.searcher, self.row_split)
        calibrating = self.calibrate.name == "measured"
        stages: list[Stage] = []
        if self.first_contact and self.cost_model.chosen and self.device == "cpu" and not calibrating:
            stages.append(FirstContact(self.calibrate))
        if calibrating and self.calibrate.on == "tables":
            stages.append(CalibrateTables(self.calibrate))
        stages.append(search)
        if calibrating and self.calibrate.on == "plan":
            stages.append(CalibratePlan(self.calibrate, search))
        if self.autotune.name != "off":
            stages.append(Autotune(self.autotune, search))
        if self.polish.name == "measured":
            stages.append(Polish(self.polish))
        if calibrating and self.calibrate.on == "plan":
            stages.append(CheckOnPlan())
        return tuple(stages)

    def start(self, task: Task, fill: float | None = None) -> PlanningState:
        """The state a run of ``task`` starts from: the task checked and its cost model built once
        (``build_cost_model``); on a GPU, tables in tiered memory where its memory is short (``core.tiers.tiered``;
        ``fill``: until the tables take at most that share of the devices, a run's retry where the search packed
        none at the first)."""
        if not isinstance(task, Task):
            raise UserError(f"planner.run: got {type(task).__name__}, expected a Task (workloads.builders.make_task)")
        check_jax_environment()  # a library's caller too: JAX_PLATFORMS=cuda without a GPU is one line, not XLA's
        task = on_device(task, self.device)  # its memory as this device's kernels hold it (a GPU's workspace)
        given, price = task, tier_price(self.device)
        if self.device == "cuda":  # where a GPU's memory is short, tables in host memory with a cache on it
            task = tiered(task, self.tiering, price, fill)
        check_feasible(task)  # an infeasible task is refused before any model is built or kernel measured
        keep_compiled_kernels()
        model, choice = build_cost_model(self.cost_model, task, self.device, self.fallback)  # choice.instead: why
        if self.device == "cuda":  # every searcher prices the cached tables' misses, every plan its own
            model = model.with_tiers(task, price)
        cached = cached_tables(task)
        if cached:
            logger.info("tiering: %s", describe(task, price))
        ran = ("tiering",) if cached != cached_tables(given) else ()
        return PlanningState(task, model, choice, self.seed, ran=ran)

    def run(self, task: Task) -> Planned:
        """Plan ``task``: its state (``start``) through every stage (``stages``). On a GPU with ``tiering=auto``,
        where the search finds no plan within the devices' memory, again with more of the tables in tiered memory
        (``TIER_RETRIES``: until they take at most 75%, then 65%, 50% of the devices), the last refusal raised."""
        fills = (None, *TIER_RETRIES) if self.device == "cuda" and self.tiering == "auto" else (None,)
        for fill in fills[:-1]:
            try:
                return planned(run_stages(self.stages(), self.start(task, fill)))
            except InfeasibleError as err:
                logger.info("tiering: the search packed no plan (%s); more tables in tiered memory", err)
        return planned(run_stages(self.stages(), self.start(task, fills[-1])))

    def plan(self, task: Task) -> Plan:
        """``run(task).plan``."""
        return self.run(task).plan


def planned(state: PlanningState) -> Planned:
    """What a run returns from its last state."""
    return Planned(state.finished(), state.model, state.choice, state.candidates)


def check_device(device: str) -> str:
    if device not in DEVICES:
        raise UserError(f"device: got {device!r}, expected cpu or cuda")
    return device


@dataclasses.dataclass(frozen=True)
class PlannerOptions(Settings):
    """Every option of a planning run, in one place: the main job's top-level keys (its ``searcher`` and
    ``cost_model`` config groups hold the names and their options), ``nsj.plan``'s and the TorchRec adapter's
    keywords: the ``Settings`` and the parts by name. ``searcher``, ``cost_model``: registered names
    (``searcher_names()``; ``neural``: the model chosen for this machine's kind, ``analytic``, or a model's name),
    with their options."""

    searcher: str = DEFAULT_SEARCHER
    searcher_options: dict = dataclasses.field(default_factory=dict)
    cost_model: str = "neural"
    cost_model_options: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()
        for options in GROUPED.values():  # None: no options (as nsj.plan's keywords have always taken it)
            object.__setattr__(self, options, dict(getattr(self, options) or {}))

    def planner(self) -> Planner:
        """The planner these options build: the searcher and the cost model's spec made from their names once, the
        settings as they are."""
        searcher = make_searcher(self.searcher, dict(self.searcher_options))
        spec = spec_of(self.cost_model, self.cost_model_options)
        return self.with_parts(searcher, spec)


GROUPED = {"searcher": "searcher_options", "cost_model": "cost_model_options"}  # a name and its options


def option_names() -> tuple[str, ...]:
    """The planner's options: the fields of ``PlannerOptions``."""
    return tuple(f.name for f in dataclasses.fields(PlannerOptions))


def planner_options(keywords: Mapping[str, Any], where: str = "") -> PlannerOptions:
    """``PlannerOptions`` from keywords as every entry point gives them: its fields, with ``searcher`` or
    ``cost_model`` also as a config group's mapping (``{"name": "beam", "k": 5}``), and the searcher's own options
    beside them (``k=5``); ``calibrate``/``polish`` as ``True``/``False``. A keyword that is neither is refused with
    the nearest name. ``where``: the prefix of key names in errors."""
    values = dict(keywords)
    for options in GROUPED.values():
        if options in values and values[options] is None:
            values[options] = {}
    for group, options in GROUPED.items():
        chosen = values.get(group)
        if isinstance(chosen, Mapping):  # a config group: its name and its options
            chosen = dict(chosen)
            if "name" not in chosen:
                raise UserError(f"{where}{group}: got {chosen!r:.60}, expected a name or a mapping with 'name'")
            values[group] = chosen.pop("name")
            values[options] = {**chosen, **dict(values.get(options) or {})}
    if "seed" in values:  # numpy integers taken, and the one message a bad seed gets everywhere
        values["seed"] = check_seed(values["seed"])
    for stage, cls in STAGES.items():
        if stage in values and not isinstance(values[stage], Mapping):  # a config group's mapping: typed below
            values[stage] = stage_config(cls, values[stage], stage)
    searcher = values.get("searcher", PlannerOptions.searcher)
    if isinstance(searcher, str) and searcher not in searcher_names():  # the name before its options
        make_searcher(searcher)
    own = searcher_options(searcher) if isinstance(searcher, str) else ()
    names = option_names()
    loose = {k: values.pop(k) for k in [k for k in values if k not in names]}
    unknown = [k for k in loose if k not in own]
    if unknown:
        raise UserError(f"{where}{unknown[0]}: unknown option, {nearest(unknown[0], sorted({*names, *own}))}")
    if loose:
        values["searcher_options"] = {**dict(values.get("searcher_options") or {}), **loose}
    return typed(PlannerOptions, values, where.rstrip("."))


def planner_from(keywords: Mapping[str, Any], planner: Planner | None = None, where: str = "") -> Planner:
    """What ``nsj.plan``, the TorchRec adapter and the main job plan with: ``planner`` where given (then any
    planning keyword given as well is refused in one line: which of the two should plan would be a guess), else the
    planner ``keywords`` build (``planner_options``)."""
    if planner is None:
        return planner_options(keywords, where).planner()
    if not isinstance(planner, Planner):
        raise UserError(
            f"planner: got {planner!r:.60}, expected a Planner (PlannerOptions(...).planner()), or the options as "
            "keywords (searcher=..., seed=...)"
        )
    if keywords:
        raise UserError(
            f"planner: given with {next(iter(keywords))}=...; expected the planner alone (its parts say how to plan) "
            "or its options as keywords"
        )
    return planner


STAGES = {"calibrate": CalibrateConfig, "polish": PolishConfig, "autotune": AutotuneConfig}  # the measured stages
ON = {"calibrate": "measured", "polish": "measured", "autotune": "kernels"}  # what True turns each on as


def stage_config(cls, value, key: str):
    """A measured stage's config (``key``: calibrate | polish | autotune) from ``True``/``False``, a mode's name
    (``autotune="kernels"``) or the config itself."""
    if isinstance(value, cls):
        return value
    if isinstance(value, bool):
        return cls(name=ON[key] if value else "off")
    if isinstance(value, str):
        if value not in cls.modes:
            raise UserError(
                f"{key}: got {value!r:.60}, expected True, False, a {cls.__name__} or a mode's name "
                f"({', '.join(cls.modes)})"
            )
        return cls(name=value)
    raise UserError(f"{key}: got {value!r:.60}, expected True, False, a {cls.__name__} or a mode's name")
