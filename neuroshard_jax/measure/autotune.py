"""``autotune=kernels``: the candidates' devices measured on this machine's kernels, the measured fastest returned.

The cost model cannot see differences of a few per cent between plans (on an H200 it priced grid's plan 0.5% dearer
than beam's, and the kernels read it 11% faster); a measurement can. The candidates are the portfolio's ``k`` best
distinct plans by the model's score (the searcher's own plan, for a plain searcher) and TorchRec's default and
table-wise + column-wise plans (``baselines``; one that cannot be planned, e.g. without TorchRec installed, is dropped
with why). Every distinct device kernel of every candidate is measured once per round, the rounds interleaved (round
r + 1 of every kernel after round r of all), with the evaluator's request; a candidate's step in a round is its
measured compute with the model's comm (``polish.simulate``: the straggler waits from the measured compute), so every
plan's collectives are priced alike. Measuring stops once the leader's slowest round beats every other candidate's
fastest (it leads beyond the measured noise), after ``rounds``, or past ``budget_s``; the least median step wins.
Readings are appended to ``readings`` (a JSONL file; the main job keeps it in its run folder), so a run stopped and
started again measures only what it lacks. Cost: ``rounds`` x the candidates' distinct devices, each a short fwd+bwd
(``warmup`` + ``iters`` iterations): docs/autotune.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.config import bounded
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.hardware import hardware, hardware_kind
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.records import AutotuneRecord, MeasuredCandidate
from neuroshard_jax.costs.cost_model import CostModel, expected_cost_model, plan_cost_ms
from neuroshard_jax.kernels.executors import ExecutorConfig, open_executor, pinned
from neuroshard_jax.kernels.processes import quiet
from neuroshard_jax.measure.evaluator import Measuring, measure_tables, plan_kernels
from neuroshard_jax.measure.polish import simulate
from neuroshard_jax.search.pipeline import search_plan
from searchers import make_searcher

logger = logging.getLogger(__name__)

MODES = ("off", "kernels")
BASELINES = ("torchrec_default", "torchrec")  # TorchRec's planner as its users get it, and table-wise + column-wise


@dataclasses.dataclass(frozen=True)
class AutotuneConfig(Measuring):
    """conf/autotune/*.yaml (``name``: off | kernels)."""

    name: str = "off"
    k: int = bounded(at_least=1, default=3)  # the portfolio's best distinct candidates by the model, measured
    baselines: tuple[str, ...] = BASELINES  # searchers whose plans are measured beside them (none: ())
    rounds: int = bounded(at_least=1, default=5)  # interleaved rounds at most
    budget_s: float = bounded(above=0, default=300.0)  # wall seconds of measuring; a round started is finished
    warmup: int = bounded(at_least=0, default=2)
    iters: int = bounded(at_least=1, default=5)
    executor: ExecutorConfig = ExecutorConfig(workers=2)  # the main job's executor (conf/executor/)
    pin: bool | None = None  # local CPU workers each on a core (null: what the executor supports)
    device: str = "cpu"  # cpu (FBGEMM CPU) | cuda (FBGEMM GPU)
    timeout_s: float = bounded(above=0, default=600.0)
    readings: str | None = None  # a JSONL file the readings are kept in (and resumed from); None: not kept

    def __post_init__(self):
        if self.name not in MODES:
            raise UserError(f"autotune: got {self.name!r}, expected one of {', '.join(MODES)}")
        self.check_measuring("autotune")
        object.__setattr__(self, "baselines", tuple(self.baselines))


@dataclasses.dataclass(frozen=True)
class Entrant:
    """A candidate the autotuner measures: its name (a portfolio member, a baseline searcher), and its plan with
    the model's costs (None: it could not be planned, ``why``)."""

    name: str
    plan: Plan | None
    why: str | None = None


class Readings:
    """Kernel readings (ms, and the CPU share the worker held) by device content key, in round order; appended to
    a JSONL file where one is given, and read back from it (lines of another machine's kind are ignored)."""

    def __init__(self, path: str | None, device: str):
        self.path = None if path is None else Path(path)
        self.kind = hardware_kind(hardware(), device)
        self.ms: dict[str, list[float]] = {}
        self.busy: dict[str, list[bool]] = {}
        self.resumed = 0
        if self.path is not None and self.path.is_file():
            for n, line in enumerate(self.path.read_text().splitlines()):
                try:
                    row = json.loads(line)
                    if row["kind"] != self.kind:
                        continue
                    self._add(str(row["key"]), float(row["ms"]), bool(row["busy"]))
                    self.resumed += 1
                except (ValueError, KeyError, TypeError):  # a line torn by a stop mid-write: measured again
                    logger.warning(f"autotune: {self.path}:{n + 1} is not a reading; it is measured again")

    def _add(self, key: str, ms: float, busy: bool) -> None:
        self.ms.setdefault(key, []).append(ms)
        self.busy.setdefault(key, []).append(busy)

    def add(self, key: str, ms: float, busy: bool) -> None:
        self._add(key, ms, busy)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps({"key": key, "ms": ms, "busy": busy, "kind": self.kind}) + "\n")

    def count(self, key: str) -> int:
        return len(self.ms.get(key, ()))


def autotune_kernels(
    task_plans: list[Entrant], model: CostModel, config: AutotuneConfig
) -> tuple[Plan, AutotuneRecord]:
    """The measured fastest of ``task_plans`` (plans of one task, the model's costs on them; entrants without a plan
    are recorded as dropped) and the record of what was measured. Plans that repeat an earlier entrant's are
    measured once (the first name kept)."""
    started = time.perf_counter()
    expected = expected_cost_model(model)
    entrants, dropped = [], []
    seen: dict[tuple, str] = {}
    alias: dict[str, str] = {}  # a repeated plan's name -> the name it was measured under
    for entrant in task_plans:
        if entrant.plan is None:
            dropped.append(MeasuredCandidate(name=entrant.name, kept=False, why=entrant.why))
            continue
        key = (frozenset(entrant.plan.shards), entrant.plan.data_parallel)
        if key in seen:
            alias[entrant.name] = seen[key]
            dropped.append(MeasuredCandidate(name=entrant.name, kept=False, why=f"the same plan as {seen[key]}"))
            continue
        seen[key] = entrant.name
        entrants.append(entrant)
    if not entrants:
        raise InfeasibleError(f"autotune: no candidate made a plan ({'; '.join(str(d.why) for d in dropped)})")
    plans = [e.plan for e in entrants]
    kernels = [plan_kernels(p) for p in plans]  # per plan, per device: (key, task, tables) of each kernel
    jobs = {key: (at, tables) for per_plan in kernels for device in per_plan for key, at, tables in device}
    readings = Readings(config.readings, config.device)
    evaluator = config.evaluator()
    stopped, rounds = "rounds", 0
    pin = pinned(config.pin, config.executor)
    with open_executor(config.executor, config.device, config.timeout_s, pin=pin) as pool:
        for r in range(config.rounds):
            todo = {key: job for key, job in jobs.items() if readings.count(key) <= r}
            if todo:
                answers = measure_tables(todo, evaluator, pool, what="autotune: a device measurement failed")
                for key, (answer,) in answers.items():
                    readings.add(key, float(answer["total_ms"]), not quiet(answer))
            rounds = r + 1
            steps = _round_steps(plans, kernels, readings, expected, rounds)
            leader = int(np.argmin(np.median(steps, axis=1)))
            progress(rounds, config.rounds, entrants, steps)
            if len(plans) > 1 and rounds >= 2 and _leads(steps, leader):
                stopped = "leader"
                break
            if time.perf_counter() - started > config.budget_s:
                stopped = "budget"
                break
    steps = _round_steps(plans, kernels, readings, expected, rounds)
    medians = np.median(steps, axis=1)
    best = int(np.argmin(medians))
    compute = _compute(plans, kernels, readings, rounds)
    measured = [
        MeasuredCandidate(
            name=e.name,
            searcher=e.plan.searcher,
            predicted_ms=float(e.plan.costs.cost_ms),
            measured_ms=float(medians[i]),
            low_ms=float(steps[i].min()),
            high_ms=float(steps[i].max()),
            compute_ms=float(np.median(compute[i].max(axis=1))),
            kept=True,
        )
        for i, e in enumerate(entrants)
    ]
    default_name = alias.get("torchrec_default", "torchrec_default")
    default = next((m for m in measured if m.name == default_name), None)
    busy = sum(any(readings.busy[key][:rounds]) for key in jobs)
    record = AutotuneRecord(
        mode="kernels",
        candidates=(*measured, *dropped),
        chosen=entrants[best].name,
        vs_torchrec_default=None if default is None else float(medians[best] / default.measured_ms),
        rounds=rounds,
        stopped=stopped,
        devices=len(jobs),
        resumed=readings.resumed,
        busy=busy,
        seconds=time.perf_counter() - started,
        warmup=config.warmup,
        iters=config.iters,
        device=config.device,
    )
    return dataclasses.replace(plans[best], autotune=record), record


def _compute(plans: list[Plan], kernels: list, readings: Readings, rounds: int) -> list[np.ndarray]:
    """Per plan f64[R, N]: each device's measured compute in each round (its kernels' readings summed, divided by
    the device's speed)."""
    out = []
    for plan, per_plan in zip(plans, kernels):
        speeds = plan.task.speeds()
        ms = np.zeros((rounds, plan.task.num_devices))
        for d, device in enumerate(per_plan):
            for key, _, _ in device:
                ms[:, d] += np.asarray(readings.ms[key][:rounds]) / speeds[d]
        out.append(ms)
    return out


def _round_steps(plans, kernels, readings: Readings, expected: CostModel, rounds: int) -> np.ndarray:
    """f64[K, R]: each candidate's step in each round: its measured compute, the model's comm (straggler waits
    from the measured compute), the slowest device's total."""
    compute = _compute(plans, kernels, readings, rounds)
    return np.stack(
        [np.asarray(plan_cost_ms(simulate(expected, [p] * rounds, c)), np.float64) for p, c in zip(plans, compute)]
    )


def _leads(steps: np.ndarray, leader: int) -> bool:
    """The leader's slowest round is faster than every other candidate's fastest: it leads beyond the noise."""
    others = np.delete(steps, leader, axis=0)
    return bool(steps[leader].max() < others.min(axis=1).min())


def progress(done: int, rounds: int, entrants: list[Entrant], steps: np.ndarray) -> None:
    """One line on stderr per round: the candidates' median measured steps so far."""
    medians = np.median(steps, axis=1)
    shown = ", ".join(f"{e.name} {m:.3f}" for e, m in zip(entrants, medians))
    print(f"autotune: round {done}/{rounds}: {shown} ms", file=sys.stderr, flush=True)


def autotune_plan(plan: Plan, candidates: dict[str, Plan], model: CostModel, config: AutotuneConfig, seed: int) -> Plan:
    """``plan`` (what the search kept) replaced by the measured fastest of its candidates (``autotune_kernels``): a
    portfolio's ``k`` best distinct plans by the model's score (``candidates``: each member's plan), else ``plan``
    itself, and the ``baselines``' plans of the same task, costed by the same ``model``. The returned plan keeps
    the search's records (portfolio, calibration) and adds the autotune record."""
    entrants = []
    if plan.portfolio is not None:
        distinct = [c for c in plan.portfolio.candidates if c.error is None and c.same_as is None]
        best = sorted(distinct, key=lambda c: c.score_ms)[: config.k]
        entrants += [Entrant(c.member, candidates[c.member]) for c in best]
    else:
        entrants.append(Entrant(plan.searcher or "plan", plan))
    for name in config.baselines:
        try:
            entrants.append(Entrant(name, search_plan(plan.task, make_searcher(name), model, seed)))
        except (UserError, InfeasibleError) as err:  # TorchRec not installed, or no plan of this task: dropped
            why = (str(err).splitlines() or [type(err).__name__])[0]
            logger.warning(f"autotune: {name} is not a candidate: {why}")
            entrants.append(Entrant(name, None, why))
    chosen, _ = autotune_kernels(entrants, model, config)
    return dataclasses.replace(
        chosen, portfolio=plan.portfolio, calibration=plan.calibration, seed=seed, search_time_s=plan.search_time_s
    )
