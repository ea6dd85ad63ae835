"""Task builders: tasks drawn from a pool (NeuroShard or DreamShard style), loaded from files, or built from tables."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from neuroshard_jax.core.config import bounded, check_bounds, typed
from neuroshard_jax.core.constants import (
    BYTES_PER_ELEMENT,
    DIM_ALIGNMENT,
    GIB_BYTES,
    MAX_BATCH,
    MAX_CAP_GB,
    MAX_DEVICES,
    TASK_DIMS,
)
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import NUM_BINS
from neuroshard_jax.core.files import read_json
from neuroshard_jax.core.memory import PLAIN_SGD, Training
from neuroshard_jax.core.schema import BIN_KEYS
from neuroshard_jax.core.sharding import is_legal_dim, mem_bytes
from neuroshard_jax.core.table import Table
from neuroshard_jax.core.task import Task
from neuroshard_jax.workloads.pool import PoolSpec, TablePool, load_pool
from neuroshard_jax.workloads.statistics import DEFAULT_ZIPF, estimated_stats

SPLITS = ("all", "train", "test")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """What ``conf/task/*.yaml`` holds. ``num_tables=None`` draws it from [min_tables, max_tables]."""

    num_tables: int | None = bounded(at_least=1, default=50)
    min_tables: int = 10
    max_tables: int = 59
    num_devices: int = bounded(at_least=1, at_most=MAX_DEVICES, default=4)
    mem_cap_gb: float = bounded(above=0, at_most=MAX_CAP_GB, default=4.0)
    batch_size: int = bounded(at_least=1, at_most=MAX_BATCH, default=4096)
    dims: tuple[int, ...] = TASK_DIMS
    precision: str = "fp32"
    optimizer: str = "exact_sgd"  # the fused optimizer the tables train with (FBGEMM's or TorchRec's name)
    mem_reserve: float = 0.0  # share of every device's cap held back for what the plan does not hold
    workspace: float | None = None  # bytes a lookup the backward holds (core.memory); None: the plan's device's own
    max_fill: float = bounded(above=0, at_most=1, default=0.9)
    split: str = "all"
    pool: PoolSpec = PoolSpec()

    def __post_init__(self):
        check_bounds(self, "task.")  # TaskGroupConfig's seed too
        if not 1 <= self.min_tables <= self.max_tables:
            raise UserError(
                f"task.min_tables/max_tables: got {self.min_tables}/{self.max_tables}, expected 1 <= min <= max"
            )
        bad = [d for d in self.dims if not is_legal_dim(d)]
        if bad or not self.dims:
            raise UserError(f"task.dims: got {list(self.dims)}, expected positive multiples of {DIM_ALIGNMENT}")
        if self.split not in SPLITS:
            raise UserError(f"task.split: got {self.split!r}, expected one of {', '.join(SPLITS)}")
        if self.precision not in BYTES_PER_ELEMENT:
            raise UserError(f"task.precision: got {self.precision!r}, expected one of {', '.join(BYTES_PER_ELEMENT)}")
        Training(self.optimizer, self.mem_reserve, self.workspace)  # refuses a bad optimizer, reserve or workspace

    @property
    def training(self) -> Training:
        return Training(self.optimizer, self.mem_reserve, self.workspace)


@dataclasses.dataclass(frozen=True)
class TaskGroupConfig(TaskConfig):
    """``conf/task/*.yaml``: how to draw the task (TaskConfig) and the draw's ``seed``, or ``path``: a task file.
    ``style`` names the paper whose task setup the file follows."""

    path: str | None = None  # a task JSON file (the "task" object of plan.json); overrides everything below
    seed: int = bounded(at_least=0, default=0)  # checked by TaskConfig.__post_init__
    style: str = "neuroshard"


def split_table_ids(pool: TablePool, split: str) -> np.ndarray:
    """Disjoint train/test halves of the pool (DreamShard style), fixed by the pool's seed."""
    if split not in SPLITS:
        raise UserError(f"task.split: got {split!r}, expected one of {', '.join(SPLITS)}")
    ids = np.arange(pool.num_tables)
    if split == "all":
        return ids
    perm = np.random.default_rng([pool.spec.seed, 7919]).permutation(ids)
    half = pool.num_tables // 2
    return np.sort(perm[:half] if split == "train" else perm[half:])


def generate_task(pool: TablePool, config: TaskConfig, seed: int, max_attempts: int = 1000) -> Task:
    """Draw a task: tables without replacement, a dim per table, total within max_fill of all memory.

    Every table fits one device at its dim (drawn uniformly among the task dims that fit);
    draws whose total breaks the budget are redrawn.
    """
    rng = np.random.default_rng([seed, 104729])
    cap_bytes = config.mem_cap_gb * GIB_BYTES
    budget_bytes = config.max_fill * config.num_devices * cap_bytes
    dims = np.sort(np.asarray(config.dims))
    # Only tables that fit one device at the smallest dim are eligible; each gets a dim that fits.
    candidates = split_table_ids(pool, config.split)
    candidates = candidates[mem_bytes(pool.rows[candidates], dims[0], config.precision) <= cap_bytes]
    for _ in range(max_attempts):
        num_tables = config.num_tables or int(rng.integers(config.min_tables, config.max_tables + 1))
        if num_tables > len(candidates):
            raise UserError(
                f"task.num_tables: got {num_tables}, expected at most {len(candidates)} "
                f"(tables of split {config.split!r} that fit {config.mem_cap_gb} GiB)"
            )
        ids = rng.choice(candidates, size=num_tables, replace=False)
        fitting = mem_bytes(pool.rows[ids, None], dims[None, :], config.precision) <= cap_bytes  # [T, D]
        choice = (rng.random(num_tables) * fitting.sum(1)).astype(int)
        table_dims = dims[choice]  # dims that fit are a prefix of the sorted dims
        if mem_bytes(pool.rows[ids], table_dims, config.precision).sum() <= budget_bytes:
            tables = tuple(
                Table(int(i), int(pool.rows[i]), int(d), float(pool.pooling_factor[i]), tuple(map(float, pool.bins[i])))
                for i, d in zip(ids, table_dims)
            )
            return Task.uniform(
                config.num_devices,
                float(config.mem_cap_gb),
                pool.batch_size,
                tables,
                config.precision,
                pool.spec,
                training=config.training,
            )
    raise UserError(
        f"task: no draw of {config.num_tables or 'random'} tables fit {config.num_devices} x {config.mem_cap_gb} GiB "
        f"(max_fill {config.max_fill}) in {max_attempts} attempts; expected fewer tables or more memory"
    )


def make_task(config: TaskConfig, seed: int, path: str | None = None) -> Task:
    """The task of a run: loaded from ``path`` if given (the configured optimizer, reserve and workspace replace the
    file's, each where set), else generated from the configured pool."""
    if path:
        task = load_task(path)
        given = {
            field.name: getattr(config.training, field.name)
            for field in dataclasses.fields(Training)
            if getattr(config.training, field.name) != getattr(PLAIN_SGD, field.name)
        }
        if given:
            task = dataclasses.replace(task, training=dataclasses.replace(task.training, **given))
        return task
    return generate_task(load_pool(config.pool, config.batch_size), config, seed)


def load_task(path: str | Path) -> Task:
    """Read a task file (the object under "task" in plan.json; a whole plan.json is accepted too)."""
    path = Path(path)
    obj = read_json(path, "task.path", "a task JSON file")
    if "task" in obj and "tables" not in obj:
        obj = obj["task"]
    return Task.from_json(obj, where=f"task file {path.name}")


def task_config(options: dict) -> TaskGroupConfig:
    """The typed ``task`` group (a TaskConfig plus the file path and the draw's seed)."""
    return typed(TaskGroupConfig, options, "task")


TableSpecs = Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]]
STAND_IN_BINS = [1.0] + [0.0] * (NUM_BINS - 1)  # a histogram to be estimated, while the task checks the rest


DEFAULT_DEVICES = 4  # nsj.plan's devices where neither a count nor a list is given


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskOptions:
    """What a task of the user's tables trains with, declared once for ``nsj.plan``, the TorchRec adapter and
    ``task_from_tables``: ``batch_size`` (samples a device looks up per step), ``precision`` (the weights'),
    ``optimizer`` (the fused optimizer, FBGEMM's or TorchRec's name), ``mem_reserve`` (the share of every cap held
    back) and ``zipf`` (the exponent of the access law a table without statistics is estimated with)."""

    batch_size: int = 4096
    precision: str = "fp32"
    optimizer: str = "exact_sgd"
    mem_reserve: float = 0.0
    zipf: float = DEFAULT_ZIPF


def task_from_tables(
    tables: TableSpecs,
    num_devices: int | None = None,
    mem_cap_gb: float = 4.0,
    *,
    options: TaskOptions = TaskOptions(),
    devices: Sequence[Mapping[str, float]] | None = None,
    seed: int = 0,
) -> Task:
    """A task of the user's tables: ``{name: {rows, dim, pooling_factor, bins}}`` or a list of such objects
    each with a ``name``. ``bins``: 17 shares of the rows accessed in a batch by access count (docs/plans.md,
    "Tables and features"); a table without them gets an estimate from its rows and pooling factor, a Zipf law of
    exponent ``options.zipf`` drawn with ``seed`` (``statistics.estimated_stats``, as the TorchRec adapter's), and is
    marked estimated. Table ids are the positions in the given order. ``devices``: heterogeneous devices,
    ``[{"mem_cap_gb": 16, "speed": 1.0}, ...]``, in place of ``num_devices`` x ``mem_cap_gb`` (a count given beside
    them must be theirs; None: theirs, else ``DEFAULT_DEVICES``). ``options``: what the tables train with."""
    specs = _table_specs(tables)
    unmeasured = {i for i, spec in enumerate(specs) if isinstance(spec, dict) and not _has_histogram(spec)}
    if devices is not None and num_devices is not None and num_devices != len(list(devices)):
        raise UserError(
            f"num_devices: got {num_devices}, but devices lists {len(list(devices))}; expected one of them (or the "
            "same count)"
        )
    count = DEFAULT_DEVICES if num_devices is None else num_devices
    shape = {"num_devices": count, "mem_cap_gb": mem_cap_gb} if devices is None else {"devices": list(devices)}
    obj = {
        **shape,
        "batch_size": options.batch_size,
        "precision": options.precision,
        "optimizer": options.optimizer,
        "mem_reserve": options.mem_reserve,
        "tables": [
            {**spec, "id": i, **({"bins": STAND_IN_BINS, "estimated": True} if i in unmeasured else {})}
            if isinstance(spec, dict)
            else spec
            for i, spec in enumerate(specs)
        ],
    }
    task = Task.from_json(obj, where="plan")  # rows and pooling factors checked before anything is estimated
    if not unmeasured:
        return task
    estimated = [
        dataclasses.replace(
            t,
            bins=estimated_stats(
                t.name or str(t.id), t.rows, t.pooling_factor, task.batch_size, options.zipf, seed
            ).bins,
        )
        if i in unmeasured
        else t
        for i, t in enumerate(task.tables)
    ]
    return dataclasses.replace(task, tables=tuple(estimated))


def _table_specs(tables: TableSpecs) -> list:
    """The tables as a list of objects; a mapping's keys become the tables' names."""
    if isinstance(tables, Mapping):
        if not tables:
            raise UserError("plan.tables: got {}, expected at least one table")
        specs = []
        for name, spec in tables.items():
            if not isinstance(spec, Mapping):
                raise UserError(
                    f"plan.tables[{name!r}]: got {spec!r:.60}, expected a table object like "
                    "{'rows': 1000, 'dim': 64, 'pooling_factor': 1.0}"
                )
            if spec.get("name", name) != name:
                raise UserError(
                    f"plan.tables[{name!r}].name: got {spec['name']!r:.60}, expected its key {name!r} or no name"
                )
            specs.append({**spec, "name": name})
        return specs
    if isinstance(tables, Sequence) and not isinstance(tables, str):
        return [dict(spec) if isinstance(spec, Mapping) else spec for spec in tables]
    raise UserError(
        f"plan.tables: got {type(tables).__name__}, expected a mapping of name -> table object or a list of them"
    )


def _has_histogram(spec: dict) -> bool:
    return "bins" in spec or any(key in spec for key in BIN_KEYS)
