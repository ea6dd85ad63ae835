"""The tiered-memory miss model (``core.tiers.missed_rows``) against a simulation of FBGEMM's cache on real streams.

    python -m tools.cache_misses [--tasks 0,1 --batches 12 --load-factors 0.5,0.2,0.05 --out FILE]

For tables of the GPU tasks (``workloads/gpu_tasks.py``: rows 1e5-1e7, their synthetic pool streams), the batches a
training step reads one after another (``streams.next_batches``: the hot rows kept, the cold ones moved), run through
a simulation of FBGEMM's managed cache as TorchRec runs it (``lxu_cache``, LRU): ``ceil(load factor x rows / 32)``
sets of 32 slots, a row's set its hash modulo the sets; each batch's distinct rows looked up, the ones held touched,
the others inserted into the set's slots not touched in this batch, least recently used first, a set's misses in row
index order (FBGEMM sorts a batch's missed rows by set and index before it inserts them; ``--order random``: in any
order); a row that finds no slot is read from host memory, uncached. A batch's missed rows are its distinct rows not
held when it starts. The cache first takes in twice its slots and runs ``MIN_FILL`` batches (a training run's steady
state: the hot rows a batch misses settle only in the slots its cold rows leave; at most ``MAX_FILL`` batches), then
the mean over ``--batches`` more is read. Printed per table and load factor: the simulated missed rows a batch, the
model's, and their ratio; ``--out`` writes them as JSON. Nothing is timed: a CPU measures no GPU cache, but the rule
that prices the misses is checked where the streams are known.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from neuroshard_jax.core.cli import fail
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.memory import CACHE_ASSOC
from neuroshard_jax.core.tiers import missed_rows
from neuroshard_jax.workloads.gpu_tasks import GpuTaskConfig, gpu_task, table_params, table_stream
from neuroshard_jax.workloads.streams import next_batches

SEED = 54  # the GPU tasks' (tools/gpu_check.py)
CHUNK = 16  # batches drawn at a time (each draw's first is the table's own batch, left out)
MIN_FILL = 200  # batches at least (the hot rows a batch misses settle in the slots its cold rows leave, slowly)
MAX_FILL = 2000  # batches at most to fill the cache before it is read
MIN_ROWS, MAX_ROWS = 100_000, 10_000_000  # tables whose cache matters, small enough to simulate in seconds
HASH = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: a row's set (FBGEMM hashes the row index too)


class LruCache:
    """FBGEMM's set-associative LRU cache of ``rows`` rows at ``load_factor``, simulated (rows only, no weights)."""

    def __init__(self, rows: int, load_factor: float, order: str = "index"):
        self.order = order  # which of a set's misses take its free slots first: lowest row index, or any
        self.rng = np.random.default_rng(0)
        self.sets = max(1, int(np.ceil(load_factor * rows / CACHE_ASSOC)))
        self.row = np.full((self.sets, CACHE_ASSOC), -1, np.int64)  # the row a slot holds, -1 empty
        self.time = np.full((self.sets, CACHE_ASSOC), -1, np.int64)  # when it was last used
        self.slot = np.full(rows, -1, np.int64)  # where a row is held (set * 32 + way), -1 not held
        self.step = 0

    def set_of(self, rows: np.ndarray) -> np.ndarray:
        return ((rows.astype(np.uint64) * HASH) >> np.uint64(20)).astype(np.int64) % self.sets

    def batch(self, ids: np.ndarray) -> int:
        """Look up a batch's ids: its distinct rows not held are missed (returned), and inserted where their set has
        a slot not used in this batch, least recently used first."""
        self.step += 1
        unique = np.unique(ids)
        held = self.slot[unique] >= 0
        hit = self.slot[unique[held]]
        self.time.reshape(-1)[hit] = self.step
        missed = unique[~held]
        if len(missed):
            if self.order == "random":
                missed = self.rng.permutation(missed)
            sets = self.set_of(missed)
            order = np.argsort(sets, kind="stable")
            missed, sets = missed[order], sets[order]
            first = np.searchsorted(sets, sets, side="left")
            rank = np.arange(len(sets)) - first  # a miss's place among its set's misses
            free = self.time < self.step  # slots not touched in this batch, least recently used first
            ways = np.argsort(np.where(free, self.time, np.iinfo(np.int64).max), axis=1, kind="stable")
            room = free.sum(axis=1)
            fits = rank < room[sets]
            sets, rank, rows = sets[fits], rank[fits], missed[fits]
            way = ways[sets, rank]
            old = self.row[sets, way]
            self.slot[old[old >= 0]] = -1
            self.row[sets, way] = rows
            self.time[sets, way] = self.step
            self.slot[rows] = sets * CACHE_ASSOC + way
        return len(missed)


