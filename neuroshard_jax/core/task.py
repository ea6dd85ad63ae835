"""A task: tables to shard over devices, at a batch size, precision and training setup; what memory its tables need
and whether they can fit at all (``check_feasible``, with advice); its file form (``to_json``/``from_json``, through
``core.schema``).

## The memory model every searcher plans within
A shard (a whole table, a column slice or a row block) holds

- **weights**: rows x width x the weights' bytes (``precision``: fp32, fp16, bf16, int8);
- **optimizer state**, as the fused optimizer keeps it (FBGEMM's TBE allocates it with the weights, in fp32 unless
  told otherwise): per row (row-wise Adagrad: one value), per weight (Adagrad: one, Adam and LAMB: two), or none (SGD);
  a column slice keeps its own per-row state, so slicing a table does not divide that part;
- **what a training step holds for it** (as TorchRec's storage estimator counts a shard's input and output): the
  looked-up ids and their offsets at the batch (8 bytes each, int64), the pooled outputs (fp32, batch x width) and
  their gradients.

Every device also holds, whatever its tables, what the step keeps for its own slice of the batch (``batch /
devices`` samples: the task's batch is the global one, as in the labels and in DistributedModelParallel): the pooled
outputs of every table it receives in the output all-to-all and their gradients (fp32, local batch x all widths, x2),
and its slice's ids and offsets of every table with the copy the input all-to-all sends (int64, x2): ``step_memory``.
Measured in DistributedModelParallel (``tools/dmp_memory.py``), these two terms took the error of the predicted total
against each rank's peak from -12% to within +-1% on average.

A device's cap loses a stated ``reserve`` share first (what the planner does not see: dense parameters, activations,
the allocator's slack; TorchRec's default planner holds back 15%). ``Task`` carries the optimizer and the reserve
(``Task.training``); ``Task.table_mem_bytes`` and ``Task.cap_bytes`` apply this model (``shard_memory``,
``step_memory``), so every searcher, the row split, replicas, the plan's check and ``explain`` count the same bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from neuroshard_jax.core.config import plain, typed
from neuroshard_jax.core.constants import BYTES_PER_ELEMENT, GIB_BYTES, MAX_CAP_GB, MAX_DEVICES
from neuroshard_jax.core.devices import Device, Links
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.features import feature_matrix
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.memory import (
    PLAIN_SGD,
    MemoryParts,
    Training,
    device_workspace,
    gib,
    host_memory,
    shard_memory,
    step_memory,
)
from neuroshard_jax.core.schema import (
    TaskFile,
    checked_links,
    devices_json,
    devices_of,
    links_json,
    table_from_json,
    table_json,
    table_where,
)
from neuroshard_jax.core.sharding import Shard, element_bytes, narrowest_dim, row_block_size
from neuroshard_jax.core.table import PoolSpec, Table


@dataclasses.dataclass(frozen=True)
class Task:
    """Tables to shard over ``devices`` (each with its memory cap for tables, relative compute speed and host);
    ``Task.uniform(num_devices, mem_cap_gb, ...)`` builds a task of identical devices of speed 1."""

    devices: tuple[Device, ...]
    batch_size: int
    tables: tuple[Table, ...]
    precision: str = "fp32"
    pool: PoolSpec | None = None
    links: Links | None = None
    training: Training = PLAIN_SGD  # the fused optimizer and the cap's reserve: what memory holds

    def __post_init__(self):
        object.__setattr__(self, "devices", tuple(self.devices))
        if not 1 <= len(self.devices) <= MAX_DEVICES:
            raise ValueError(f"task: {len(self.devices)} devices, expected 1..{MAX_DEVICES}")
        if any(not (0 < d.mem_cap_gb <= MAX_CAP_GB and d.speed > 0) for d in self.devices):
            raise ValueError(f"task: device caps must be in (0, {MAX_CAP_GB}] GiB and speeds > 0, got {self.devices}")
        if self.links is not None:
            if not (self.links.intra_host_gbps > 0 and self.links.inter_host_gbps > 0):
                raise ValueError(f"task: link bandwidths must be > 0, got {self.links}")
            if self.links.devices_per_host and any(d.host for d in self.devices):
                raise ValueError("task: devices_per_host given beside the devices' own hosts; expected one")

    @classmethod
    def uniform(
        cls,
        num_devices: int,
        mem_cap_gb: float,
        batch_size: int,
        tables,
        precision: str = "fp32",
        pool: PoolSpec | None = None,
        links: Links | None = None,
        training: Training = PLAIN_SGD,
    ) -> Task:
        """A task of ``num_devices`` identical devices of ``mem_cap_gb`` GiB each and speed 1."""
        return cls((Device(mem_cap_gb),) * num_devices, batch_size, tuple(tables), precision, pool, links, training)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def is_uniform(self) -> bool:
        """Whether every device is the same, of speed 1 in host 0 (a task file then names their count and cap)."""
        return all(d == Device(self.devices[0].mem_cap_gb) for d in self.devices)

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def largest_cap_gb(self) -> float:
        """The largest device's cap in GiB (every device's, for a uniform task)."""
        return max(d.mem_cap_gb for d in self.devices)

    @property
    def largest_cap_bytes(self) -> int:
        """The largest device's cap in bytes (every device's, for a uniform task)."""
        return int(self.largest_cap_gb * GIB_BYTES)

    @property
    def has_speeds(self) -> bool:
        """Whether some device's speed is not 1 (its compute is scaled)."""
        return any(d.speed != 1.0 for d in self.devices)

    def cap_bytes(self) -> np.ndarray:
        """i64[N]: the bytes each device has for its tables' shards: its cap less the training's reserve share and
        less what every device holds for its slice of the batch (``step_memory``); 0 where that leaves none."""
        return np.maximum(self.room_bytes() - self.step_memory().total, 0)

    def room_bytes(self) -> np.ndarray:
        """i64[N]: each device's memory for training: its cap less the training's reserve share."""
        keep = 1.0 - self.training.reserve
        return np.array([int(cap * keep * GIB_BYTES) for cap in self.caps_gb()], dtype=np.int64)

    def step_memory(self) -> MemoryParts:
        """What every device holds for its own slice of the batch, whatever tables it holds (``shard_memory``);
        computed once per task (``cap_bytes`` asks for it on every call)."""
        return self._step

    @functools.cached_property
    def _step(self) -> MemoryParts:
        return step_memory(
            self.batch_size,
            self.num_devices,
            sum(t.width(t.dim) for t in self.tables),
            sum(t.pooling_factor for t in self.tables),
            self.num_tables,
        )

    def caps_gb(self) -> list[float]:
        """Each device's memory cap in GiB."""
        return [d.mem_cap_gb for d in self.devices]

    def speeds(self) -> np.ndarray:
        """f64[N]: each device's relative compute speed."""
        return np.array([d.speed for d in self.devices], dtype=np.float64)

    def hosts(self) -> list[int]:
        """Each device's host: consecutive groups of ``links.devices_per_host`` where given, else the devices' own."""
        if self.links is not None and self.links.devices_per_host:
            return [d // self.links.devices_per_host for d in range(self.num_devices)]
        return [d.host for d in self.devices]

    def comm_scale(self) -> np.ndarray:
        """f64[N]: each device's all-to-all time relative to one host (``Links.comm_scale``; 1 without links)."""
        if self.links is None:
            return np.ones(self.num_devices)
        return self.links.comm_scale(self.hosts())

    def local_size(self) -> int | None:
        """Devices per host where the task spans several hosts of equal size, each holding consecutive devices (the
        layout TorchRec's topology assumes); None for one host or any other layout."""
        hosts = self.hosts()
        if not self.multi_host:
            return None
        local = hosts.count(hosts[0])
        regular = self.num_devices % local == 0 and all(h == hosts[(d // local) * local] for d, h in enumerate(hosts))
        return local if regular and len(set(hosts)) == self.num_devices // local else None

    def host_groups(self) -> list[list[int]] | None:
        """Each host's devices, where the task spans several hosts of the same size holding consecutive devices (the
        layout TorchRec's ``table_row_wise`` runs on); None otherwise."""
        local = self.local_size()
        if local is None:
            return None
        return [list(range(h * local, (h + 1) * local)) for h in range(self.num_devices // local)]

    @property
    def multi_host(self) -> bool:
        """Whether the devices sit in more than one host (the comm is then scaled by ``comm_scale``)."""
        return self.links is not None and len(set(self.hosts())) > 1

    def describe_devices(self) -> str:
        """The devices in a few words, for messages: ``4 x 2.0 GiB`` or ``4 devices of 1.0-8.0 GiB``."""
        if self.is_uniform:
            return f"{self.num_devices} x {self.devices[0].mem_cap_gb} GiB"
        caps = self.caps_gb()
        return f"{self.num_devices} devices of {min(caps)}-{max(caps)} GiB ({sum(caps):.2f} GiB in all)"

    def need_words(self) -> str:
        """``tables need 0.000139 GiB of 4 x 0.001 GiB``: what the tables take and where, for messages."""
        need = sum(self.table_mem_bytes(i) for i in range(self.num_tables))
        return f"tables need {gib(need)} GiB of {self.describe_devices()}"

    def table_mem_bytes(self, index: int, dim: int | None = None) -> int:
        """Memory of table ``index`` while it trains (of a column shard of it when ``dim`` is given): weights,
        optimizer state and the step's buffers (``shard_memory``)."""
        table = self.tables[index]
        return self.rows_memory(index, table.rows, table.dim if dim is None else dim).total

    def rows_memory(self, index: int, rows: int, dim: int) -> MemoryParts:
        """The parts of ``rows`` rows x ``dim`` columns of table ``index`` (a row block looks up its rows' share
        of the table's ids, taken as even)."""
        table = self.tables[index]
        ids = table.pooling_factor * rows / table.rows
        precision = self.table_precision(index)
        training = self.training
        return shard_memory(
            rows,
            dim,
            ids,
            self.batch_size,
            precision,
            training.state,
            table.sequence,
            training.workspace_bytes,
            table.cache_load_factor,
        )

    def host_mem_bytes(self) -> int:
        """Bytes the tables in tiered memory (``Table.cached``) keep in host memory, all of them together: their
        weights and optimizer state (``host_memory``); 0 where none is."""
        return sum(
            host_memory(t.rows, t.dim, self.table_precision(i), self.training.state)
            for i, t in enumerate(self.tables)
            if t.cached
        )

    def table_precision(self, index: int) -> str:
        """The data type of table ``index``'s weights: its own (``Table.precision``), else the task's."""
        return self.tables[index].precision or self.precision

    @property
    def precisions(self) -> tuple[str, ...]:
        """The data types of the tables' weights, sorted: one for most tasks, several for a module mixing them
        (each table's bytes, and a kernel per data type on a device: ``Table.precision``); a task of no tables (a
        probe), the task's."""
        return tuple(sorted({t.precision or self.precision for t in self.tables} or {self.precision}))

    def row_block_bytes(self, index: int, count: int, dim: int | None = None) -> np.ndarray:
        """i64[count]: the bytes of each of the ``count`` row blocks of table ``index`` (``sharding.row_blocks``:
        ceil-sized blocks in order, the last ones shorter or empty; ``dim`` columns, default all), each distinct
        size worked out once."""
        table = self.tables[index]
        block = row_block_size(table.rows, count)
        sizes = np.clip(table.rows - block * np.arange(count, dtype=np.int64), 0, block)
        dim = table.dim if dim is None else dim
        distinct, which = np.unique(sizes, return_inverse=True)
        return np.array([self.rows_memory(index, int(c), dim).total for c in distinct], dtype=np.int64)[which]

    def device_memory(self, shards, replicated: tuple[int, ...] = ()) -> list[MemoryParts]:
        """Each device's memory by part, holding ``shards`` and the ``replicated`` tables (task indices) whole."""
        out = [MemoryParts()] * self.num_devices
        for s in shards:
            out[s.device] = out[s.device] + self.rows_memory(s.table, s.rows(self.tables[s.table].rows), s.dim)
        for t in replicated:
            whole = self.rows_memory(t, self.tables[t].rows, self.tables[t].dim)
            out = [parts + whole for parts in out]
        return out

    def device_mem_bytes(self, shards, replicated: tuple[int, ...] = ()) -> np.ndarray:
        """i64[N]: each device's bytes holding ``shards`` (and ``replicated`` tables whole): ``device_memory``'s
        totals, each distinct shape of shard worked out once (thousands of row blocks are a few shapes)."""
        out = np.zeros(self.num_devices, dtype=np.int64)
        if shards:
            rows = self.table_rows()
            totals: dict[tuple[int, int, int], int] = {}
            keys = [(s.table, s.rows(rows[s.table]), s.dim) for s in shards]
            for key in keys:
                if key not in totals:
                    totals[key] = self.rows_memory(*key).total
            np.add.at(out, [s.device for s in shards], [totals[key] for key in keys])
        for t in replicated:
            out += self.table_mem_bytes(t)
        return out

    def table_names(self) -> list[str]:
        """Each table's name, else its id, as text (for messages)."""
        return [t.name if t.name is not None else str(t.id) for t in self.tables]

    def table_rows(self) -> list[int]:
        return [t.rows for t in self.tables]

    def shard_width(self, shard: Shard) -> int:
        """Elements per sample ``shard`` puts in the all-to-all (``Table.width``: its dim, or a row per id of a
        sequence table)."""
        table = self.tables[shard.table]
        return table.width(shard.dim, shard.row_offset, shard.rows(table.rows))

    def features(self) -> np.ndarray:
        """Raw features f64[T, F] in FEATURE_NAMES order (each table's kernel kind among them)."""
        return feature_matrix(
            [t.rows for t in self.tables],
            [t.dim for t in self.tables],
            [t.pooling_factor for t in self.tables],
            [t.bins for t in self.tables],
            [t.pooling for t in self.tables],
            [t.weighted for t in self.tables],
            [element_bytes(self.table_precision(i)) for i in range(self.num_tables)],
        )

    def to_json(self) -> JSONDoc:
        out: dict[str, Any] = {
            "num_devices": self.num_devices,
            "mem_cap_gb": self.largest_cap_gb,
            **({"devices": devices_json(self.devices)} if not self.is_uniform else {}),
            **({"links": links_json(self.links)} if self.links is not None else {}),
            "batch_size": self.batch_size,
            "precision": self.precision,
            **({"optimizer": self.training.optimizer} if self.training.optimizer != Training.optimizer else {}),
            **({"mem_reserve": self.training.reserve} if self.training.reserve else {}),
            **({"workspace": self.training.workspace} if self.training.workspace is not None else {}),
            "tables": [table_json(t) for t in self.tables],
        }
        if self.pool is not None:
            out["pool"] = self.pool.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str = "task") -> Task:
        """Parse and validate a task object (numpy numbers and arrays taken as Python's) through its schema
        (``TaskFile``, ``TableFile``: ``core.config.typed``, then the rules across fields); errors name
        ``where.field``, and a table by its name where it has one (``where.tables['user_id'].rows``)."""
        obj = plain(obj)
        if not isinstance(obj, dict):
            raise UserError(f"{where}: got {type(obj).__name__}, expected a JSON object")
        raw = typed(TaskFile, obj, where)
        devices = devices_of(raw, where)
        if raw.batch_size is None:
            raise UserError(f"{where}.batch_size: missing, expected a value")
        if raw.precision not in BYTES_PER_ELEMENT:
            raise UserError(f"{where}.precision: got {raw.precision!r}, expected one of {', '.join(BYTES_PER_ELEMENT)}")
        if not raw.tables:
            given = raw.tables if raw.tables is None else list(raw.tables)
            raise UserError(f"{where}.tables: got {given!r:.60}, expected a non-empty list of tables")
        at = [table_where(t, i, where) for i, t in enumerate(raw.tables)]
        tables = tuple(table_from_json(t, at[i], i) for i, t in enumerate(raw.tables))
        seen: set[int] = set()
        names: set[str] = set()
        for i, t in enumerate(tables):
            if t.id in seen:
                if isinstance(raw.tables[i], dict) and "id" not in raw.tables[i]:  # its place, taken by another's id
                    raise UserError(
                        f"{at[i]}: has no id, and its place ({i}) is another table's id; expected ids on every table "
                        "or on none"
                    )
                raise UserError(f"{at[i]}.id: got {t.id}, expected ids unique within a task")
            if t.name is not None and t.name in names:
                raise UserError(f"{where}.tables[{i}].name: got {t.name!r}, expected names unique within a task")
            seen.add(t.id)
            names.add(t.name)
        for i, t in enumerate(tables):
            for d in ((t.constraints.pin,) if t.constraints.pin is not None else ()) + t.constraints.exclude:
                if not 0 <= d < len(devices):
                    key = "pin" if d == t.constraints.pin else "exclude"
                    raise UserError(f"{at[i]}.{key}: got device {d}, expected 0..{len(devices) - 1}")
        links = checked_links(raw.links, devices, where)
        training = training_of(raw.optimizer, raw.mem_reserve, where, raw.workspace)
        return cls(tuple(devices), raw.batch_size, tables, raw.precision, raw.pool, links, training)


def memory_words(task: Task, parts: MemoryParts) -> str:
    """``weights 0.900 + row-wise state 0.225 + step buffers 0.010 GiB``-like words of a device's memory."""
    gib = GIB_BYTES
    state = task.training.state
    words = f"weights {parts.weights / gib:.3f}"
    if parts.state or state.per_row or state.per_weight:
        words += f" + {state.name} state {parts.state / gib:.3f}"
    words += f" + step buffers {parts.buffers / gib:.3f} GiB"
    if task.training.workspace_bytes:
        words += f" (with the backward's workspace, {task.training.workspace_bytes:g} B a lookup)"
    return words + (f"; {100 * task.training.reserve:g}% of the cap reserved" if task.training.reserve else "")


def training_of(optimizer: str, reserve: float, where: str = "task", workspace: float | None = None) -> Training:
    """The ``Training`` of a task's optimizer, reserve and workspace; UserError naming ``where``'s field otherwise."""
    try:
        return Training(optimizer, reserve, workspace)
    except UserError as err:
        raise UserError(f"{where}.{str(err).removeprefix('task.')}") from None


def check_feasible(task: Task) -> None:
    """Raise InfeasibleError if no plan can exist (``infeasibility``: a table that fits nowhere even split, or too
    much in total); the message gives the memory by part and what would fit (``fit_advice``)."""
    why = infeasibility(task)
    if why is not None:
        raise InfeasibleError(why + fit_advice(task))


def infeasibility(task: Task) -> str | None:
    """Why no plan of ``task`` can exist, or None: every device's slice of the batch over its room, a table that
    fits nowhere even split (its narrowest column slice and its largest row block over every device on no device,
    or the whole table over all the devices together), or more than the devices hold in total."""
    caps = task.cap_bytes()
    cap = int(caps.max())
    step, room = task.step_memory().total, int(task.room_bytes().max())
    if step >= room:
        local = -(-task.batch_size // task.num_devices)
        return (
            f"task infeasible: every device holds {gib(step)} GiB for its {local} samples of the batch (the pooled "
            f"outputs of all {task.num_tables} tables, {sum(t.dim for t in task.tables)} wide, their gradients and "
            f"the ids), expected less than its {gib(room)} GiB for training"
        )
    for i, table in enumerate(task.tables):
        narrowest = task.table_mem_bytes(i, narrowest_dim(table.dim))
        whole = task.table_mem_bytes(i)
        rows_fit = narrowest <= cap or bool(np.all(task.row_block_bytes(i, task.num_devices) <= caps))
        if not rows_fit or (whole > cap and whole > int(caps.sum())):
            where = f"devices of {task.devices[0].mem_cap_gb} GiB" if task.is_uniform else task.describe_devices()
            parts = memory_words(task, task.rows_memory(i, table.rows, table.dim))
            return (
                f"task infeasible: table {table.id} needs {gib(whole)} GiB ({parts}), which no split "
                f"fits (column slices, or row blocks over every device) in {where}"
            )
    total = sum(task.table_mem_bytes(i) for i in range(task.num_tables))
    if total > caps.sum():
        every = (task.rows_memory(i, t.rows, t.dim) for i, t in enumerate(task.tables))
        parts = memory_words(task, sum(every, MemoryParts()))
        held_back = []
        if task.training.reserve:
            held_back.append(f"{100 * task.training.reserve:g}% reserved")
        if step:
            held_back.append(f"{gib(step)} GiB a device for its slice of the batch")
        return (
            f"task infeasible: tables need {gib(total)} GiB in total ({parts}), expected at most {gib(caps.sum())} "
            f"GiB ({task.describe_devices()}" + (f" less {' and '.join(held_back)})" if held_back else ")")
        )
    return None


def fit_advice(task: Task) -> str:
    """``; it would fit with ...``: what ``infeasibility`` would accept, every table counted: the least memory per
    device (every device at that cap, rounded up), the fewest devices of this cap (devices alike), the optimizer
    without state, no reserve; and how much a device is short of that cap."""
    ideas = ["a smaller batch"] if task.step_memory().total >= int(task.room_bytes().max()) else []
    least = _least_cap_gb(task)
    if least is not None:
        ideas.append(f"{least:.3g} GiB per device")
    if task.is_uniform:
        count = _least_devices(task)
        if count is not None:
            ideas.append(f"{count} devices")
    if task.training.optimizer != "exact_sgd" and infeasibility(_with_training(task, optimizer="exact_sgd")) is None:
        ideas.append("exact_sgd (no optimizer state)")
    if task.training.reserve and infeasibility(_with_training(task, reserve=0.0)) is None:
        ideas.append("no reserve")
    if not ideas:
        return ""
    largest = max(d.mem_cap_gb for d in task.devices)
    short = "" if least is None else f" short by {least - largest:.3g} GiB a device:"
    return f";{short} it would fit with {' or '.join(ideas)}"


def on_device(task: Task, device: str) -> Task:
    """``task`` as a plan for ``device`` counts it (UserError for a table in tiered memory on a CPU): where its
    workspace is the device's own (None), the bytes per lookup that device's kernels hold in their backward
    (``device_workspace``: FBGEMM's CUDA temporaries on a GPU; nothing more on a CPU, so a CPU task is unchanged)."""
    if device != "cuda":
        for i, t in enumerate(task.tables):
            if t.cached:
                name = task.table_names()[i]
                raise UserError(
                    f"task.tables[{name!r}].cache_load_factor: got {t.cache_load_factor} for device {device!r}, "
                    "expected none (tiered memory keeps a GPU's cache of host rows; a CPU's tables are in host memory) "
                    "or device=cuda"
                )
    workspace = device_workspace(device)
    if task.training.workspace is not None or not workspace:
        return task
    return _with_training(task, workspace=workspace)


def _with_training(task: Task, **changes) -> Task:
    return dataclasses.replace(task, training=dataclasses.replace(task.training, **changes))


def _at_cap(task: Task, cap_gb: float) -> Task:
    return dataclasses.replace(task, devices=tuple(dataclasses.replace(d, mem_cap_gb=cap_gb) for d in task.devices))


def _least_cap_gb(task: Task) -> float | None:
    """The least memory per device (GiB, rounded up to three significant digits) at which ``task`` is feasible;
    None where no cap up to ``MAX_CAP_GB`` is (a batch too large for any device)."""
    low, high = max(d.mem_cap_gb for d in task.devices), max(d.mem_cap_gb for d in task.devices)
    while infeasibility(_at_cap(task, high)) is not None:
        low, high = high, high * 2
        if high > MAX_CAP_GB:
            return None
    for _ in range(60):  # to well under the shown precision
        mid = (low + high) / 2
        low, high = (low, mid) if infeasibility(_at_cap(task, mid)) is None else (mid, high)
    shown = _round_up(high)
    return shown if infeasibility(_at_cap(task, shown)) is None else high


def _least_devices(task: Task) -> int | None:
    """The fewest devices of ``task``'s (uniform) cap at which it is feasible (each device's slice of the batch
    shrinks as devices are added), None past ``MAX_DEVICES``."""

    def fits(n: int) -> bool:
        return infeasibility(dataclasses.replace(task, devices=task.devices[:1] * n, links=None)) is None

    low, high = task.num_devices, task.num_devices
    while not fits(high):
        if high >= MAX_DEVICES:
            return None
        low, high = high, min(high * 2, MAX_DEVICES)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high


def _round_up(x: float, digits: int = 3) -> float:
    """``x`` rounded up to ``digits`` significant digits."""
    if x <= 0:
        return x
    step = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return math.ceil(x / step - 1e-9) * step
