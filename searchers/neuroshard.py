"""NeuroShard's searchers: greedy grid search (table-wise) and beam search over column-wise splits.

Both run the batched greedy of ``searchers.grid`` (one ``lax.scan`` over shards, vmapped over
candidates and alphas); beam search scores a whole beam level in one call. Neither draws random
numbers: the seed is accepted for the interface and the plan is a function of the task and the
cost model alone.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import ClassVar

import numpy as np

from neuroshard_jax.core.config import bounded, check_bounds
from neuroshard_jax.core.constraints import KEYS as CONSTRAINT_KEYS
from neuroshard_jax.core.constraints import allowed_devices, groups, max_levels
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.features import FEATURE_INDEX, NUM_FEATURES
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import CostModel, bucket, fine_bucket
from neuroshard_jax.costs.scoring import input_terms, shards_alone
from searchers.grid import (
    MEMORY_ONLY,
    ShardBatch,
    cap_units,
    comm_slope,
    dim_bounds,
    grid_search,
    mem_units,
    unit_bytes,
)
from searchers.registry import Searcher, register

logger = logging.getLogger(__name__)
DEFAULT_ALPHAS = tuple(round(1.0 + 0.05 * i, 2) for i in range(11))  # 1.0, 1.05, ..., 1.5


class SplitSpace:
    """Column splits of a task: table t halved k_t times (0 <= k_t <= max_halvings(dim_t)).

    Precomputes, per (table, level), the shard's features, memory units and predicted compute. ``merge``: a plan that
    cuts a table over devices declares its whole tables column-wise too where they may be (``Plan.merge_column_wise``).
    """

    def __init__(self, task: Task, model: CostModel, merge: bool = True):
        self.task = task
        self.merge = merge
        # the tables that join the column-wise group of a placement that has one (``Plan.column_wise_tables``)
        self.column_ok = np.array([merge and t.joins_column_group for t in task.tables], bool)
        self.max_level = max_levels(task.tables)  # legal halvings, within the tables' constraints
        self.allowed = allowed_devices(task.tables, task.num_devices)  # bool[T, N]
        self.group_of = np.arange(task.num_tables)  # a colocated table's group leader: the group's first table
        for members in groups(task.tables).values():
            self.group_of[members] = members[0]
        levels = int(self.max_level.max()) + 1
        task_feats = task.features()
        self.shard_dim = np.array([[max(t.dim >> k, 1) for k in range(levels)] for t in task.tables])
        # each slice's all-to-all width (``Table.width``: its dim, or a row per id of a sequence table)
        self.shard_width = np.array([[t.width(int(d)) for d in row] for t, row in zip(task.tables, self.shard_dim)])
        # each level's shards: the table's features with its width and size (``shard_features``, all tables at once)
        feats = np.repeat(np.asarray(task_feats, dtype=np.float64)[:, None, :], levels, axis=1)
        feats[:, :, FEATURE_INDEX["dim"]] = self.shard_dim
        feats[:, :, FEATURE_INDEX["size"]] = feats[:, :, FEATURE_INDEX["rows"]] * self.shard_dim
        self.feats = feats.astype(np.float32)
        self.unit = unit_bytes(task)
        shard_bytes = [[task.table_mem_bytes(t, int(d)) for d in row] for t, row in enumerate(self.shard_dim)]
        self.mem = mem_units(shard_bytes, self.unit)
        self.shard_size = np.array([[t.rows] for t in task.tables]) * self.shard_dim
        self.pooling = np.array([t.pooling_factor for t in task.tables], dtype=np.float32)
        self.single_ms = shards_alone(model, self.feats)[1].astype(np.float64)

    def batch(self, candidates: list[tuple[int, ...]], min_candidates: int = 1) -> ShardBatch:
        """The shard slots of each candidate (table-major, column order), padded to power-of-two buckets (of at
        least ``min_candidates`` candidates)."""
        counts = [sum(1 << k for k in c) for c in candidates]
        num_c, num_s = bucket(len(candidates), min_candidates), fine_bucket(max(counts), 8)
        feats = np.zeros((num_c, num_s, NUM_FEATURES), dtype=np.float32)
        mem = np.zeros((num_c, num_s), dtype=np.int32)
        dims = np.zeros((num_c, num_s), dtype=np.int32)
        valid = np.zeros((num_c, num_s), dtype=bool)
        allowed = np.ones((num_c, num_s, self.task.num_devices), dtype=bool)
        leader = np.tile(np.arange(num_s, dtype=np.int32), (num_c, 1))
        column_table = np.full((num_c, num_s), -1, dtype=np.int32)
        column_ok = np.zeros((num_c, num_s), dtype=bool)
        ids = np.zeros((num_c, num_s), dtype=np.float32)
        for c, levels in enumerate(candidates):
            counts = [1 << k for k in levels]
            tables = np.repeat(np.arange(len(levels)), counts)
            ks = np.asarray(levels)[tables]
            s = len(tables)
            feats[c, :s] = self.feats[tables, ks]
            mem[c, :s] = self.mem[tables, ks]
            dims[c, :s] = self.shard_width[tables, ks]
            valid[c, :s] = True
            column_table[c, :s] = np.where(ks > 0, tables, -1)  # cut in columns: TorchRec's column_wise
            ids[c, :s] = self.pooling[tables]
            column_ok[c, :s] = self.column_ok[tables]
            allowed[c, :s] = self.allowed[tables]
            first_slot = np.cumsum([0, *counts])[:-1]  # colocated tables are whole: one slot each
            leader[c, :s] = np.where(self.group_of[tables] == tables, np.arange(s), first_slot[self.group_of[tables]])
        return ShardBatch(
            feats, mem, dims, valid, allowed, leader, column_table, ids, column_ok if self.column_ok.any() else None
        )

    def plan(self, levels: tuple[int, ...], slot_devices: np.ndarray) -> Plan:
        splits = [1 << k for k in levels]
        bounds = np.cumsum([0, *splits])
        devices = [[int(d) for d in slot_devices[bounds[t] : bounds[t + 1]]] for t in range(len(splits))]
        plan = Plan.from_assignment(self.task, splits, devices)
        return plan if self.merge else dataclasses.replace(plan, merge_column_wise=False)


MIN_CANDIDATES = 8  # beam's smallest padded batch of candidate splits
# beam's work bound (``BeamSearch.max_work``): placements weighed, summed over a search's calls after its first; a
# call of C candidates weighs C x alphas x shard slots x devices (padded). The 856-table pool on 64 devices takes
# ~5e8 in all, 5,000 tables on 512 devices 3e7 a candidate; on a 2-core AMD EPYC a unit takes ~5 ns
MAX_WORK = 2e9
PAD_WORK = 1e8  # a call is padded to a level's full bucket (one compiled shape for all) where that costs less
FULL_CANDIDATES = 64  # that bucket at most (k=3 plans x 2n=20 tables by default: 64)
# the comm-aware placement of the cheapest candidates (``Scorer.refine``) runs where its calls weigh at most this many
# placements: every task up to hundreds of tables on tens of devices (856 tables on 64 devices: ~6e6 a call); 5,000
# tables on 512 devices (~4e8) would take 30% longer for it, so there it is skipped, with a log line
REFINE_WORK = 2e7


@dataclasses.dataclass(frozen=True)
class GridConfig:
    alphas: tuple[float, ...] = bounded(at_least=1, default=DEFAULT_ALPHAS)
    # also run the greedy with no dim bound, and where that fails too, pack by memory (largest first, least used device)
    memory_only_fallback: bool = True
    # the comm-aware greedy, run again on the cheapest candidates once per weight (``Scorer.refine``): a device's load
    # is its compute plus weight x the ms its all-to-all width costs (``grid.comm_slope``); 1 weighs the collectives
    # as the model prices them; [] (the default) or 0: off, the paper's rule alone (compute, the width held by the dim
    # bound). Off by default: the plans it changed on the foreign tasks measured no faster (docs/searchers.md)
    comm_weights: tuple[float, ...] = bounded(at_least=0, default=())
    # where a plan cuts a table in columns over devices, its whole tables are declared column-wise too (one shard
    # each), so that TorchRec runs one all-to-all, one input distribution and one kernel a device in place of two
    # (``Plan.merge_column_wise``); false: they stay table-wise, and a cut pays a second all-to-all
    merge_column_wise: bool = True

    def check(self) -> None:
        """The bounds of every field (a beam's too) and a non-empty ``alphas``."""
        check_bounds(self, "searcher.")
        if not self.alphas:
            raise UserError("searcher.alphas: got [], expected a non-empty list of finite numbers >= 1")
        if not isinstance(self.merge_column_wise, bool):
            raise UserError(f"searcher.merge_column_wise: got {self.merge_column_wise!r}, expected true or false")


class Scorer:
    """Scores lists of candidate splits by the batched grid search; remembers the best plan seen."""

    def __init__(self, space: SplitSpace, model: CostModel, config: GridConfig):
        task = space.task
        self.space, self.model = space, model
        total_dim = sum(t.width(t.dim) for t in task.tables)
        n = task.num_devices
        weighs = any(w > 0 for w in config.comm_weights)
        self.slope = float(comm_slope(model.fns, model.params, total_dim / n, np.ones(n, bool))) if weighs else 0.0
        self.bounds = dim_bounds(config.alphas, total_dim, n, config.memory_only_fallback)
        # the comm-aware greedy (``refine``): ms per element of a device's all-to-all width, one per positive weight
        self.comm_weights = [w * self.slope for w in dict.fromkeys(config.comm_weights) if w > 0 and self.slope > 0]
        self.scored: dict[tuple[int, ...], float] = {}  # every candidate's cost by the paper's rule, in scoring order
        self.memory_fallback = config.memory_only_fallback
        self.cap = cap_units(task.cap_bytes(), space.unit).astype(np.int32)
        self.device_mask = np.ones(task.num_devices, dtype=bool)
        self.speed = task.speeds().astype(np.float32)
        # the ids' all-to-alls before the lookups, where the model prices them (``input_dist.py``)
        priced = model.input_dist is not None and task.num_devices > 1
        self.inputs = input_terms(model.input_dist, task) if priced else None
        self.best: tuple[float, tuple[int, ...], np.ndarray] | None = None
        self.candidates_scored = 0

    def work(self, candidates: list[tuple[int, ...]], min_candidates: int = 1) -> int:
        """The placements a ``score`` call of ``candidates`` weighs, padding included (``MAX_WORK``)."""
        slots = fine_bucket(max(sum(1 << k for k in c) for c in candidates), 8)
        return bucket(len(candidates), min_candidates) * len(self.bounds) * slots * self.space.task.num_devices

    def score(self, candidates: list[tuple[int, ...]], min_candidates: int = 1, weight: float = 0.0) -> np.ndarray:
        """Best plan cost f64[C] of each candidate over the alpha grid (+inf: infeasible); the batch is padded to at
        least ``min_candidates`` (fewer shapes to compile where calls of several sizes follow). ``weight``: the
        greedy's ms per element of a device's width (0: the paper's rule, compute alone; ``refine``)."""
        batch = self.space.batch(candidates, min_candidates)
        args = (self.model.fns, self.model.params, batch)
        weights = np.full(len(self.bounds), weight, np.float32)  # traced: every weight runs the one compiled search
        out = grid_search(
            *args, self.bounds, self.cap, self.device_mask, self.speed, inputs=self.inputs, weights=weights
        )
        cost, devices = np.asarray(out.cost_ms, dtype=np.float64), np.asarray(out.devices)
        unplaced = np.isinf(cost[: len(candidates)]).all(axis=1)
        if self.memory_fallback and unplaced.any():  # packed by memory, compiled and run only where needed
            packed = grid_search(
                *args,
                np.array([MEMORY_ONLY], np.int32),
                self.cap,
                self.device_mask,
                self.speed,
                by_memory=True,
                inputs=self.inputs,
            )
            packed_cost = np.where(np.isinf(cost).all(axis=1), np.asarray(packed.cost_ms, np.float64)[:, 0], np.inf)
            cost = np.concatenate([cost, packed_cost[:, None]], axis=1)
            devices = np.concatenate([devices, np.asarray(packed.devices)], axis=1)
        cost = cost[: len(candidates)]
        alpha = np.argmin(cost, axis=1)  # first minimum: the smallest alpha among equals
        best = cost[np.arange(len(candidates)), alpha]
        if weight == 0.0:
            for levels, c in zip(candidates, best):
                self.scored.setdefault(levels, float(c))
        self.candidates_scored += len(candidates)
        c = int(np.argmin(best))
        if np.isfinite(best[c]) and (self.best is None or best[c] < self.best[0]):
            self.best = (float(best[c]), candidates[c], devices[c, alpha[c]])
        return best

    def refine(self, k: int, min_candidates: int = 1) -> None:
        """The ``k`` cheapest candidates scored so far (first scored first among equals) placed again by the
        comm-aware greedy, once per comm weight: each device's load is its compute plus the ms its all-to-all width
        costs, so a device already wide takes the next shard only where its compute leaves room for the collectives.
        One call per weight, of the levels' shape: nothing recompiles. The
        best plan changes only where one of these is cheaper."""
        feasible = [(c, i, levels) for i, (levels, c) in enumerate(self.scored.items()) if np.isfinite(c)]
        top = [levels for _, _, levels in sorted(feasible)[:k]]
        if top and self.comm_weights and self.work(top, min_candidates) * len(self.comm_weights) > REFINE_WORK:
            logger.info("comm-aware placement skipped: %.3g placements, over %.3g", self.work(top), REFINE_WORK)
            return
        for weight in self.comm_weights if top else ():
            self.score(top, min_candidates, weight)

    def best_plan(self, searcher: str) -> Plan:
        if self.best is None:
            task = self.task_summary()
            raise InfeasibleError(
                f"{searcher}: no memory-feasible plan among {self.candidates_scored} candidate splits ({task})"
            )
        _, levels, devices = self.best
        return self.space.plan(levels, devices)

    def task_summary(self) -> str:
        return self.space.task.need_words()


@register("grid")
@dataclasses.dataclass(frozen=True)
class GridSearch(GridConfig, Searcher):
    """Table-wise greedy over the alpha grid; the plan with the lowest predicted cost."""

    constraints: ClassVar[tuple[str, ...]] = CONSTRAINT_KEYS
    replicates: ClassVar[bool] = True  # the pipeline tries its hot small tables data-parallel (search/ways.py)

    def __post_init__(self):
        self.check()

    def search(self, task: Task, cost_model: CostModel, seed: int) -> Plan:
        scorer = Scorer(SplitSpace(task, cost_model, self.merge_column_wise), cost_model, self)
        scorer.score([(0,) * task.num_tables])
        scorer.refine(1)
        return scorer.best_plan("grid")


def proposals(space: SplitSpace, levels: tuple[int, ...], n: int) -> list[int]:
    """Tables to halve next: the union of the top-n by shard size and by predicted shard compute,
    among tables whose shard can still be halved; ascending table index."""
    t = np.arange(len(levels))
    k = np.asarray(levels)
    can = np.flatnonzero(k < space.max_level)
    size = space.shard_size[t, k][can]
    cost = space.single_ms[t, k][can]
    by_size = can[np.lexsort((can, -size))][:n]
    by_cost = can[np.lexsort((can, -cost))][:n]
    return sorted(set(by_size.tolist()) | set(by_cost.tolist()))


@register("beam")
@dataclasses.dataclass(frozen=True)
class BeamSearch(GridConfig, Searcher):
    """Beam search over column-wise splits; every candidate scored by the grid search.

    A step halves one table's shards (two of half the width, each a multiple of 4); candidates are
    the union of the top-``n`` tables by shard size and by predicted compute, for each of the ``k``
    plans of the beam; a whole level is scored in one batched call; ``max_length`` steps at most.
    Returns the best plan seen (the unsplit table-wise plan included). ``column_wise=false`` (an
    ablation) splits nothing: the plan of the grid search. ``max_work`` (default ``MAX_WORK``; null: none) bounds
    the placements the levels weigh: thousands of tables on hundreds of devices, where one candidate weighs millions,
    score only the candidates it leaves room for (the best beam plans' first, in power-of-two batches) and stop
    where not even the smallest batch fits, saying so on stderr (the foreign benchmark's tasks and 856 tables on 64
    devices do not reach it; a task of hundreds of tables with 5 or more row-split and replica runs can). The
    plan stays a function of the task and the model. ``budget_s`` bounds the search in seconds the same way, from the
    measured time per candidate: the plan then depends on the machine's speed too.
    """

    k: int = bounded(at_least=1, default=3)  # beam width
    # candidates per plan: top-n tables by shard size and by predicted compute (union)
    n: int = bounded(at_least=1, default=10)
    max_length: int = bounded(at_least=0, default=10)  # halving steps at most
    column_wise: bool = True  # false: no column splits (ablation; the grid search's plan)
    # seconds: a level scores only the candidates left time allows (thousands of tables); null: none
    budget_s: float | None = bounded(above=0, default=None)
    # placements the levels may weigh in all (candidates x alphas x slots x devices); null: no bound
    max_work: float | None = bounded(above=0, default=MAX_WORK)
    constraints: ClassVar[tuple[str, ...]] = CONSTRAINT_KEYS
    replicates: ClassVar[bool] = True  # the pipeline tries its hot small tables data-parallel (search/ways.py)

    def __post_init__(self):
        self.check()
        if not isinstance(self.column_wise, bool):
            raise UserError(f"searcher.column_wise: got {self.column_wise!r}, expected true or false")

    def search(self, task: Task, cost_model: CostModel, seed: int) -> Plan:
        started = time.perf_counter()
        space = SplitSpace(task, cost_model, self.merge_column_wise)
        scorer = Scorer(space, cost_model, self)
        root = (0,) * task.num_tables
        beam = [root]
        # every call padded to a level's full size where that costs little (``PAD_WORK``): the root and the first
        # levels share one compiled shape with the rest, one trace of the grid search instead of three in every
        # process (each ~0.5 s of tracing and lowering, which JAX's persistent cache does not keep); the work bound
        # counts the unpadded batches, so the plan is the same either way
        full = min(bucket(2 * self.n * self.k, MIN_CANDIDATES), FULL_CANDIDATES)  # a level: k plans x 2n tables

        def padding(candidates: list) -> int:
            # under a time budget a call costs what ``_affordable`` counts: its own bucket
            cheap = self.budget_s is None and scorer.work(candidates, full) <= PAD_WORK
            return full if cheap else MIN_CANDIDATES

        pad = padding(beam) if scorer.work(beam, MIN_CANDIDATES) <= PAD_WORK else 1
        scorer.score(beam, pad)
        per_candidate = (time.perf_counter() - started) / pad  # compilation included: an upper bound
        work_left = self.max_work
        for level in range(self.max_length if self.column_wise else 0):
            candidates, seen = [], set()
            for levels in beam:
                for t in proposals(space, levels, self.n):
                    child = levels[:t] + (levels[t] + 1,) + levels[t + 1 :]
                    if child not in seen:
                        seen.add(child)
                        candidates.append(child)
            if self.budget_s is not None:
                room = int((self.budget_s - (time.perf_counter() - started)) / max(per_candidate, 1e-9))
                candidates = self._affordable(candidates, room, level, f"budget_s={self.budget_s:g}")
            if work_left is not None and candidates:
                room = int(work_left // scorer.work(candidates[:1]))  # the candidates of a level are alike in size
                candidates = self._affordable(candidates, room, level, f"max_work={self.max_work:.3g}")
            if not candidates:
                break
            if work_left is not None:
                work_left -= scorer.work(candidates, MIN_CANDIDATES)
            scored_at = time.perf_counter()
            pad = padding(candidates)
            costs = scorer.score(candidates, pad)
            per_candidate = (time.perf_counter() - scored_at) / bucket(len(candidates), pad)
            keep = sorted(range(len(candidates)), key=lambda i: costs[i])[: self.k]  # stable: generation order
            beam = [candidates[i] for i in keep]
        # the k + 1 cheapest candidates placed again comm-aware: a call per weight outside the budgets, as the root's
        # is (the grid's plan, where the budgets leave no level, is the grid searcher's)
        scorer.refine(self.k + 1, padding(beam))
        return scorer.best_plan("beam")

    def _affordable(self, candidates: list, room: int, level: int, bound: str) -> list:
        """The first candidates (the best beam plans' children first) that ``room`` candidates' worth of a budget
        scores, in a power-of-two batch of at least MIN_CANDIDATES; none where not even that fits."""
        if room < MIN_CANDIDATES:
            logger.info(
                "beam: %s reached after %s of %s levels; the best plan so far is returned",
                bound,
                level,
                self.max_length,
            )
            return []
        if room >= bucket(len(candidates), MIN_CANDIDATES):  # the padded batch is what a call costs
            return candidates
        return candidates[: 1 << (room.bit_length() - 1)]
