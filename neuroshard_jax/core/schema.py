"""The file schema of tasks and plans, in one place: the task, table, row-block, plan and shard objects as
dataclasses (and ``Device``, ``Links``, ``PoolSpec`` themselves), parsed by ``core.config.typed`` like every config,
and the rules across fields that follow the parse; the table object's writer. A task file is exactly the object
found under ``"task"`` in plan.json. Validation of untrusted input raises ``UserError`` naming the field, the value
and what was expected."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from neuroshard_jax.core.config import bounded, typed, typed_value
from neuroshard_jax.core.constants import (
    BYTES_PER_ELEMENT,
    MAX_BATCH,
    MAX_CAP_GB,
    MAX_DEVICES,
    MAX_DIM,
    MAX_POOLING,
    MAX_ROWS,
)
from neuroshard_jax.core.constraints import SHARDING_TYPES, TableConstraints
from neuroshard_jax.core.devices import Device, Links
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import NUM_BINS
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.memory import Training
from neuroshard_jax.core.table import PoolSpec, RowBlockStats, Table, kernel_kind

# The file schema, in one place: task, table, row-block and shard objects are the dataclasses below (and
# ``Device``, ``Links``, ``PoolSpec``), parsed by ``core.config.typed`` like every config: types and bounds from the
# fields, an unknown key refused naming the nearest. ``size`` is written by ``to_json`` for readers and ignored on
# input (rows x dim); ``samples`` and ``batches``, written by the statistics tool, are provenance and ignored too. The
# histogram is ``bins`` (a list) or ``bin_0`` .. ``bin_16`` (the feature names). The rules across fields (the
# histogram's sum, unique ids, devices in range, hosts and links) are the hooks after the parse.
BIN_KEYS = tuple(f"bin_{k}" for k in range(NUM_BINS))
IGNORED = ("size", "samples", "batches")  # a table object's keys written for readers, not read back
BINS_TOLERANCE = 0.01  # the access-histogram shares of a looked-up table sum to 1 within this


@dataclasses.dataclass(frozen=True)
class TaskFile:
    """A task object (the one under ``"task"`` in plan.json): ``devices``, or ``num_devices`` x ``mem_cap_gb``."""

    # a field left out stays None (an explicit null is refused with the field's type)
    devices: tuple[Device, ...] | None = None
    num_devices: int = bounded(at_least=1, at_most=MAX_DEVICES, default=None)
    mem_cap_gb: float = bounded(above=0, at_most=MAX_CAP_GB, default=None)
    batch_size: int = bounded(at_least=1, at_most=MAX_BATCH, default=None)
    precision: str = "fp32"
    optimizer: str = Training.optimizer  # the fused optimizer, FBGEMM's or TorchRec's name (core.memory)
    mem_reserve: float = bounded(at_least=0, default=0.0)  # share of every cap held back
    workspace: float | None = bounded(at_least=0, default=None)  # bytes per lookup the backward holds (core.memory)
    tables: tuple[JSONDoc, ...] | None = None  # TableFile objects, each parsed where errors can name it by its name
    pool: PoolSpec | None = None
    links: Links | None = None


@dataclasses.dataclass(frozen=True)
class TableFile:
    """A table object of a task file (constraints: ``core.constraints``)."""

    rows: int = bounded(at_least=1, at_most=MAX_ROWS)
    # any width FBGEMM's CPU kernels and TorchRec take; only a multiple of DIM_ALIGNMENT is cut into column slices
    dim: int = bounded(at_least=1, at_most=MAX_DIM)
    pooling_factor: float = bounded(at_least=0, at_most=MAX_POOLING)
    id: int | None = bounded(at_least=0, default=None)  # absent: the table's place in the task's list
    # 17 shares (``_checked_bins``), given as ``bins`` or as bin_0 .. bin_16 (``_bins_field``)
    bins: tuple[float, ...] = bounded(at_least=0, at_most=1, default=())
    name: str | None = None
    estimated: bool = False
    row_blocks: tuple[RowBlocksFile, ...] = ()
    pin: int | None = bounded(at_least=0, default=None)
    exclude: tuple[int, ...] = ()  # device indices (their range: the task's)
    no_split: bool = False
    max_shards: int | None = bounded(at_least=1, default=None)
    colocate: str | None = None
    sharding_types: tuple[str, ...] | None = None
    pooling: str = "sum"  # ``table.POOLINGS``: none for sequence embeddings
    weighted: bool = False  # per-id weights on its lookups
    precision: str | None = None  # its weights' data type where it differs from the task's
    # tiered memory: host rows, this share of them cached on the GPU (``Table.cache_load_factor``)
    cache_load_factor: float | None = bounded(above=0, below=1, default=None)


@dataclasses.dataclass(frozen=True)
class RowBlocksFile:
    """One entry of a table's ``row_blocks``: the statistics of its ``count`` row blocks."""

    count: int = bounded(at_least=2)
    pooling_factors: tuple[float, ...] | None = bounded(at_least=0, default=None)
    bins: tuple[tuple[float, ...], ...] | None = bounded(at_least=0, at_most=1, default=None)


