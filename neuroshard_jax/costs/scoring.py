"""The scoring API: pure, jitted functions over padded arrays, for searchers and for other JAX code;
and host-side scoring of ``Plan`` objects (``score_plan``, ``score_plans``, ``with_costs``).

Every function takes ``fns`` (a ``CostFns``, static: pass ``model.fns``) and ``params`` (a pytree:
``model.params``), then arrays; any leading batch dimensions broadcast, so a whole batch of
candidate plans is scored in one call. Padded tables/devices are masked out. Same padded shapes never
recompile. Everything is differentiable with respect to the float inputs.

    import neuroshard_jax as nsj
    from neuroshard_jax.costs import scoring
    model = nsj.load_cost_model("neural")                     # or "analytic", or a checkpoint directory
    arrays = scoring.plan_arrays(plan, model)                  # PlanArrays: feats f32[N, T, F], table_mask, devices
    z = scoring.table_latents(model.fns, model.params, arrays.feats)  # f32[N, T, F] -> f32[N, T, D]
    costs = scoring.costs_from_latents(model.fns, model.params, (z * arrays.table_mask[..., None]).sum(-2),
                                       arrays.table_mask.any(-1), arrays.devices)  # DeviceCosts of f32[N]
    cost_ms = scoring.plan_costs(model.fns, model.params, arrays)  # f32[]; stacked PlanArrays: f32[B]
    shard_ms = scoring.shard_costs(model.fns, model.params, shard_feats, shard_mask)  # f32[S, T, F] -> f32[S]

The jitted functions price the all-to-all of the widths they are given. A neural model with a row comm fit
(``model.row_comm``, ``row_comm.py``) prices the collectives of row-split tables apart: the host-side functions
below add them (``fitted_ms``) and leave row blocks out of the all-to-all width: ``plan_arrays(plan, model)`` puts
both in its ``devices`` (``rows_ms``, ``dim_sums``). TorchRec runs one all-to-all per sharding type: the column-wise
tables' all-to-all is priced apart from the table-wise one (``devices.apart``, ``apart_arrays``; without it, every
width is priced as one all-to-all). A model with an input distribution fit (``model.input_dist``,
``input_dist.py``) also prices the ids' all-to-alls before the lookups, one per sharding type, in ``rows_ms``'
forward (``fitted_ms``). ``plan_arrays(plan)`` without a model gives the widths alone, every row block in them.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from neuroshard_jax.core.assignment import (
    INPUT_TYPES,
    all_to_all_dims,
    apart_arrays,
    crosses_hosts,
    input_features,
    row_groups,
)
from neuroshard_jax.core.features import NUM_FEATURES
from neuroshard_jax.core.plan import Plan, PlanCosts
from neuroshard_jax.core.sharding import Shard, replica_features, shard_features
from neuroshard_jax.core.task import Task
from neuroshard_jax.core.tiers import tier_key
from neuroshard_jax.costs.cost_model import (
    CostFns,
    CostModel,
    DeviceArrays,
    DeviceCosts,
    PlanArrays,
    bucket,
    combine_costs,
    device_compute_ms,
    device_costs,
    input_dist_ms,
    plan_cost_ms,
)
from neuroshard_jax.costs.input_dist import InputDist
from neuroshard_jax.costs.row_comm import RowComm

CHUNK = 1024  # items per step of the big-batch paths: activations stay in cache (4x faster than one pass on CPU)


def map_chunks(fn, arrays, item_ndims, chunk: int = CHUNK):
    """Apply ``fn`` to ``arrays`` in chunks of ``chunk`` items along the flattened leading batch dims.

    ``item_ndims[i]``: trailing dims of one item of ``arrays[i]``. Equivalent to ``fn(*arrays)`` for fns
    that treat batch items independently; large batches run as a ``lax.map`` over chunks.
    """
    batch_shape = arrays[0].shape[: arrays[0].ndim - item_ndims[0]]
    count = 1
    for d in batch_shape:
        count *= d
    if count <= chunk:
        return fn(*arrays)
    pad = -count % chunk
    flat = []
    for a, k in zip(arrays, item_ndims):
        a = a.reshape((count, *a.shape[a.ndim - k :]))
        a = jnp.concatenate([a, jnp.repeat(a[:1], pad, axis=0)]) if pad else a
        flat.append(a.reshape((-1, chunk, *a.shape[1:])))
    out = jax.lax.map(lambda xs: fn(*xs), tuple(flat))
    return jax.tree_util.tree_map(
        lambda o: o.reshape((-1, *o.shape[2:]))[:count].reshape(batch_shape + o.shape[2:]), out
    )


@functools.partial(jax.jit, static_argnums=0)
def shard_costs(fns: CostFns, params, feats: jax.Array, mask: jax.Array) -> jax.Array:
    """Fused-kernel compute ms f32[...] of shards: feats f32[..., T, F], mask bool[..., T] (chunked)."""
    return map_chunks(lambda f, m: device_compute_ms(fns, params, f, m), (feats, mask), (2, 1))


@functools.partial(jax.jit, static_argnums=0)
def table_latents(fns: CostFns, params, feats: jax.Array) -> jax.Array:
    """Per-table (shard) latents: raw features f32[..., F] -> f32[..., D]."""
    return fns.embed(params, feats)


@functools.partial(jax.jit, static_argnums=0)
def single_shard_costs(fns: CostFns, params, feats: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Latents f32[..., D] and compute ms f32[...] of shards on their own (raw features f32[..., F]):
    the ordering key of the greedy searchers and the RL MDP."""
    z = fns.embed(params, feats)
    return z, fns.head(params, z)


