"""The parts of a device's memory and what sets them: the fused optimizers (the state each keeps, where FBGEMM's
kernels run it), a task's training setup (``Training``: its optimizer and the cap's reserve share), the parts of one
shard's or one device's bytes (``MemoryParts``). The rule that counts them, and the check that a task's tables can fit
at all, are ``core.task``'s (``shard_memory``, ``step_memory``, ``check_feasible``), beside the task they read.
"""

from __future__ import annotations

import dataclasses
import math

from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.sharding import mem_bytes


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """A fused embedding optimizer: FBGEMM's ``EmbOptimType`` value (``name``), its enum name in TorchRec's
    ``fused_params`` (``torchrec``), the state it keeps (fp32 values per row and per weight), and whether FBGEMM's
    CPU and CUDA kernels run it (FBGEMM 1.8's TBE refuses the non-exact SGD and row-wise Adagrad on both)."""

    name: str
    torchrec: str
    per_row: int
    per_weight: int
    cpu: bool
    gpu: bool = True

    def describe(self) -> str:
        """``row-wise state (1 per row)``-like words for messages."""
        if not (self.per_row or self.per_weight):
            return "no state"
        parts = ([f"{self.per_row} per row"] if self.per_row else []) + (
            [f"{self.per_weight} per weight"] if self.per_weight else []
        )
        return f"state of {' + '.join(parts)}"


OPTIMIZERS = {
    o.name: o
    for o in (
        Optimizer("exact_sgd", "EXACT_SGD", 0, 0, cpu=True),
        Optimizer("sgd", "SGD", 0, 0, cpu=False, gpu=False),
        Optimizer("exact_row_wise_adagrad", "EXACT_ROWWISE_ADAGRAD", 1, 0, cpu=True),
        Optimizer("row_wise_adagrad", "ROWWISE_ADAGRAD", 1, 0, cpu=False, gpu=False),
        Optimizer("exact_adagrad", "EXACT_ADAGRAD", 0, 1, cpu=True),
        Optimizer("adam", "ADAM", 0, 2, cpu=False),
        Optimizer("partial_row_wise_adam", "PARTIAL_ROWWISE_ADAM", 1, 1, cpu=False),
        Optimizer("lamb", "LAMB", 0, 2, cpu=False),
        Optimizer("partial_row_wise_lamb", "PARTIAL_ROWWISE_LAMB", 1, 1, cpu=False),
        Optimizer("lars_sgd", "LARS_SGD", 0, 1, cpu=False),
    )
}
_BY_ANY_NAME = {**{o.torchrec.lower(): o for o in OPTIMIZERS.values()}, **OPTIMIZERS}


def optimizer_named(name: str, where: str = "task.optimizer") -> Optimizer:
    """The optimizer of FBGEMM's name (``exact_row_wise_adagrad``) or TorchRec's (``EXACT_ROWWISE_ADAGRAD``,
    ``EmbOptimType.EXACT_ROWWISE_ADAGRAD``), any case; UserError naming the known ones otherwise."""
    key = str(name).rsplit(".", 1)[-1].lower()
    if key not in _BY_ANY_NAME:
        raise UserError(f"{where}: got {name!r}, expected one of {', '.join(OPTIMIZERS)} (or TorchRec's names)")
    return _BY_ANY_NAME[key]


def kernel_optimizer(name: str, device: str, where: str = "optimizer") -> Optimizer:
    """The optimizer ``name`` (``optimizer_named``) where ``device``'s FBGEMM kernels run it; UserError naming
    ``where`` and the ones they do run otherwise (a CPU runs exact SGD, exact Adagrad and exact row-wise Adagrad)."""
    optimizer = optimizer_named(name, where)
    if not (optimizer.cpu or optimizer.gpu):
        raise UserError(
            f"{where}: {optimizer.name} is deprecated in FBGEMM's TBE kernels (CPU and CUDA), expected "
            f"exact_{optimizer.name} (the exact update of the same rule)"
        )
    if device == "cpu" and not optimizer.cpu:
        runs = ", ".join(o.name for o in OPTIMIZERS.values() if o.cpu)
        raise UserError(
            f"{where}: {optimizer.name} does not run on FBGEMM's CPU kernels, expected one of {runs} (or device=cuda)"
        )
    if device != "cpu" and not optimizer.gpu:
        runs = ", ".join(o.name for o in OPTIMIZERS.values() if o.gpu)
        raise UserError(f"{where}: {optimizer.name} does not run on FBGEMM's CUDA kernels, expected one of {runs}")
    return optimizer


