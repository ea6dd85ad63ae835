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
(``warmup`` + ``iters`` iterations): docs/autotune.md. ``autotune=loop`` goes on from there (``_loop``): the model
tuned on the measured devices (``costs.task_tune``) searches again and its new plans are measured the same way.
``autotune=steps``: ``measure.autotune_steps``.

Why one module of ~530 lines: kernels and loop are one measuring (the same rounds, readings, retakes and rule of
choice, ``KernelRounds`` and ``decide``); the loop only adds plans to what is measured.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import numpy as np

from neuroshard_jax.core.config import bounded, nearest
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.hardware import (
    hardware,
    hardware_kind,
)
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.progress import progress_bar, progress_lines
from neuroshard_jax.core.records import AutotuneRecord, LoopRecord, MeasuredCandidate
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import CostModel, plan_cost_ms, table_keys
from neuroshard_jax.costs.scoring import balanced_step, device_width, plan_arrays, with_costs
from neuroshard_jax.costs.task_tune import tuned_on_devices
from neuroshard_jax.kernels.executors import ExecutorConfig, open_executor, pinned
from neuroshard_jax.measure.evaluator import Measuring, measure_tables, plan_kernels
from neuroshard_jax.measure.polish import simulate
from searchers import searcher_names

logger = logging.getLogger(__name__)

MODES = ("off", "kernels", "steps", "loop")
MIN_ROUNDS = 2
BASELINES = ("torchrec_default", "torchrec")  # TorchRec's planner as its users get it, and table-wise + column-wise


@dataclasses.dataclass(frozen=True)
class AutotuneConfig(Measuring):
    """conf/autotune/*.yaml (``name``: off | kernels | steps | loop). ``device``: where the kernels run, the plan's own
    (the planner refuses another); ``steps`` always runs its gloo ranks on this machine's CPU."""

    modes: ClassVar[tuple[str, ...]] = MODES  # what ``name`` may be

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
    searches: int = bounded(at_least=1, default=3)  # loop: searches with the model tuned on the measured devices
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


def _reading(line: bytes) -> JSONDoc | None:
    """A readings file's line as a reading (key, ms: a finite time >= 0, busy, kind), or None."""
    try:
        row = json.loads(line.decode("utf-8"))
        ms = float(row["ms"])
        if not (isinstance(row["key"], str) and isinstance(row["kind"], str) and isinstance(row["busy"], bool)):
            return None
    except (ValueError, KeyError, TypeError, RecursionError, UnicodeDecodeError):
        return None
    return row if np.isfinite(ms) and ms >= 0 else None


Search = Callable[[CostModel], list[Entrant]]  # autotune=loop's search: a model -> its best plans of the task


def autotune_kernels(
    task_plans: list[Entrant], model: CostModel, config: AutotuneConfig, search: Search | None = None
) -> tuple[Plan, AutotuneRecord]:
    """The measured fastest of ``task_plans`` (plans of one task, the model's costs on them; entrants without a plan
    are recorded as dropped) and the record of what was measured. Plans that repeat an earlier entrant's are
    measured once (the first name kept). ``autotune=loop`` with ``search``: then measure, learn, search again
    (``_loop``)."""
    started = time.perf_counter()
    expected = model.expected
    entrants, dropped, alias = distinct(task_plans)
    task = entrants[0].plan.task
    protocol = f"warmup {config.warmup} iters {config.iters} {task.training.optimizer}"
    bench = KernelRounds(config, Readings(config.readings, config.device, protocol), started)
    pick = model_pick(entrants)
    loop = None
    pin = pinned(config.pin, config.executor)
    with bench.bar(entrants), open_executor(config.executor, config.device, config.timeout_s, pin=pin) as pool:
        rounds, stopped = 0, "rounds"
        for r in range(config.rounds):
            busy_left = bench.read_round(entrants, r, pool)
            rounds = r + 1
            steps, _ = bench.steps(entrants, expected, rounds)
            progress(rounds, config.rounds, entrants, steps)
            stopped = "busy" if busy_left else stop_reason(steps, rounds, config, bench.elapsed_s()) or stopped
            if stopped != "rounds":
                break
        if config.name == "loop" and search is not None and stopped != "busy":
            entrants, loop = _loop(entrants, model, expected, config, search, bench, pool, rounds)
            stopped = loop.stopped
    steps, busy_rounds = bench.steps(entrants, expected, rounds)
    medians = np.median(steps, axis=1)
    best, kept = decide(steps, busy_rounds, pick, [e.name for e in entrants])
    compute = bench.compute(entrants, rounds)[0]
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
    jobs = bench.jobs(entrants)
    busy = sum(any(bench.readings.taken(key, rounds)[1]) for key in jobs)
    record = AutotuneRecord(
        mode=config.name if config.name == "loop" else "kernels",
        candidates=(*measured, *dropped),
        chosen=entrants[best].name,
        vs_torchrec_default=None if default is None else float(medians[best] / default.measured_ms),
        rounds=rounds,
        stopped=stopped,
        devices=len(jobs),
        resumed=bench.readings.resumed,
        busy=busy,
        seconds=time.perf_counter() - started,
        warmup=config.warmup,
        iters=config.iters,
        device=config.device,
        model_pick=entrants[pick].name,
        kept_pick=kept,
        bound_ms=bench.bound(entrants, expected, rounds),
        loop=loop,
    )
    return entrants[best].plan.with_record(AutotuneRecord, record), record