def shards_alone(model: CostModel, feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``single_shard_costs`` of host features f32[S, ..., F]: latents f32[S, ..., D] and compute ms f32[S, ...]. The
    leading axis is padded to a power of two with copies of the first shard, so tasks of similar size share one
    compiled shape (each shard is costed on its own: the padding changes no result)."""
    count = feats.shape[0]
    padded = np.concatenate([feats, np.repeat(feats[:1], bucket(count, 1) - count, axis=0)]) if count else feats
    latents, ms = single_shard_costs(model.fns, model.params, padded)
    return np.asarray(latents)[:count], np.asarray(ms)[:count]


@functools.partial(jax.jit, static_argnums=0)
def costs_from_latents(fns: CostFns, params, latent_sums: jax.Array, has_tables: jax.Array, devices: DeviceArrays):
    """Per-device costs (``DeviceCosts``) from summed latents f32[..., N, D] and has_tables bool[..., N], with the
    devices' arrays (``DeviceArrays``: widths, masks, speeds, collectives priced by fits, all-to-alls apart)."""
    compute = jnp.where(has_tables, fns.head(params, latent_sums), 0.0)
    return combine_costs(fns, params, compute, devices)


def _filled(arrays: PlanArrays) -> PlanArrays:
    """``arrays`` with every device array broadcast to the batch's shape: speeds of 1 and no collectives where none
    are given (``apart`` stays None: then no comm nets run on parts that move nothing)."""
    dim_sums = arrays.devices.dim_sums
    shape = jnp.broadcast_shapes(arrays.feats.shape[:-2], dim_sums.shape)
    speed, rows, apart = arrays.devices.speed, arrays.devices.rows_ms, arrays.devices.apart
    devices = DeviceArrays(
        jnp.broadcast_to(dim_sums, shape),
        jnp.broadcast_to(arrays.devices.device_mask, shape),
        jnp.broadcast_to(jnp.ones(shape, dim_sums.dtype) if speed is None else speed, shape),
        tuple(jnp.broadcast_to(jnp.asarray(r, dim_sums.dtype), shape) for r in rows or (0.0, 0.0)),
        None if apart is None else jnp.broadcast_to(apart, shape[:-1] + apart.shape[-2:]),
    )
    return PlanArrays(arrays.feats, arrays.table_mask, devices)


# trailing dims of one plan in each array of ``PlanArrays`` (a None field has no leaf)
_ITEM_NDIMS = PlanArrays(3, 2, DeviceArrays(1, 1, 1, (1, 1), 2))


@functools.partial(jax.jit, static_argnums=0)
def plan_costs(fns: CostFns, params, arrays: PlanArrays) -> jax.Array:
    """Plan costs f32[...] of padded plans (``PlanArrays`` with any leading batch dims; chunked over plans)."""
    arrays = _filled(arrays)
    treedef = jax.tree_util.tree_structure(arrays)
    ndims = (
        _ITEM_NDIMS
        if arrays.devices.apart is not None
        else _ITEM_NDIMS._replace(devices=_ITEM_NDIMS.devices._replace(apart=None))
    )

    def one_chunk(*leaves):
        return plan_cost_ms(device_costs(fns, params, jax.tree_util.tree_unflatten(treedef, leaves)))

    leaves = jax.tree_util.tree_leaves(arrays)
    return map_chunks(one_chunk, leaves, jax.tree_util.tree_leaves(ndims), max(1, CHUNK // 8))


# ---------------------------------------------------------------------------------------------
# Host side: Plan objects to padded arrays, scored in one call


def shard_row(task: Task, task_feats: np.ndarray, shard: Shard) -> tuple[np.ndarray, bool]:
    """A shard's features f64[F] (``task_feats``: ``task.features()``) and whether it does work (an empty row block
    does none): one row of ``PlanArrays.feats``, built here for every scorer."""
    table = task.tables[shard.table]
    block = None if shard.whole_rows(table.rows) else shard.rows(table.rows)
    stats = table.block_stats(shard.row_offset, block) if block else None
    return shard_features(task_feats[shard.table], shard.dim, block, stats), block != 0


def plan_arrays(plan: Plan, model: CostModel | None = None, max_tables: int | None = None) -> PlanArrays:
    """The padded arrays of one plan (``PlanArrays``, T = ``max_tables`` or ``device_width``), built in one pass
    over its shards. With ``model``, everything it prices: row blocks out of the all-to-all width where it has
    ``row_comm``, the collectives its fits price (``fitted_ms``), the all-to-alls apart (``apart_arrays``), the
    devices' speeds; without, the all-to-all widths of every shard and the speeds alone."""
    task = plan.task
    n = task.num_devices
    width = max_tables or device_width(plan)
    feats = np.zeros((n, width, NUM_FEATURES), dtype=np.float32)
    mask = np.zeros((n, width), dtype=bool)
    task_feats = task.features()
    filled = np.zeros(n, dtype=int)  # tables placed on each device so far
    for s in plan.shards:
        j = filled[s.device]
        feats[s.device, j], mask[s.device, j] = shard_row(task, task_feats, s)
        filled[s.device] += 1
    for t in plan.data_parallel:  # every device's part of each data-parallel table, after its own shards
        replica = replica_features(task_feats[t], n)
        feats[np.arange(n), filled] = replica
        mask[np.arange(n), filled] = True
        filled += 1
    speed = task.speeds().astype(np.float32)
    rows_apart = model is not None and model.prices_rows
    devices = DeviceArrays(all_to_all_dims(plan, rows_apart), np.ones(n, dtype=bool), speed)
    if model is not None:
        rows = tuple(r[0] for r in fitted_ms(model, [plan]))
        devices = devices._replace(rows_ms=rows, apart=apart_arrays(plan, rows_apart))
    return PlanArrays(feats, mask, devices)


def stacked_arrays(model: CostModel, plans: list[Plan], size: int | None = None) -> PlanArrays:
    """``PlanArrays`` of many plans of one task stacked on a leading axis f32[K, ...] (``fitted_ms`` worked out for
    them at once) and padded to ``size`` plans (default: the power-of-two bucket of K, at least 8) by repeating
    the first: one padded shape, few compilations."""
    width = max(device_width(p) for p in plans)
    one = [plan_arrays(p, None, width) for p in plans]
    feats, mask = np.stack([a.feats for a in one]), np.stack([a.table_mask for a in one])
    dims = np.stack([all_to_all_dims(p, model.prices_rows) for p in plans])
    apart = np.stack([apart_arrays(p, model.prices_rows) for p in plans])
    speed = np.broadcast_to(plans[0].task.speeds().astype(np.float32), dims.shape)
    devices = DeviceArrays(dims, np.ones_like(dims, bool), speed, fitted_ms(model, plans), apart)
    return pad_plans(PlanArrays(feats, mask, devices), size or bucket(len(plans), 8))


def pad_plans(tree, size: int):
    """Every array of ``tree`` padded on its leading (plan) axis to ``size`` by repeating its first plan."""
    return jax.tree_util.tree_map(lambda a: np.concatenate([a, np.repeat(a[:1], size - len(a), axis=0)]), tree)


def device_width(plan: Plan) -> int:
    """The padded table axis of ``plan_arrays``: the most tables one device holds (data-parallel ones included)."""
    held = np.bincount([s.device for s in plan.shards], minlength=plan.task.num_devices)
    return bucket(int(held.max(initial=0)) + len(plan.data_parallel))


def plan_dim_sums(plan: Plan, model: CostModel) -> np.ndarray:
    """f32[N]: each device's all-to-all width as ``model`` prices it (row blocks apart where it has ``row_comm``)."""
    return all_to_all_dims(plan, model.prices_rows)


@functools.partial(jax.jit, static_argnums=0)
def _device_costs_jit(fns, params, arrays: PlanArrays) -> DeviceCosts:
    return device_costs(fns, params, arrays)


def fitted_ms(model: CostModel, plans: list[Plan]) -> tuple[np.ndarray, np.ndarray]:
    """(fwd, bwd) f32[K, N]: each plan's collectives priced by fits rather than the comm nets: its row groups' by the
    model's ``row_comm`` and, forward, its input distributions by its ``input_dist`` (0 without them)."""
    n = plans[0].task.num_devices
    out = np.zeros((2, len(plans), n), np.float32)
    if model.prices_rows:
        for i, plan in enumerate(plans):
            out[:, i] = device_row_ms(model.row_comm, plan)
    if model.input_dist is not None and n > 1:
        out[0] += device_input_ms(model.input_dist, plans, np.stack([input_taken(p) for p in plans]))
    return out[0], out[1]


def device_input_ms(fit: InputDist, plans: list[Plan], taken: np.ndarray) -> np.ndarray:
    """f32[K, N]: each device's ms in the input distributions of plans of one task, whose ids taken are ``taken``
    f32[K, len(INPUT_TYPES), N] (``input_taken``), by ``fit``."""
    task = plans[0].task
    terms = input_terms(fit, task)  # the fit's terms at the task's devices, batch and links
    return np.asarray(input_dist_ms(terms, taken, np.ones(task.num_devices, bool)))


def input_terms(fit: InputDist, task: Task) -> np.ndarray:
    """f32[3, N]: each device's input distribution terms (``cost_model.input_dist_ms``) for ``task``: the fit's at the
    task's devices and batch, scaled by each device's links (``Task.comm_scale``)."""
    return (fit.terms(task.num_devices, task.batch_size)[:, None] * task.comm_scale()[None, :]).astype(np.float32)


def input_taken(plan: Plan) -> np.ndarray:
    """f32[len(INPUT_TYPES), N]: the ids per sample each device takes in each of the plan's input distributions (0 for
    a sharding type the plan does not use)."""
    features = input_features(plan)
    return np.array(
        [[sum(f) for f in features.get(kind, [[]] * plan.task.num_devices)] for kind in INPUT_TYPES], np.float32
    )


def score_plan(model: CostModel, plan: Plan) -> DeviceCosts:
    """Predicted per-device costs of one plan, as numpy arrays f64[N] (compute divided by the devices' speeds)."""
    model = model.for_task(plan.task)  # its own tables in tiered memory priced (TorchRec's may differ from ours)
    costs = _device_costs_jit(model.fns, model.params, plan_arrays(plan, model))
    return DeviceCosts(*(np.asarray(c, dtype=np.float64) for c in costs))


def score_plans(model: CostModel, plans: list[Plan]) -> np.ndarray:
    """Predicted plan costs f64[K] of many plans of one task, in one batched call."""
    costs, _ = score_plans_devices(model, plans, uncertainty=False)
    return np.asarray(plan_cost_ms(costs), dtype=np.float64)


def score_plans_devices(
    model: CostModel, plans: list[Plan], uncertainty: bool = True
) -> tuple[DeviceCosts, np.ndarray | None]:
    """Predicted per-device costs of many plans of one task (DeviceCosts of f64[K, N]) and, for an ensemble
    (and ``uncertainty``), each device's relative spread f64[K, N] (else None); batched calls of one padded
    shape."""
    if plans and any(tier_key(p.task) != tier_key(plans[0].task) for p in plans[1:]):  # each its own tiering
        parts = [score_plans_devices(model, [p], uncertainty) for p in plans]
        costs = DeviceCosts(*(np.concatenate(c) for c in zip(*(c for c, _ in parts))))
        spreads = [s for _, s in parts]
        return costs, None if spreads[0] is None else np.concatenate(spreads)
    if plans:
        model = model.for_task(plans[0].task)
    arrays = stacked_arrays(model, plans)
    costs = _device_costs_jit(model.fns, model.params, arrays)
    costs = DeviceCosts(*(np.asarray(c, dtype=np.float64)[: len(plans)] for c in costs))
    if not uncertainty or model.fns.uncertainty is None:
        return costs, None
    spread, _ = _uncertainty_jit(model.fns, model.params, arrays.feats, arrays.table_mask)
    return costs, np.asarray(spread, np.float64)[: len(plans)]


@functools.partial(jax.jit, static_argnums=0)
def _uncertainty_jit(fns, params, feats, table_mask):
    latent_sums = jnp.where(table_mask[..., None], fns.embed(params, feats), 0.0).sum(-2)
    spread, trust = fns.uncertainty(params, latent_sums)
    has = table_mask.any(-1)
    return jnp.where(has, spread, 0.0), jnp.where(has, trust, 1.0)


def device_uncertainty(model: CostModel, plan: Plan) -> tuple[np.ndarray, np.ndarray] | None:
    """(relative spread, trust) f64[N] of each device's predicted compute, or None for a model without an
    ensemble (``CostFns.uncertainty``)."""
    if model.fns.uncertainty is None:
        return None
    arrays = plan_arrays(plan)
    spread, trust = _uncertainty_jit(model.fns, model.params, arrays.feats, arrays.table_mask)
    return np.asarray(spread, np.float64), np.asarray(trust, np.float64)


def with_costs(model: CostModel, plan: Plan) -> Plan:
    """``plan`` with its predicted per-device costs (``Plan.costs``) by ``model``, and where the model is an
    ensemble, how sure it is of each device."""
    model = model.for_task(plan.task)
    costs = score_plan(model, plan)
    columns = [tuple(float(x) for x in c) for c in costs]
    unsure = device_uncertainty(model, plan)
    spread, trust = (tuple(float(x) for x in u) for u in unsure) if unsure else (None, None)
    return dataclasses.replace(plan, costs=PlanCosts(*columns, float(plan_cost_ms(costs)), model.name, spread, trust))


def device_row_ms(model: RowComm, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(fwd, bwd) f64[N]: each device's row-group collectives, a group spanning hosts scaled by its devices' links."""
    n = plan.task.num_devices
    fwd, bwd = np.zeros(n), np.zeros(n)
    groups = row_groups(plan)
    scale = plan.task.comm_scale() if groups else None
    for width, devices in groups:
        f, b = model.group_ms(len(devices), width, plan.task.batch_size)
        s = scale[devices] if crosses_hosts(plan, devices) else 1.0
        fwd[devices] += f * s
        bwd[devices] += b * s
    return fwd, bwd


def balanced_step(model, plan: Plan, compute: list[float]) -> float:
    """(b)'s balance bound of ``plan``: its step were its measured compute and its all-to-all widths (each sharding
    type's all-to-all's apart) spread evenly over its devices (its row groups' and input distributions' collectives
    as they are), by the same formula as ``step``. A task's least over its plans is what no placement of those
    kernels beats by balance alone (fusing tables otherwise changes the kernels' sum a little, either way)."""
    n = plan.task.num_devices
    width = float(plan_dim_sums(plan, model).sum()) / n
    apart = apart_arrays(plan, model.prices_rows)  # each sharding type's all-to-all apart, as ``step`` prices them
    apart = np.repeat(apart.mean(-1, keepdims=True), n, -1)[None]
    even = DeviceArrays(
        np.full((1, n), width, np.float32), np.ones((1, n), bool), None, fitted_ms(model, [plan]), apart
    )
    costs = combine_costs(model.fns, model.params, np.full((1, n), sum(compute) / n, np.float32), even)
    return float(np.asarray(plan_cost_ms(costs))[0])
