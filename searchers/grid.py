"""NeuroShard's table-wise greedy grid search, batched: one ``lax.scan`` over shards, vmapped over
(candidate column split, alpha).

The greedy (paper, section "search"): shards go in descending order of their predicted
single-shard compute cost; each goes to the device with the lowest *current* predicted compute cost
among devices where it still fits in memory and whose dim sum stays <= alpha x (total dim / N). Devices of
unequal speed: the device where the shard would finish first (its load plus the shard's cost alone, both divided
by the device's speed). A
device's cost is cached and only its head is rerun when a shard joins it (its latent sum grows by
the shard's embedding). The plan cost of every (candidate, alpha) is the simulator's formula.

Exact integer rules, shared with the plain-Python oracle in the tests:
* memory in units of ``unit_bytes`` (the smallest power of two that keeps the caps and the tables below
  ``MAX_UNITS``: 16 bytes for devices of 4 GiB), each shard rounded *up* and each device's cap rounded *down*, so a
  placement accepted here never exceeds the cap in bytes, and rounding costs a device at most a unit per shard;
* the dim bound of alpha is ``floor(alpha * total_dim / N)`` (``dim_bounds``);
* ties go to the lowest device index, equal shard costs keep their slot order.
If no device is eligible for a shard, that (candidate, alpha) is infeasible (cost +inf). A last,
memory-only bound (``MEMORY_ONLY``) can be appended to the alpha grid as a fallback; a candidate that no bound places
can then be packed by memory (``by_memory``: largest first, each shard on the device with the most memory left where
it fits, worst-fit decreasing: tight caps that the cost order cannot pack).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from neuroshard_jax.costs.cost_model import CostFns, DeviceArrays, combine_costs, input_dist_ms, plan_cost_ms

MEM_UNIT_BYTES = 1  # the finest unit: 3,000 tables of 48 B each take 48 B, not a 1 KiB unit each
MEMORY_ONLY = np.iinfo(np.int32).max  # a dim bound that never binds


MAX_UNITS = 2**29  # the cap and a whole task's tables stay below this: a device's i32 load + a shard cannot overflow


def unit_bytes(task) -> int:
    """Bytes per memory unit for ``task``: the smallest power of two that keeps its cap and its tables' total memory
    below MAX_UNITS units (a byte below 512 MiB, 16 bytes for 4 GiB, 4 MiB for 1 PiB of host memory)."""
    largest = max(task.largest_cap_bytes, sum(task.table_mem_bytes(i) for i in range(task.num_tables)))
    unit = MEM_UNIT_BYTES
    while largest // unit >= MAX_UNITS:
        unit *= 2
    return unit


def mem_units(nbytes, unit: int = MEM_UNIT_BYTES) -> np.ndarray:
    """Shard memory in units, rounded up (i64 values; i32 safe for the units of ``unit_bytes``)."""
    return -(-np.asarray(nbytes, dtype=np.int64) // unit)


def cap_units(cap_bytes, unit: int = MEM_UNIT_BYTES) -> np.ndarray:
    """Caps in units, rounded down (i64 values of the shape of ``cap_bytes``: one cap, or one per device)."""
    return np.asarray(cap_bytes, dtype=np.int64) // unit


def dim_bounds(alphas, total_dim: int, num_devices: int, memory_only_fallback: bool) -> np.ndarray:
    """i32[A]: floor(alpha * total_dim / N) per alpha (plus MEMORY_ONLY as the fallback)."""
    bounds = [min(math.floor(a * total_dim / num_devices + 1e-9), MEMORY_ONLY) for a in alphas]
    return np.array(bounds + ([MEMORY_ONLY] if memory_only_fallback else []), dtype=np.int32)


class ShardBatch(NamedTuple):
    """Candidate shard lists, padded: C candidates x S shard slots.

    feats f32[C, S, F] raw shard features; mem i32[C, S] memory units; dims i32[C, S]; valid bool[C, S];
    allowed bool[C, S, N] the devices a slot may go to (placement constraints); leader i32[C, S] the slot that
    places it (its own index, or the first slot of its colocation group: the group goes to one device as one item);
    column_table i32[C, S] (optional): for a column slice of a table cut in more than one, the table's index, else
    -1: where the slices of a table end on more than one device, their widths go in the column-wise all-to-all, apart
    from the table-wise one (``combine_costs``' ``apart``); all on one device, ``merge_colocated`` makes the table
    whole again and it stays table-wise;
    ids f32[C, S] (optional): each slot's table's ids per sample (its pooling factor), what the slot's device takes in
    TorchRec's input distribution (once per table and device: slices sharing a device are one shard);
    column_ok bool[C, S] (optional, with ``column_table``): the slots of whole tables that join the column-wise group
    where a placement cuts any table over devices (``Plan.column_wise_tables``, ``merge_column_wise``): one all-to-all
    and one input distribution in place of two.
    """

    feats: np.ndarray
    mem: np.ndarray
    dims: np.ndarray
    valid: np.ndarray
    allowed: np.ndarray
    leader: np.ndarray
    column_table: np.ndarray | None = None
    ids: np.ndarray | None = None
    column_ok: np.ndarray | None = None


class GridResult(NamedTuple):
    """cost_ms f32[C, A] (+inf where infeasible); devices i32[C, A, S] per shard slot (-1: padding)."""

    cost_ms: jax.Array
    devices: jax.Array


def comm_slope(fns: CostFns, params, width: float, device_mask) -> jax.Array:
    """f32[]: the ms of a step's all-to-alls (forward and backward) one more element of width adds to a device, as the
    model prices them where every device of ``device_mask`` carries ``width`` (a task's width spread evenly): the
    slope of its comm nets between 3/4 and 5/4 of that width (0 on one device: it sends nothing). The one rule of
    the greedy's comm-aware key (``_place``), shared with the oracle of the tests by definition."""
    mask = jnp.asarray(device_mask, bool)
    width = jnp.maximum(jnp.asarray(width, jnp.float32), 1.0)
    parts = jnp.stack([jnp.where(mask, 0.75 * width, 0.0), jnp.where(mask, 1.25 * width, 0.0)])[:, None, :]
    masks = jnp.broadcast_to(mask, parts.shape)
    ms = fns.bwd_comm(params, parts, masks) + fns.fwd_comm(params, parts, jnp.zeros_like(parts), masks)
    mean = jnp.where(masks, ms, 0.0).sum((-2, -1)) / jnp.maximum(mask.sum(), 1)
    slope = jnp.maximum((mean[1] - mean[0]) / (0.5 * width), 0.0)
    return jnp.where(mask.sum() > 1, slope, 0.0).astype(jnp.float32)


def _place(
    fns: CostFns, params, z, mem, dims, valid, allowed, single, bound, weight, cap, device_mask, speed, by_memory=False
):
    """Greedy placement of shards already in placement order (one candidate, one alpha; ``by_memory``: each on the
    eligible device with the most memory left).

    z f32[S, D], mem/dims i32[S], valid bool[S], allowed bool[S, N], single f32[S] each shard's cost alone; cap
    i32[N]; speed f32[N]; ``weight`` f32[] ms a device's load counts per element of its all-to-all width (0: the
    paper's rule, compute alone; ``comm_slope`` x a comm weight: the device whose compute and all-to-all together
    end first); returns (compute f32[N] (divided by the devices' speeds), dim sums i32[N], ok, devices i32[S]).
    """
    n = device_mask.shape[0]

    uniform = jnp.all(speed == speed[0])

    def step(carry, shard):
        latents, used, dim_sums, compute, ok = carry
        z_s, m, d, v, a, alone = shard
        eligible = device_mask & a & (used + m <= cap) & (dim_sums + d <= bound)
        found = eligible.any()
        # identical devices: the least loaded (the paper's rule); devices of unequal speed: where the shard would
        # finish first (its cost alone, divided by the device's speed, on top of the device's load)
        load = compute + weight * dim_sums.astype(jnp.float32)
        key = used - cap if by_memory else jnp.where(uniform, load, load + alone / speed)
        choice = jnp.argmin(jnp.where(eligible, key, jnp.inf))
        take = v & found
        row = latents[choice] + z_s
        # the chosen device alone changes: updated in place (a full pass over the devices per shard would cost as
        # much again as choosing it, at hundreds of devices)
        latents = latents.at[choice].set(jnp.where(take, row, latents[choice]))
        used = used.at[choice].add(jnp.where(take, m, 0))
        dim_sums = dim_sums.at[choice].add(jnp.where(take, d, 0))
        compute = compute.at[choice].set(jnp.where(take, fns.head(params, row) / speed[choice], compute[choice]))
        return (latents, used, dim_sums, compute, ok & (found | ~v)), jnp.where(take, choice, -1)

    init = (
        jnp.zeros((n, z.shape[-1]), z.dtype),
        jnp.zeros(n, jnp.int32),
        jnp.zeros(n, jnp.int32),
        jnp.zeros(n, jnp.float32),
        jnp.array(True),
    )
    (_, _, dim_sums, compute, ok), devices = jax.lax.scan(step, init, (z, mem, dims, valid, allowed, single))
    return compute, dim_sums, ok, devices


def _spread(devices, column_table):
    """bool[S]: the slots of tables cut in columns whose slices ended on more than one device (``column_wise_dims``),
    from one placement (devices i32[S] in slot order, -1 for padding)."""
    slots = devices.shape[0]
    sliced = column_table >= 0
    table = jnp.where(sliced, column_table, slots)  # out of range: dropped by the segment ops
    lowest = jax.ops.segment_min(devices, table, num_segments=slots)
    highest = jax.ops.segment_max(devices, table, num_segments=slots)
    own = jnp.minimum(table, slots - 1)  # each slot's table (a whole table's slot: masked by ``sliced``)
    return sliced & (lowest[own] != highest[own])


def _column_group(devices, column_table, column_ok):
    """bool[S]: the slots in the column-wise group of one placement: ``_spread``'s and, where there are any, the
    ``column_ok`` slots (None: none; ``Plan.column_wise_tables``)."""
    spread = _spread(devices, column_table)
    return spread if column_ok is None else spread | (spread.any() & column_ok)


def _column_wise_sums(devices, dims, spread, n: int):
    """i32[N]: each device's widths in the column-wise all-to-all, from one placement: the ``spread`` slots (slices
    of tables whose slices ended on more than one device, ``_spread``)."""
    return jax.ops.segment_sum(jnp.where(spread, dims, 0), jnp.where(devices >= 0, devices, n), num_segments=n)


def _input_taken(devices, ids, column_table, spread, n: int):
    """f32[2, N]: the ids per sample each device takes in the table-wise and the column-wise (``spread``, ``_spread``)
    input distributions, from one placement: a table's once per device holding any of its slices."""
    slots = devices.shape[0]
    table = jnp.where(column_table >= 0, column_table, slots + jnp.arange(slots))  # a whole table: a key of its own
    device = jnp.where(devices >= 0, devices, n)
    key = table * (n + 1) + device  # one per (table, device) pair; sorted, a pair's first slot starts a run
    order = jnp.argsort(key, stable=True)
    ordered = key[order]
    starts = jnp.concatenate([jnp.ones(1, bool), ordered[1:] != ordered[:-1]])
    first = jnp.zeros(slots, bool).at[order].set(starts)
    take = first & (devices >= 0)
    per_kind = [jnp.where(take & kind, ids, 0.0) for kind in (~spread, spread)]
    return jnp.stack([jax.ops.segment_sum(x, device, num_segments=n) for x in per_kind])


@functools.partial(jax.jit, static_argnums=0, static_argnames="by_memory")
def grid_search(
    fns: CostFns,
    params,
    batch: ShardBatch,
    bounds,
    cap,
    device_mask,
    speed,
    by_memory: bool = False,
    inputs=None,
    weights=None,
) -> GridResult:
    """Run the greedy for every candidate of ``batch`` and every dim bound of ``bounds`` (i32[A]).

    ``weights`` f32[A] (optional; 0 without): each bound's greedy counts a device's all-to-all width at that many
    ms per element beside its compute (``_place``; ``comm_weights`` x ``comm_slope``).
    ``cap``: memory units of each device (i32[N]); ``device_mask`` bool[N]; ``speed`` f32[N] each device's relative
    compute speed (its predicted compute is divided by it). Costs by the cost model ``fns``. ``by_memory`` (the
    packing fallback, compiled apart): shards in descending order of memory, each on the eligible device with the
    most memory left. ``inputs`` f32[3, N] (optional, with ``batch.ids``): each device's input distribution terms
    (``scoring.input_terms``): the ids' all-to-alls of each placement are priced (``cost_model.input_dist_ms``).
    """
    num_slots = batch.valid.shape[1]
    z = fns.embed(params, batch.feats) * batch.valid[..., None]  # [C, S, D]
    # a colocation group is one item: its leader slot carries the sum of its slots' latents (a device's latent is
    # the sum of its shards'), memory and dims; the other slots are placed with it
    items = jax.vmap(functools.partial(jax.ops.segment_sum, num_segments=num_slots))
    z, mem, dims = (
        items(z, batch.leader),
        items(batch.mem * batch.valid, batch.leader),
        items(batch.dims * batch.valid, batch.leader),
    )
    valid = batch.valid & (batch.leader == jnp.arange(num_slots))
    single = jnp.where(valid, fns.head(params, z), 0.0)  # [C, S]
    first = jnp.where(valid, -mem, jnp.iinfo(jnp.int32).max) if by_memory else jnp.where(valid, -single, jnp.inf)
    order = jnp.argsort(first, axis=-1, stable=True)
    take = functools.partial(jnp.take_along_axis, axis=1)
    z_sorted = jnp.take_along_axis(z, order[..., None], axis=1)
    allowed_sorted = jnp.take_along_axis(batch.allowed, order[..., None], axis=1)
    sorted_ = (z_sorted, take(mem, order), take(dims, order), take(valid, order), allowed_sorted, take(single, order))

    weights = jnp.zeros(bounds.shape, jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)

    def one(z_c, mem_c, dims_c, valid_c, allowed_c, single_c, bound, weight):
        args = (z_c, mem_c, dims_c, valid_c, allowed_c, single_c, bound, weight, cap, device_mask, speed, by_memory)
        return _place(fns, params, *args)

    over_alphas = jax.vmap(one, in_axes=(None, None, None, None, None, None, 0, 0))
    over = jax.vmap(over_alphas, in_axes=(0, 0, 0, 0, 0, 0, None, None))
    compute, dim_sums, ok, placed = over(*sorted_, bounds, weights)
    # back from placement order to slot order: devices[c, a, order[c, s]] = placed[c, a, s]
    inverse = jnp.argsort(order, axis=-1)
    devices = jnp.take_along_axis(placed, inverse[:, None, :], axis=-1)
    devices = jnp.take_along_axis(devices, batch.leader[:, None, :], axis=-1)  # a group's slots: its leader's device
    devices = jnp.where(batch.valid[:, None, :], devices, -1)
    n = device_mask.shape[0]
    apart = rows_ms = None
    if batch.column_table is None:  # no table cut in columns: everything table-wise
        table, spread = jnp.full_like(batch.valid, -1, jnp.int32), jnp.zeros(devices.shape, bool)
    else:  # where each candidate's slices ended (once for both uses), and the column-wise tables' all-to-all
        table = batch.column_table
        spread = jax.vmap(jax.vmap(_column_group, in_axes=(0, None, None)))(devices, table, batch.column_ok)
        per_alpha = jax.vmap(_column_wise_sums, in_axes=(0, None, 0, None))
        sums = jax.vmap(per_alpha, in_axes=(0, 0, 0, None))(devices, batch.dims, spread, n)
        apart = sums.astype(jnp.float32)[..., None, :]
    if inputs is not None:  # the ids' all-to-alls, table-wise and column-wise
        per_alpha = jax.vmap(_input_taken, in_axes=(0, None, None, 0, None))
        taken = jax.vmap(per_alpha, in_axes=(0, 0, 0, 0, None))(devices, batch.ids, table, spread, n)
        rows_ms = (input_dist_ms(inputs, taken, device_mask), 0.0)
    costs = combine_costs(
        fns, params, compute, DeviceArrays(dim_sums.astype(jnp.float32), device_mask, None, rows_ms, apart)
    )
    cost_ms = jnp.where(ok, plan_cost_ms(costs), jnp.inf)
    return GridResult(cost_ms, devices)
