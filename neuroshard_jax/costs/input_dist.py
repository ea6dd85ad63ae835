"""What TorchRec's input distribution costs: a fit of measured ids' all-to-alls, per number of devices.

    python -m neuroshard_jax.collect kind=comm comm.input_share=1.0 num_samples=300 out_dir=DIR   # labels (gloo)
    python -m neuroshard_jax.train family=input_dist datasets=[DIR] name=epyc-gloo out=neuroshard_jax/data/input_dist

Before a step's lookups, TorchRec sends every rank's slice of the batch of each sparse feature to the devices whose
shards take it, one ``KJTAllToAll`` per sharding type: an exchange of splits, all-to-alls of the lengths and of the
ids (one per lookup), and on the receiver a permute that regroups what arrived by feature. A table-wise table's ids
go to its one device; a column-wise table's go to every device holding a slice of it; a row-wise table's are split
by its row blocks; a data-parallel table's stay where they are (``assignment.input_features``). This costs as much
as a device's pooled all-to-all or more (ids are 8 bytes each, and a table of pooling factor p takes p of them per
sample whatever its width), and nothing else in the model prices it. So each device of N, for each sharding type
whose distribution moves anything, spends ``a(N) + b(N) x received + c(N) x sent`` ms, where received is the ids
per sample its shards take of that type and sent the type's ids per sample over N (each device sends its batch
slice of every feature), fitted by non-negative least squares on comm labels whose samples carry input
distributions (the worker times them apart: ``fwd_inputs_ms``) and scaled by batch / label batch. Device counts
between the measured ones are interpolated in log2 N; beyond the largest measured count the last segment is
extended (``row_comm.interpolate``). Fits are JSON files shipped under ``data/input_dist/``, each with its manifest
and the hardware kind of its labels: a neural model gets the fit of its own labels' kind (``for_kinds``), else none,
and then, as the analytic model always does, leaves the input distribution unpriced. NumPy only.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.costs.row_comm import fit_records, interpolate, of_kinds, read_fit

SHIPPED = "data/input_dist"
TERMS = 3  # ms per distribution, per received id per sample, per sent id per sample


@dataclasses.dataclass(frozen=True)
class InputDist:
    """Per measured device count N (``sizes``, ascending): the (a, b, c) terms of one input distribution, in ms at
    ``batch_size``."""

    name: str
    sizes: tuple[int, ...]
    coefs: tuple[tuple[float, float, float], ...]
    batch_size: int
    kind: str = ""  # the hardware kind of its labels (datasets.hardware_kind)

    def terms(self, world: int, batch_size: int) -> np.ndarray:
        """f64[3]: (ms per distribution, ms per received id per sample, ms per sent id per sample) at ``world``
        devices and ``batch_size``."""
        scale = np.array([1.0, batch_size / self.batch_size, batch_size / self.batch_size])
        return np.array([interpolate(self.sizes, [c[i] for c in self.coefs], world) for i in range(TERMS)]) * scale

    def scaled(self, factor: float) -> InputDist:
        """The fit with every term multiplied by ``factor`` (first contact: this machine's collectives)."""
        return dataclasses.replace(self, coefs=tuple(tuple(x * factor for x in c) for c in self.coefs))

    def to_json(self) -> JSONDoc:
        fields = dataclasses.asdict(self)
        return {**fields, "sizes": list(self.sizes), "coefs": [list(c) for c in self.coefs]}

    @classmethod
    def from_json(cls, obj: dict, where: str = "input dist") -> InputDist:
        """The fit ``obj``; a malformed one is a UserError naming ``where``."""
        try:
            out = cls(
                str(obj["name"]),
                tuple(int(k) for k in obj["sizes"]),
                tuple(tuple(float(x) for x in c) for c in obj["coefs"]),  # type: ignore[misc]
                int(obj["batch_size"]),
                str(obj.get("kind", "")),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise UserError(f"{where}: a malformed fit ({err!r}), expected name, sizes, coefs, batch_size") from None
        ok = out.sizes and list(out.sizes) == sorted(set(out.sizes)) and len(out.coefs) == len(out.sizes)
        if not ok or min(out.sizes) < 2 or out.batch_size < 1 or any(len(c) != TERMS for c in out.coefs):
            raise UserError(
                f"{where}: got device counts {list(out.sizes)} with {len(out.coefs)} coefficient triples, expected "
                "ascending counts >= 2, one (a, b, c) triple per count and a batch size >= 1"
            )
        return out


def received(inputs: list) -> np.ndarray:
    """f64[G, N]: the ids per sample each device takes in each input distribution of ``inputs`` ([type][device] =
    ids per sample of each feature, ``assignment.input_features``)."""
    return np.array([[sum(features) for features in per_device] for per_device in inputs], np.float64).reshape(
        len(inputs), -1
    )


def design(record: dict) -> tuple[np.ndarray, np.ndarray]:
    """(x f64[N, 3], y f64[N]) of one comm label with input distributions: each rank's terms and its measured
    ``fwd_inputs_ms``."""
    taken = received(record["inputs"])
    moves = taken.sum(-1, keepdims=True) > 0
    n = taken.shape[-1]
    x = np.stack(
        [
            np.broadcast_to(moves, taken.shape).sum(0),
            (taken * moves).sum(0),
            np.broadcast_to(taken.sum(-1, keepdims=True) / n, taken.shape).sum(0),
        ],
        axis=-1,
    )
    return x, np.asarray(record["fwd_inputs_ms"], np.float64)


def fit(records: list[dict], name: str, kind: str = "") -> InputDist:
    """The non-negative least-squares fit, per device count, of comm labels with input distributions (``collect
    kind=comm`` with ``comm.input_share``). Records of one batch size; a device count with no label is left out."""
    usable, batch = fit_records(
        records,
        ("inputs", "fwd_inputs_ms"),
        "input dist fit: no comm record with input distributions and their times; expected labels collected with "
        "comm.input_share > 0",
    )
    from scipy.optimize import nnls  # a fit's alone: half a second of every planner start otherwise

    sizes = tuple(sorted({int(r["world"]) for r in usable}))
    coefs = []
    for n in sizes:
        xs, ys = zip(*(design(r) for r in usable if r["world"] == n))
        coefs.append(tuple(float(c) for c in nnls(np.concatenate(xs), np.concatenate(ys))[0]))
    return InputDist(name, sizes, tuple(coefs), batch, kind)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=8)
def load(name_or_path: str) -> InputDist:
    """A shipped fit by name, or a fit's JSON file (``{"fit": ..., "manifest": ...}``)."""
    return InputDist.from_json(*read_fit(SHIPPED, name_or_path, "input dist", "input_dist"))


def for_kinds(kinds: list[str]) -> InputDist | None:
    """This user's or the shipped fit whose labels' hardware kind is one of ``kinds`` (a model's ``hardware_kinds``),
    else None (``row_comm.of_kinds``)."""
    return of_kinds(SHIPPED, "input_dist", load, kinds)
