"""``autotune=steps``: the candidates timed in full training steps, DistributedModelParallel on gloo ranks
(``LocalRanks``: started on this machine) or on every rank of a live process group (``torchrec.group_steps``).
Rounds, readings and the rule that noise never overrules the model are ``measure.autotune``'s; what differs is what a
reading is (a candidate's step, its slowest rank's) and what a candidate costs to start (its ranks' processes and
modules).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Protocol

import numpy as np

from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.hardware import MEMORY_SHARE, RANK_PROCESS_BYTES, OtherLoad, available_bytes
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.records import AutotuneRecord, MeasuredCandidate
from neuroshard_jax.measure.autotune import (
    AutotuneConfig,
    Entrant,
    Readings,
    decide,
    distinct,
    first_line,
    model_pick,
    plan_digest,
    progress,
    retake_wait,
    stop_reason,
)
from neuroshard_jax.measure.training_steps import dmp_steps

logger = logging.getLogger(__name__)


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
    busy: bool  # the last ``step_ms`` was read while other work loaded this machine's cores (it is read again)

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
    core per rank where the machine has them (``pin``: None or True pins where it can, False never). A step is busy
    where other processes took more than a tenth of a core of this process's cores while it was read
    (``hardware.OtherLoad``: the ranks wait in their collectives, so their own CPU share cannot say it)."""

    device = "cpu"
    busy = False

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
        with OtherLoad(self.cores) as load:  # the ranks' cores: a job on another core does not slow them
            [result] = dmp_steps([plan], warmup, steps, self.timeout_s, self.cores)
        self.busy = load.busy
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
    collective error) is dropped with one line and the others go on. A step read while other work loaded the machine
    (``runner.busy``) is read again after a wait while the budget lasts; where one stands, measuring stops (``busy``)
    and it cannot replace the model's pick. Rounds stop as ``autotune_kernels``' do; the least median step replaces
    the model's pick only where it leads beyond the spread of both, read quiet (``decide``)."""
    entrants, dropped, alias = distinct(task_plans)
    pick = entrants[model_pick(entrants)]
    entrants = [pick, *(e for e in entrants if e is not pick)]  # the model's pick is measured first, whatever else
    runner = runner or LocalRanks(entrants[0].plan.task.num_devices, config)
    warn = logger.warning if runner.says() else logger.debug
    protocol = f"steps warmup {config.step_warmup} steps {config.steps} pinned {runner.pinned}"
    readings = Readings(config.readings, runner.device, protocol)
    keys = {e.name: plan_digest(e.plan) for e in entrants}
    live: list[str] = []
    for entrant in entrants:
        why = runner.admits(entrant.plan)
        if why is not None:
            warn(f"autotune: {entrant.name} not started: {why}")
            dropped.append(MeasuredCandidate(name=entrant.name, kept=False, why=why))
        else:
            live.append(entrant.name)
    by_name = {e.name: e for e in entrants}
    stopped, rounds = "rounds", 0
    for r in range(config.rounds):
        names = list(live)
        busy_left = False
        for name in names[r % len(names) :] + names[: r % len(names)] if names else []:
            if readings.quiet_count(keys[name]) > r:  # read quiet before this run: kept in the readings
                continue
            if runner.elapsed_s() > config.budget_s and (r > 0 or name != names[0]):
                stopped = "budget"
                break
            try:
                busy_left |= _read_step(runner, by_name[name].plan, keys[name], readings, config, warn, name)
            except UserError as err:  # this candidate fails here: dropped, the others go on
                why = first_line(err)
                warn(f"autotune: {name} dropped: {why}")
                dropped.append(MeasuredCandidate(name=name, kept=False, why=why))
                live.remove(name)
                continue
        if not live:
            raise UserError(f"autotune=steps: no candidate ran ({'; '.join(str(d.why) for d in dropped)})")
        if stopped == "budget":  # past the budget mid-round: the round is left out, or in round 0 the unread
            if r == 0:
                for name in [n for n in live if not readings.count(keys[n])]:
                    why = f"not started within autotune.budget_s ({config.budget_s:g} s)"
                    dropped.append(MeasuredCandidate(name=name, kept=False, why=why))
                    live.remove(name)
                rounds = 1
            break
        rounds = r + 1
        steps, _ = _taken(live, keys, readings, rounds)  # resumed readings of later rounds wait their turn
        if runner.says():
            progress(rounds, config.rounds, [by_name[n] for n in live], steps)
        stopped = "busy" if busy_left else stop_reason(steps, rounds, config, runner.elapsed_s()) or stopped
        if stopped != "rounds":
            break
    names = list(live)
    steps, busy = _taken(names, keys, readings, rounds)
    medians = np.median(steps, axis=1)
    index, kept = decide(steps, busy, names.index(pick.name) if pick.name in live else 0, names)
    best = names[index]
    measured = [
        MeasuredCandidate(
            name=n,
            searcher=by_name[n].plan.searcher,
            predicted_ms=float(by_name[n].plan.costs.cost_ms),
            measured_ms=float(m),
            low_ms=float(steps[i].min()),
            high_ms=float(steps[i].max()),
            kept=True,
        )
        for i, (n, m) in enumerate(zip(names, medians))
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
        busy=int(busy.any(axis=1).sum()),
        warmup=config.step_warmup,
        iters=config.steps,
        device=runner.device,
        pinned=runner.pinned,
    )
    return by_name[best].plan.with_record(AutotuneRecord, record), record


def _read_step(runner: StepRunner, plan: Plan, key: str, readings: Readings, config, warn, name: str) -> bool:
    """One round's step of a candidate, read again after a wait (``retake_wait``) while it reads busy and the budget
    allows; whether the reading that stands is busy."""
    waited = 0
    while True:
        ms = runner.step_ms(plan, config.step_warmup, config.steps)
        readings.add(key, ms, runner.busy)
        if not runner.busy:
            return False
        wait = retake_wait(waited, runner.elapsed_s(), config.budget_s)
        if wait is None:  # the machine stayed busy past the budget: this reading stands, and says so
            return True
        warn(f"autotune: {name}'s step read on a busy machine; read again in {wait:.0f} s")
        time.sleep(wait)
        waited += 1


def _taken(names: list[str], keys: dict[str, str], readings: Readings, rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """f64[K, R] and bool[K, R]: each candidate's ``rounds`` steps (its quiet readings first) and which are busy."""
    taken = [readings.taken(keys[n], rounds) for n in names]
    return np.array([ms for ms, _ in taken], np.float64), np.array([b for _, b in taken], bool)
