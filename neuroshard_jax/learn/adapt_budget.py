"""The clock of an ``adapt`` run: the seconds each stage spends, kept as they pass, and what a budget must hold.

``adapt.json`` keeps ``spent_s`` per stage. While a stage runs, ``Ledger.stage`` rewrites it every ``TICK_S``, so a
run stopped in any way (``kill -9`` included) loses at most that much of it, and a rerun spends only what is left
of its budget. What a stage costs is estimated from what it cost on this machine before (``Rates``: seconds per
label, per plan task, per fine-tune), else from ``FIRST_GUESS_S``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, read_json, write_json

logger = logging.getLogger(__name__)

TICK_S = 1.0  # adapt.json's spent time is rewritten this often while a stage runs
# What a stage costs before this machine has done it once, from the 2-core AMD EPYC (family 25 model 17): an
# input-distribution label 1.4 s, a searcher's search of a plan task about 7 s, a fine-tune on a few dozen labels and
# its report 6-8 s, a measuring call's start (two workers, the start model's first scores) 8-9 s; rounded up. A spec
# label's own cost (1.4-1.6 s wall on two workers there) is timed on the first labels, before the budget is judged.
FIRST_GUESS_S = {"inputs": 1.5, "search": 8.0, "fit": 15.0, "start": 8.0}
FASTEST_SPEC_S = 0.05  # no spec label is cheaper than this on any device: a budget below even that is refused at once
REPORT_S = 5.0  # of the fine-tune's time: scoring the held-out labels and registering, after the last epoch


class Ledger:
    """The seconds each stage of a run spent, kept in ``path`` (adapt.json's ``spent_s``) beside what else the file
    holds (the last report)."""

    def __init__(self, path: Path):
        self.path = path
        self.state: dict = read_json(path, "out", "adapt.json written by neuroshard_jax.adapt") if path.exists() else {}
        self.spent: dict[str, float] = {k: float(v) for k, v in self.state.get("spent_s", {}).items()}
        self._lock = threading.Lock()

    def total(self) -> float:
        return sum(self.spent.values())

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Count the time spent inside as ``name``'s, written every ``TICK_S`` and at the end (a stop included)."""
        started, before = time.monotonic(), self.spent.get(name, 0.0)
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(TICK_S):
                try:
                    self._write(name, before + time.monotonic() - started)
                except UserError as err:  # a full disk: the stage goes on, the end of it writes again
                    logger.warning(f"adapt: the time spent could not be recorded: {err}")

        ticker = threading.Thread(target=tick, name=f"adapt-ledger-{name}", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()
            self._write(name, before + time.monotonic() - started)

    def note(self, key: str, value) -> None:
        """Keep ``key`` in the file (a figure measured on the way: what a measuring call's start costs)."""
        with self._lock:
            self.state = {**self.state, key: value}
            write_json({**self.state, "spent_s": self._rounded()}, self.path)

    def finish(self, report: dict) -> None:
        """The run's report becomes the file, with the time spent."""
        with self._lock:
            noted = {k: self.state[k] for k in ("start_s",) if k in self.state}
            self.state = {**noted, **report, "spent_s": self._rounded()}
            write_json(self.state, self.path)

    def _write(self, name: str, seconds: float) -> None:
        with self._lock:
            self.spent[name] = seconds
            write_json({**self.state, "spent_s": self._rounded()}, self.path)

    def _rounded(self) -> JSONDoc:
        return {k: round(v, 2) for k, v in self.spent.items()}


class LabelCounts(NamedTuple):
    """What an adapt run's folders hold (``fine_tune.LabelFolders.counts``): spec labels, input labels, plan tasks."""

    specs: int
    inputs: int
    plans: int


@dataclasses.dataclass(frozen=True)
class Rates:
    """Wall seconds a stage's unit costs on this machine with the run's workers: measured where a run of this
    ``out`` did some of it (``measured``: the spec labels were), else a first guess. ``start``: a measuring call's
    own start (its workers, the start model's first scores) before its first label comes in; ``steady``: the share
    of spec labels training keeps (a busy machine's labels spread too much)."""

    spec_label: float
    start: float
    input_label: float
    plan_task: float
    fit: float
    measured: bool
    steady: float = 1.0

    @classmethod
    def of(
        cls,
        ledger: Ledger,
        counts: LabelCounts,
        spec_times: list[float],
        plan_guess: Callable[[float], float],
        steady: float = 1.0,
    ) -> Rates:
        """``counts``: the spec labels, input labels and plan tasks on disk, ``ledger`` the seconds they took;
        ``spec_times``: when each spec label came in (``flow``); ``plan_guess(spec_label_s)``: a plan task's
        seconds before one was done."""

        def rate(stage: str) -> float | None:
            done, spent = getattr(counts, stage), ledger.spent.get(stage, 0.0)
            return spent / done if done and spent > 0 else None

        spec = flow(spec_times)
        spec_s = spec if spec is not None else FASTEST_SPEC_S
        return cls(
            spec_label=spec_s,
            start=ledger.state.get("start_s", FIRST_GUESS_S["start"]),
            input_label=rate("inputs") or FIRST_GUESS_S["inputs"],
            plan_task=rate("plans") or plan_guess(spec_s),
            fit=ledger.state.get("fit_s") or FIRST_GUESS_S["fit"],
            measured=spec is not None,
            steady=steady,
        )


def flow(times: list[float]) -> float | None:
    """Wall seconds per label while labels flow: the mean gap between labels that came in one after another
    (gaps past 10x the median, another stage or run between two labels, left out); None below 3 labels."""
    gaps = np.diff(np.sort(np.asarray(times, np.float64)))
    if len(gaps) < 2:
        return None
    return float(gaps[gaps <= 10 * max(float(np.median(gaps)), 1e-3)].mean())


def minutes_up(seconds: float) -> float:
    """Seconds as minutes, rounded up to a tenth: a budget that holds them."""
    return math.ceil(seconds / 6.0 - 1e-9) / 10.0
