"""One planner: calibrate -> row split -> search -> autotune -> polish, the pipeline the main job,
``neuroshard_jax.plan`` and the TorchRec adapter all run (TorchRec's ``EmbeddingShardingPlanner``, built once from its
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
import functools
import logging
import time
from collections.abc import Mapping
from typing import Any

from neuroshard_jax.core.cli import check_jax_environment
from neuroshard_jax.core.config import check_seed, nearest, typed
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.records import CalibrationRecord
from neuroshard_jax.core.sharding import check_row_split
from neuroshard_jax.core.task import Task, check_feasible
from neuroshard_jax.costs.choice import CostModelSpec, ModelChoice, build_cost_model, spec_of
from neuroshard_jax.costs.cost_model import CostModel, with_compute_scale
from neuroshard_jax.costs.coverage import out_of_depth_warning
from neuroshard_jax.kernels.executors import open_executor
from neuroshard_jax.measure.autotune import (
    AutotuneConfig,
    Entrant,
    Search,
    autotune_kernels,
    first_line,
)
from neuroshard_jax.measure.autotune_steps import autotune_steps
from neuroshard_jax.measure.calibration import (
    CalibrateConfig,
    PlanReadings,
    calibrate_on_plans,
    calibrated,
    checked_on_plan,
)
from neuroshard_jax.measure.first_contact import contact_line, first_contact
from neuroshard_jax.measure.polish import PolishConfig, polish_plan
from neuroshard_jax.search.pipeline import keep_compiled_kernels, search_candidates
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
    machine from a few spec kernels measured once and kept (``measure.first_contact``). Keyword-only, so that a
    subclass's parts come first."""

    seed: int = 0
    row_split: str = "fit"
    calibrate: CalibrateConfig = CalibrateConfig()
    polish: PolishConfig = PolishConfig()
    autotune: AutotuneConfig = AutotuneConfig()
    device: str = "cpu"
    fallback: bool = False
    first_contact: bool = True

    def __post_init__(self):
        object.__setattr__(self, "seed", check_seed(self.seed))
        for stage, cls in STAGES.items():
            object.__setattr__(self, stage, stage_config(cls, getattr(self, stage), stage))
        check_row_split(self.row_split)
        check_device(self.device)
        if self.autotune.device == AutotuneConfig.device:  # left as it is: the plan's device (another is refused)
            object.__setattr__(self, "autotune", dataclasses.replace(self.autotune, device=self.device))

    def settings(self) -> dict[str, Any]:
        """The settings alone, by name (what a ``Planner`` is built with besides its parts)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Settings)}


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

    def run(self, task: Task) -> Planned:
        """Plan ``task``: build its cost model once (``build_cost_model``), calibrate it on the task's tables (if
        asked), search (row splits tried first where they may pay), or calibrate on the searched plans' devices and
        search again (``calibrate.on=plan``), autotune and polish on the real kernels (if asked), and read the plan
        returned on its own devices (``calibrate.on=plan``)."""
        if not isinstance(task, Task):
            raise UserError(f"planner.run: got {type(task).__name__}, expected a Task (workloads.builders.make_task)")
        check_jax_environment()  # a library's caller too: JAX_PLATFORMS=cuda without a GPU is one line, not XLA's
        check_feasible(task)  # an infeasible task is refused before any model is built or kernel measured
        keep_compiled_kernels()
        model, choice = build_cost_model(self.cost_model, task, self.device, self.fallback)  # choice.instead: why
        record, on_plan = None, None
        if self.meets_first(choice, model):  # a machine kind no model was trained on: the closest one scaled to it
            model, record, cached = first_contact(model, choice.spec.label, task, self.calibrate)
            choice = dataclasses.replace(choice, contact=contact_line(record, cached))
        if self.calibrate.name == "measured" and self.calibrate.on == "tables":
            model, record = calibrated(task, model, self.calibrate, self.seed)
        plan, candidates = search_candidates(task, self.searcher, model, self.seed, self.row_split)
        if self.calibrate.name == "measured" and self.calibrate.on == "plan":
            plan, candidates, model, record, on_plan = self.calibrated_on_plan(model, plan, candidates)
        if self.autotune.name != "off":
            again = functools.partial(self.best_plans, task) if self.autotune.name == "loop" else None
            plan = autotune_plan(plan, candidates, model, self.autotune, self.seed, again)
        if self.polish.name == "measured":
            plan = polish_plan(plan, model, self.polish, self.seed)
        if on_plan is not None:  # the plan returned, after autotune and polish, read on its own devices
            record = on_plan.checked(plan, model, record)
        if record is not None:
            plan = dataclasses.replace(plan, calibration=record)
        return Planned(plan, model, choice, candidates)

    def meets_first(self, choice: ModelChoice, model: CostModel) -> bool:
        """Whether first contact scales ``model`` (``measure.first_contact``): on, the model chosen for this machine
        (nobody named one) but of another kind, the plan for this machine's CPU, and no calibration asked for."""
        return (
            self.first_contact
            and choice.chosen
            and not choice.matches
            and bool(choice.kinds)
            and self.device == "cpu"
            and self.calibrate.name == "off"
            and model.calibration == 1.0
        )

    def plan(self, task: Task) -> Plan:
        """``run(task).plan``."""
        return self.run(task).plan

    def best_plans(self, task: Task, model: CostModel) -> list[Entrant]:
        """``autotune=loop``'s search: the searcher's ``autotune.k`` best distinct plans of ``task`` by ``model``
        (a portfolio's members'; a plain searcher's own plan), each named by its member."""
        plan, candidates = search_candidates(task, self.searcher, model, self.seed, self.row_split)
        if plan.portfolio is None:
            return [Entrant(plan.searcher or "plan", plan)]
        distinct = [c for c in plan.portfolio.candidates if c.error is None and c.same_as is None]
        best = sorted(distinct, key=lambda c: c.score_ms)[: self.autotune.k]
        return [Entrant(c.member, candidates[c.member]) for c in best]

    def calibrated_on_plan(
        self, model: CostModel, plan: Plan, candidates: dict[str, Plan]
    ) -> tuple[Plan, dict[str, Plan], CostModel, CalibrationRecord, OnPlan]:
        """``calibrate.on=plan``: ``model`` as trained calibrated on the devices of the search's ``plan`` and of its
        ``candidates`` (a portfolio's members'), and the search run again with the calibrated model wherever the
        factor differs from the scale the search had (one factor keeps the compute's ranking but reweighs it against
        the collectives, so the choice may move). Returns the plan, its candidates, the calibrated model, the record
        and what checks the plan finally returned on its own devices (``OnPlan.checked``)."""
        task, config = plan.task, self.calibrate
        started = time.perf_counter()
        plans = list({(frozenset(p.shards), p.data_parallel): p for p in [plan, *candidates.values()]}.values())
        with open_executor(config.executor, config.device, config.timeout_s) as pool:
            readings = PlanReadings(config, pool)
            record = calibrate_on_plans(plans, with_compute_scale(model, 1.0, task.comm_scale()), readings)
        again, searched = record.factor != model.calibration, plan
        model = with_compute_scale(model, record.factor, task.comm_scale())
        if again:
            searched, candidates = search_candidates(task, self.searcher, model, self.seed, self.row_split)
        changed = _placement(searched) != _placement(plan)
        return searched, candidates, model, record, OnPlan(readings, again, changed, started)


