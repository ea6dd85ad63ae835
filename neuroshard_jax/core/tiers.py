"""Tiered memory on a GPU: tables kept in host memory (UVM) with a cache of their rows in the device's memory
(FBGEMM's managed caching, TorchRec's ``fused_uvm_caching``), what they cost and which tables go there.

* **Which rows hit the cache** (``missed_rows``): from a table's access histogram (``core.features``: the share of a
  batch's distinct rows read about 2^k times) and its lookups at the batch: the batch reads U distinct rows; those it
  reads more than twice are its hot rows, which an LRU cache that has run for a while keeps once it holds them (each
  batch reads them again), as many as its sets hold (FBGEMM's cache is sets of 32 slots, a row's set named by its
  hash: where hot rows crowd a set past 32, the rest miss, ``set_held``); the rows read once or twice are the cold
  tail (``COLD_BINS``), drawn from the table's other rows, of which the slots the H' held hot rows leave of C hold a
  share (C - H') / (rows - H). A uniform table's hit share is then the load factor; a skewed table's hot rows all
  hit while they are few against the sets.
* **What a miss costs** (``TierPrice``): each missed row is fetched over the host link and, the cache's rows being
  dirty in training, one is written back as it is evicted (2 x its bytes); the optimizer state stays in host memory,
  read and written for every distinct row (2 x its state's bytes); plus a fixed time per missed row (the populate
  kernel's). ``PRIOR``: TorchRec's planner's own host link (``HBM_TO_DDR_MEM_BW``, 32 GiB/s) and no per-row time,
  until a GPU run's managed-caching labels (``tools/gpu_check.py``'s ``uvm.json``) fit both (``fit_price``).
* **Priced in every searcher** (``CostModel.with_tiers``, ``miss_terms``): a cached table's shard adds its misses'
  ms (so much a column, so much a shard; a row block its own) to its device's compute, a latent channel the searches
  sum and the head adds; a plan whose task caches other tables (TorchRec's own choice) is priced with its own
  (``CostModel.for_task``, which every scoring entry point asks).
* **Which tables** (``tiered``): where a GPU task's tables do not fit its devices' memory, the planner moves tables
  to tiered memory one step at a time (load factor 0.5, then 0.2, 0.1, 0.05), each step the one that adds the least
  miss time per byte it frees, until the tables take at most ``TIER_FILL`` of the devices' memory (room for the
  search to pack). A task that fits is planned as before. The search cuts no cached table in row blocks nor
  replicates it by choice (``search.ways``); TorchRec's plans may, and their blocks' misses are priced too.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import NUM_BINS, table_keys
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.memory import CACHE_ASSOC, STATE_BYTES, Optimizer, Training, cache_slots, gib
from neuroshard_jax.core.sharding import element_bytes, row_blocks, shard_features
from neuroshard_jax.core.table import Table
from neuroshard_jax.core.task import Task, infeasibility

# a batch's rows read at most twice (histogram bins 0 and 1) are its cold rows: the next batch reads others in their
# place, as the project's streams of a training step's batches take it (``workloads.streams.COLD_READS``,
# docs/results/batches.md); rows read more often stay hot
COLD_BINS = 2
LOAD_FACTORS = (0.5, 0.2, 0.1, 0.05)  # the steps a table takes into tiered memory, largest cache first
TIER_FILL = 0.85  # tiering stops where the tables take at most this share of the devices' memory for tables
TIER_RETRIES = (0.75, 0.65, 0.5)  # and where the search packs no plan at that, at these (``Planner.run``)
TIERING_MODES = ("auto", "off")  # auto: where a GPU's memory is short; off: never (an infeasible task is refused)
GIB = 1024**3
# the mean access count of a row in each histogram bin: 1 in bin 0, (2^(k-1), 2^k] in bin k (its midpoint), and
# past 2^15 (bin 16) taken as 2^16
BIN_COUNTS = np.array([1.0] + [(2 ** (k - 1) + 1 + 2**k) / 2 for k in range(1, NUM_BINS - 1)] + [2.0**16])


@dataclasses.dataclass(frozen=True)
class TierPrice:
    """What a cache miss costs: the host link's bandwidth (GiB/s, both ways) and a fixed time per missed row (us);
    ``source``: where they come from (TorchRec's constant, or the labels they were fitted on)."""

    link_gibps: float
    miss_us: float = 0.0
    source: str = "TorchRec's planner's host link (HBM_TO_DDR_MEM_BW, 32 GiB/s): no managed-caching labels"

    def __post_init__(self):
        if not (self.link_gibps > 0 and self.miss_us >= 0):
            raise UserError(f"tier price: got {self.link_gibps} GiB/s and {self.miss_us} us a miss, expected > 0, >= 0")

    def ms(self, traffic_bytes, missed_rows):
        """ms of moving ``traffic_bytes`` over the link and handling ``missed_rows`` missed rows."""
        return traffic_bytes / (self.link_gibps * GIB / 1e3) + missed_rows * self.miss_us / 1e3

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


PRIOR = TierPrice(32.0)


def distinct_rows(table: Table, batch_size: int) -> np.ndarray:
    """f64[17]: the distinct rows a batch of ``batch_size`` reads, by histogram bin (its lookups over the mean count
    of a distinct row), at most the table's rows."""
    bins = np.asarray(table.bins, np.float64)
    mean_count = float(bins @ BIN_COUNTS)
    if mean_count <= 0 or table.pooling_factor <= 0:
        return np.zeros(NUM_BINS)
    total = min(table.pooling_factor * batch_size / mean_count, float(table.rows))
    return bins * total


def missed_rows(table: Table, batch_size: int, load_factor: float, rows: int | None = None) -> tuple[float, float]:
    """(missed, distinct): the distinct rows a batch reads that an LRU cache of ``load_factor`` of ``rows`` rows
    (default the table's) does not hold, and all the distinct rows it reads (the module's words give the rule)."""
    rows = table.rows if rows is None else rows
    share = rows / max(table.rows, 1)
    per_bin = distinct_rows(table, batch_size) * share
    slots = cache_slots(rows, load_factor)
    hot_rows = float(per_bin[COLD_BINS:].sum())
    held = min(set_held(hot_rows, slots // CACHE_ASSOC, CACHE_ASSOC), float(rows))
    cold = float(per_bin[:COLD_BINS].sum())
    population = max(rows - hot_rows, cold, 1.0)
    hit = min(1.0, max(min(slots, rows) - held, 0.0) / population)
    return hot_rows - held + cold * (1.0 - hit), float(per_bin.sum())


def set_held(rows: float, sets: int, ways: int) -> float:
    """The rows a cache of ``sets`` sets of ``ways`` slots holds of ``rows`` rows that each batch reads (its hot
    rows: once held, an LRU cache keeps them), each in the set its hash names: ``sets`` x E[min(X, ways)], X the rows
    hashed to one set (Poisson of mean rows / sets); where they crowd a set past its ways, the rest miss."""
    if rows <= 0 or sets <= 0:
        return 0.0
    mean = rows / sets
    pmf, below, held = math.exp(-mean), 0.0, 0.0
    for k in range(ways):  # E[min(X, ways)] = sum over k < ways of P(X > k)
        below += pmf
        held += max(0.0, 1.0 - below)
        pmf *= mean / (k + 1)
    return min(rows, sets * held)


def miss_traffic(task: Task, index: int, load_factor: float, dim: int | None = None) -> tuple[float, float]:
    """(bytes over the host link, missed rows) a step of table ``index`` (``dim`` of its columns, default all) at
    ``load_factor``: each missed row fetched and one written back, the optimizer state of every distinct row read and
    written in host memory."""
    table = task.tables[index]
    dim = table.dim if dim is None else dim
    missed, distinct = missed_rows(table, task.batch_size, load_factor)
    per_dim, fixed = traffic_terms(missed, distinct, element_bytes(task.table_precision(index)), task.training.state)
    return per_dim * dim + fixed, missed


def traffic_terms(missed: float, distinct: float, element: int, state: Optimizer) -> tuple[float, float]:
    """(bytes a column, bytes whatever the width) a shard moves over the host link a step: each of its ``missed``
    rows fetched and one written back, the optimizer state of each of its ``distinct`` rows read and written."""
    per_dim = 2 * missed * element + 2 * distinct * state.per_weight * STATE_BYTES
    return per_dim, 2 * distinct * state.per_row * STATE_BYTES


def miss_ms(task: Task, index: int, load_factor: float, price: TierPrice = PRIOR) -> float:
    """ms a step of table ``index`` (whole) spends on its cache's misses at ``load_factor``."""
    return float(price.ms(*miss_traffic(task, index, load_factor)))


WHOLE_ROWS = ("table_wise", "column_wise")


def check_whole_rows(table: Table, name: str) -> None:
    """UserError naming table ``name`` where it is in tiered memory and its sharding types allow no whole rows
    (table-wise or column-wise): tiered memory is for tables whose rows the devices cannot hold, and the search cuts
    no cached table in row blocks nor replicates it by choice (``search.ways``)."""
    if table.cached and not tierable(table):
        raise UserError(
            f"task.tables[{name!r}].cache_load_factor: given with sharding_types "
            f"{list(table.constraints.sharding_types)}, expected table_wise "
            "or column_wise among them (a table in tiered memory is planned in whole rows)"
        )


def tierable(table: Table) -> bool:
    """Whether the planner may move ``table`` to tiered memory: not data-parallel-only, and its sharding types
    allow whole rows (table-wise or column-wise)."""
    types = table.constraints.sharding_types
    return types is None or bool(set(WHOLE_ROWS) & set(types))


def check_tiering(mode: str) -> str:
    """``mode`` if it is one of ``TIERING_MODES``, else a one-line UserError."""
    if mode not in TIERING_MODES:
        raise UserError(f"tiering: got {mode!r}, expected one of {', '.join(TIERING_MODES)}")
    return mode


def tiered(task: Task, mode: str = "auto", price: TierPrice = PRIOR, fill: float | None = None) -> Task:
    """``task`` with tables moved to tiered memory where its devices' memory is short (``mode`` auto, a GPU task:
    the module's words give the rule), else ``task`` itself; ``fill``: until the tables take at most that share of
    the devices' memory for tables whether or not they fit (a planning run's retry, ``TIER_RETRIES``; None: where
    they do not fit, ``TIER_FILL``). Tables the user cached keep their load factor (``check_whole_rows``). Tables
    alike in every feature but width (which a model prices alike) move together, so that one price is right for all
    of them."""
    check_tiering(mode)
    for i, t in enumerate(task.tables):
        check_whole_rows(t, task.table_names()[i])
    if mode == "off" or (fill is None and infeasibility(task) is None):
        return task
    if task.step_memory().total >= int(task.room_bytes().max()):  # the batch's slice alone fills a device
        return task
    tables = list(task.tables)
    room = float(task.cap_bytes().sum()) * (TIER_FILL if fill is None else fill)
    sizes = [task.table_mem_bytes(i) for i in range(task.num_tables)]
    need = float(sum(sizes))
    keys = table_keys(task.features())
    groups: dict[bytes, list[int]] = {}
    for i, t in enumerate(tables):
        if not t.cached and tierable(t):
            groups.setdefault(keys[i].tobytes(), []).append(i)
    moves: list[tuple[float, int, int]] = []  # (ms per byte freed, the group's first table, step)
    members = {g[0]: g for g in groups.values()}

    def push(first: int, step: int) -> None:
        """The group's next step that frees bytes (a narrow table's cache slots may take more than its rows)."""
        group = members[first]
        was = sum(_cost(task, i, tables[i].cache_load_factor, price) for i in group)
        for at in range(step, len(LOAD_FACTORS)):
            freed = sum(sizes[i] - _bytes(task, tables[i], LOAD_FACTORS[at]) for i in group)
            if freed > 0:
                added = sum(_cost(task, i, LOAD_FACTORS[at], price) for i in group) - was
                heapq.heappush(moves, (added / freed, first, at))
                return

    for first in members:
        push(first, 0)
    current = task
    while (need > room or infeasibility(current) is not None) and moves:
        _, first, step = heapq.heappop(moves)
        lf = LOAD_FACTORS[step]
        for i in members[first]:
            tables[i] = dataclasses.replace(tables[i], cache_load_factor=lf)
            after = _bytes(task, tables[i], lf)
            need -= sizes[i] - after
            sizes[i] = after
        current = dataclasses.replace(task, tables=tuple(tables))
        push(first, step + 1)
    return current


def _bytes(task: Task, table: Table, load_factor: float) -> int:
    probe = dataclasses.replace(task, tables=(dataclasses.replace(table, cache_load_factor=load_factor),))
    return probe.table_mem_bytes(0)


def _cost(task: Task, index: int, load_factor: float | None, price: TierPrice) -> float:
    return 0.0 if load_factor is None else miss_ms(task, index, load_factor, price)


def tier_key(task: Task) -> tuple:
    """Which tables of ``task`` are in tiered memory, at which load factor, the tables' features, the batch, the
    optimizer and the devices: what a model pricing tiered memory (``CostModel.with_tiers``) was priced for; ()
    where none is."""
    cached = tuple((i, t.cache_load_factor) for i, t in enumerate(task.tables) if t.cached)
    if not cached:
        return ()
    layout = (task.batch_size, task.training.optimizer, task.num_devices, task.local_size())
    return cached, layout, hash(task.tables)  # the tables themselves (frozen): no feature matrix on a scoring path


def miss_terms(task: Task, price: TierPrice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys f32[K, F], ms a column f64[K], ms a shard f64[K]) of ``task``'s cached tables, whole and in the row
    blocks the search and TorchRec cut (over every device, over one host's): a shard whose features are key k's adds
    ``per_dim[k]`` x its width + ``fixed[k]`` ms of misses (``miss_traffic``'s rule: its rows fetched and written
    back, its optimizer state read and written for every row it reads, the time per missed row). Tables of the
    task alike in every feature but width share a key: where not all of them are cached the same, each is priced at
    their mean (the planner caches such tables together, ``tiered``)."""
    feats = task.features()
    keys = table_keys(feats)
    per_link = price.link_gibps * GIB / 1e3  # bytes a ms
    state = task.training.state
    counts = [c for c in {task.num_devices, task.local_size() or 0} if c >= 2]
    terms: dict[bytes, list] = {}  # key -> [key, per_dim, fixed, how many tables]
    alike: dict[bytes, int] = {}
    for k in keys:
        alike[k.tobytes()] = alike.get(k.tobytes(), 0) + 1
    for i, t in enumerate(task.tables):
        if not t.cached:
            continue
        shapes = {(None, None)} | {
            (n, t.block_stats(offset, n)) if t.row_blocks else (n, None)
            for c in counts
            for offset, n in row_blocks(t.rows, c)
            if 0 < n < t.rows
        }
        element = element_bytes(task.table_precision(i))
        for n, stats in shapes:
            key = keys[i] if n is None else table_keys(shard_features(feats[i], t.dim, n, stats)[None])[0]
            missed, distinct = missed_rows(t, task.batch_size, t.cache_load_factor, n)
            per_dim, fixed = (b / per_link for b in traffic_terms(missed, distinct, element, state))
            fixed += missed * price.miss_us / 1e3
            entry = terms.setdefault(key.tobytes(), [key, 0.0, 0.0, alike.get(key.tobytes(), 1) if n is None else 1])
            entry[1], entry[2] = entry[1] + per_dim, entry[2] + fixed
    if not terms:
        return np.zeros((0, feats.shape[1]), np.float32), np.zeros(0), np.zeros(0)
    rows = list(terms.values())
    return (
        np.stack([r[0] for r in rows]).astype(np.float32),
        np.array([r[1] / r[3] for r in rows]),
        np.array([r[2] / r[3] for r in rows]),
    )


def cached_tables(task: Task) -> list[int]:
    """The indices of ``task``'s tables in tiered memory."""
    return [i for i, t in enumerate(task.tables) if t.cached]


def describe(task: Task, price: TierPrice = PRIOR) -> str:
    """``3 tables in tiered memory (load factors 0.2-0.5), their misses 1.2 ms a step by ...`` for messages."""
    cached = cached_tables(task)
    factors = sorted({task.tables[i].cache_load_factor for i in cached})
    ms = sum(miss_ms(task, i, task.tables[i].cache_load_factor, price) for i in cached)
    span = f"{factors[0]:g}" if len(factors) == 1 else f"{factors[0]:g}-{factors[-1]:g}"
    return (
        f"{len(cached)} table{'s' if len(cached) != 1 else ''} in tiered memory (host rows, a cache of "
        f"{span} of them on the GPU: {gib(task.host_mem_bytes())} GiB in host memory), their misses "
        f"{ms:.3g} ms a step by {price.source}"
    )


# --------------------------------------------------------------------------------------------------------------------
# fitted on a GPU run's managed-caching labels


def price_readings(doc: dict) -> list[dict]:
    """Per (table, load factor) of a ``uvm.json``: the cached kernel's mean ms over the same table's in the GPU's
    memory (the extra), and the bytes and missed rows ``miss_traffic`` predicts; readings that failed are left out."""
    out = []
    training = Training(optimizer=doc.get("optimizer", "exact_sgd"))
    for row in doc.get("tables", []):
        if "bins" not in row:
            raise UserError(f"uvm labels: table {row.get('table')} has no bins, expected its access histogram")
        table = Table(
            int(row["table"]), int(row["rows"]), int(row["dim"]), float(row["pooling_factor"]), tuple(row["bins"])
        )
        task = Task.uniform(1, 1.0, int(doc["batch_size"]), (table,), doc.get("precision", "fp32"), training=training)
        ok = [r for r in row["readings"] if r.get("ok")]
        hbm = [r["total_ms"] for r in ok if r["cache_load_factor"] is None]
        if not hbm:
            continue
        for lf in sorted({r["cache_load_factor"] for r in ok if r["cache_load_factor"] is not None}):
            cached = [r["total_ms"] for r in ok if r["cache_load_factor"] == lf]
            traffic, missed = miss_traffic(task, 0, lf)
            extra = float(np.mean(cached) - np.mean(hbm))
            out.append({"table": table.id, "load_factor": lf, "extra_ms": extra, "bytes": traffic, "missed": missed})
    return out


def fit_price(readings: Sequence[dict], source: str) -> TierPrice:
    """The ``TierPrice`` whose ms fit the readings' extra ms best (least squares on relative error, a reading within
    5% of the median's of 0 weighed as at that floor; both terms >= 0, the link always): its link from the bytes, its
    per-row time from the missed rows (none where the two cannot be told apart: every table of one row width).
    UserError with fewer than two readings."""
    if len(readings) < 2:
        raise UserError(f"uvm labels: {len(readings)} usable readings, expected at least 2 to fit the miss price")
    floor = 0.05 * float(np.median([abs(r["extra_ms"]) for r in readings]))  # a reading near 0 weighs as at it
    extra = np.array([r["extra_ms"] for r in readings])
    weight = 1.0 / np.maximum(np.abs(extra), max(floor, 1e-9))
    design = np.array([[r["bytes"] / (GIB / 1e3), r["missed"] / 1e3] for r in readings]) * weight[:, None]
    target = extra * weight
    best = None
    # non-negative least squares over two terms: each subset, the best kept; where the bytes and the missed rows
    # move together (tables of one row width and no optimizer state), the link alone
    subsets = ((0, 1), (0,)) if np.linalg.matrix_rank(design, tol=1e-6) == 2 else ((0,),)  # a link, always
    for cols in subsets:
        coef, *_ = np.linalg.lstsq(design[:, cols], target, rcond=None)
        if np.any(coef < 0):
            continue
        full = np.zeros(2)
        full[list(cols)] = coef
        err = float(np.sum((design @ full - target) ** 2))
        if best is None or err < best[0]:
            best = (err, full)
    if best is None or best[1][0] <= 0:
        raise UserError("uvm labels: the cached kernels were not slower with more misses; no miss price to fit")
    inv_bw, us = best[1]
    return TierPrice(1.0 / inv_bw, float(us), source)


def held_out(readings: Sequence[dict], source: str) -> dict:
    """Each table's readings priced by the price fitted on the other tables': MAPE of the extra ms, per table and
    in all (the figure a fitted price is judged by)."""
    tables = sorted({r["table"] for r in readings})
    errors: dict[str, float] = {}
    every = []
    for t in tables:
        try:
            price = fit_price([r for r in readings if r["table"] != t], source)
        except UserError:  # the other tables fit no price: this one is not judged
            continue
        mine = [r for r in readings if r["table"] == t]
        errs = [abs(price.ms(r["bytes"], r["missed"]) - r["extra_ms"]) / max(abs(r["extra_ms"]), 1e-6) for r in mine]
        errors[str(t)] = float(np.mean(errs))
        every += errs
    return {"per_table_mape": errors, "mape": float(np.mean(every)) if every else math.nan}


PRICES = Path(__file__).resolve().parent.parent / "data" / "tiers"


def price_file(gpu: str) -> Path:
    """Where the miss price fitted on a GPU of this name is shipped: ``data/tiers/<its name, lower case, words
    joined by ->.json``."""
    return PRICES / ("-".join(re.findall(r"[a-z0-9]+", gpu.lower())) + ".json")


def tier_price(device: str) -> TierPrice:
    """The miss price a plan for ``device`` uses: on a GPU, the one fitted on this machine's GPU where shipped
    (``price_file``), else ``PRIOR`` (a plan made on a machine without a GPU takes ``PRIOR``)."""
    if device != "cuda":
        return PRIOR
    gpu = hardware().get("gpu")
    path = price_file(str(gpu)) if gpu else None
    if path is None or not path.is_file():
        return PRIOR
    doc = json.loads(path.read_text())
    return TierPrice(float(doc["link_gibps"]), float(doc["miss_us"]), str(doc["source"]))
