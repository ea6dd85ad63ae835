"""What a row-split table's comm costs: a fit of measured reduce-scatters and all-gathers, per group size.

    python -m neuroshard_jax.collect kind=comm comm.row_share=1.0 num_samples=240 out_dir=DIR   # labels (gloo)
    python -m neuroshard_jax.train family=row_comm datasets=[DIR] name=xeon-gloo out=neuroshard_jax/data/row_comm

TorchRec's row_wise and table_row_wise output dist combines a row-split table's partial pooled sums with a
reduce-scatter over the devices holding its row blocks (forward) and all-gathers the gradients (backward); tables
cut over one device set are fused into one collective (``assignment.row_groups``: [width, devices] per device set). The
all-to-all nets were never trained on these, and pricing a block's width as all-to-all width is 2-5x too cheap on
gloo (``tools/bench_row_comm.py``). So a row group is priced apart: each device of a group of k devices spends
``a(k) + b(k) x width x batch / label batch`` ms forward (and its own a, b backward), fitted by non-negative least
squares on comm labels whose samples carry row groups (the worker times the collectives apart:
``fwd_rows_ms``, ``bwd_rows_ms``). Group sizes between the measured ones are interpolated in log2 k; beyond the
largest measured size (8 ranks here) the last segment is extended, never below the largest measured cost: an
extrapolation, stated in docs/cost-models.md. A group spanning hosts is scaled by its devices' link scale
(``Task.comm_scale``), one within a host is not. Fits are JSON files shipped under ``data/row_comm/``, each with its
manifest (how, where, when) and the kind of hardware its labels hold for: a neural model gets the fit of its own
labels' kind (``for_kinds``), else none, and then prices a row block's width as all-to-all width, as the analytic
model always does. NumPy only.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, read_json
from neuroshard_jax.core.paths import cache_folder, own_entries, package_path, user_fits_dir

SHIPPED = "data/row_comm"


@dataclasses.dataclass(frozen=True)
class RowComm:
    """Per measured group size k (``sizes``, ascending): forward and backward (ms per collective, ms per unit of
    width at ``batch_size``) of each device in the group."""

    name: str
    sizes: tuple[int, ...]
    fwd: tuple[tuple[float, float], ...]
    bwd: tuple[tuple[float, float], ...]
    batch_size: int
    kind: str = ""  # the hardware kind of its labels (datasets.hardware_kind)

    def group_ms(self, k: int, width: float, batch_size: int) -> tuple[float, float]:
        """(fwd, bwd) ms each device of a row group of ``k`` devices spends on ``width`` columns of partial sums."""
        scale = width * batch_size / self.batch_size
        return tuple(
            interpolate(self.sizes, [a + b * scale for a, b in coefs], k)  # type: ignore[misc]
            for coefs in (self.fwd, self.bwd)
        )

    def scaled(self, factor: float) -> RowComm:
        """The fit with every coefficient multiplied by ``factor`` (first contact: this machine's collectives)."""
        times = lambda pairs: tuple((a * factor, b * factor) for a, b in pairs)  # noqa: E731
        return dataclasses.replace(self, fwd=times(self.fwd), bwd=times(self.bwd))

    def to_json(self) -> JSONDoc:
        return {
            "name": self.name,
            "sizes": list(self.sizes),
            "fwd": [list(c) for c in self.fwd],
            "bwd": [list(c) for c in self.bwd],
            "batch_size": self.batch_size,
            "kind": self.kind,
        }

    @classmethod
    def from_json(cls, obj: dict, where: str = "row comm") -> RowComm:
        """The fit ``obj``; a malformed one is a UserError naming ``where``."""
        try:
            out = cls(
                str(obj["name"]),
                tuple(int(k) for k in obj["sizes"]),
                tuple((float(a), float(b)) for a, b in obj["fwd"]),
                tuple((float(a), float(b)) for a, b in obj["bwd"]),
                int(obj["batch_size"]),
                str(obj.get("kind", "")),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise UserError(f"{where}: a malformed fit ({err!r}), expected name, sizes, fwd, bwd, batch_size") from None
        ok = out.sizes and list(out.sizes) == sorted(set(out.sizes)) and len(out.fwd) == len(out.bwd) == len(out.sizes)
        if not ok or min(out.sizes) < 2 or out.batch_size < 1:
            raise UserError(
                f"{where}: got group sizes {list(out.sizes)} with {len(out.fwd)}/{len(out.bwd)} coefficient pairs, "
                "expected ascending sizes >= 2, one (a, b) pair per size each way, and a batch size >= 1"
            )
        return out


def interpolate(sizes: tuple[int, ...], values: list[float], k: int) -> float:
    """``values`` (one per measured group size) at ``k``: linear in log2 k between sizes; below the smallest its
    value; above the largest the last segment extended, never below the largest size's value."""
    x = np.log2(np.asarray(sizes, np.float64))
    if k <= sizes[0] or len(sizes) == 1:
        return float(values[0]) if k <= sizes[0] else float(values[-1])
    if k <= sizes[-1]:
        return float(np.interp(np.log2(k), x, values))
    slope = (values[-1] - values[-2]) / (x[-1] - x[-2])
    return float(max(values[-1], values[-1] + slope * (np.log2(k) - x[-1])))


def rank_ms(model: RowComm, record: dict) -> np.ndarray:
    """f64[2, W]: (fwd, bwd) ms each rank of a comm label (``record``: world, batch_size, row_groups) spends on the
    collectives of its row groups, by ``model``."""
    out = np.zeros((2, record["world"]))
    for width, ranks in record["row_groups"]:
        out[:, ranks] += np.asarray(model.group_ms(len(ranks), width, record["batch_size"]))[:, None]
    return out


def disjoint(groups: list) -> bool:
    """Whether no device is in two of ``groups`` ([width, devices]): a plan's groups are (every device, or the
    hosts' disjoint sets); a device in two overlapping groups waits in the second for peers still in the first."""
    seen = [d for _, devices in groups for d in devices]
    return len(seen) == len(set(seen))


def fit_records(records: list[dict], keys: tuple[str, ...], none: str) -> tuple[list[dict], int]:
    """(the successful ``records`` that carry every one of ``keys``, their one batch size) for a fit; ``none``: the
    error when there is no such record. Records of several batch sizes are refused."""
    usable = [r for r in records if r.get("ok") and all(r.get(k) for k in keys)]
    if not usable:
        raise UserError(none)
    batches = {int(r["batch_size"]) for r in usable}
    if len(batches) > 1:
        raise UserError(f"{none.split(':')[0]}: records of batch sizes {sorted(batches)}, expected one")
    return usable, batches.pop()


def fit(records: list[dict], name: str, kind: str = "") -> RowComm:
    """The non-negative least-squares fit of comm labels with row groups (``collect kind=comm`` with
    ``comm.row_share``): each rank's ``fwd_rows_ms`` and ``bwd_rows_ms`` as the sum over its groups of
    a(k) + b(k) x width. Records of one batch size with disjoint groups; a group size with no label is left out."""
    usable, batch = fit_records(
        [r for r in records if r.get("row_groups") and disjoint(r["row_groups"])],
        ("row_groups", "fwd_rows_ms"),
        "row comm fit: no comm record with row groups and their times; expected labels collected with "
        "comm.row_share > 0",
    )
    sizes = tuple(sorted({len(g[1]) for r in usable for g in r["row_groups"]}))
    column = {k: i for i, k in enumerate(sizes)}
    design, fwd, bwd = [], [], []
    for r in usable:
        for rank in range(r["world"]):
            x = np.zeros(2 * len(sizes))
            for width, ranks in r["row_groups"]:
                if rank in ranks:
                    x[2 * column[len(ranks)]] += 1.0
                    x[2 * column[len(ranks)] + 1] += width
            if x.any():
                design.append(x)
                fwd.append(r["fwd_rows_ms"][rank])
                bwd.append(r["bwd_rows_ms"][rank])
    a = np.asarray(design)
    from scipy.optimize import nnls  # a fit's alone: half a second of every planner start otherwise

    coefs = [nnls(a, np.asarray(y))[0].reshape(-1, 2) for y in (fwd, bwd)]
    return RowComm(
        name,
        sizes,
        tuple((float(c[0]), float(c[1])) for c in coefs[0]),
        tuple((float(c[0]), float(c[1])) for c in coefs[1]),
        batch,
        kind,
    )


def shipped_names(folder: str = SHIPPED) -> list[str]:
    root = package_path(folder)
    return sorted(p.stem for p in root.glob("*.json")) if root.exists() else []


def read_fit(folder: str, name_or_path: str, what: str, family: str) -> tuple[dict, str]:
    """(the fit object, where it came from) of a fit shipped under ``folder`` by name, or of a fit's JSON file
    (``{"fit": ..., "manifest": ...}``) written by ``python -m neuroshard_jax.train family=FAMILY``."""
    names = shipped_names(folder)
    path = package_path(f"{folder}/{name_or_path}.json") if name_or_path in names else Path(name_or_path)
    if not path.is_file():
        raise UserError(f"{what}: {name_or_path!r} is neither a shipped fit ({', '.join(names) or 'none'}) nor a file")
    written_by = f"a {what} fit written by python -m neuroshard_jax.train family={family}"
    obj = read_json(path, what, written_by)
    if not isinstance(obj.get("fit"), dict):
        raise UserError(f"{what}: {str(path)!r} has no 'fit' object, expected {written_by}")
    return obj["fit"], f"{what} {str(path)!r}"


def of_kinds(folder: str, family: str, load, kinds: list[str]):
    """The first fit of one of ``kinds`` (a model's ``hardware_kinds``): this user's (``files.user_fits_dir(family)``,
    by file name: measured on this very machine), then the shipped ones under ``folder`` by name; None if none is of
    those kinds."""
    what = f"{family} fits of this machine"
    mine = cache_folder(user_fits_dir(family).name, what, make=False)
    own = [] if mine is None else [str(p) for p in own_entries(mine, what, "*.json")]
    paths = [*own, *shipped_names(folder)]
    return next((fit for fit in map(load, paths) if fit.kind and fit.kind in kinds), None)


@functools.lru_cache(maxsize=8)
def load(name_or_path: str) -> RowComm:
    """A shipped fit by name, or a fit's JSON file (``{"fit": ..., "manifest": ...}``)."""
    return RowComm.from_json(*read_fit(SHIPPED, name_or_path, "row comm", "row_comm"))


def for_kinds(kinds: list[str]) -> RowComm | None:
    """This user's or the shipped fit whose labels' hardware kind is one of ``kinds``, else None (``of_kinds``)."""
    return of_kinds(SHIPPED, "row_comm", load, kinds)