def _placement(plan: Plan):
    return frozenset(plan.shards), plan.data_parallel


@dataclasses.dataclass
class OnPlan:
    """What ``calibrate.on=plan`` measured (``readings``: its kernels, kept), whether it searched again and whether
    that changed the plan, and when it started: ``checked`` reads the plan finally returned on its own devices."""

    readings: PlanReadings
    searched_again: bool
    changed: bool
    started: float

    def checked(self, plan: Plan, model: CostModel, record: CalibrationRecord) -> CalibrationRecord:
        """``record`` with ``plan_devices``: ``plan`` (after autotune and polish, if they ran) on its own devices,
        only kernels not read yet measured, against the calibrated ``model``; the seconds of the whole stage."""
        config = self.readings.config
        with open_executor(config.executor, config.device, config.timeout_s) as pool:
            self.readings.executor = pool
            check = checked_on_plan(plan, model, self.readings, self.searched_again, self.changed)
        return dataclasses.replace(record, plan_devices=check, seconds=round(time.perf_counter() - self.started, 1))


def autotune_plan(
    plan: Plan,
    candidates: dict[str, Plan],
    model: CostModel,
    config: AutotuneConfig,
    seed: int,
    search: Search | None = None,
) -> Plan:
    """``plan`` (what the search kept) replaced by the measured fastest of its candidates (``entrants``): on the
    kernels (``autotune_kernels``; ``loop``: and the plans ``search`` finds with the model tuned on them) or in
    training steps (``autotune_steps``). The returned plan keeps the search's records (portfolio, calibration) and
    adds the autotune record."""
    entrants = candidate_plans(plan, candidates, model, config, seed)
    if config.name == "steps":
        chosen, _ = autotune_steps(entrants, config)
    else:
        chosen, _ = autotune_kernels(entrants, model, config, search)
    return searched_records(chosen, plan, seed)


def searched_records(chosen: Plan, searched: Plan, seed: int) -> Plan:
    """The measured choice ``chosen`` with the search's records (portfolio, calibration, seed, search time) of
    ``searched``, the plan the search kept."""
    return dataclasses.replace(
        chosen,
        portfolio=searched.portfolio,
        calibration=searched.calibration,
        seed=seed,
        search_time_s=searched.search_time_s,
    )


def candidate_plans(
    plan: Plan, candidates: dict[str, Plan], model: CostModel, config: AutotuneConfig, seed: int
) -> list[Entrant]:
    """What autotune measures: a portfolio's ``k`` best distinct plans by the model's score (``candidates``: each
    member's plan), else ``plan`` itself, then the ``baselines``' plans of the same task, costed by the same
    ``model`` (one that cannot be planned: an entrant without a plan, and why)."""
    entrants = []
    if plan.portfolio is not None:
        distinct = [c for c in plan.portfolio.candidates if c.error is None and c.same_as is None]
        best = sorted(distinct, key=lambda c: c.score_ms)[: config.k]
        entrants += [Entrant(c.member, candidates[c.member]) for c in best]
    else:
        entrants.append(Entrant(plan.searcher or "plan", plan))
    for name in config.baselines:
        if any(e.name == name for e in entrants):  # a member of that name: the same searcher's plan already there
            continue
        try:
            entrants.append(Entrant(name, search_candidates(plan.task, make_searcher(name), model, seed)[0]))
        except (UserError, InfeasibleError) as err:  # TorchRec not installed, or no plan of this task: dropped
            why = first_line(err)
            logger.warning(f"autotune: {name} is not a candidate: {why}")
            entrants.append(Entrant(name, None, why))
    return entrants


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
        return Planner(searcher=searcher, cost_model=spec, **self.settings())


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
        try:
            return cls(name=value)
        except UserError as err:  # its modes, as the config names them
            modes = str(err).rpartition("expected ")[2]
            raise UserError(
                f"{key}: got {value!r:.60}, expected True, False, a {cls.__name__} or a mode's name ({modes})"
            ) from None
    raise UserError(f"{key}: got {value!r:.60}, expected True, False, a {cls.__name__} or a mode's name")