# Bytes FBGEMM's CUDA backward holds per lookup while it runs (``transpose_embedding_input``, FBGEMM 1.6-1.9): the
# lookups' linear indices and their sorted copy (int64: 8 + 8), their positions and the sorted copy (int32 for pooled
# kernels, int64 for sequence ones: up to 8 + 8), the sorted runs (int64: 8), their lengths and cumulative lengths
# (int32: 4 + 4) and, while it sorts, the radix sort's own buffers (about one more key and value each, freed before
# the runs are made): 48 at the larger of the two layouts. Its CPU backward holds its own (not counted: a host's
# memory is not what binds a CPU plan, and no CPU peak was measured).
FBGEMM_GPU_WORKSPACE_BYTES = 48.0
MAX_WORKSPACE_BYTES = 4096.0  # per lookup: far past any kernel's temporaries (a typo's guard)


def device_workspace(device: str) -> float:
    """Bytes per lookup a ``device``'s kernels hold in their backward beyond what ``shard_memory`` counts."""
    return FBGEMM_GPU_WORKSPACE_BYTES if device == "cuda" else 0.0


@dataclasses.dataclass(frozen=True)
class Training:
    """How the tables train, as far as memory goes: the fused optimizer (FBGEMM's name), the share of every
    device's cap held back for what the plan does not hold (``reserve``, 0 to below 1), and the bytes per lookup the
    kernels' backward holds as its workspace (``workspace``; None: the plan's device's own, ``device_workspace``,
    set by the planner)."""

    optimizer: str = "exact_sgd"
    reserve: float = 0.0
    workspace: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "optimizer", optimizer_named(self.optimizer).name)
        if not (isinstance(self.reserve, (int, float)) and 0.0 <= self.reserve < 1.0):
            raise UserError(f"task.mem_reserve: got {self.reserve!r}, expected a share of the cap in [0, 1)")
        w = self.workspace
        if w is not None and not (
            isinstance(w, (int, float)) and not isinstance(w, bool) and 0.0 <= w <= MAX_WORKSPACE_BYTES
        ):
            raise UserError(
                f"task.workspace: got {w!r}, expected bytes per lookup in [0, {MAX_WORKSPACE_BYTES:g}] (or none: the "
                "device's own)"
            )

    @property
    def workspace_bytes(self) -> float:
        """Bytes per lookup counted: ``workspace``, 0 where it is the device's own and no device has set it."""
        return float(self.workspace or 0.0)

    @property
    def state(self) -> Optimizer:
        return OPTIMIZERS[self.optimizer]


PLAIN_SGD = Training()  # the default: exact SGD (no state), nothing reserved


@dataclasses.dataclass(frozen=True)
class MemoryParts:
    """Bytes of one shard or one device, by part (ints)."""

    weights: int = 0
    state: int = 0
    buffers: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.state + self.buffers

    def __add__(self, other: MemoryParts) -> MemoryParts:
        return MemoryParts(self.weights + other.weights, self.state + other.state, self.buffers + other.buffers)


def gib(count: float) -> str:
    """Bytes as GiB in words: 3 significant digits (``0.000457``, ``0.45``, ``12.5``), 2 decimals from 100 on."""
    value = count / GIB_BYTES
    return f"{value:.2f}" if value >= 100 else f"{value:.3g}"


ID_BYTES = 8  # int64 ids and offsets, as TorchRec's KeyedJaggedTensor carries them
OUTPUT_BYTES = 4  # pooled outputs and their gradients are fp32
STATE_BYTES = 4  # FBGEMM keeps optimizer state in fp32 unless told otherwise (optimizer_state_dtypes)


