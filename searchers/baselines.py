"""Classic baselines: greedy by a per-table key, and random search.

Greedy (as in the NeuroShard reference): sort tables by the key, descending; put each on the device
with the smallest sum of keys among devices where it still fits. Unlike the reference, a table that
fits on no device raises InfeasibleError instead of landing on the last device.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from neuroshard_jax.core.config import bounded, check_bounds
from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.constraints import KEYS as CONSTRAINT_KEYS
from neuroshard_jax.core.constraints import allowed_devices, groups, max_levels
from neuroshard_jax.core.errors import InfeasibleError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.costs.scoring import score_plans
from searchers.registry import Searcher, register

GREEDY_KEYS = {
    "dim": lambda t: float(t.dim),
    "size": lambda t: float(t.rows * t.dim),
    "lookup": lambda t: t.dim * t.pooling_factor,
    "size_lookup": lambda t: t.dim * t.pooling_factor * math.log10(t.rows),
}


def no_room(task: Task, table_index: int, free_bytes: np.ndarray, searcher: str) -> InfeasibleError:
    table = task.tables[table_index]
    return InfeasibleError(
        f"{searcher}: table {table.id} ({task.table_mem_bytes(table_index) / GIB_BYTES:.3f} GiB) fits on no device "
        f"(largest free memory {free_bytes.max() / GIB_BYTES:.3f} GiB of {task.describe_devices()})"
    )


def placement_items(task: Task) -> list[list[int]]:
    """The units a table-wise placement moves: each colocation group as one item, every other table alone; in
    task order of their first table."""
    leader = list(range(task.num_tables))
    for members in groups(task.tables).values():
        for m in members:
            leader[m] = members[0]
    items: dict[int, list[int]] = {}
    for i, first in enumerate(leader):
        items.setdefault(first, []).append(i)
    return list(items.values())


def greedy_plan(task: Task, key: str, searcher: str) -> Plan:
    """Table-wise greedy placement by ``GREEDY_KEYS[key]`` (a colocation group: one item, the sum of its keys),
    on the devices each item is allowed on; each goes to the device of least load (its keys' sum divided by its
    speed) where it fits, or for devices of unequal speed, where it would finish first."""
    keys = np.array([GREEDY_KEYS[key](t) for t in task.tables])
    allowed = allowed_devices(task.tables, task.num_devices)
    items = placement_items(task)
    order = sorted(range(len(items)), key=lambda k: -keys[items[k]].sum())  # stable: ties keep task order
    free = task.cap_bytes()
    speed = task.speeds()
    load = np.zeros(task.num_devices)
    devices = [0] * task.num_tables
    for k in order:
        item = items[k]
        need = sum(task.table_mem_bytes(i) for i in item)
        fits = (free >= need) & allowed[item[0]]
        if not fits.any():
            raise no_room(task, item[0], free, searcher)
        # identical devices: the least loaded; devices of unequal speed: where the item would finish first
        finish = load if (speed == speed[0]).all() else load + keys[item].sum() / speed
        d = int(np.argmin(np.where(fits, finish, np.inf)))
        for i in item:
            devices[i] = d
        free[d] -= need
        load[d] += keys[item].sum() / speed[d]
    return Plan.from_assignment(task, [1] * task.num_tables, [[d] for d in devices])


def _make_greedy(key: str):
    name = f"{key}_greedy"

    @register(name)
    @dataclasses.dataclass(frozen=True)
    class Greedy(Searcher):
        __doc__ = f"Greedy table-wise placement by {key} (see GREEDY_KEYS)."
        constraints: ClassVar[tuple[str, ...]] = CONSTRAINT_KEYS

        def search(self, task: Task, cost_model: CostModel, seed: int) -> Plan:
            return greedy_plan(task, key, name)

    Greedy.__name__ = Greedy.__qualname__ = f"{key.title().replace('_', '')}Greedy"
    return Greedy


DimGreedy, SizeGreedy, LookupGreedy, SizeLookupGreedy = (_make_greedy(k) for k in GREEDY_KEYS)


@register("random")
@dataclasses.dataclass(frozen=True)
class RandomSearch(Searcher):
    """Best of ``num_samples`` random plans by the cost model.

    Each sample halves every table a random number of times (0..max_halvings, when
    ``column_wise``), then puts the shards, in random order, on random devices that still have
    room. Samples that run out of room are redrawn (up to ``max_attempts_per_sample`` each).
    """

    num_samples: int = bounded(at_least=1, default=64)  # plans drawn (K)
    column_wise: bool = True  # also draw random column splits
    max_halvings: int = bounded(at_least=0, default=2)  # a table is split into at most 2^max_halvings column shards
    max_attempts_per_sample: int = 20
    constraints: ClassVar[tuple[str, ...]] = CONSTRAINT_KEYS

    def __post_init__(self):
        check_bounds(self, "searcher.")

    def sample(self, task: Task, rng: np.random.Generator) -> Plan | None:
        levels = max_levels(task.tables)  # legal halvings within the constraints (a colocated table: none)
        splits = [2 ** int(rng.integers(0, min(self.max_halvings, k) + 1)) if self.column_wise else 1 for k in levels]
        allowed = allowed_devices(task.tables, task.num_devices)
        # units placed at once: each shard alone, a colocation group's (whole) tables together
        units = []
        for item in placement_items(task):
            if task.tables[item[0]].constraints.colocate is not None:
                units.append([(t, 0) for t in item])
            else:
                units.extend([(item[0], j)] for j in range(splits[item[0]]))
        free = task.cap_bytes()
        devices = [[0] * count for count in splits]
        for k in rng.permutation(len(units)):
            need = sum(task.table_mem_bytes(t, task.tables[t].dim // splits[t]) for t, _ in units[k])
            room = np.flatnonzero((free >= need) & allowed[units[k][0][0]])
            if len(room) == 0:
                return None
            d = int(rng.choice(room))
            for t, j in units[k]:
                devices[t][j] = d
            free[d] -= need
        return Plan.from_assignment(task, splits, devices)

    def search(self, task: Task, cost_model: CostModel, seed: int) -> Plan:
        rng = np.random.default_rng([seed, 17])
        plans = []
        for _ in range(self.num_samples):
            for _ in range(self.max_attempts_per_sample):
                plan = self.sample(task, rng)
                if plan is not None:
                    plans.append(plan)
                    break
        if not plans:
            attempts = self.num_samples * self.max_attempts_per_sample
            raise InfeasibleError(
                f"random: no memory-feasible random placement found in {attempts} attempts ({task.need_words()})"
            )
        costs = score_plans(cost_model, plans)
        return plans[int(np.argmin(costs))]
