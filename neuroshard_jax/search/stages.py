"""The stages of a planning run, each an object with ``run(state) -> state``, and the state they pass on.

A ``Planner`` (``sharding_planner.py``) is a sequence of them, built in one place (``Planner.stages``) from its
settings: first contact, calibrate on the tables, search, calibrate on the plan, autotune, polish, the plan's check
on its own devices. The main job, ``nsj.plan`` and the TorchRec adapter (``plan`` and ``collective_plan``, on rank 0
or on every rank) run that sequence in that order; the plan names the stages that acted (``Plan.stages``). A new stage
is a class here with a ``name`` and a ``run``, and one line in ``Planner.stages``::

    @dataclasses.dataclass(frozen=True)
    class Report:
        name: ClassVar[str] = "report"

        def run(self, state: PlanningState) -> PlanningState:
            print(state.plan.costs.cost_ms)
            return state
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import ClassVar, Protocol

from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.records import CalibrationRecord, PortfolioRecord
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.choice import ModelChoice
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.kernels.executors import open_executor
from neuroshard_jax.measure.autotune import AutotuneConfig, Entrant, Search, autotune_kernels, first_line
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
from neuroshard_jax.search.pipeline import search_candidates
from searchers import Searcher, make_searcher

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PlanningState:
    """What a planning run holds between stages: the task, the one cost model every stage prices with (calibrated
    where a stage scaled it) and which model it is (``choice``), the plan kept so far and a portfolio's members' own
    plans (``candidates``), the calibration record so far, what ``calibrate.on=plan`` measured (``on_plan``) and the
    names of the stages that acted, in order."""

    task: Task
    model: CostModel
    choice: ModelChoice
    seed: int
    plan: Plan | None = None
    candidates: dict[str, Plan] = dataclasses.field(default_factory=dict)
    record: CalibrationRecord | None = None
    on_plan: OnPlan | None = None
    ran: tuple[str, ...] = ()

    def searched(self) -> Plan:
        if self.plan is None:
            raise UserError("planning: a stage that needs a plan ran before the search")
        return self.plan

    def finished(self) -> Plan:
        """The plan with the run's calibration record and the names of the stages that acted."""
        plan = self.searched()
        if self.record is not None:
            plan = plan.with_record(CalibrationRecord, self.record)
        return dataclasses.replace(plan, stages=self.ran)


class Stage(Protocol):
    """One step of a planning run: ``run`` takes the state and returns the next (``dataclasses.replace``)."""

    name: ClassVar[str]

    def run(self, state: PlanningState) -> PlanningState: ...


def run_stages(stages: tuple[Stage, ...], state: PlanningState) -> PlanningState:
    """``state`` through ``stages`` in order, the name of each one that acted added to ``state.ran`` (a stage with
    nothing to do returns the state it was given: first contact on a machine kind its model knows)."""
    for stage in stages:
        given, state = state, stage.run(state)
        if state is not given:
            state = dataclasses.replace(state, ran=(*state.ran, stage.name))
    return state


@dataclasses.dataclass(frozen=True)
class FirstContact:
    """On a machine kind no model was trained on, the model chosen for it (nobody named one) scaled to this machine
    from a few spec kernels measured once and kept (``measure.first_contact``); on a model of this kind, nothing."""

    name: ClassVar[str] = "first_contact"
    calibrate: CalibrateConfig

    def run(self, state: PlanningState) -> PlanningState:
        choice, model = state.choice, state.model
        if not (choice.chosen and not choice.matches and choice.kinds and model.calibration == 1.0):
            return state
        model, record, cached = first_contact(model, choice.spec.label, state.task, self.calibrate)
        return dataclasses.replace(
            state, model=model, record=record, choice=dataclasses.replace(choice, contact=contact_line(record, cached))
        )


@dataclasses.dataclass(frozen=True)
class CalibrateTables:
    """``calibrate=measured`` on the task's tables: the model scaled by their measured kernels before the search."""

    name: ClassVar[str] = "calibrate"
    config: CalibrateConfig

    def run(self, state: PlanningState) -> PlanningState:
        model, record = calibrated(state.task, state.model, self.config, state.seed)
        return dataclasses.replace(state, model=model, record=record)


@dataclasses.dataclass(frozen=True)
class SearchStage:
    """The searcher's plan of the task by the state's model (row splits tried first where they may pay), and a
    portfolio's members' own plans."""

    name: ClassVar[str] = "search"
    searcher: Searcher
    row_split: str

    def run(self, state: PlanningState) -> PlanningState:
        plan, candidates = search_candidates(state.task, self.searcher, state.model, state.seed, self.row_split)
        return dataclasses.replace(state, plan=plan, candidates=candidates)

    def best_plans(self, task: Task, model: CostModel, seed: int, k: int) -> list[Entrant]:
        """The ``k`` best distinct plans of ``task`` by ``model`` (a portfolio's members'; a plain searcher's own
        plan), each named by its member: what ``autotune=loop`` searches again with the model tuned on them."""
        plan, candidates = search_candidates(task, self.searcher, model, seed, self.row_split)
        if plan.portfolio is None:
            return [Entrant(plan.searcher or "plan", plan)]
        distinct = [c for c in plan.portfolio.candidates if c.error is None and c.same_as is None]
        best = sorted(distinct, key=lambda c: c.score_ms)[:k]
        return [Entrant(c.member, candidates[c.member]) for c in best]