class KernelRounds:
    """The kernels of candidate plans measured in interleaved rounds (round r + 1 of every kernel after round r of
    all), each reading kept in ``readings``; a kernel read on a busy machine read again while the budget lasts."""

    def __init__(self, config: AutotuneConfig, readings: Readings, started: float):
        self.config, self.readings, self.started = config, readings, started
        self.evaluator = config.evaluator()
        self._kernels: dict[int, list] = {}  # per plan (by id), per device: (key, task, tables) of each kernel
        self._bar = None

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def kernels(self, entrant: Entrant) -> list:
        if id(entrant.plan) not in self._kernels:
            self._kernels[id(entrant.plan)] = plan_kernels(entrant.plan)
        return self._kernels[id(entrant.plan)]

    def jobs(self, entrants: list[Entrant]) -> dict[str, tuple[Task, list]]:
        return {key: (at, t) for e in entrants for device in self.kernels(e) for key, at, t in device}

    def bar(self, entrants: list[Entrant]):
        """A bar on a terminal (the kernels of every round at most; a leader may end the rounds early)."""
        total = self.config.rounds * len(self.jobs(entrants))
        self._bar = progress_bar(total=total, desc="autotune", unit=" kernels", enabled=sys.stderr.isatty())
        return self._bar

    def read_round(self, entrants: list[Entrant], r: int, pool) -> int:
        """Round ``r`` of every kernel of ``entrants`` that lacks a quiet reading of it; the kernels still busy when
        the budget ran out (0: the round is quiet)."""
        jobs = self.jobs(entrants)
        todo = {key: job for key, job in jobs.items() if self.readings.quiet_count(key) <= r}
        if self._bar is not None:
            self._bar.update(len(jobs) - len(todo))  # read before, kept in the readings
        waited = 0
        while todo:
            what = "autotune: a device measurement failed"
            done = (lambda: self._bar.update(1)) if self._bar is not None else None
            answers = measure_tables(todo, self.evaluator, pool, what=what, done=done)
            for key, (answer,) in answers.items():
                self.readings.add(key, float(answer.total_ms), not answer.quiet)
            todo = {key: job for key, job in todo.items() if self.readings.quiet_count(key) <= r}
            wait = retake_wait(waited, self.elapsed_s(), self.config.budget_s)
            if todo and wait is None:  # the machine stayed busy past the budget: this round's busy ones stand
                break
            if todo:
                progress_lines(logger)(
                    f"autotune: {len(todo)} kernels read on a busy machine; read again in {wait:.0f} s"
                )
                time.sleep(wait)
                waited += 1
        return len(todo)

    def compute(self, entrants: list[Entrant], rounds: int) -> tuple[list[np.ndarray], np.ndarray]:
        return _compute([e.plan for e in entrants], [self.kernels(e) for e in entrants], self.readings, rounds)

    def steps(self, entrants: list[Entrant], expected: CostModel, rounds: int) -> tuple[np.ndarray, np.ndarray]:
        return _round_steps(
            [e.plan for e in entrants], [self.kernels(e) for e in entrants], self.readings, expected, rounds
        )

    def bound(self, entrants: list[Entrant], expected: CostModel, rounds: int) -> float:
        """The task's balance bound from what was measured: the least over the candidates of their median measured
        compute and all-to-all widths spread evenly over the devices (``scoring.balanced_step``)."""
        compute = self.compute(entrants, rounds)[0]
        return min(balanced_step(expected, e.plan, np.median(c, axis=0).tolist()) for e, c in zip(entrants, compute))


