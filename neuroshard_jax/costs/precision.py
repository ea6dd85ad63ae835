"""What a table of another data type costs beside the labels' own: per hardware kind, the measured factor of each
precision's kernels over the precision a model was trained at (the same spec samples timed at both:
``tools/precision_factor.py``). A neural model is trained at one precision; a task mixing data types (a TorchRec
module with fp16 tables beside fp32 ones) is priced by it where its kind has a factor for every other precision:
each such shard's latent scaled by the factor (``CostModel.with_precision_scales``; an ensemble's device head
corrects the device's sum on top of it, as for any shard), else the choice refuses it in one line.

Measured on an AMD EPYC (family 25 model 17), FBGEMM 1.8.0's CPU kernels: fp16 weights run 1.13x fp32's (forward
0.84x, backward 1.25x: the update converts), the opposite of what a bandwidth roofline says
(docs/results/kernel-kinds.md#data-types)."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from neuroshard_jax.core.config import typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, read_json
from neuroshard_jax.core.paths import package_path
from neuroshard_jax.core.sharding import element_bytes
from neuroshard_jax.costs.cost_model import MAX_ELEMENT_BYTES

SHIPPED = "data/precision/factors.json"


@dataclasses.dataclass(frozen=True)
class PrecisionFactor:
    """One precision's kernels over the trained precision's, on one hardware kind: the geometric mean of paired
    labels' ratios (``factor``), their count and spread (10th and 90th percentiles)."""

    factor: float
    pairs: int
    p10: float
    p90: float


@dataclasses.dataclass(frozen=True)
class KindFactors:
    """A hardware kind's factors over the ``trained`` precision, and how they were measured."""

    kind: str
    trained: str
    factors: dict[str, PrecisionFactor]
    manifest: dict


def fit(base: dict, other: dict) -> PrecisionFactor:
    """The factor of ``other``'s labels over ``base``'s (each ``{id: total_ms}``, the same samples at two precisions;
    only ids both hold)."""
    ids = sorted(set(base) & set(other), key=str)
    if len(ids) < 10:
        raise UserError(f"precision factor: {len(ids)} samples timed at both precisions, expected at least 10")
    ratios = np.array([other[i] / base[i] for i in ids])
    logs = np.log(ratios)
    p10, p90 = np.percentile(ratios, [10, 90])
    return PrecisionFactor(round(float(np.exp(logs.mean())), 4), len(ids), round(float(p10), 4), round(float(p90), 4))


def kind_json(entry: KindFactors) -> JSONDoc:
    return {
        "trained": entry.trained,
        "factors": {p: dataclasses.asdict(f) for p, f in entry.factors.items()},
        "manifest": entry.manifest,
    }


@functools.cache
def shipped() -> dict[str, KindFactors]:
    """The shipped factors by hardware kind."""
    obj = read_json(package_path(SHIPPED), "precision factors", "tools/precision_factor.py")
    out = {}
    for kind, entry in obj.get("kinds", {}).items():
        factors = {p: typed(PrecisionFactor, f, f"precision factors.{kind}.{p}") for p, f in entry["factors"].items()}
        out[kind] = KindFactors(kind, entry["trained"], factors, entry.get("manifest", {}))
    return out


def factors_for(kinds: list[str], trained: str) -> dict[str, PrecisionFactor]:
    """The factors of the first of ``kinds`` (a model's ``hardware_kinds``) measured over ``trained``; none if none."""
    for kind in kinds:
        entry = shipped().get(kind)
        if entry is not None and entry.trained == trained:
            return entry.factors
    return {}


def log_scales(factors: dict[str, PrecisionFactor], precisions: tuple[str, ...], trained: str) -> np.ndarray:
    """f32[MAX_ELEMENT_BYTES + 1]: the log scale of a shard by its weights' element size, for a task whose tables
    are of ``precisions`` (each other than ``trained`` must have a factor; two of one size must agree)."""
    out = np.zeros(MAX_ELEMENT_BYTES + 1, np.float32)
    taken: dict[int, str] = {}
    for p in precisions:
        if p == trained:
            continue
        size = element_bytes(p)
        if size in taken or size == element_bytes(trained):
            raise UserError(
                f"task.precision: tables of {p} beside {taken.get(size, trained)}, whose elements take as many bytes; "
                "expected data types a model can tell apart by their size"
            )
        taken[size] = p
        out[size] = math.log(factors[p].factor)
    return out
