"""Placement constraints users set per table, in one place: what they allow, whether a plan keeps them, and the
smallest conflicting part of a set that no plan can keep.

Per table (task file and Python API; all optional):

* ``pin: D`` -- every shard of the table on device D;
* ``exclude: [D, ...]`` -- none of its shards on these devices;
* ``no_split: true`` -- one shard (table-wise); ``max_shards: K`` -- at most K column shards (the largest
  power of two <= K, within the table's legal halvings);
* ``colocate: "GROUP"`` -- every shard of every table of the group on one device (so the group's tables stay
  whole: slices of one table on one device are merged, ``sharding.merge_colocated``);
* ``sharding_types: [...]`` -- the ways the table may be sharded, as TorchRec's ``ParameterConstraints`` says them
  (``SHARDING_TYPES``): without ``column_wise`` it is not cut into column shards, without ``row_wise`` and
  ``table_row_wise`` not into row blocks, without ``data_parallel`` not replicated; ``[data_parallel]`` alone makes
  it data-parallel. Table-wise and column-wise are one family here (a table-wise table is one column shard).

A table holds its own as a ``TableConstraints`` (``Table.constraints``). The searchers honour them through
``allowed_devices`` (a device mask per table, a group's the AND of its tables'), ``max_levels`` (halvings per table)
and ``groups``; ``Plan.validate`` refuses a plan that breaks one (``violations``), so polishing keeps them too. NumPy
only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from neuroshard_jax.core.errors import InfeasibleError
from neuroshard_jax.core.memory import gib
from neuroshard_jax.core.sharding import Shard, max_halvings

KEYS = ("pin", "exclude", "no_split", "max_shards", "colocate", "sharding_types")
# TorchRec's sharding types: table_wise (one shard), column_wise (column slices), row_wise (row blocks over every
# device), table_row_wise (row blocks over one host's devices), data_parallel (every device holds the whole table and
# looks up its own slice of the batch; the gradients are all-reduced)
SHARDING_TYPES = ("table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel")


@dataclasses.dataclass(frozen=True)
class TableConstraints:
    """Where one table may go (TorchRec's ``ParameterConstraints`` is the model; the keys above). The default is no
    constraint at all."""

    pin: int | None = None
    exclude: tuple[int, ...] = ()
    no_split: bool = False
    max_shards: int | None = None
    colocate: str | None = None
    sharding_types: tuple[str, ...] | None = None  # TorchRec's names (SHARDING_TYPES); None: any

    @property
    def given(self) -> bool:
        """Whether any constraint is set."""
        return self != NONE

    def used(self) -> list[str]:
        """The keys (``KEYS`` order) this sets."""
        return [k for k in KEYS if getattr(self, k) not in (None, False, ())]


NONE = TableConstraints()


class Constrained(Protocol):
    """What this module reads of a table (``core.table.Table``)."""

    dim: int
    constraints: TableConstraints


class Placing(Protocol):
    """What ``unhonoured`` reads of a task (``core.task.Task``, which imports this module through its tables)."""

    tables: Sequence[Constrained]
    num_tables: int

    def table_mem_bytes(self, index: int) -> int: ...

    def table_names(self) -> list[str]: ...

    def cap_bytes(self) -> np.ndarray: ...


def has_constraints(tables: Sequence[Constrained]) -> bool:
    return any(t.constraints.given for t in tables)


def constraints_used(tables: Sequence[Constrained]) -> list[str]:
    """The constraint keys (``KEYS`` order) that at least one of ``tables`` sets."""
    used = {k for t in tables for k in t.constraints.used()}
    return [k for k in KEYS if k in used]


def may_be_data_parallel(table: Constrained) -> bool:
    """Whether a plan may replicate the table on every device: its sharding types allow it, and no constraint
    keeps it off a device or beside a group."""
    c = table.constraints
    allowed = c.sharding_types is None or "data_parallel" in c.sharding_types
    return allowed and c.pin is None and not c.exclude and c.colocate is None


def must_be_data_parallel(table: Constrained) -> bool:
    return table.constraints.sharding_types == ("data_parallel",)


def may_be_column_wise(table: Constrained) -> bool:
    """Whether the table's sharding types allow TorchRec's column_wise (a plan may declare it so whole, one shard)."""
    types = table.constraints.sharding_types
    return types is None or "column_wise" in types


def may_split_rows(table: Constrained) -> bool:
    """Whether the table's sharding types allow row blocks (row_wise or table_row_wise)."""
    types = table.constraints.sharding_types
    return types is None or "row_wise" in types or "table_row_wise" in types


def groups(tables: Sequence[Constrained]) -> dict[str, list[int]]:
    """Colocation groups: name -> table indices, in task order."""
    out: dict[str, list[int]] = {}
    for i, t in enumerate(tables):
        if t.constraints.colocate is not None:
            out.setdefault(t.constraints.colocate, []).append(i)
    return out


def allowed_devices(tables: Sequence[Constrained], num_devices: int) -> np.ndarray:
    """bool[T, N]: where each table's shards may go (pin, exclude; a colocated table: its group's intersection)."""
    allowed = np.ones((len(tables), num_devices), dtype=bool)
    for i, t in enumerate(tables):
        c = t.constraints
        if c.pin is not None:
            allowed[i] = np.arange(num_devices) == c.pin
        allowed[i, list(c.exclude)] = False
    for members in groups(tables).values():
        allowed[members] = allowed[members].all(axis=0)
    return allowed


def max_levels(tables: Sequence[Constrained]) -> np.ndarray:
    """i64[T]: how many times each table may be halved (its legal halvings, no_split, max_shards, colocate)."""
    out = []
    for t in tables:
        c, level = t.constraints, max_halvings(t.dim)
        if (
            c.no_split
            or c.colocate is not None
            or (c.sharding_types is not None and "column_wise" not in c.sharding_types)
        ):
            level = 0
        elif c.max_shards is not None:
            level = min(level, int(c.max_shards).bit_length() - 1)
        out.append(level)
    return np.array(out, dtype=np.int64)


def violations(
    tables: Sequence[Constrained], shards: Sequence[Shard], names: Sequence[str], data_parallel: Sequence[int] = ()
) -> list[str]:
    """One line per broken constraint of a plan's shards and data-parallel tables (empty: the plan keeps them
    all)."""
    by_table: dict[int, list[Shard]] = {}
    for s in shards:
        by_table.setdefault(s.table, []).append(s)
    out = []
    replicated = set(data_parallel)
    for i, t in enumerate(tables):
        if i in replicated:
            if not may_be_data_parallel(t):
                out.append(f"table {names[i]}: data_parallel (on every device), which its constraints do not allow")
            continue
        if must_be_data_parallel(t):
            out.append(f"table {names[i]}: sharding_types [data_parallel], but it is sharded")
        c = t.constraints
        cut_rows = any(s.row_offset != 0 or s.num_rows is not None for s in by_table.get(i, []))
        if cut_rows and not may_split_rows(t):
            out.append(
                f"table {names[i]}: cut into row blocks, its sharding_types {list(c.sharding_types)} do not allow it"
            )
        devices = sorted({s.device for s in by_table.get(i, [])})
        count = len(by_table.get(i, []))
        if c.pin is not None and devices != [c.pin]:
            out.append(f"table {names[i]}: pinned to device {c.pin}, has shards on {devices}")
        if set(devices) & set(c.exclude):
            out.append(f"table {names[i]}: excluded from devices {sorted(c.exclude)}, has shards on {devices}")
        if c.no_split and count > 1:
            out.append(f"table {names[i]}: no_split, cut into {count} shards")
        if c.max_shards is not None and count > c.max_shards:
            out.append(f"table {names[i]}: at most {c.max_shards} shards, cut into {count}")
    for group, members in groups(tables).items():
        devices = sorted({s.device for m in members for s in by_table.get(m, [])})
        if len(devices) > 1:
            out.append(
                f"colocate group {group!r} (tables {', '.join(names[m] for m in members)}): on devices {devices}"
            )
    return out


def conflicts(
    tables: Sequence[Constrained], names: Sequence[str], mem_bytes: Sequence[int], cap_bytes: Sequence[int]
) -> str | None:
    """The smallest conflicting part of the constraints found, or None: a table (or group) allowed on no device;
    a group whose tables are pinned apart; a table kept whole (``no_split``, ``max_shards`` 1) or a group too large
    for any device it may go to; tables pinned to one device (with their groups) over its memory. ``mem_bytes``: each
    table's whole memory; ``cap_bytes``: each device's cap."""
    num_devices = len(cap_bytes)
    for i, t in enumerate(tables):
        c = t.constraints
        if c.pin is not None and c.pin in c.exclude:
            return f"table {names[i]}: pinned to device {c.pin}, which it also excludes"
    for group, members in groups(tables).items():
        pins = sorted({tables[m].constraints.pin for m in members if tables[m].constraints.pin is not None})
        if len(pins) > 1:
            return f"colocate group {group!r}: its tables are pinned to devices {pins}, expected one device"
    allowed = allowed_devices(tables, num_devices)
    for i in range(len(tables)):
        if not allowed[i].any():
            group = tables[i].constraints.colocate
            where = f"colocate group {group!r}" if group else f"table {names[i]}"
            return f"{where}: allowed on no device (pin and exclude leave none of 0..{num_devices - 1})"
    for i, t in enumerate(tables):
        c = t.constraints
        if (c.no_split or c.max_shards == 1) and not c.colocate:
            room = max(cap_bytes[d] for d in np.flatnonzero(allowed[i]))
            if mem_bytes[i] > room:
                kept = "no_split" if c.no_split else "max_shards 1"
                return (
                    f"table {names[i]}: kept whole ({kept}), needs {gib(mem_bytes[i])} GiB, the largest device it may "
                    f"go to holds {gib(room)} GiB"
                )
    for group, members in groups(tables).items():
        need = sum(mem_bytes[m] for m in members)
        room = max(cap_bytes[d] for d in np.flatnonzero(allowed[members[0]]))
        if need > room:
            return (
                f"colocate group {group!r}: its tables need {gib(need)} GiB together, the largest device it "
                f"may go to holds {gib(room)} GiB"
            )
    for d in range(num_devices):
        forced = [i for i in range(len(tables)) if allowed[i].sum() == 1 and allowed[i, d]]
        need = sum(mem_bytes[i] for i in forced)
        if need > cap_bytes[d]:
            listed = ", ".join(names[i] for i in forced[:6]) + (", ..." if len(forced) > 6 else "")
            return f"tables pinned to device {d} ({listed}) need {gib(need)} GiB, its cap is {gib(cap_bytes[d])} GiB"
    return None


def unhonoured(task: Placing, honoured: Sequence[str]) -> list[str]:
    """The constraints ``task``'s tables use that a searcher taking ``honoured`` does not (none for a task without
    constraints), once its constraints are known to leave a placement: else InfeasibleError naming the smallest
    conflicting part found (``conflicts``)."""
    if not has_constraints(task.tables):
        return []
    mem = [task.table_mem_bytes(i) for i in range(task.num_tables)]
    conflict = conflicts(task.tables, task.table_names(), mem, task.cap_bytes())
    if conflict:
        raise InfeasibleError(f"constraints cannot all hold: {conflict}")
    return [k for k in constraints_used(task.tables) if k not in honoured]
