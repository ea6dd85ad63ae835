"""Plain-Python NeuroShard search, one shard at a time, as the paper describes it: the oracle the
vectorised searchers must agree with. Deliberately loop-based and independent of searchers.grid
except for the integer rules (memory units, dim bounds) it shares by definition."""

from __future__ import annotations

import jax
import numpy as np

from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import shard_features
from neuroshard_jax.costs.cost_model import plan_cost_ms
from neuroshard_jax.costs.scoring import score_plan
from searchers.grid import cap_units, comm_slope, dim_bounds, mem_units, unit_bytes


class Oracle:
    def __init__(self, task, model, alphas, memory_only_fallback=True, comm_weights=()):
        self.task, self.model = task, model
        self._embed = jax.jit(lambda f: model.fns.embed(model.params, f))
        self._head = jax.jit(lambda z: model.fns.head(model.params, z))
        self.feats = task.features()
        total_dim = sum(t.dim for t in task.tables)
        n = task.num_devices
        slope = float(comm_slope(model.fns, model.params, total_dim / n, np.ones(n, bool)))
        # the comm-aware greedy's ms per element of a device's width, one per positive weight (``refine``)
        self.weights = [w * slope for w in dict.fromkeys(comm_weights) if w > 0 and slope > 0]
        self.bounds = [int(b) for b in dim_bounds(alphas, total_dim, n, memory_only_fallback)]
        self.memory_only_fallback = memory_only_fallback
        self.unit = unit_bytes(task)
        self.cap = cap_units(task.largest_cap_bytes, self.unit)

    def shard(self, t, dim):
        z = np.asarray(self._embed(shard_features(self.feats[t], dim).astype(np.float32)))
        return z, float(self._head(z))

    def greedy(self, levels, bound, by_memory=False, weight=0.0):
        """One table-wise greedy run; returns a Plan or None when a shard fits nowhere. ``by_memory``: largest
        memory first, each on the eligible device with the most memory left."""
        task, n = self.task, self.task.num_devices
        slots = [(t, task.tables[t].dim >> levels[t]) for t in range(task.num_tables) for _ in range(1 << levels[t])]
        shards = [self.shard(t, d) for t, d in slots]
        need = [int(mem_units(task.table_mem_bytes(t, d), self.unit)) for t, d in slots]
        order = sorted(range(len(slots)), key=lambda i: -(need[i] if by_memory else shards[i][1]))
        latents = [None] * n
        used, dim_sums, compute = [0] * n, [0] * n, [0.0] * n
        devices = [None] * len(slots)
        for i in order:
            t, d = slots[i]
            eligible = [j for j in range(n) if used[j] + need[i] <= self.cap and dim_sums[j] + d <= bound]
            if not eligible:
                return None
            # first of equals: lowest; a device's load: its compute and ``weight`` ms per element of its width
            j = min(eligible, key=lambda j: used[j] - self.cap if by_memory else compute[j] + weight * dim_sums[j])
            latents[j] = shards[i][0] if latents[j] is None else latents[j] + shards[i][0]
            used[j] += need[i]
            dim_sums[j] += d
            compute[j] = float(self._head(latents[j]))
            devices[i] = j
        splits = [1 << k for k in levels]
        per_table, start = [], 0
        for count in splits:
            per_table.append(devices[start : start + count])
            start += count
        return Plan.from_assignment(task, splits, per_table)

    def grid(self, levels=None, weight=0.0):
        """Best (cost, plan) over the alpha grid; (inf, None) if no alpha gives a plan. ``weight``: the greedy's ms
        per element of a device's width (0: the paper's rule)."""
        levels = levels or (0,) * self.task.num_tables
        best = (float("inf"), None)
        for bound in self.bounds:
            plan = self.greedy(levels, bound, weight=weight)
            if plan is not None:
                cost = float(plan_cost_ms(score_plan(self.model, plan)))
                if cost < best[0]:
                    best = (cost, plan)
        if best[1] is None and self.memory_only_fallback:  # nothing placed it: pack by memory
            plan = self.greedy(levels, np.iinfo(np.int32).max, by_memory=True)
            if plan is not None:
                best = (float(plan_cost_ms(score_plan(self.model, plan))), plan)
        return best

    def beam(self, k, n, max_length):
        task = self.task
        max_level = [0] * task.num_tables
        for t, table in enumerate(task.tables):
            while table.dim % (4 << (max_level[t] + 1)) == 0:
                max_level[t] += 1
        root = (0,) * task.num_tables
        best = self.grid(root)
        scored = {root: best[0]}
        beam = [root]
        for _ in range(max_length):
            candidates = []
            for levels in beam:
                can = [t for t in range(task.num_tables) if levels[t] < max_level[t]]
                size = {t: task.tables[t].rows * (task.tables[t].dim >> levels[t]) for t in can}
                cost = {t: self.shard(t, task.tables[t].dim >> levels[t])[1] for t in can}
                top = set(sorted(can, key=lambda t: (-size[t], t))[:n]) | set(
                    sorted(can, key=lambda t: (-cost[t], t))[:n]
                )
                for t in sorted(top):
                    child = levels[:t] + (levels[t] + 1,) + levels[t + 1 :]
                    if child not in candidates:
                        candidates.append(child)
            if not candidates:
                break
            level = [(self.grid(c), c) for c in candidates]
            for (cost, plan), c in level:
                scored.setdefault(c, cost)
                if cost < best[0]:
                    best = (cost, plan)
            order = sorted(range(len(level)), key=lambda i: level[i][0][0])
            beam = [level[i][1] for i in order[:k]]
        return self.refine(scored, k + 1, best)

    def grid_search(self):
        """The grid searcher's plan: the table-wise greedy over the alpha grid, then placed again comm-aware."""
        root = (0,) * self.task.num_tables
        best = self.grid(root)
        return self.refine({root: best[0]}, 1, best)

    def refine(self, scored, k, best):
        """The k cheapest candidates scored (first scored first among equals) placed again by the comm-aware greedy,
        once per weight; the best (cost, plan) of all."""
        top = sorted((c, i, levels) for i, (levels, c) in enumerate(scored.items()) if np.isfinite(c))[:k]
        for weight in self.weights:
            for _, _, levels in top:
                cost, plan = self.grid(levels, weight)
                if cost < best[0]:
                    best = (cost, plan)
        return best