def simulate(
    indices: np.ndarray, offsets: np.ndarray, rows: int, load_factor: float, measured: int, order: str = "index"
) -> tuple:
    """(mean missed rows a batch, batches run to fill): the cache run on a training step's batches of the table
    (``next_batches``, drawn ``CHUNK`` at a time) until it has taken in twice its slots and run ``MIN_FILL`` batches
    (or ``MAX_FILL``), then ``measured`` batches more, whose mean is its steady state."""
    cache = LruCache(rows, load_factor, order)
    slots, taken, run, misses, chunk = cache.sets * CACHE_ASSOC, 0, 0, [], 0
    while len(misses) < measured:
        for ids, _ in next_batches(indices, offsets, rows, CHUNK, SEED + chunk)[1:]:
            missed = cache.batch(ids)
            if (taken < 2 * slots or run < MIN_FILL) and run < MAX_FILL:
                taken, run = taken + missed, run + 1
            elif len(misses) < measured:
                misses.append(missed)
        chunk += 1
    return float(np.mean(misses)), run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="0,1", help="GPU task indices (workloads/gpu_tasks.py, seed 54)")
    parser.add_argument("--tables", type=int, default=6, help="tables a task, spread over their rows")
    parser.add_argument("--batches", type=int, default=8, help="batches read after the cache is filled")
    parser.add_argument("--load-factors", default="0.5,0.2,0.05")
    parser.add_argument(
        "--order",
        default="index",
        choices=("index", "random"),
        help="which misses of a set take its free slots first: the lowest row index (FBGEMM's sorted insert) or any",
    )
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    try:
        factors = [float(x) for x in args.load_factors.split(",")]
        if args.batches < 1 or not all(0 < f < 1 for f in factors):
            raise UserError(f"--batches {args.batches}, --load-factors {factors}: expected >= 1 and shares in (0, 1)")
        config = GpuTaskConfig()
        rows_out = []
        for index in (int(x) for x in args.tasks.split(",")):
            task = gpu_task(config, SEED, index)
            params, stream_seed = table_params(config, SEED, index, task.num_tables)
            big = sorted(
                (i for i, t in enumerate(task.tables) if MIN_ROWS <= t.rows <= MAX_ROWS),
                key=lambda i: task.tables[i].rows,
            )
            picks = [big[int(k)] for k in np.unique(np.linspace(0, len(big) - 1, min(args.tables, len(big))).round())]
            for t in picks:
                table = task.tables[t]
                indices, offsets = table_stream(params, stream_seed, t, task.batch_size)
                for lf in factors:
                    simulated, filled = simulate(indices, offsets, table.rows, lf, args.batches, args.order)
                    model, distinct = missed_rows(table, task.batch_size, lf)
                    row = {
                        "task": index,
                        "table": t,
                        "rows": table.rows,
                        "pooling_factor": table.pooling_factor,
                        "read_once_share": round(table.bins[0], 4),
                        "load_factor": lf,
                        "distinct": round(distinct),
                        "simulated": round(simulated),
                        "model": round(model),
                        "ratio": round(model / simulated, 4) if simulated else None,
                    }
                    rows_out.append(row)
                    print(
                        f"task {index} table {t:>3} rows {table.rows:>9,} once {table.bins[0]:.2f} lf {lf:<4g} "
                        f"distinct {distinct:>9,.0f} missed: simulated {simulated:>9,.0f} model {model:>9,.0f} "
                        f"({row['ratio']})",
                        flush=True,
                    )
        ratios = np.array([r["ratio"] for r in rows_out if r["ratio"] is not None])
        err = np.abs(ratios - 1)
        print(
            f"{len(ratios)} cases: model / simulated missed rows median {np.median(ratios):.3f}, |error| median "
            f"{np.median(err):.1%}, p90 {np.quantile(err, 0.9):.1%}, worst {err.max():.1%}"
        )
        if args.out:
            doc = {
                "machine": hardware(),
                "command": " ".join(["python -m tools.cache_misses", *sys.argv[1:]]),
                "rows": rows_out,
            }
            Path(args.out).write_text(json.dumps(doc, indent=1))
    except UserError as err:
        fail(str(err))


if __name__ == "__main__":
    main()
