"""The scoring API: pure, jitted functions over padded arrays, for searchers and for other JAX code;
and host-side scoring of ``Plan`` objects (``score_plan``, ``score_plans``, ``with_costs``).

Every function takes ``fns`` (a ``CostFns``, static: pass ``model.fns``) and ``params`` (a pytree:
``model.params``), then arrays; any leading batch dimensions broadcast, so a whole batch of
candidate plans is scored in one call. Padded tables/devices are masked out. Same padded shapes never
recompile. Everything is differentiable with respect to the float inputs.

    import neuroshard_jax as nsj
    from neuroshard_jax.costs import scoring
    model = nsj.load_cost_model("neural")                     # or "analytic", or a checkpoint directory
    z = scoring.table_latents(model.fns, model.params, feats)  # f32[B, N, T, F] -> f32[B, N, T, D]
    costs = scoring.costs_from_latents(model.fns, model.params, (z * mask[..., None]).sum(-2),
                                       mask.any(-1), dim_sums, device_mask)   # DeviceCosts of f32[B, N]
    cost_ms = scoring.plan_costs(model.fns, model.params, feats, mask, dim_sums, device_mask)  # f32[B]
    shard_ms = scoring.shard_costs(model.fns, model.params, shard_feats, shard_mask)  # f32[S, T, F] -> f32[S]

The jitted functions price the all-to-all of the widths they are given. A neural model with a row comm fit
(``model.row_comm``, ``row_comm.py``) prices the collectives of row-split tables apart: the host-side functions
below (``score_plan``, ``score_plans``) add them (``fitted_ms``) and leave row blocks out of the all-to-all width
(``plan_arrays(..., rows_apart=True)``); from your own JAX code pass those as ``rows_ms`` to ``plan_costs`` or
``costs_from_latents``. TorchRec runs one all-to-all per sharding type: the host-side functions price the
column-wise tables' all-to-all apart from the table-wise one (``apart_arrays``); from your own JAX code pass it as
``apart`` (without it, every width is priced as one all-to-all). A model with an input distribution fit
(``model.input_dist``, ``input_dist.py``) also prices the ids' all-to-alls before the lookups, one per sharding type:
the host-side functions add them to the forward (``fitted_ms``); from your own JAX code add
``cost_model.input_dist_ms(input_terms(...), taken, device_mask)`` to ``rows_ms``' forward.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from neuroshard_jax.core.assignment import (
    INPUT_TYPES,
    column_wise_dims,
    crosses_hosts,
    input_features,
    replica_width,
    row_groups,
    whole_row_dims,
)
from neuroshard_jax.core.features import NUM_FEATURES
from neuroshard_jax.core.sharding import replica_features, shard_features
from neuroshard_jax.core.types import Plan, PlanCosts, Task
from neuroshard_jax.costs.cost_model import (
    CostFns,
    CostModel,
    DeviceCosts,
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


@functools.partial(jax.jit, static_argnums=0)
def costs_from_latents(
    fns: CostFns,
    params,
    latent_sums: jax.Array,
    has_tables: jax.Array,
    dim_sums: jax.Array,
    device_mask: jax.Array,
    speed: jax.Array | None = None,
    rows_ms: tuple[jax.Array, jax.Array] | None = None,
    apart: jax.Array | None = None,
) -> DeviceCosts:
    """Per-device costs from summed latents f32[..., N, D], has_tables bool[..., N], dim_sums f32[..., N]
    (``speed`` f32[..., N]: heterogeneous devices' relative compute speeds, optional; ``rows_ms``: the row groups'
    collectives (fwd, bwd) f32[..., N], optional, ``fitted_ms``; ``apart`` f32[..., G, N]: the parts of the widths
    that are all-to-alls of their own, optional, ``apart_arrays``)."""
    compute = jnp.where(has_tables, fns.head(params, latent_sums), 0.0)
    return combine_costs(fns, params, compute, dim_sums, device_mask, speed, rows_ms, apart)


@functools.partial(jax.jit, static_argnums=0)
def plan_costs(
    fns: CostFns,
    params,
    feats: jax.Array,
    table_mask: jax.Array,
    dim_sums: jax.Array,
    device_mask: jax.Array,
    speed: jax.Array | None = None,
    rows_ms: tuple[jax.Array, jax.Array] | None = None,
    apart: jax.Array | None = None,
) -> jax.Array:
    """Plan costs f32[...] of padded plans: feats f32[..., N, T, F], table_mask bool[..., N, T],
    dim_sums f32[..., N], device_mask bool[..., N], speed f32[..., N] (optional: heterogeneous devices' relative
    compute speeds), rows_ms (optional: the row groups' collectives (fwd, bwd) f32[..., N], ``fitted_ms``), apart
    (optional f32[..., G, N]: all-to-alls of their own, ``apart_arrays``) (chunked over plans)."""
    speed = jnp.broadcast_to(jnp.ones_like(dim_sums) if speed is None else speed, dim_sums.shape)
    rows_fwd, rows_bwd = (jnp.broadcast_to(jnp.asarray(r, dim_sums.dtype), dim_sums.shape) for r in rows_ms or (0, 0))
    arrays = (feats, table_mask, dim_sums, device_mask, speed, rows_fwd, rows_bwd)
    item_ndims = (3, 2, 1, 1, 1, 1, 1)
    if apart is not None:  # without it, one all-to-all of every width: no comm nets run on parts that move nothing
        arrays += (jnp.broadcast_to(apart, dim_sums.shape[:-1] + apart.shape[-2:]),)
        item_ndims += (2,)

    def one_chunk(f, m, d, dm, sp, rf, rb, g=None):
        return plan_cost_ms(device_costs(fns, params, f, m, d, dm, sp, (rf, rb), g))

    return map_chunks(one_chunk, arrays, item_ndims, max(1, CHUNK // 8))


# ---------------------------------------------------------------------------------------------
# Host side: Plan objects to padded arrays, scored in one call


def plan_arrays(plan: Plan, max_tables: int | None = None, rows_apart: bool = False):
    """Padded arrays of one plan: feats f32[N, T, F], table_mask bool[N, T], dim_sums f32[N], device_mask bool[N].
    ``rows_apart``: row blocks left out of the all-to-all width (a model with ``row_comm`` prices them apart)."""
    task = plan.task
    n = task.num_devices
    per_device = [plan.device_shards(d) for d in range(n)]
    width = max_tables or device_width(plan)
    feats = np.zeros((n, width, NUM_FEATURES), dtype=np.float32)
    mask = np.zeros((n, width), dtype=bool)
    task_feats = task.features()
    replicas = [replica_features(task_feats[t], n) for t in plan.data_parallel]
    for d, shards in enumerate(per_device):
        for j, s in enumerate(shards):
            table = task.tables[s.table]
            block = None if s.whole_rows(table.rows) else s.rows(table.rows)
            stats = table.block_stats(s.row_offset, block) if block else None
            feats[d, j] = shard_features(task_feats[s.table], s.dim, block, stats)
            mask[d, j] = block != 0  # an empty row block does no work
        for j, replica in enumerate(replicas, start=len(shards)):  # every device's part of each data-parallel table
            feats[d, j] = replica
            mask[d, j] = True
    return feats, mask, _all_to_all_dims(plan, rows_apart), np.ones(n, dtype=bool)


def device_width(plan: Plan) -> int:
    """The padded table axis of ``plan_arrays``: the most tables one device holds (data-parallel ones included)."""
    return bucket(max(len(plan.device_shards(d)) for d in range(plan.task.num_devices)) + len(plan.data_parallel))


def _all_to_all_dims(plan: Plan, rows_apart: bool) -> np.ndarray:
    if rows_apart:
        return np.asarray(whole_row_dims(plan), dtype=np.float32)
    # without a row-comm fit, row blocks and the data-parallel all-reduce are priced as all-to-all width
    return (plan.dim_sums() + _replicated(plan)).astype(np.float32)


def _replicated(plan: Plan) -> int:
    return replica_width(plan) if plan.data_parallel and plan.task.num_devices > 1 else 0


APART = 3  # all-to-alls apart from the table-wise one: the column-wise tables', and as width the replicas', rows'


def apart_arrays(plan: Plan, rows_apart: bool = False) -> np.ndarray:
    """f32[APART, N]: the parts of ``plan_arrays``' all-to-all widths that are collectives of their own (TorchRec runs
    one per sharding type), priced as all-to-alls (``combine_costs``' ``apart``): the column-wise tables' widths
    (``column_wise_dims``) and, for a model without a row-comm fit (with one, they are row groups: ``fitted_ms``),
    the data-parallel tables' all-reduce and the row-split tables' widths."""
    out = np.zeros((APART, plan.task.num_devices), np.float32)
    out[0] = column_wise_dims(plan)
    if not rows_apart:
        out[1] = _replicated(plan)
        out[2] = plan.dim_sums() - np.asarray(whole_row_dims(plan))  # row blocks' widths
    return out


def plan_dim_sums(plan: Plan, model: CostModel) -> np.ndarray:
    """f32[N]: each device's all-to-all width as ``model`` prices it (row blocks apart where it has ``row_comm``)."""
    return _all_to_all_dims(plan, model.prices_rows)


@functools.partial(jax.jit, static_argnums=0)
def _device_costs_jit(fns, params, feats, table_mask, dim_sums, device_mask, speed, rows_ms, apart):
    return device_costs(fns, params, feats, table_mask, dim_sums, device_mask, speed, rows_ms, apart)


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
    n = plans[0].task.num_devices
    return np.asarray(input_dist_ms(input_terms(fit, plans[0].task), taken, np.ones(n, bool)))


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
    arrays = plan_arrays(plan, rows_apart=model.prices_rows)
    rows = tuple(r[0] for r in fitted_ms(model, [plan]))
    speed = plan.task.speeds().astype(np.float32)
    apart = apart_arrays(plan, model.prices_rows)
    costs = _device_costs_jit(model.fns, model.params, *arrays, speed, rows, apart)
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
    width = max(device_width(p) for p in plans)
    arrays = [plan_arrays(p, width, model.prices_rows) for p in plans]
    stacked = [np.stack(a) for a in zip(*arrays)] + list(fitted_ms(model, plans))
    stacked.append(np.stack([apart_arrays(p, model.prices_rows) for p in plans]))
    pad = bucket(len(plans), 8) - len(plans)
    stacked = [np.concatenate([a, np.repeat(a[:1], pad, axis=0)]) for a in stacked]
    speed = np.broadcast_to(plans[0].task.speeds().astype(np.float32), stacked[2].shape)
    costs = _device_costs_jit(model.fns, model.params, *stacked[:4], speed, tuple(stacked[4:6]), stacked[6])
    costs = DeviceCosts(*(np.asarray(c, dtype=np.float64)[: len(plans)] for c in costs))
    if not uncertainty or model.fns.uncertainty is None:
        return costs, None
    spread, _ = _uncertainty_jit(model.fns, model.params, stacked[0], stacked[1])
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
    feats, mask, _, _ = plan_arrays(plan)
    spread, trust = _uncertainty_jit(model.fns, model.params, feats, mask)
    return np.asarray(spread, np.float64), np.asarray(trust, np.float64)


def with_costs(model: CostModel, plan: Plan) -> Plan:
    """``plan`` with its predicted per-device costs (``Plan.costs``) by ``model``, and where the model is an
    ensemble, how sure it is of each device."""
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
