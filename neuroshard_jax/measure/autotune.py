"""``autotune=kernels``: the candidates' devices measured on this machine's kernels, the measured fastest returned.

The cost model cannot see differences of a few per cent between plans (on an H200 it priced grid's plan 0.5% dearer
than beam's, and the kernels read it 11% faster); a measurement can. The candidates are the portfolio's ``k`` best
distinct plans by the model's score (the searcher's own plan, for a plain searcher) and TorchRec's default and
table-wise + column-wise plans (``baselines``; one that cannot be planned, e.g. without TorchRec installed, is dropped
with why). Every distinct device kernel of every candidate is measured once per round, the rounds interleaved (round
r + 1 of every kernel after round r of all), with the evaluator's request; a candidate's step in a round is its
measured compute with the model's comm (``polish.simulate``: the straggler waits from the measured compute), so every
plan's collectives are priced alike. A kernel read on a busy machine (its worker held under MIN_CPU_SHARE of its
core) is read again after a wait (``retake_wait``) while the budget lasts. Measuring stops once the leader's slowest
round beats every other candidate's fastest (it leads beyond the measured noise), after ``rounds``, past
``budget_s``, or where the machine stayed busy past it. Noise never overrules the model (``decide``): the least median
step replaces the model's pick (the candidate it scores cheapest) only where it leads beyond the spread of both, read
quiet; else the pick is returned and the record says why (``kept_pick``).
Readings are appended to ``readings`` (a JSONL file; the main job keeps it in its run folder), so a run stopped and
started again measures only what it lacks. Cost: ``rounds`` x the candidates' distinct devices, each a short fwd+bwd
(``warmup`` + ``iters`` iterations): docs/autotune.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from neuroshard_jax.core.config import bounded, nearest
from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.hardware import (
    MEMORY_SHARE,
    RANK_PROCESS_BYTES,
    available_bytes,
    hardware,
    hardware_kind,
)
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.progress import progress_bar, progress_lines
from neuroshard_jax.core.records import AutotuneRecord, MeasuredCandidate
from neuroshard_jax.costs.cost_model import CostModel, expected_cost_model, plan_cost_ms
from neuroshard_jax.kernels.executors import ExecutorConfig, open_executor, pinned
from neuroshard_jax.measure.evaluator import Measuring, measure_tables, plan_kernels
from neuroshard_jax.measure.polish import simulate
from neuroshard_jax.measure.training_steps import dmp_steps
from searchers import searcher_names

logger = logging.getLogger(__name__)

MODES = ("off", "kernels", "steps")
MIN_ROUNDS = 2
BASELINES = ("torchrec_default", "torchrec")  # TorchRec's planner as its users get it, and table-wise + column-wise


@dataclasses.dataclass(frozen=True)
class AutotuneConfig(Measuring):
    """conf/autotune/*.yaml (``name``: off | kernels | steps). ``device``: where the kernels run, the plan's own
    (the planner refuses another); ``steps`` always runs its gloo ranks on this machine's CPU."""

    name: str = "off"
    k: int = bounded(at_least=1, default=3)  # the portfolio's best distinct candidates by the model, measured
    baselines: tuple[str, ...] = BASELINES  # searchers whose plans are measured beside them (none: ())
    rounds: int = bounded(at_least=1, default=5)  # interleaved rounds at most
    # rounds before a leader may end the measuring (the default, where rounds are fewer: rounds)
    min_rounds: int = bounded(at_least=2, default=MIN_ROUNDS)
    budget_s: float = bounded(above=0, default=300.0)  # wall seconds of measuring; a round started is finished
    warmup: int = bounded(at_least=0, default=2)
    iters: int = bounded(at_least=1, default=5)
    executor: ExecutorConfig = ExecutorConfig(workers=2)  # the main job's executor (conf/executor/)
    pin: bool | None = None  # local CPU workers each on a core (null: what the executor supports)
    device: str = "cpu"  # cpu (FBGEMM CPU) | cuda (FBGEMM GPU)
    timeout_s: float = bounded(above=0, default=600.0)
    readings: str | None = None  # a JSONL file the readings are kept in (and resumed from); None: not kept
    # steps: each round times every candidate in DistributedModelParallel (gloo ranks started here), warm-ups apart
    steps: int = bounded(at_least=1, default=10)
    step_warmup: int = bounded(at_least=0, default=2)

    def __post_init__(self):
        if self.name not in MODES:
            raise UserError(f"autotune: got {self.name!r}, expected one of {', '.join(MODES)}")
        self.check_measuring("autotune")
        if self.min_rounds > self.rounds and self.min_rounds != MIN_ROUNDS:  # the default follows fewer rounds
            raise UserError(
                f"autotune.min_rounds: got {self.min_rounds}, expected at most autotune.rounds ({self.rounds})"
            )
        object.__setattr__(self, "baselines", tuple(self.baselines))
        for name in self.baselines:
            if name not in searcher_names() or name == "portfolio":
                known = [n for n in searcher_names() if n != "portfolio"]
                raise UserError(f"autotune.baselines: got {name!r}, {nearest(name, known)}")


@dataclasses.dataclass(frozen=True)
class Entrant:
    """A candidate the autotuner measures: its name (a portfolio member, a baseline searcher), and its plan with
    the model's costs (None: it could not be planned, ``why``)."""

    name: str
    plan: Plan | None
    why: str | None = None


class Readings:
    """Readings (ms, and whether the machine was busy) by key (a device's kernel, or a candidate's training step), in
    round order; appended to a JSONL file where one is given, and read back from it (lines of another machine's
    kind or protocol are ignored; a line that is not a reading, torn by a stop mid-write, undecodable, or not a
    finite time, is warned of by file and line and measured again). A file that holds something else is refused
    before anything is written to it: a readings file only autotune wrote is ever appended to."""

    def __init__(self, path: str | None, device: str, protocol: str):
        self.path = None if path is None else Path(path)
        self.kind = f"{hardware_kind(hardware(), device)} | {protocol}"  # a reading of another protocol is not one
        self.ms: dict[str, list[float]] = {}
        self.busy: dict[str, list[bool]] = {}
        self.resumed = 0
        if self.path is not None and self.path.exists() and not self.path.is_file():  # a FIFO would block, forever
            raise UserError(f"autotune.readings: {str(self.path)!r} is not a regular file, expected a JSONL file")
        if self.path is not None and self.path.is_file():
            data = self.path.read_bytes()
            lines = data.split(b"\n")
            if lines[0].strip() and _reading(lines[0]) is None and (len(lines) > 1 or not data.startswith(b"{")):
                raise UserError(
                    f"autotune.readings: {str(self.path)!r} holds something else (its first line is not an autotune "
                    "reading); expected a new file or one autotune wrote (nothing was written to it)"
                )
            for n, line in enumerate(lines):
                if not line.strip():
                    continue
                row = _reading(line)
                if row is None:  # a line torn by a stop mid-write, a stray byte: measured again
                    logger.warning(f"autotune: {self.path}:{n + 1} is not a reading; it is measured again")
                elif row["kind"] == self.kind:
                    self._add(str(row["key"]), float(row["ms"]), bool(row["busy"]))
                    self.resumed += 1
            if data and not data.endswith(b"\n"):  # the next line starts whole
                with open(self.path, "a") as f:
                    f.write("\n")

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

    def quiet_count(self, key: str) -> int:
        """The readings of ``key`` taken on a quiet machine (a round needs one of each kernel)."""
        return sum(not b for b in self.busy.get(key, ()))

    def taken(self, key: str, rounds: int) -> tuple[list[float], list[bool]]:
        """The ``rounds`` readings of ``key`` a step is priced from: its quiet ones in order, then, where the machine
        never quietened, its busy ones; and which of them are busy."""
        ms, busy = self.ms.get(key, []), self.busy.get(key, [])
        order = [i for i, b in enumerate(busy) if not b] + [i for i, b in enumerate(busy) if b]
        order = order[:rounds]
        return [ms[i] for i in order], [busy[i] for i in order]


def plan_digest(plan: Plan) -> str:
    """A plan's key in the readings: its task and its shards (a plan measured again reads as the same)."""
    content = [plan.task.to_json(), sorted(dataclasses.astuple(s) for s in plan.shards), sorted(plan.data_parallel)]
    return hashlib.sha1(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _reading(line: bytes) -> dict | None:
    """A readings file's line as a reading (key, ms: a finite time >= 0, busy, kind), or None."""
    try:
        row = json.loads(line.decode("utf-8"))
        ms = float(row["ms"])
        if not (isinstance(row["key"], str) and isinstance(row["kind"], str) and isinstance(row["busy"], bool)):
            return None
    except (ValueError, KeyError, TypeError, RecursionError, UnicodeDecodeError):
        return None
    return row if np.isfinite(ms) and ms >= 0 else None


def autotune_kernels(
    task_plans: list[Entrant], model: CostModel, config: AutotuneConfig
) -> tuple[Plan, AutotuneRecord]:
    """The measured fastest of ``task_plans`` (plans of one task, the model's costs on them; entrants without a plan
    are recorded as dropped) and the record of what was measured. Plans that repeat an earlier entrant's are
    measured once (the first name kept)."""
    started = time.perf_counter()
    expected = expected_cost_model(model)
    entrants, dropped, alias = _distinct(task_plans)
    plans = [e.plan for e in entrants]
    kernels = [plan_kernels(p) for p in plans]  # per plan, per device: (key, task, tables) of each kernel
    jobs = {key: (at, tables) for per_plan in kernels for device in per_plan for key, at, tables in device}
    task = entrants[0].plan.task
    protocol = f"warmup {config.warmup} iters {config.iters} {task.training.optimizer}"
    readings = Readings(config.readings, config.device, protocol)
    evaluator = config.evaluator()
    stopped, rounds = "rounds", 0
    pin = pinned(config.pin, config.executor)
    # a bar on a terminal (the kernels of every round at most; a leader may end the rounds early)
    bar = progress_bar(total=config.rounds * len(jobs), desc="autotune", unit=" kernels", enabled=sys.stderr.isatty())
    with bar, open_executor(config.executor, config.device, config.timeout_s, pin=pin) as pool:
        for r in range(config.rounds):
            todo = {key: job for key, job in jobs.items() if readings.quiet_count(key) <= r}
            bar.update(len(jobs) - len(todo))  # read before, kept in the readings
            waited = 0
            while todo:
                what = "autotune: a device measurement failed"
                answers = measure_tables(todo, evaluator, pool, what=what, done=lambda: bar.update(1))
                for key, (answer,) in answers.items():
                    readings.add(key, float(answer.total_ms), not answer.quiet)
                todo = {key: job for key, job in todo.items() if readings.quiet_count(key) <= r}
                wait = retake_wait(waited, time.perf_counter() - started, config.budget_s)
                if todo and wait is None:  # the machine stayed busy past the budget: this round's busy ones stand
                    break
                if todo:
                    progress_lines(logger)(
                        f"autotune: {len(todo)} kernels read on a busy machine; read again in {wait:.0f} s"
                    )
                    time.sleep(wait)
                    waited += 1
            rounds = r + 1
            steps, _ = _round_steps(plans, kernels, readings, expected, rounds)
            progress(rounds, config.rounds, entrants, steps)
            stopped = "busy" if todo else _stop(steps, rounds, config, time.perf_counter() - started) or stopped
            if stopped != "rounds":
                break
    steps, busy_rounds = _round_steps(plans, kernels, readings, expected, rounds)
    medians = np.median(steps, axis=1)
    pick = model_pick(entrants)
    best, kept = decide(steps, busy_rounds, pick, [e.name for e in entrants])
    compute = _compute(plans, kernels, readings, rounds)[0]
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
    busy = sum(any(readings.taken(key, rounds)[1]) for key in jobs)
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
        model_pick=entrants[pick].name,
        kept_pick=kept,
    )
    return dataclasses.replace(plans[best], autotune=record), record


def _compute(plans: list[Plan], kernels: list, readings: Readings, rounds: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Per plan f64[R, N]: each device's measured compute in each round (its kernels' readings summed, divided by
    the device's speed; ``Readings.taken``: quiet readings first); and bool[K, R]: the rounds of each plan that hold
    a reading taken on a busy machine."""
    out, busy = [], np.zeros((len(plans), rounds), bool)
    for i, (plan, per_plan) in enumerate(zip(plans, kernels)):
        speeds = plan.task.speeds()
        ms = np.zeros((rounds, plan.task.num_devices))
        for d, device in enumerate(per_plan):
            for key, _, _ in device:
                taken, flags = readings.taken(key, rounds)
                ms[:, d] += np.asarray(taken) / speeds[d]
                busy[i] |= np.asarray(flags, bool)
        out.append(ms)
    return out, busy


def _round_steps(plans, kernels, readings: Readings, expected: CostModel, rounds: int):
    """f64[K, R]: each candidate's step in each round: its measured compute, the model's comm (straggler waits
    from the measured compute), the slowest device's total; and bool[K, R], the rounds read on a busy machine."""
    compute, busy = _compute(plans, kernels, readings, rounds)
    steps = [np.asarray(plan_cost_ms(simulate(expected, [p] * rounds, c)), np.float64) for p, c in zip(plans, compute)]
    return np.stack(steps), busy


RETAKE_WAITS_S = (2.0, 5.0, 10.0, 20.0, 30.0)  # the waits before busy readings are taken again, then the last again


def retake_wait(waited: int, elapsed_s: float, budget_s: float) -> float | None:
    """Seconds to wait before the kernels read on a busy machine are read again (the ``waited``-th wait of this
    round), or None where the wait and a reading would pass ``budget_s``."""
    wait = RETAKE_WAITS_S[min(waited, len(RETAKE_WAITS_S) - 1)]
    return None if elapsed_s + wait >= budget_s else wait


def model_pick(entrants: list[Entrant]) -> int:
    """The candidate the model scores cheapest (the first of equals): the plan a measurement must beat."""
    return int(np.argmin([e.plan.costs.cost_ms if e.plan.costs else np.inf for e in entrants]))


def decide(steps: np.ndarray, busy: np.ndarray | None, pick: int, names: list[str]) -> tuple[int, str | None]:
    """The candidate returned (``steps`` f64[K, R], ``busy`` bool[K, R] or None) and, where the model's ``pick`` is
    kept over one measured faster, why. Noise never overrules the model: the fastest by median replaces the pick only
    where its slowest round beats the pick's fastest (it leads beyond the spread of both) and neither was read on a
    busy machine."""
    medians = np.median(steps, axis=1)
    fastest = int(np.argmin(medians))
    if fastest == pick or medians[fastest] >= medians[pick]:
        return pick, None
    lead = f"{names[fastest]} measured {100 * (1 - medians[fastest] / medians[pick]):.1f}% faster"
    if busy is not None and (busy[fastest].any() or busy[pick].any()):
        return pick, f"{lead}, read on a busy machine: the model's pick kept"
    if steps[fastest].max() >= steps[pick].min():
        low, high = steps[[fastest, pick]].min(axis=1), steps[[fastest, pick]].max(axis=1)
        spread = f"{low[0]:.3f}-{high[0]:.3f} vs {low[1]:.3f}-{high[1]:.3f} ms"
        return pick, f"{lead}, within the rounds' spread ({spread}): the model's pick kept"
    return fastest, None


def _stop(steps: np.ndarray, rounds: int, config: AutotuneConfig, elapsed_s: float) -> str | None:
    """Why measuring ends after this round (``steps`` f64[K, R]: each candidate's step in each round so far), or None:
    ``alone`` (one candidate: nothing to choose between, one reading for the record), ``leader`` (from round
    ``min_rounds``, one leads beyond the noise), ``budget`` (``budget_s`` spent)."""
    if len(steps) == 1:
        return "alone"
    if rounds >= min(config.min_rounds, config.rounds) and _leads(steps, int(np.argmin(np.median(steps, axis=1)))):
        return "leader"
    if elapsed_s > config.budget_s:
        return "budget"
    return None


def _leads(steps: np.ndarray, leader: int) -> bool:
    """The leader's slowest round is faster than every other candidate's fastest: it leads beyond the noise."""
    others = np.delete(steps, leader, axis=0)
    return bool(steps[leader].max() < others.min(axis=1).min())


def progress(done: int, rounds: int, entrants: list[Entrant], steps: np.ndarray) -> None:
    """One progress line per round (``core.progress``: an INFO record; the commands show it on stderr): the
    candidates' median measured steps so far."""
    medians = np.median(steps, axis=1)
    shown = ", ".join(f"{e.name} {m:.3f}" for e, m in zip(entrants, medians))
    progress_lines(logger)(f"autotune: round {done}/{rounds}: {shown} ms")


def first_line(err: Exception) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0]


def _distinct(task_plans: list[Entrant]) -> tuple[list[Entrant], list[MeasuredCandidate], dict[str, str]]:
    """The entrants with a plan, each plan once (the first name kept); the others as dropped candidates; and each
    repeat's name -> the name its plan is measured under."""
    entrants, dropped, seen, alias = [], [], {}, {}
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
    return entrants, dropped, alias


def rank_cores(world: int) -> list[int] | None:
    """A core of its own for each of ``world`` ranks where this process may use that many, else None (the ranks
    share the cores: a step's time is then the ranks' work time-sliced, which cannot show balance)."""
    cores = sorted(os.sched_getaffinity(0))
    return cores[:world] if len(cores) >= world else None


class StepRunner(Protocol):
    """Where ``autotune_steps`` runs its candidates' training steps: gloo ranks started on this machine
    (``LocalRanks``), or every rank of a live process group (``torchrec.group_steps.GroupSteps``: each rank runs
    ``autotune_steps`` with the same candidates, so every answer must be the same on every rank)."""

    device: str  # the ranks' compute device
    pinned: bool  # each rank has a core (or a GPU) of its own: balance shows in the step

    def admits(self, plan: Plan) -> str | None:
        """Why ``plan``'s ranks would not fit the memory they have, or None."""

    def step_ms(self, plan: Plan, warmup: int, steps: int) -> float:
        """The median over ``steps`` timed steps (after ``warmup``) of the slowest rank's step; UserError (one line)
        where the candidate fails."""

    def elapsed_s(self) -> float:
        """Wall seconds since the measuring started."""

    def says(self) -> bool:
        """Whether this process reports progress (one process of the ranks)."""


class LocalRanks:
    """``StepRunner`` of gloo ranks started on this machine for each candidate (``training_steps.dmp_steps``), a
    core per rank where the machine has them (``pin``: None or True pins where it can, False never)."""

    device = "cpu"

    def __init__(self, world: int, config: AutotuneConfig):
        self.cores = rank_cores(world) if config.pin is not False else None
        self.pinned = self.cores is not None
        self.room = available_bytes()
        self.timeout_s = config.timeout_s
        self.started = time.perf_counter()

    def admits(self, plan: Plan) -> str | None:
        """Why ``plan``'s ranks would not fit this machine: their modules (``Plan.memory``) and the rank processes
        themselves (``RANK_PROCESS_BYTES`` each), against ``MEMORY_SHARE`` of the available memory; or None."""
        ranks = plan.task.num_devices
        need = sum(part.total for part in plan.memory()) + ranks * RANK_PROCESS_BYTES
        if self.room is not None and need > MEMORY_SHARE * self.room:
            room = self.room / GIB_BYTES
            return (
                f"its {ranks} ranks need about {need / GIB_BYTES:.1f} GiB (modules and {ranks} rank processes), this "
                f"machine has {room:.1f} GiB available"
            )
        return None

    def step_ms(self, plan: Plan, warmup: int, steps: int) -> float:
        [result] = dmp_steps([plan], warmup, steps, self.timeout_s, self.cores)
        return float(result["step_ms"])

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def says(self) -> bool:
        return True


def autotune_steps(
    task_plans: list[Entrant], config: AutotuneConfig, runner: StepRunner | None = None
) -> tuple[Plan, AutotuneRecord]:
    """The fastest of ``task_plans`` in full training steps: each round runs every candidate in
    DistributedModelParallel on ``runner``'s ranks (default ``LocalRanks``: gloo ranks started here, one candidate's
    modules at a time, built, timed for ``steps`` steps after ``step_warmup``, freed), the candidates' order rotated
    per round. A candidate whose ranks would not fit their memory is not started; one that fails (out of memory, a
    collective error) is dropped with one line and the others go on. Rounds stop as ``autotune_kernels``' do; the
    least median step replaces the model's pick only where it leads beyond the spread of both (``decide``)."""
    entrants, dropped, alias = _distinct(task_plans)
    pick = entrants[model_pick(entrants)]
    entrants = [pick, *(e for e in entrants if e is not pick)]  # the model's pick is measured first, whatever else
    runner = runner or LocalRanks(entrants[0].plan.task.num_devices, config)
    warn = logger.warning if runner.says() else logger.debug
    protocol = f"steps warmup {config.step_warmup} steps {config.steps} pinned {runner.pinned}"
    readings = Readings(config.readings, runner.device, protocol)
    keys = {e.name: plan_digest(e.plan) for e in entrants}
    runs: dict[str, list[float]] = {}
    for entrant in entrants:
        why = runner.admits(entrant.plan)
        if why is not None:
            warn(f"autotune: {entrant.name} not started: {why}")
            dropped.append(MeasuredCandidate(name=entrant.name, kept=False, why=why))
        else:
            runs[entrant.name] = list(readings.ms.get(keys[entrant.name], []))
    by_name = {e.name: e for e in entrants}
    stopped, rounds = "rounds", 0
    for r in range(config.rounds):
        names = list(runs)
        for name in names[r % len(names) :] + names[: r % len(names)] if names else []:
            if len(runs[name]) > r:  # read before this run: kept in the readings
                continue
            if runner.elapsed_s() > config.budget_s and (r > 0 or name != names[0]):
                stopped = "budget"
                break
            try:
                ms = runner.step_ms(by_name[name].plan, config.step_warmup, config.steps)
            except UserError as err:  # this candidate fails here: dropped, the others go on
                why = first_line(err)
                warn(f"autotune: {name} dropped: {why}")
                dropped.append(MeasuredCandidate(name=name, kept=False, why=why))
                del runs[name]
                continue
            runs[name].append(ms)
            readings.add(keys[name], ms, False)
        if not runs:
            raise UserError(f"autotune=steps: no candidate ran ({'; '.join(str(d.why) for d in dropped)})")
        if stopped == "budget":  # past the budget mid-round: the round is left out, or in round 0 the unread
            if r == 0:
                for name in [n for n in runs if not runs[n]]:
                    why = f"not started within autotune.budget_s ({config.budget_s:g} s)"
                    dropped.append(MeasuredCandidate(name=name, kept=False, why=why))
                    del runs[name]
                rounds = 1
            runs = {name: ms[:rounds] for name, ms in runs.items()}
            break
        rounds = r + 1
        steps = np.array([runs[name][:rounds] for name in runs])  # resumed readings of later rounds wait their turn
        if runner.says():
            progress(rounds, config.rounds, [by_name[n] for n in runs], steps)
        stopped = _stop(steps, rounds, config, runner.elapsed_s()) or stopped
        if stopped != "rounds":
            break
    runs = {name: ms[:rounds] for name, ms in runs.items()}
    names = list(runs)
    steps = np.array([runs[n] for n in names])
    medians = np.median(steps, axis=1)
    index, kept = decide(steps, None, names.index(pick.name) if pick.name in runs else 0, names)
    best = names[index]
    measured = [
        MeasuredCandidate(
            name=n,
            searcher=by_name[n].plan.searcher,
            predicted_ms=float(by_name[n].plan.costs.cost_ms),
            measured_ms=float(m),
            low_ms=float(min(runs[n])),
            high_ms=float(max(runs[n])),
            kept=True,
        )
        for n, m in zip(names, medians)
    ]
    default = dict(zip(names, medians)).get(alias.get("torchrec_default", "torchrec_default"))
    record = AutotuneRecord(
        mode="steps",
        candidates=(*measured, *dropped),
        chosen=best,
        vs_torchrec_default=None if default is None else float(medians[index] / default),
        model_pick=pick.name,
        kept_pick=kept,
        rounds=rounds,
        stopped=stopped,
        devices=entrants[0].plan.task.num_devices,
        seconds=runner.elapsed_s(),
        resumed=readings.resumed,
        warmup=config.step_warmup,
        iters=config.steps,
        device=runner.device,
        pinned=runner.pinned,
    )
    return dataclasses.replace(by_name[best].plan, autotune=record), record