@dataclasses.dataclass(frozen=True)
class CalibratePlan:
    """``calibrate.on=plan``: the model as trained calibrated on the devices of the searched plan and of its
    candidates, and the search run again with the calibrated model wherever the factor differs from the scale the
    search had (one factor keeps the compute's ranking but reweighs it against the collectives, so the choice may
    move). What it measured is kept for ``CheckOnPlan``."""

    name: ClassVar[str] = "calibrate_on_plan"
    config: CalibrateConfig
    search: SearchStage

    def run(self, state: PlanningState) -> PlanningState:
        plan, model, task, config = state.searched(), state.model, state.task, self.config
        started = time.perf_counter()
        plans = list({_placement(p): p for p in [plan, *state.candidates.values()]}.values())
        with open_executor(config.executor, config.device, config.timeout_s) as pool:
            readings = PlanReadings(config, pool)
            record = calibrate_on_plans(plans, model.with_compute_scale(1.0, task.comm_scale()), readings)
        again = record.factor != model.calibration
        model = model.with_compute_scale(record.factor, task.comm_scale())
        state = dataclasses.replace(state, model=model, record=record)
        if again:
            state = self.search.run(state)
        on_plan = OnPlan(readings, again, _placement(state.searched()) != _placement(plan), started)
        return dataclasses.replace(state, on_plan=on_plan)


@dataclasses.dataclass(frozen=True)
class Autotune:
    """The plan replaced by the measured fastest of its candidates (``candidate_plans``): on the kernels
    (``kernels``; ``loop``: and the plans the search finds with the model tuned on them) or in training steps
    (``steps``: local rank processes; the adapter's ``collective_plan`` times them on its live group instead). The
    returned plan keeps the search's records and adds the autotune record."""

    name: ClassVar[str] = "autotune"
    config: AutotuneConfig
    search: SearchStage

    def run(self, state: PlanningState) -> PlanningState:
        plan = state.searched()
        entrants = candidate_plans(plan, state.candidates, state.model, self.config, state.seed)
        return dataclasses.replace(state, plan=self.chosen(entrants, state))

    def chosen(self, entrants: list[Entrant], state: PlanningState) -> Plan:
        """The measured choice among ``entrants`` with the search's records of ``state.plan``."""
        if self.config.name == "steps":
            chosen, _ = autotune_steps(entrants, self.config)
        else:
            again: Search | None = None
            if self.config.name == "loop":
                task, seed, k = state.task, state.seed, self.config.k
                again = lambda model: self.search.best_plans(task, model, seed, k)  # noqa: E731
            chosen, _ = autotune_kernels(entrants, state.model, self.config, again)
        return searched_records(chosen, state.searched(), state.seed)


@dataclasses.dataclass(frozen=True)
class Polish:
    """``polish=measured``: shards moved where the real kernels say a device is slowest."""

    name: ClassVar[str] = "polish"
    config: PolishConfig

    def run(self, state: PlanningState) -> PlanningState:
        return dataclasses.replace(state, plan=polish_plan(state.searched(), state.model, self.config, state.seed))


@dataclasses.dataclass(frozen=True)
class CheckOnPlan:
    """After ``calibrate.on=plan``: the plan returned (after autotune and polish, if they ran) read on its own
    devices, only kernels not read yet measured (``OnPlan.checked``)."""

    name: ClassVar[str] = "check_on_plan"

    def run(self, state: PlanningState) -> PlanningState:
        if state.on_plan is None or state.record is None:
            return state
        return dataclasses.replace(state, record=state.on_plan.checked(state.searched(), state.model, state.record))


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
        """``record`` with ``plan_devices``: ``plan`` on its own devices, only kernels not read yet measured, against
        the calibrated ``model``; the seconds of the whole stage."""
        config = self.readings.config
        with open_executor(config.executor, config.device, config.timeout_s) as pool:
            self.readings.executor = pool
            check = checked_on_plan(plan, model, self.readings, self.searched_again, self.changed)
        return dataclasses.replace(record, plan_devices=check, seconds=round(time.perf_counter() - self.started, 1))


def searched_records(chosen: Plan, searched: Plan, seed: int) -> Plan:
    """The measured choice ``chosen`` with the search's records (portfolio, calibration, seed, search time) of
    ``searched``, the plan the search kept."""
    kinds = (PortfolioRecord, CalibrationRecord)  # the search's own, made before the measured choice's
    records = (
        *(r for r in searched.records if isinstance(r, kinds)),
        *(r for r in chosen.records if not isinstance(r, kinds)),
    )
    return dataclasses.replace(chosen, records=records, seed=seed, search_time_s=searched.search_time_s)


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