@dataclasses.dataclass(frozen=True)
class PlanFile:
    """A plan.json object (``Plan.to_json``): the task, the shards and the replicated tables; the predicted costs
    (``devices``' ``cost_ms``, ``cost_ms``, ``cost_model``), provenance, the polishing and calibration records."""

    task: JSONDoc  # a TaskFile object, parsed by ``Task.from_json`` where errors can name it
    shards: tuple[ShardFile, ...]
    searcher: str | None = None
    cost_model: str | None = None
    seed: int | None = None
    data_parallel: tuple[int, ...] = ()  # table ids
    devices: tuple[JSONDoc, ...] | None = None  # each device's predicted costs (``plan_costs``: read where complete)
    cost_ms: float | None = None
    search_time_s: float | None = None
    polish: JSONDoc | None = None  # ``PolishRecord``'s own schema
    calibration: JSONDoc | None = None  # ``CalibrationRecord``'s own schema
    portfolio: JSONDoc | None = None  # ``PortfolioRecord``'s own schema
    autotune: JSONDoc | None = None  # ``AutotuneRecord``'s own schema
    stages: tuple[str, ...] = ()  # the planning run's stages in order (older files: none)
    # whole tables join the column-wise group where the plan has one (``Plan.merge_column_wise``); None: a file from
    # before the rule, read as true but for TorchRec's plans
    merge_column_wise: bool | None = None
    column_wise: tuple[int, ...] = ()  # the column-wise group's table ids, for readers; ignored on input
    host_mem_gb: float | None = None  # what the tables in tiered memory keep in host memory, for readers; ignored


@dataclasses.dataclass(frozen=True)
class ShardFile:
    """A plan.json shard: a table's column slice on a device, and for a row block its row range."""

    table: int
    col_offset: int = bounded(at_least=0)
    dim: int = bounded(at_least=1)
    device: int = bounded(at_least=0)
    row_offset: int = bounded(at_least=0, default=0)
    num_rows: int | None = bounded(at_least=0, default=None)


SHARD_KEYS = tuple(f.name for f in dataclasses.fields(ShardFile))