# FBGEMM's managed caching (``EmbeddingLocation.MANAGED_CACHING``, FBGEMM 1.6-1.9, LRU as TorchRec runs it): a shard's
# cache is ``cache_sets`` x ``CACHE_ASSOC`` slots (sets: ceil(load factor x rows / 32)); each slot holds a row of
# weights (the cache's data type: the weights'; as wide as the widest cached table of its kernel, counted here at each
# table's own width) and two int64s (``lxu_cache_state``, the row it holds; ``lxu_state``, its LRU time); every row of
# the table an int32 on the device (``cache_index_table_map``); each lookup, while a step runs, its linear cache index
# (int64) and its cache location (int32), and the prefetch's unique indices and their counts (int64 + int32) at most:
# 24 bytes. The table's weights and its optimizer state stay in host memory (UVM, ``cacheable=False`` for the state),
# reached over the host link.
CACHE_ASSOC = 32
CACHE_SLOT_BYTES = 16
CACHE_ROW_BYTES = 4
CACHE_LOOKUP_BYTES = 24


def cache_slots(rows: int, load_factor: float) -> int:
    """Slots of FBGEMM's cache of ``rows`` rows at ``load_factor``: whole sets of ``CACHE_ASSOC``, at least one."""
    return max(1, math.ceil(load_factor * rows / CACHE_ASSOC)) * CACHE_ASSOC


def shard_memory(
    rows: int,
    dim: int,
    ids_per_sample: float,
    batch_size: int,
    precision: str,
    optimizer: Optimizer,
    sequence: bool = False,
    workspace: float = 0.0,
    cache_load_factor: float | None = None,
) -> MemoryParts:
    """The bytes a shard of ``rows`` x ``dim`` holds on its device while it trains at ``batch_size`` samples, looking
    up ``ids_per_sample`` ids per sample (its table's pooling factor; a row block's share of it); a ``sequence``
    table's outputs are a row per id, not per sample; ``workspace``: bytes per lookup its kernel's backward holds
    while it runs (``Training.workspace``), among the buffers. ``cache_load_factor``: the shard in tiered memory
    (its weights and state in host memory, ``host_memory``): its device holds the cache's slots (``cache_slots``,
    as weights) and their bookkeeping, a table index a row and the lookups' cache indices (as buffers), no optimizer
    state."""
    lookups = int(round(ids_per_sample * batch_size))
    ids = lookups + batch_size + 1  # the ids and the offsets
    outputs = lookups if sequence else batch_size
    buffers = ids * ID_BYTES + 2 * outputs * dim * OUTPUT_BYTES  # the outputs and their gradients
    buffers += int(round(lookups * workspace))
    if cache_load_factor is not None:
        slots = cache_slots(rows, cache_load_factor)
        weights = mem_bytes(slots, dim, precision)
        buffers += slots * CACHE_SLOT_BYTES + rows * CACHE_ROW_BYTES + lookups * CACHE_LOOKUP_BYTES
        return MemoryParts(int(weights), 0, int(buffers))
    return MemoryParts(int(mem_bytes(rows, dim, precision)), int(state_bytes(rows, dim, optimizer)), int(buffers))


def state_bytes(rows: float, dim: int, optimizer: Optimizer) -> float:
    """Bytes of ``optimizer``'s state for ``rows`` rows of width ``dim`` (fp32: ``STATE_BYTES``)."""
    return rows * (optimizer.per_row + optimizer.per_weight * dim) * STATE_BYTES


def host_memory(rows: int, dim: int, precision: str, optimizer: Optimizer) -> int:
    """Bytes a shard in tiered memory keeps in host memory: its weights and its optimizer state (fp32)."""
    return int(mem_bytes(rows, dim, precision) + state_bytes(rows, dim, optimizer))


def step_memory(
    batch_size: int, num_devices: int, dim_total: int, ids_per_sample: float, num_tables: int
) -> MemoryParts:
    """What every device holds for its own slice of the batch whatever its tables (``buffers``): the pooled outputs
    of all ``num_tables`` tables (``dim_total`` wide together) it receives and their gradients, and its slice's ids
    (``ids_per_sample`` over all tables) and offsets with the copy sent in the input all-to-all."""
    local = -(-batch_size // num_devices)
    outputs = 2 * local * dim_total * OUTPUT_BYTES
    ids = 2 * (int(round(ids_per_sample * local)) + local * num_tables + num_tables) * ID_BYTES
    return MemoryParts(buffers=int(outputs + ids))
