"""The sequence benchmark: tasks whose models hold sequence embeddings (TorchRec's EmbeddingCollection) beside
pooled, mean-pooled and weighted bags, planned by every searcher and by TorchRec's own planner (all its types), every
plan measured on the kernels as the foreign benchmark measures them (each device's kernels, one per kind, and the
all-to-alls of their real width: a sequence table sends a row per id). Its stages are the foreign benchmark's
(``tools/foreign_benchmark.py``) on this suite, into ``outputs/bench/sequence``.

    python -m tools.sequence_benchmark tasks
    python -m tools.sequence_benchmark plan --searchers beam,grid,size_lookup_greedy,torchrec,torchrec_default
    python -m tools.sequence_benchmark measure --run R --repeats 3 --workers 2 --pin
    python -m tools.sequence_benchmark report --run R

Generators written for this suite alone (their own seed; no generator of the project uses it, and the training
sampler's kind labels are drawn from ``collect``'s streams): 6 tasks, 3 at 4 devices and 3 at 8, one of each family:
* ``din_history`` (DIN, BST): a user and a target item looked up once, the target's category, a multi-hot tag field
  pooled by its mean, a weighted field (scored ids), and the user's histories of items and categories (sequence
  lookups over the item and category vocabularies, 10-50 long);
* ``hstu_long`` (generative recommenders, HSTU-style): long histories (60-120) of items and of action types as
  sequences of one width, a few bags of user features;
* ``mixed_many``: 16-28 tables, half of them sequence features of lengths 1-30, a quarter weighted, the rest sum or
  mean pooled.
Access: each field's ids from a bounded power law of its own exponent (``sealed_benchmark.batch_bins``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from neuroshard_jax.core.task import Task
from tools.foreign_benchmark import Suite, main
from tools.sealed_benchmark import BATCH_SIZE, Draw, batch_bins, roomy_cap_gib

BASE_SEED = 740_211  # this suite's own seeds (no generator of the project uses them)


class Field(NamedTuple):
    """A table of a task: rows, width, lookups per sample, access exponent and its kernel (pooling, weighted)."""

    name: str
    rows: int
    dim: int
    pooling: float
    skew: float
    kind: str = "sum"  # sum | mean | weighted | sequence


def _rows(rng: np.random.Generator, low: float, high: float) -> int:
    return int(round(10 ** rng.uniform(low, high)))


def din_history(rng: np.random.Generator) -> list[Field]:
    dim = int(rng.choice((16, 32)))
    items, categories = _rows(rng, 5.0, 6.3), _rows(rng, 3.0, 4.0)
    length = float(np.round(rng.uniform(10, 50), 1))
    skew = lambda: float(rng.uniform(0.8, 1.3))  # noqa: E731
    return [
        Field("user", _rows(rng, 5.5, 6.5), dim, 1.0, skew()),
        Field("item", items, dim, 1.0, skew()),
        Field("category", categories, dim, 1.0, skew()),
        Field("tags", _rows(rng, 3.0, 4.5), 8, float(rng.uniform(3, 8)), skew(), "mean"),
        Field("scored", _rows(rng, 3.5, 5.0), 16, float(rng.uniform(5, 20)), skew(), "weighted"),
        Field("item_history", items, dim, length, skew(), "sequence"),
        Field("category_history", categories, dim, length, skew(), "sequence"),
    ]


def hstu_long(rng: np.random.Generator) -> list[Field]:
    dim = int(rng.choice((32, 64)))
    length = float(np.round(rng.uniform(60, 120), 1))
    out = [
        Field("item_history", _rows(rng, 5.0, 6.0), dim, length, float(rng.uniform(0.9, 1.3)), "sequence"),
        Field("action_history", int(rng.integers(5, 20)), dim, length, 0.8, "sequence"),
        Field("surface_history", int(rng.integers(20, 200)), dim, length, 1.0, "sequence"),
    ]
    out += [Field(f"user_{j}", _rows(rng, 2.0, 6.0), 16, 1.0, float(rng.uniform(0.6, 1.2))) for j in range(4)]
    return out


def mixed_many(rng: np.random.Generator) -> list[Field]:
    count = int(rng.integers(16, 29))
    dim = int(rng.choice((16, 32)))
    out = []
    for j in range(count):
        u = rng.random()
        kind = "sequence" if u < 0.5 else "weighted" if u < 0.75 else str(rng.choice(("sum", "mean")))
        pooling = (
            float(np.round(rng.uniform(1, 30), 1)) if kind == "sequence" else float(np.round(rng.uniform(1, 12), 1))
        )
        width = dim if kind == "sequence" else int(rng.choice((8, 16, 32, 64)))
        out.append(Field(f"f{j}_{kind}", _rows(rng, 2.0, 6.0), width, pooling, float(rng.uniform(0.5, 1.4)), kind))
    return out


FAMILIES: dict[str, Callable[[np.random.Generator], list[Field]]] = {
    "din_history": din_history,
    "hstu_long": hstu_long,
    "mixed_many": mixed_many,
}
KERNEL = {"sum": ("sum", False), "mean": ("mean", False), "weighted": ("sum", True), "sequence": ("none", False)}


def sequence_task(family: str, devices: int, index: int) -> Task:
    """Task ``index`` at ``devices`` devices of ``family``: its own seed, its tables and each batch's histogram."""
    rng = np.random.default_rng([BASE_SEED, devices, index])
    fields = FAMILIES[family](rng)
    tables = []
    for j, f in enumerate(fields):
        pooling, weighted = KERNEL[f.kind]
        tables.append(
            {
                "id": j,
                "name": f"{family}.{f.name}",
                "rows": f.rows,
                "dim": f.dim,
                "pooling_factor": f.pooling,
                "bins": batch_bins(rng, f.rows, f.pooling, f.skew, 0.0),
                **({"pooling": pooling} if pooling != "sum" else {}),
                **({"weighted": True} if weighted else {}),
            }
        )
    cap = roomy_cap_gib([Draw(f.name, f.rows, f.dim, f.pooling, f.skew) for f in fields], devices)
    obj = {"num_devices": devices, "mem_cap_gb": float(np.round(cap, 2)), "batch_size": BATCH_SIZE, "tables": tables}
    return Task.from_json(obj, where=f"sequence task d{devices}-{index:02d}")


def generate_tasks() -> list[tuple[str, str, Task]]:
    """(task id, family, task): every family once at 4 and once at 8 devices."""
    names = list(FAMILIES)
    return [
        (f"d{devices}-{i:02d}", names[i], sequence_task(names[i], devices, i))
        for devices in (4, 8)
        for i in range(len(names))
    ]


SEQUENCE = Suite("sequence", generate_tasks, BASE_SEED, "outputs/bench/sequence")


if __name__ == "__main__":
    main(SEQUENCE, __doc__)