def devices_of(raw: TaskFile, where: str) -> list[Device]:
    """The task's devices: ``devices`` (``num_devices`` and ``mem_cap_gb``, if given beside them, must agree: the
    number of devices, the largest cap, as ``to_json`` writes them), else ``num_devices`` x ``mem_cap_gb``."""
    if raw.devices is None:
        for key in ("num_devices", "mem_cap_gb"):
            if getattr(raw, key) is None:
                raise UserError(f"{where}.{key}: missing, expected a value")
        return [Device(raw.mem_cap_gb)] * raw.num_devices
    devices = list(raw.devices)
    if not devices:
        raise UserError(f"{where}.devices: got [], expected a non-empty list like [{{'mem_cap_gb': 16, 'speed': 1.0}}]")
    if len(devices) > MAX_DEVICES:
        raise UserError(f"{where}.devices: got {len(devices)} devices, expected at most {MAX_DEVICES}")
    if raw.num_devices is not None and raw.num_devices != len(devices):
        raise UserError(f"{where}.num_devices: got {raw.num_devices!r}, expected {len(devices)} (the devices given)")
    largest = max(d.mem_cap_gb for d in devices)
    if raw.mem_cap_gb is not None and raw.mem_cap_gb != largest:
        raise UserError(
            f"{where}.mem_cap_gb: got {raw.mem_cap_gb!r}, expected {largest} (the largest of the devices' caps) "
            f"or no mem_cap_gb beside devices"
        )
    return devices


def devices_json(devices: tuple[Device, ...]) -> list[JSONDoc]:
    """The devices as plan.json writes them: their hosts only where they sit in several."""
    several = len({d.host for d in devices}) > 1
    return [{"mem_cap_gb": d.mem_cap_gb, "speed": d.speed, **({"host": d.host} if several else {})} for d in devices]


def links_json(links: Links) -> JSONDoc:
    return {key: value for key, value in dataclasses.asdict(links).items() if value is not None}


def checked_links(links: Links | None, devices: list[Device], where: str) -> Links | None:
    """The task's ``links`` (None when absent): required when the devices sit in more than one host, and hosts come
    from the devices or from ``devices_per_host``, not both."""
    hosts = sorted({d.host for d in devices})
    if links is None:
        if len(hosts) > 1:
            raise UserError(
                f"{where}.links: missing, but the devices sit in {len(hosts)} hosts; expected "
                "{'intra_host_gbps': ..., 'inter_host_gbps': ...} (GB/s per device within a host and between hosts)"
            )
        return None
    at = f"{where}.links"
    if links.devices_per_host is not None and len(hosts) > 1:
        raise UserError(
            f"{at}.devices_per_host: got {links.devices_per_host}, but the devices name their hosts; expected one"
        )
    if links.devices_per_host is None and len(hosts) < 2:
        raise UserError(
            f"{at}: the devices sit in one host; expected a host per device (devices[i].host) or links.devices_per_host"
        )
    if links.devices_per_host is not None and len(devices) % links.devices_per_host:
        raise UserError(
            f"{at}.devices_per_host: got {links.devices_per_host}, but {len(devices)} devices do not fill whole hosts "
            f"of it; expected a divisor of {len(devices)}"
        )
    return links


def table_where(obj: Any, index: int, where: str) -> str:
    """How errors name a table: by its name where it has one (``plan.tables['user_id']``), else by position."""
    name = obj.get("name") if isinstance(obj, dict) else None
    return f"{where}.tables[{name!r}]" if isinstance(name, str) and name else f"{where}.tables[{index}]"


def table_from_json(obj: dict, where: str, index: int = 0) -> Table:
    """A table object of a task file (a mapping, ``TaskFile.tables``' elements, the ``index``-th), parsed and
    checked; without an ``id``, its id is ``index``."""
    fields = {k: v for k, v in obj.items() if k not in BIN_KEYS}
    raw = typed(TableFile, {**fields, "bins": _bins_field(obj, where)}, where, ignore=IGNORED)
    bins = _checked_bins(raw.bins, raw.pooling_factor, f"{where}.bins")
    if raw.name == "":
        raise UserError(f"{where}.name: got '', expected a non-empty string")
    try:
        kernel_kind(raw.pooling, raw.weighted)
    except ValueError as err:
        raise UserError(f"{where}.{err}") from None
    if raw.precision is not None and raw.precision not in BYTES_PER_ELEMENT:
        raise UserError(
            f"{where}.precision: got {raw.precision!r}, expected one of {', '.join(BYTES_PER_ELEMENT)} (or none: the "
            "task's)"
        )
    table = Table(
        index if raw.id is None else raw.id,
        raw.rows,
        raw.dim,
        raw.pooling_factor,
        bins,
        raw.name,
        raw.estimated,
        pooling=raw.pooling,
        weighted=raw.weighted,
        precision=raw.precision,
    )
    if raw.cache_load_factor is not None:
        table = dataclasses.replace(table, cache_load_factor=float(raw.cache_load_factor))
    blocks = row_blocks_of(raw.row_blocks, raw.rows, raw.pooling_factor, f"{where}.row_blocks")
    return dataclasses.replace(table, row_blocks=blocks, constraints=_constraints_of(raw, where))


