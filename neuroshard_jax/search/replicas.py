"""The data-parallel stage: which tables every device holds whole (TorchRec's data_parallel), tried before the
search places the rest.

A small table looked up very often decides the step of every table-wise or column-wise plan: whichever device holds
it does all its lookups. Data-parallel, every device holds it and looks up its own slice of the batch (batch / N);
the price is its memory on every device and an all-reduce of its gradients (``scoring``: priced as a row group
over every device). The stage tries the tables that must be data-parallel (``sharding_types: [data_parallel]``)
and, for a searcher that chooses sharding types (``replicates``: beam, grid), those plus the hottest candidate,
and those plus every candidate: a table that may be data-parallel (``constraints.may_be_data_parallel``), fits
every device whole, and whose compute alone exceeds the mean device's share of the whole task's. The searcher
plans the other tables around them (``replica_rest``: the devices' caps less the replicas' memory) and the
pipeline keeps the way its cost model scores cheapest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.constraints import may_be_data_parallel, must_be_data_parallel
from neuroshard_jax.core.errors import InfeasibleError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.task import Task
from neuroshard_jax.search.row_split import join, task_around


def replica_choices(task: Task, table_ms: np.ndarray | None, chooses: bool) -> list[tuple[int, ...]]:
    """The sets of data-parallel tables (task indices, ascending) the stage tries, the plain one first.
    ``table_ms`` f64[T]: each table's predicted compute alone and whole (needed where ``chooses``); ``chooses``:
    the searcher picks sharding types (else only the tables that must be data-parallel)."""
    forced = tuple(i for i, t in enumerate(task.tables) if must_be_data_parallel(t))
    choices = [forced]
    if not chooses or task.num_devices < 2 or table_ms is None:
        return choices
    share = float(table_ms.sum()) / task.num_devices
    room = int(task.cap_bytes().min())
    candidates = [
        i
        for i in np.argsort(-table_ms, kind="stable").tolist()
        if i not in forced
        and may_be_data_parallel(task.tables[i])
        and table_ms[i] > share
        and task.table_mem_bytes(i) <= room
    ]
    for more in (candidates[:1], candidates):
        choice = tuple(sorted({*forced, *more}))
        if choice not in choices:
            choices.append(choice)
    return choices


def replicas_fit(task: Task, replicated: Sequence[int]) -> int:
    """The bytes the data-parallel tables ``replicated`` take on every device; InfeasibleError if a device cannot
    hold them."""
    need = sum(task.table_mem_bytes(i) for i in replicated)
    caps = task.cap_bytes()
    short = int(np.argmin(caps))
    if need > caps[short]:
        names = ", ".join(str(task.tables[t].id) for t in replicated)
        raise InfeasibleError(
            f"task infeasible: data-parallel table(s) {names} need {need / GIB_BYTES:.3f} GiB on every device; "
            f"device {short} holds {task.caps_gb()[short]} GiB"
        )
    return need


def replica_rest(task: Task, replicated: Sequence[int]) -> tuple[Task, list[int]]:
    """The task the searcher plans around the data-parallel tables ``replicated``: the other tables (and their task
    indices), on devices whose caps lose the replicas' memory. InfeasibleError if a device cannot hold them."""
    need = replicas_fit(task, replicated)
    return task_around(task, np.full(task.num_devices, need, dtype=np.int64), set(replicated))


def with_replicas(task: Task, rest_plan: Plan, rest: Sequence[int], replicated: Sequence[int]) -> Plan:
    """The whole task's plan: ``rest_plan``'s shards renumbered to the task's tables (``row_split.join``), and
    ``replicated`` data-parallel."""
    return dataclasses.replace(join(task, rest_plan, rest, ()), data_parallel=tuple(sorted(replicated)))
