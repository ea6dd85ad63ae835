"""What a plan records of its measurements: measured polishing (``PolishRecord``) and the cost model's calibration
to the measuring machine (``CalibrationRecord``), frozen. ``Plan`` holds them; ``to_json`` / ``from_json`` are their
part of the plan.json contract, key for key (the fields are named as the keys, so a plan writes the bytes it wrote
when they were dicts). Records of plan files written before a field existed read with its default. Times are in
milliseconds (``*_ms``, a measured device's ``compute``, ``fwd_comm``, ``bwd_comm``, ``total``) or seconds
(``*_s``, ``seconds``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from neuroshard_jax.core.config import typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc

__all__ = [
    "RECORD_TYPES",
    "StageRecord",
    "AutotuneRecord",
    "CalibrationProtocol",
    "CalibrationRatios",
    "CalibrationRecord",
    "Candidate",
    "MeasuredCandidate",
    "MeasuredDevice",
    "PlanDevices",
    "PolishProtocol",
    "PolishRecord",
    "PolishStep",
    "PortfolioRecord",
    "ratio_errors",
]


def ratio_errors(pred, true) -> dict[str, float]:
    """The error of predictions against positive measurements, as ``PlanDevices`` and the benchmarks record it: MAPE,
    the median signed error (the bias, robust to one wild device) and the worst ratio either way, rounded to 4
    places."""
    ratio = np.asarray(pred, float) / np.asarray(true, float)
    return {
        "mape": round(float(np.mean(np.abs(ratio - 1))), 4),
        "bias": round(float(np.median(ratio - 1)), 4),
        "worst": round(float(np.max(np.maximum(ratio, 1 / ratio))), 4),
    }


def _json(value: Any) -> Any:
    """A record's value as JSON takes it: dataclasses as objects in field order, tuples as lists."""
    if dataclasses.is_dataclass(value):
        return {f.name: _json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    return value


def _parsed(cls, obj: Any, where: str):
    """``cls`` from a plan.json object (``typed``: unknown keys and wrong types refused in one line)."""
    if not isinstance(obj, dict):
        raise UserError(f"{where}: got {obj!r:.60}, expected an object")
    return typed(cls, obj, where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolishStep:
    """One measured proposal of polishing: its kind (move, swap, halve, merge, rows), the plan cost the corrected
    model estimated for it, the cost measured, the plan's cost before it, and whether it was kept."""

    change: str
    estimated_ms: float
    measured_ms: float
    before_ms: float
    kept: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolishProtocol:
    """How polishing measured a device (``PolishConfig``'s fields); ``pin``, ``anchors``: None in older files."""

    warmup: int
    iters: int
    repeats: int
    pin: bool | None = None
    anchors: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeasuredDevice:
    """A device of the polished plan as finally measured: compute (ms, its relative ``noise``), the all-to-all's
    fwd_comm and bwd_comm (ms) and their sum ``total`` (ms)."""

    device: int
    compute: float
    noise: float
    fwd_comm: float
    bwd_comm: float
    total: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolishRecord:
    """Measured polishing of a plan (``measure.polish.polish_plan``): what it measured and the fresh measured
    improvement. ``reverted``: the kept changes were undone after the fresh measurement, which put the changed plan's
    slowest device at ``rejected_measured_compute_ms`` (None: not reverted); ``drift``: per measured step, its
    anchors' median fresh / first median (1: no drift)."""

    key: ClassVar[str] = "polish"  # its plan.json key

    mode: str
    measurements: int
    time_s: float
    changes_kept: int
    reverted: bool = False
    rejected_measured_compute_ms: float | None = None
    steps: tuple[PolishStep, ...]
    protocol: PolishProtocol
    drift: tuple[float, ...] = ()
    unpolished_measured_ms: float
    measured_ms: float
    improvement: float
    unpolished_measured_compute_ms: float  # the slowest device's compute, without the comm
    measured_compute_ms: float
    compute_improvement: float
    devices: tuple[MeasuredDevice, ...]

    def to_json(self) -> JSONDoc:
        """The plan.json ``polish`` object."""
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any, where: str = "plan.polish") -> PolishRecord:
        """Parse a plan.json ``polish`` object (errors name ``where``)."""
        return _parsed(cls, obj, where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CalibrationRatios:
    """Quantiles of the measured / predicted compute of the calibration's devices."""

    p10: float
    p50: float
    p90: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class CalibrationProtocol:
    """How calibration measured (``CalibrateConfig``'s fields)."""

    device: str
    warmup: int
    iters: int
    tries: int = 1  # readings of a device at most, a busy one read again (older plan.json files: one)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanDevices:
    """A calibration on the plan (``calibrate.on=plan``), checked on the plan returned: each of its devices'
    measured compute and the calibrated model's prediction of it (ms), their mean absolute error, the median signed
    error, the worst device's ratio either way (1.5: 50% over or a third under), and whether the search ran again
    with the calibrated model and whether that changed the plan."""

    measured_ms: tuple[float, ...]
    predicted_ms: tuple[float, ...]
    mape: float
    bias: float
    worst: float
    searched_again: bool
    changed: bool
    busy: int = 0  # of these devices, read while the machine was busy (every try)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CommCalibration:
    """First contact's collectives: a few fixed exchanges measured on this machine's gloo ranks at each of ``worlds``
    ranks, and ``factors``, the median measured / predicted (fwd + bwd) of each world's devices; every all-to-all,
    row-group collective and input distribution the model prices for N devices is scaled by ``factor_at(N)``. With
    the measured and predicted ms of the ``devices``, the ratios' quantiles and the seconds it took."""

    worlds: tuple[int, ...]
    factors: tuple[float, ...]
    ratios: CalibrationRatios
    devices: int
    measured_ms: tuple[float, ...]
    predicted_ms: tuple[float, ...]
    seconds: float

    def __post_init__(self):
        if not self.worlds or list(self.worlds) != sorted(set(self.worlds)) or len(self.factors) != len(self.worlds):
            raise UserError(
                f"calibration.comm: got worlds {list(self.worlds)} and {len(self.factors)} factors, expected ascending "
                "worlds and a factor each"
            )
        if min(self.worlds) < 2 or min(self.factors) <= 0:
            raise UserError(
                f"calibration.comm: got worlds {list(self.worlds)}, factors {list(self.factors)}, expected "
                "worlds >= 2 and factors > 0"
            )

    def factor_at(self, devices: int) -> float:
        """The factor of ``devices`` ranks: interpolated in log(ranks) between the measured worlds (log factors);
        past the largest, the largest's, below the least, the least's. Not extended past the largest: on a 2-core
        machine the factor rose from 2 ranks (one a core) to 4 (two a core) and then stayed (2026-11-30, AMD EPYC
        family 26 model 2, the nearest kind's model, three probes: 0.69-0.85 at 2, 1.13-1.55 at 4, 1.04-1.41 at 8),
        and the trend of two noisy worlds extended one doubling priced 8-device plans' collectives 22-60% high in
        three of six runs (docs/results/first-contact.md)."""
        logs, worlds = np.log(self.factors), np.log2(self.worlds)
        at = np.log2(max(devices, 2))
        return float(np.exp(np.interp(at, worlds, logs)))


CALIBRATED_ON = (None, "tables", "plan", "first_contact")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CalibrationRecord:
    """The cost model's calibration factor (every device's predicted compute scaled by it), either ``given``
    (``cost_model.calibration=F``: the factor alone) or measured (``measure.calibration``: the median measured /
    predicted compute over ``devices`` devices, each measured and predicted ms, its spread, the protocol, the seconds
    it took, whether it is ``far`` from 1, and how many devices were read while the machine was ``busy``). ``on``:
    what was measured, groups of the task's own tables before the search (``tables``; None in older files), the
    devices of the search's plan and its candidates (``plan``), then checked on the plan returned (``plan_devices``),
    or first contact's spec kernels, on a machine kind no model was trained on (``first_contact``)."""

    key: ClassVar[str] = "calibration"  # its plan.json key

    factor: float
    given: bool = False
    ratios: CalibrationRatios | None = None
    devices: int | None = None
    tables_per_device: float | None = None
    measured_ms: tuple[float, ...] | None = None
    predicted_ms: tuple[float, ...] | None = None
    protocol: CalibrationProtocol | None = None
    seconds: float | None = None
    far: bool | None = None
    busy: int | None = None  # devices still read on a busy machine after every try (older files: None)
    on: str | None = None
    plan_devices: PlanDevices | None = None
    comm: CommCalibration | None = None  # first contact's collectives (None: their fits as trained)

    def __post_init__(self):
        # None in files written before they were recorded, or not measured
        later = ("busy", "on", "plan_devices", "comm")
        measured = [f.name for f in dataclasses.fields(self)][2:]
        measured = [name for name in measured if name not in later]
        if not self.given and any(getattr(self, name) is None for name in measured):
            missing = next(name for name in measured if getattr(self, name) is None)
            raise UserError(f"calibration.{missing}: missing, expected it in a measured calibration (or given: true)")
        if self.on not in CALIBRATED_ON:
            raise UserError(f"calibration.on: got {self.on!r}, expected tables, plan or first_contact")
        if self.plan_devices is not None and self.on != "plan":
            raise UserError(f"calibration.plan_devices: given with on {self.on!r}, expected only with on: plan")
        if self.comm is not None and self.on != "first_contact":
            raise UserError(f"calibration.comm: given with on {self.on!r}, expected only with on: first_contact")

    @classmethod
    def of_factor(cls, factor: float) -> CalibrationRecord:
        """A factor given by the user (``cost_model.calibration``), not measured here."""
        return cls(factor=factor, given=True)

    def to_json(self) -> JSONDoc:
        """The plan.json ``calibration`` object: {factor, given: true}, or the measured record (no ``given``)."""
        if self.given:
            return {"factor": self.factor, "given": True}
        optional = ("plan_devices", "comm")  # left out where not measured
        return {k: v for k, v in _json(self).items() if k != "given" and not (k in optional and v is None)}

    @classmethod
    def from_json(cls, obj: Any, where: str = "plan.calibration") -> CalibrationRecord:
        """Parse a plan.json ``calibration`` object (errors name ``where``)."""
        return _parsed(cls, obj, where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
    """One member of a portfolio (``searcher=portfolio``): its ``member`` name (``beam``, ``beam:hot``), the
    searcher and row-split mode that ran, its plan's predicted cost (``cost_ms``, the slowest device's step: the
    plan.json ``cost_ms``; ``compute_ms``, its slowest device's compute) and the search's own score (``score_ms``: an
    ensemble's risk term included, what the portfolio compares), the seconds its runs took (a run shared with another
    member counted for both, so the members' seconds may sum past the search's); ``same_as``: the earlier member
    whose plan it repeats (then it is not compared again); ``error``: why it made no plan (its costs None)."""

    member: str
    searcher: str
    row_split: str
    cost_ms: float | None = None
    compute_ms: float | None = None
    score_ms: float | None = None
    search_time_s: float = 0.0
    same_as: str | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PortfolioRecord:
    """A portfolio's candidates in their members' order and the one ``chosen`` (the least ``score_ms``, the first
    on a tie); ``margin``: the chosen plan's score below the next distinct plan's, as a share of it (0: a tie; None:
    every member made the same plan). The model's own error is larger than a few per cent, so a small margin is a
    guess: ``autotune`` measures."""

    key: ClassVar[str] = "portfolio"  # its plan.json key

    candidates: tuple[Candidate, ...]
    chosen: str
    margin: float | None

    def chosen_candidate(self) -> Candidate:
        return next(c for c in self.candidates if c.member == self.chosen)

    def to_json(self) -> JSONDoc:
        """The plan.json ``portfolio`` object."""
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any, where: str = "plan.portfolio") -> PortfolioRecord:
        """Parse a plan.json ``portfolio`` object (errors name ``where``)."""
        record = _parsed(cls, obj, where)
        if record.chosen not in {c.member for c in record.candidates}:
            raise UserError(f"{where}.chosen: got {record.chosen!r}, expected one of its candidates' members")
        return record


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopRecord:
    """What ``autotune=loop`` did after its first rounds: the searches with the model tuned on the measured devices,
    why it stopped (``bound``: the measured fastest within the rounds' noise of the task's balance bound;
    ``converged``: the tuned model's search found no new plan; ``no better``: the new plans measured no faster beyond
    the noise; ``searches``; ``budget``; ``busy``), and the last tuning's devices, the model's MAPE on them before and
    after it, the corrected model's on measured devices left out of its fit and the prior chosen for it (None: the model
    kept as it was, the correction not carrying to devices it did not see; ``task_tune``)."""

    searches: int
    stopped: str
    devices: int = 0
    mape_before: float | None = None
    mape_after: float | None = None
    mape_held_out: float | None = None
    prior: float | None = None

    def fit_words(self) -> str:
        return fit_words(self.devices, self.mape_before, self.mape_after, self.mape_held_out, self.prior)


def fit_words(devices: int, before: float, after: float, held_out: float | None, prior: float | None) -> str:
    """What ``autotune=loop``'s per-table correction did, in a clause: ``tables scaled (prior 0.02): MAPE on the 24
    measured devices 15.4% -> 4.9%, on devices held out of the fit 12.0%``, or why the model stayed as it was."""
    if held_out is None:
        return f"the model as it is: {devices} measured devices, too few to check a correction on"
    on = f"MAPE on the {devices} measured devices {100 * before:.1f}%"
    held = f"on devices held out of the fit {100 * held_out:.1f}%"
    if prior is None:
        return f"the model as it is ({on}; scaled per table, {held})"
    return f"tables scaled (prior {prior:g}): {on} -> {100 * after:.1f}%, {held}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeasuredCandidate:
    """A candidate of ``autotune`` (kernels or steps): its name (a portfolio member, a baseline searcher), the
    searcher that made it, its predicted step (ms), its measured step (the median over rounds, and the fastest and
    slowest round: measured compute and the model's comm, or a whole training step), its slowest device's measured
    compute (median over rounds; kernels only); ``kept``: it was measured (else ``why`` not: no plan, or the same plan
    as another candidate)."""

    name: str
    searcher: str | None = None
    predicted_ms: float | None = None
    measured_ms: float | None = None
    low_ms: float | None = None
    high_ms: float | None = None
    compute_ms: float | None = None
    kept: bool
    why: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class AutotuneRecord:
    """What ``autotune`` measured (``measure.autotune``): every candidate, the one ``chosen`` (the least measured
    step), its measured step over TorchRec default's (None: that plan was not measured), the rounds and why they
    stopped (``leader``: one led beyond the noise; ``rounds``; ``budget``; ``alone``: one candidate, read once),
    ``devices``: the distinct device kernels measured (``kernels``) or the gloo ranks of a step (``steps``), the
    readings resumed from an earlier run, the kernels read on a busy machine, the seconds, the protocol (``warmup``
    and ``iters``: a kernel's iterations, or a candidate's warm-up and timed steps); the model's pick and, where a
    candidate measured faster did not replace it (noise never overrules the model), why (``kept_pick``)."""

    key: ClassVar[str] = "autotune"  # its plan.json key

    mode: str
    candidates: tuple[MeasuredCandidate, ...]
    chosen: str
    vs_torchrec_default: float | None = None
    rounds: int
    stopped: str
    devices: int
    resumed: int = 0
    busy: int = 0
    seconds: float
    warmup: int
    iters: int
    device: str
    pinned: bool | None = None  # steps: each rank on a core of its own (False: the ranks time-sliced the cores)
    model_pick: str | None = None  # the candidate the model scored cheapest
    kept_pick: str | None = None  # why the model's pick was kept over a candidate measured faster (None: it was not)
    bound_ms: float | None = None  # kernels, loop: the task's balance bound from the measured candidates
    loop: LoopRecord | None = None  # loop: the searches after the first rounds

    def chosen_candidate(self) -> MeasuredCandidate:
        return next(c for c in self.candidates if c.name == self.chosen)

    def to_json(self) -> JSONDoc:
        """The plan.json ``autotune`` object."""
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any, where: str = "plan.autotune") -> AutotuneRecord:
        """Parse a plan.json ``autotune`` object (errors name ``where``)."""
        record = _parsed(cls, obj, where)
        if record.chosen not in {c.name for c in record.candidates if c.kept}:
            raise UserError(f"{where}.chosen: got {record.chosen!r}, expected one of its measured candidates")
        return record


# A stage's record, as a plan carries them (``Plan.records``, in the order the stages made them); plan.json writes each
# under its ``key`` in this order, and reads them back from there.
StageRecord = PolishRecord | CalibrationRecord | PortfolioRecord | AutotuneRecord
RECORD_TYPES: tuple[type, ...] = (PolishRecord, CalibrationRecord, PortfolioRecord, AutotuneRecord)