def _checked_bins(bins: tuple[float, ...], pooling: float, where: str) -> tuple[float, ...]:
    """An access histogram (its shares in [0, 1] already: the schema's bounds): 17 of them summing to 1 (or all 0
    where nothing is looked up)."""
    if len(bins) != NUM_BINS:
        raise UserError(f"{where}: got {list(bins)!r:.60}, expected {NUM_BINS} shares in [0, 1]")
    total = math.fsum(bins)
    if pooling > 0 and abs(total - 1) > BINS_TOLERANCE:
        raise UserError(
            f"{where}: the shares sum to {total:.4g}, expected 1 (within {BINS_TOLERANCE}) for a pooling_factor of "
            f"{pooling:g}"
        )
    if pooling == 0 and total > 0 and abs(total - 1) > BINS_TOLERANCE:
        raise UserError(f"{where}: the shares sum to {total:.4g}, expected 1 (within {BINS_TOLERANCE}) or all 0")
    return tuple(float(b) for b in bins)


def row_blocks_from_json(raw: Any, rows: int, pooling: float, where: str) -> tuple[RowBlockStats, ...]:
    """A table's ``row_blocks`` as JSON gives them (a statistics file's): parsed by the schema (``RowBlocksFile``),
    then checked (``row_blocks_of``)."""
    return row_blocks_of(typed_value(tuple[RowBlocksFile, ...], raw, where), rows, pooling, where)


def row_blocks_of(
    entries: tuple[RowBlocksFile, ...], rows: int, pooling: float, where: str
) -> tuple[RowBlockStats, ...]:
    """A table's row-block statistics from its parsed ``row_blocks`` (one entry per block count): a pooling factor
    and a histogram per block, the block pooling factors summing to the table's (within 1%)."""
    out, counts = [], set()
    for k, entry in enumerate(entries):
        at = f"{where}[{k}]"
        count = entry.count
        if count > rows or count in counts:
            why = f"at most the table's {rows} rows" if count > rows else "one entry per count"
            raise UserError(f"{at}.count: got {count}, expected {why}")
        counts.add(count)
        for name in ("pooling_factors", "bins"):
            value = getattr(entry, name)
            if value is None:
                raise UserError(f"{at}.{name}: missing, expected a value")
            if len(value) != count:
                raise UserError(f"{at}.{name}: got {list(value)!r:.60}, expected a list of {count} (one per block)")
        factors = list(entry.pooling_factors)
        if abs(math.fsum(factors) - pooling) > 0.01 * pooling + 1e-9:
            raise UserError(
                f"{at}.pooling_factors: they sum to {math.fsum(factors):.4g}, expected the table's pooling_factor "
                f"{pooling:g} (within 1%)"
            )
        bins = tuple(_checked_bins(b, f, f"{at}.bins[{i}]") for i, (b, f) in enumerate(zip(entry.bins, factors)))
        out.append(RowBlockStats(count, tuple(factors), bins))
    return tuple(sorted(out, key=lambda b: b.count))


def row_blocks_json(blocks: tuple[RowBlockStats, ...]) -> list[JSONDoc]:
    """``row_blocks`` as task-file objects."""
    return [
        {"count": b.count, "pooling_factors": list(b.pooling_factors), "bins": [list(x) for x in b.bins]}
        for b in blocks
    ]