def _loop(
    entrants: list[Entrant],
    model: CostModel,
    expected: CostModel,
    config: AutotuneConfig,
    search: Search,
    bench: KernelRounds,
    pool,
    rounds: int,
) -> tuple[list[Entrant], LoopRecord]:
    """``autotune=loop`` after the first rounds: learn from every device measured (the model tuned on them,
    ``task_tune``), search again with it, measure the new plans' new kernels only (as many rounds as the others), and
    repeat until the search finds nothing new, the measured fastest stops improving beyond the rounds' noise, it is
    within the noise of the task's balance bound, ``searches`` are done or the budget is spent."""
    fits, stopped, searches = [], "searches", 0
    keys = table_keys(entrants[0].plan.task.features())  # the task's tables, as the per-table correction knows them
    for it in range(1, config.searches + 1):
        steps, _ = bench.steps(entrants, expected, rounds)
        medians = np.median(steps, axis=1)
        noise = float(np.median((steps.max(axis=1) - steps.min(axis=1)) / medians))
        bound = bench.bound(entrants, expected, rounds)
        if medians.min() <= bound * (1 + noise):
            stopped = "bound"
            break
        if bench.elapsed_s() > config.budget_s:
            stopped = "budget"
            break
        feats, mask, measured = _measured_devices(entrants, bench, rounds)
        tuned, fit = tuned_on_devices(model, feats, mask, measured, keys, it)
        fits.append(fit)
        searches = it
        seen = {_placement(e.plan) for e in entrants}
        new = [
            Entrant(f"loop{it}:{e.name}", e.plan)
            for e in search(tuned)
            if e.plan is not None and _placement(e.plan) not in seen
        ]
        new = list({_placement(e.plan): e for e in new}.values())
        if not new:
            stopped = "converged"
            break
        # priced by the model as given (the record's predicted ms compare alike), measured like the first candidates
        new = [dataclasses.replace(e, plan=with_costs(expected, e.plan)) for e in new]
        for r in range(rounds):
            if bench.read_round(new, r, pool):
                stopped = "busy"
                break
        entrants = entrants + new
        if stopped == "busy":
            break
        after = np.median(bench.steps(entrants, expected, rounds)[0], axis=1)
        progress_lines(logger)(
            f"autotune: search {it}: {len(new)} new plan(s), the fastest {after[-len(new) :].min():.3f} ms against "
            f"{medians.min():.3f} ms before (bound {bound:.3f} ms; {fit.words()})"
        )
        if after[-len(new) :].min() >= medians.min() * (1 - noise):
            stopped = "no better"
            break
    # the last fit's figures: ``TaskFit``'s fields are the record's
    loop = LoopRecord(searches=searches, stopped=stopped, **(dataclasses.asdict(fits[-1]) if fits else {}))
    return entrants, loop


def _placement(plan: Plan):
    return frozenset(plan.shards), plan.data_parallel


def _measured_devices(entrants: list[Entrant], bench: KernelRounds, rounds: int):
    """Every distinct measured device of the candidates (by its kernels): features f32[D, T, F], mask, and its median
    measured compute, ms."""
    compute = bench.compute(entrants, rounds)[0]
    width = max(device_width(e.plan) for e in entrants)
    seen, feats, mask, measured = set(), [], [], []
    for e, c in zip(entrants, compute):
        arrays = plan_arrays(e.plan, None, width)
        for d, device in enumerate(bench.kernels(e)):
            key = tuple(k for k, _, _ in device)
            ms = float(np.median(c[:, d])) * e.plan.task.speeds()[d]
            if key and key not in seen and ms > 0:
                seen.add(key)
                feats.append(arrays.feats[d])
                mask.append(arrays.table_mask[d])
                measured.append(ms)
    return np.stack(feats), np.stack(mask), np.asarray(measured)


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


def stop_reason(steps: np.ndarray, rounds: int, config: AutotuneConfig, elapsed_s: float) -> str | None:
    """Why measuring ends after this round (``steps`` f64[K, R]: each candidate's step in each round so far), or None:
    ``alone`` (one candidate: nothing to choose between, one reading for the record), ``leader`` (from round
    ``min_rounds``, one leads beyond the noise), ``budget`` (``budget_s`` spent)."""
    if len(steps) == 1 and config.name != "loop":  # a loop searches on from one plan: its rounds give the noise
        return "alone"
    if rounds >= min(config.min_rounds, config.rounds) and _leads(steps, int(np.argmin(np.median(steps, axis=1)))):
        return "leader"
    if elapsed_s > config.budget_s:
        return "budget"
    return None


def _leads(steps: np.ndarray, leader: int) -> bool:
    """The leader's slowest round is faster than every other candidate's fastest: it leads beyond the noise."""
    others = np.delete(steps, leader, axis=0)
    if not len(others):  # alone (a loop's first plan): it leads once its rounds show the noise
        return True
    return bool(steps[leader].max() < others.min(axis=1).min())


def progress(done: int, rounds: int, entrants: list[Entrant], steps: np.ndarray) -> None:
    """One progress line per round (``core.progress``: an INFO record; the commands show it on stderr): the
    candidates' median measured steps so far."""
    medians = np.median(steps, axis=1)
    shown = ", ".join(f"{e.name} {m:.3f}" for e, m in zip(entrants, medians))
    progress_lines(logger)(f"autotune: round {done}/{rounds}: {shown} ms")


def first_line(err: Exception) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0]


def distinct(task_plans: list[Entrant]) -> tuple[list[Entrant], list[MeasuredCandidate], dict[str, str]]:
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