def _constraints_of(raw: TableFile, where: str) -> TableConstraints:
    """A table's constraints, checked (device ranges are checked by the task, which knows its devices)."""
    out: dict[str, Any] = {"pin": raw.pin, "exclude": tuple(sorted(set(raw.exclude))), "no_split": raw.no_split}
    out["max_shards"] = raw.max_shards
    group = raw.colocate
    if group == "":
        raise UserError(f"{where}.colocate: got '', expected a group name (a non-empty string)")
    out["colocate"] = group
    types = raw.sharding_types
    if types is not None:
        if not types or not all(x in SHARDING_TYPES for x in types) or len(set(types)) != len(types):
            raise UserError(
                f"{where}.sharding_types: got {list(types)!r:.80}, expected a non-empty list of distinct names among "
                f"{', '.join(SHARDING_TYPES)}"
            )
        if not set(types) & {"table_wise", "column_wise", "data_parallel"}:
            raise UserError(
                f"{where}.sharding_types: got {list(types)}, expected table_wise, column_wise or data_parallel among "
                "them (row blocks alone are not planned here: a table that cannot be placed whole has no fallback)"
            )
        out["sharding_types"] = tuple(x for x in SHARDING_TYPES if x in types)
        if types == ("data_parallel",) and (out["pin"] is not None or out["exclude"] or out["colocate"]):
            raise UserError(
                f"{where}.sharding_types: got ['data_parallel'] (on every device) with pin, exclude or colocate, "
                "expected one or the other"
            )
    return TableConstraints(**out)


def _constraints_json(table: Table) -> JSONDoc:
    """The table's constraints as task-file keys (only those set)."""
    out: dict[str, Any] = {}
    if table.constraints.pin is not None:
        out["pin"] = table.constraints.pin
    if table.constraints.exclude:
        out["exclude"] = list(table.constraints.exclude)
    if table.constraints.no_split:
        out["no_split"] = True
    if table.constraints.max_shards is not None:
        out["max_shards"] = table.constraints.max_shards
    if table.constraints.colocate is not None:
        out["colocate"] = table.constraints.colocate
    if table.constraints.sharding_types is not None:
        out["sharding_types"] = list(table.constraints.sharding_types)
    return out


def _bins_field(obj: dict, where: str) -> Any:
    """The histogram as ``bins`` or as ``bin_0`` .. ``bin_16`` (not both)."""
    given = [k for k in BIN_KEYS if k in obj]
    if not given:
        if "bins" not in obj:
            raise UserError(f"{where}.bins: missing, expected a value")
        return obj["bins"]
    if "bins" in obj:
        raise UserError(f"{where}: both bins and {given[0]}.. given, expected one form of the histogram")
    missing = [k for k in BIN_KEYS if k not in obj]
    if missing:
        raise UserError(f"{where}.{missing[0]}: missing, expected all of bin_0 .. bin_{NUM_BINS - 1} (or bins)")
    return [obj[k] for k in BIN_KEYS]


def table_json(t: Table) -> JSONDoc:
    """A task file's table object (plan.json's ``task.tables[i]``)."""
    return {
        "id": t.id,
        **({"name": t.name} if t.name is not None else {}),
        "rows": t.rows,
        "dim": t.dim,
        "pooling_factor": t.pooling_factor,
        "size": t.size,
        "bins": list(t.bins),
        **({"estimated": True} if t.estimated else {}),
        **({"pooling": t.pooling} if t.pooling != "sum" else {}),
        **({"weighted": True} if t.weighted else {}),
        **({"precision": t.precision} if t.precision is not None else {}),
        **({"cache_load_factor": t.cache_load_factor} if t.cache_load_factor is not None else {}),
        **_constraints_json(t),
        **({"row_blocks": row_blocks_json(t.row_blocks)} if t.row_blocks else {}),
    }
