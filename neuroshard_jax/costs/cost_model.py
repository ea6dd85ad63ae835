"""Cost models: the interface every model implements and the plan-cost formula (defined once, here).

A cost model is four pure functions over a params pytree (``CostFns``):

* ``embed(params, feats f32[..., F]) -> f32[..., D]``: a latent per table (shard) from its raw
  features (FEATURE_NAMES order, ``dim`` the shard's width);
* ``head(params, latent_sum f32[..., D]) -> f32[...]``: fused-kernel fwd+bwd compute ms of a device
  from the *sum* of its tables' latents. Sum pooling makes the model order-free and lets a search
  add a table to a device by adding its latent and rerunning only the head;
* ``bwd_comm(params, dim_sums f32[..., N], device_mask bool[..., N]) -> f32[..., N]`` ms;
* ``fwd_comm(params, dim_sums, delays_ms f32[..., N], device_mask) -> f32[..., N]`` ms, including
  the wait for the slowest peer given each device's straggler delay.

``device_costs`` combines them with NeuroShard's simulator formula, once for every model, searcher
and report: a device's fwd delay is (compute + bwd comm) minus the minimum over devices, and
the plan cost is the max over devices of compute + fwd comm + bwd comm (``plan_cost_ms``).

The models themselves: ``analytic.py`` (a roofline) and ``neural.py`` (Flax nets); ``models.py`` builds
either by name; ``scoring.py`` is the jitted API over padded plans.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from neuroshard_jax.core.features import FEATURE_INDEX, IDENTITY, NUM_FEATURES, table_keys  # noqa: F401 (theirs)
from neuroshard_jax.core.records import CalibrationRecord
from neuroshard_jax.core.task import Task
from neuroshard_jax.core.tiers import PRIOR, TierPrice, miss_terms, tier_key
from neuroshard_jax.costs.input_dist import InputDist
from neuroshard_jax.costs.row_comm import RowComm


class CostFns(NamedTuple):
    embed: Callable
    head: Callable
    bwd_comm: Callable
    fwd_comm: Callable
    # Optional fast path: embed_sum(params, feats f32[..., T, F], mask bool[..., T]) -> f32[..., D], equal to
    # the masked sum of embed (a model whose last embedding layer is linear sums before it: fewer FLOPs).
    embed_sum: Callable | None = None
    # Optional: uncertainty(params, latent_sum f32[..., D]) -> (relative spread f32[...], trust f32[...]): how much
    # an ensemble's members disagree on a device's compute, and the weight (0..1) its prediction kept against
    # its fallback. Models without one are taken as certain.
    uncertainty: Callable | None = None


@dataclasses.dataclass(frozen=True)
class CostModel:
    """A named cost model: static functions plus their parameters (a pytree), and what a plan's model is made of
    beside them: its collectives' fits and this machine's scales. It owns its variants: ``expected`` (no risk
    term, built once per model), ``with_scales``, ``with_compute_scale``, ``with_comm_factor``; every caller asks
    the model for them instead of re-deriving them (``costs/scoring.py`` encodes and scores plans with it)."""

    name: str
    fns: CostFns
    params: Any
    row_comm: RowComm | None = None  # row-split groups' collectives priced apart (None: as all-to-all width)
    input_dist: InputDist | None = None  # TorchRec's input distributions (ids' all-to-alls), priced (None: unpriced)
    calibration: float = 1.0  # every device's compute is scaled by this (``with_scales``), as given: plan.json's
    # the miss price of tables in tiered memory (``with_tiers``: a GPU's; None: none priced) and which tables of
    # which task it prices (``core.tiers.tier_key``)
    tier_price: TierPrice | None = None
    tier_key: tuple = ()

    @property
    def prices_rows(self) -> bool:
        """Whether row blocks leave the all-to-all width, their groups' collectives priced by ``row_comm``."""
        return self.row_comm is not None

    @property
    def own_params(self):
        """The model's own params, under its ``Scaled``, ``TableScaled`` and ``PrecisionScaled`` wrappers or not."""
        params = self.params
        while isinstance(params, WRAPPERS):
            params = params.inner
        return params

    @functools.cached_property
    def expected(self) -> CostModel:
        """This model without its risk term (an ensemble's spread): the costs a plan reports are expectations, not
        the search's score. Built once per model and kept with it; the model itself where it has no risk term."""
        if hasattr(self.own_params, "risk"):
            return self.map_params(lambda params: params._replace(risk=0.0))
        return self

    def map_params(self, change: Callable) -> CostModel:
        """This model with ``change`` applied to its own params (under its wrappers, ``WRAPPERS``)."""

        def changed(params):
            if isinstance(params, WRAPPERS):
                return params._replace(inner=changed(params.inner))
            return change(params)

        return dataclasses.replace(self, params=changed(self.params))

    def with_table_scales(self, keys: np.ndarray, log_scale: np.ndarray) -> CostModel:
        """This model with each of a task's tables ``exp(log_scale[t])`` times as heavy: the latent of every shard
        whose features are table t's (``keys`` f32[T, F], ``table_keys``; its width and size aside) multiplied by it,
        so what a device holding the table costs moves with it in every plan (``task_tune``). Under the model's
        ``Scaled`` wrapper, if any: its calibration and links apply as before."""
        scaled = isinstance(self.params, Scaled)
        base = _UNSCALED[self.fns] if scaled else self.fns
        inner = self.params.inner if scaled else self.params
        tabled = TableScaled(inner, jnp.asarray(keys, jnp.float32), jnp.asarray(log_scale, jnp.float32))
        if scaled:
            params = self.params._replace(inner=tabled)
            return dataclasses.replace(self, fns=_scaled(_table_scaled(base)), params=params)
        return dataclasses.replace(self, fns=_table_scaled(base), params=tabled)

    def with_precision_scales(self, log_scale_by_bytes: np.ndarray) -> CostModel:
        """This model with every shard whose weights take ``b`` bytes an element (its ``weight_bytes`` feature: a
        table of another data type than the model was trained at) ``exp(log_scale_by_bytes[b])`` times as heavy
        (f32[MAX_ELEMENT_BYTES + 1]; index 0, not given, and the trained bytes at 0). Innermost: a model built for a
        task gets it before any calibration or table scale (``choice.neural_model``)."""
        if isinstance(self.params, (Scaled, TableScaled)):
            raise ValueError("with_precision_scales: expected a model as built, before its scales")
        params = PrecisionScaled(self.params, jnp.asarray(log_scale_by_bytes, jnp.float32))
        return dataclasses.replace(self, fns=_precision_scaled(self.fns), params=params)

    def with_scales(self, comm_scale: np.ndarray, compute_scale: float = 1.0) -> CostModel:
        """This model with each device's transfer time (bwd comm, and fwd comm less the straggler wait) multiplied
        by ``comm_scale`` f64[N] (``Task.comm_scale``: devices in several hosts) and every device's compute by
        ``compute_scale`` (this machine's measured / predicted compute, ``calibrate.py``); the model itself where
        every scale is 1. The scales are parameters, not constants: one compilation serves every task."""
        if np.allclose(comm_scale, 1.0) and compute_scale == 1.0:
            return self
        params = Scaled(self.params, jnp.asarray(comm_scale, jnp.float32), jnp.asarray(compute_scale, jnp.float32))
        return dataclasses.replace(self, fns=_scaled(self.fns), params=params, calibration=float(compute_scale))

    def with_compute_scale(self, factor: float, comm_scale: np.ndarray) -> CostModel:
        """This model with every device's compute scaled by ``factor`` in place of its own scale (1: as trained);
        ``comm_scale``: the task's (``Task.comm_scale``), kept where the model is scaled already."""
        if isinstance(self.params, Scaled):
            scale = jnp.asarray(factor, jnp.float32)
            return dataclasses.replace(
                self, params=self.params._replace(compute_scale=scale), calibration=float(factor)
            )
        return self.with_scales(comm_scale, factor)

    def calibrated(self, record: CalibrationRecord, task: Task) -> CostModel:
        """This model as a plan's calibration record scales it: its compute by the record's factor, its collectives
        by first contact's comm factor at the task's devices (a record without one: as trained), the task's links
        kept. What ``first_contact`` plans with and ``explain`` prices a plan with."""
        scaled = self.with_compute_scale(record.factor, task.comm_scale())
        if record.comm is None:
            return scaled
        return scaled.with_comm_factor(record.comm.factor_at(task.num_devices), task.comm_scale())

    def with_tiers(self, task: Task, price: TierPrice) -> CostModel:
        """This model pricing ``task``'s tables in tiered memory (``core.tiers``) at ``price``: every shard of a
        cached table adds its cache's misses to its device's compute (``core.tiers.miss_terms``: ms a column and ms a
        shard, per table and per row-block shape), carried as one more latent channel that the searches sum with the
        others and the head adds (a ``Tiered`` node, under the model's ``Scaled`` if any); a model that priced
        another task's tiering has its terms replaced. No node where no table is cached (nothing recompiles)."""
        key = tier_key(task)
        if key == self.tier_key and price == self.tier_price:
            return self
        keys, per_dim, fixed = miss_terms(task, price)
        if not len(keys) and not self._has_tiers:
            return dataclasses.replace(self, tier_price=price, tier_key=key)
        if not len(keys):  # a node kept, matching nothing
            keys, per_dim, fixed = np.zeros((1, NUM_FEATURES), np.float32), np.zeros(1), np.zeros(1)
        node = (jnp.asarray(keys, jnp.float32), jnp.asarray(per_dim, jnp.float32), jnp.asarray(fixed, jnp.float32))

        def swapped(params):
            if isinstance(params, Tiered):
                return params._replace(keys=node[0], per_dim=node[1], fixed=node[2])
            if isinstance(params, WRAPPERS):
                inner = swapped(params.inner)
                return None if inner is None else params._replace(inner=inner)
            return None

        params = swapped(self.params)
        if params is not None:
            model = dataclasses.replace(self, params=params)
        elif isinstance(self.params, Scaled):
            inner = Tiered(self.params.inner, *node)
            fns = _scaled(_tiered(_UNSCALED[self.fns]))
            model = dataclasses.replace(self, fns=fns, params=self.params._replace(inner=inner))
        else:
            model = dataclasses.replace(self, fns=_tiered(self.fns), params=Tiered(self.params, *node))
        return dataclasses.replace(model, tier_price=price, tier_key=key)

    def for_task(self, task: Task) -> CostModel:
        """This model as it prices a plan of ``task``: itself where it prices the task's tiering already (or neither
        has any), else with the task's own (``with_tiers``; TorchRec's plans choose their own cached tables), at the
        model's miss price or ``PRIOR``."""
        if tier_key(task) == self.tier_key:
            return self
        return self.with_tiers(task, self.tier_price or PRIOR)

    @property
    def _has_tiers(self) -> bool:
        params = self.params
        while isinstance(params, WRAPPERS):
            if isinstance(params, Tiered):
                return True
            params = params.inner
        return False

    def with_comm_factor(self, factor: float, comm_scale: np.ndarray) -> CostModel:
        """This model with every collective it prices (the all-to-alls' transfers, the row groups' collectives, the
        input distributions) ``factor`` times as long: first contact's reading of this machine's collectives.
        ``comm_scale``: the task's (``Task.comm_scale``), multiplied by the factor; the compute scale kept."""
        if factor == 1.0:
            return self
        row_comm = self.row_comm.scaled(factor) if self.row_comm is not None else None
        input_dist = self.input_dist.scaled(factor) if self.input_dist is not None else None
        scale = np.asarray(comm_scale, np.float64) * factor
        if isinstance(self.params, Scaled):  # scaled already (its compute): its comm scale replaced
            scaled = dataclasses.replace(self, params=self.params._replace(comm_scale=jnp.asarray(scale, jnp.float32)))
        else:
            scaled = self.with_scales(scale, self.calibration)
        return dataclasses.replace(scaled, row_comm=row_comm, input_dist=input_dist)


class DeviceCosts(NamedTuple):
    """Per-device costs in ms, each f32[..., N]; padded devices are 0."""

    compute_ms: jax.Array
    fwd_comm_ms: jax.Array
    bwd_comm_ms: jax.Array
    total_ms: jax.Array


class DeviceArrays(NamedTuple):
    """What the simulator formula reads of each device beside its compute, for one plan or a batch of plans (any
    leading dims broadcast); a pytree. ``dim_sums`` f32[..., N]: each device's all-to-all width; ``device_mask``
    bool[..., N]; ``speed`` f32[..., N] (None: all 1): heterogeneous devices' relative compute speeds, which divide
    their compute (comm is not scaled); ``rows_ms`` (fwd, bwd) f32[..., N] (None: none): collectives priced by fits
    (row-split groups', ``row_comm.py``; TorchRec's input distributions, forward, ``input_dist.py``), added to the
    all-to-all's before the forward's straggler delays are worked out; ``apart`` f32[..., G, N] (None: one
    all-to-all of every width): parts of ``dim_sums`` that are all-to-alls of their own (TorchRec runs one per
    sharding type: the column-wise tables' apart from the table-wise ones)."""

    dim_sums: Any
    device_mask: Any
    speed: Any = None
    rows_ms: tuple[Any, Any] | None = None
    apart: Any = None


class PlanArrays(NamedTuple):
    """A plan, or a batch of plans, as the padded arrays every scoring function takes (``scoring.plan_arrays`` builds
    them once per plan); a pytree. ``feats`` f32[..., N, T, F]: each device's shards' features (FEATURE_NAMES order,
    padding 0); ``table_mask`` bool[..., N, T]; ``devices``: the rest of what the formula reads (``DeviceArrays``)."""

    feats: Any
    table_mask: Any
    devices: DeviceArrays


def combine_costs(fns: CostFns, params, compute_ms, devices: DeviceArrays) -> DeviceCosts:
    """The simulator formula: compute f32[..., N] and the devices' arrays -> DeviceCosts. Each all-to-all that moves
    anything (``devices.apart``) is priced by the comm nets and they add up, the first of them taking the wait for
    the slowest peer."""
    dim_sums, device_mask, speed, rows_ms, apart = devices
    if speed is not None:
        compute_ms = compute_ms / speed
    compute_ms = jnp.where(device_mask, compute_ms, 0.0)
    rows_fwd, rows_bwd = (0.0, 0.0) if rows_ms is None else rows_ms
    leading = [compute_ms.shape[:-1], dim_sums.shape[:-1], device_mask.shape[:-1]]
    batch = jnp.broadcast_shapes(*leading, *([] if apart is None else [apart.shape[:-2]]))
    dim_sums = jnp.broadcast_to(dim_sums, batch + dim_sums.shape[-1:])
    device_mask = jnp.broadcast_to(device_mask, batch + device_mask.shape[-1:])
    exchanging = device_mask & (device_mask.sum(-1, keepdims=True) > 1)  # one device alone sends nothing
    if apart is None:
        parts, moves = dim_sums[..., None, :], jnp.ones(dim_sums.shape[:-1] + (1,), bool)
    else:
        apart = jnp.broadcast_to(apart, batch + apart.shape[-2:])
        parts = jnp.concatenate([(dim_sums - apart.sum(-2))[..., None, :], apart], axis=-2)  # [..., 1 + G, N]
        moves = jnp.where(device_mask[..., None, :], parts, 0.0).sum(-1) > 0  # [..., 1 + G]
        # a plan with nothing apart prices its one all-to-all as before, even with no width at all
        moves = moves.at[..., 0].set(moves[..., 0] | ~moves[..., 1:].any(-1))
    mask = jnp.broadcast_to(device_mask[..., None, :], parts.shape)
    bwd_parts = jnp.where(moves[..., None], fns.bwd_comm(params, parts, mask), 0.0)
    bwd = jnp.where(exchanging, bwd_parts.sum(-2) + rows_bwd, 0.0)
    ready = compute_ms + bwd
    earliest = jnp.min(jnp.where(device_mask, ready, jnp.inf), axis=-1, keepdims=True)
    delays = jnp.where(device_mask, ready - earliest, 0.0)
    first = jnp.cumsum(moves, axis=-1) == 1  # the first all-to-all that moves anything waits for the slowest peer
    part_delays = jnp.where((first & moves)[..., None], delays[..., None, :], 0.0)
    fwd_parts = jnp.where(moves[..., None], fns.fwd_comm(params, parts, part_delays, mask), 0.0)
    fwd = jnp.where(exchanging, fwd_parts.sum(-2) + rows_fwd, 0.0)
    return DeviceCosts(compute_ms, fwd, bwd, compute_ms + fwd + bwd)


def input_dist_ms(terms, taken, device_mask):
    """ms f32[..., N] each device spends in TorchRec's input distributions (``input_dist.py``): ``taken`` f32[..., G, N]
    the ids per sample each device takes in each of G distributions, ``terms`` f32[3, N] each device's (ms per
    distribution, per received id per sample, per sent id per sample: a device sends its batch slice of every
    feature, the distribution's ids per sample over N); a distribution that moves nothing costs nothing."""
    taken = jnp.where(device_mask[..., None, :], taken, 0.0)
    total = taken.sum(-1, keepdims=True)
    n = jnp.maximum(device_mask.sum(-1), 1)[..., None, None]
    per = terms[0] + terms[1] * taken + terms[2] * total / n
    return jnp.where(device_mask, jnp.where(total > 0, per, 0.0).sum(-2), 0.0)


def device_compute_ms(fns: CostFns, params, feats, table_mask):
    """Compute ms f32[..., N] of devices holding feats f32[..., N, T, F] (table_mask bool[..., N, T])."""
    if fns.embed_sum is not None:
        latent_sums = fns.embed_sum(params, feats, table_mask)
    else:
        latent_sums = jnp.where(table_mask[..., None], fns.embed(params, feats), 0.0).sum(-2)
    return jnp.where(table_mask.any(-1), fns.head(params, latent_sums), 0.0)


def device_costs(fns: CostFns, params, arrays: PlanArrays) -> DeviceCosts:
    """Per-device costs of padded plans (``PlanArrays``); any leading batch dims broadcast."""
    compute = device_compute_ms(fns, params, arrays.feats, arrays.table_mask)
    return combine_costs(fns, params, compute, arrays.devices)


def plan_cost_ms(costs: DeviceCosts) -> jax.Array:
    """Plan cost f32[...]: the slowest device gates the step."""
    return costs.total_ms.max(-1)


def straggler_wait(delays_ms, device_mask):
    """ms f32[..., N] a device waits in the forward all-to-all for the slowest peer: max delay - own delay."""
    latest = jnp.where(device_mask, delays_ms, -jnp.inf).max(-1, keepdims=True)
    return jnp.where(device_mask, latest - delays_ms, 0.0)


class Scaled(NamedTuple):
    """Params of a model whose all-to-all times are scaled per device and whose compute is scaled by one factor
    (``with_scales``)."""

    inner: Any
    comm_scale: jax.Array  # f32[N]: device d's comm time is comm_scale[d] x the model's one-host time
    compute_scale: jax.Array  # f32[]: every device's compute is compute_scale x the model's (a measured calibration)


class TableScaled(NamedTuple):
    """Params of a model with a scale per table of one task (``with_table_scales``)."""

    inner: Any
    keys: jax.Array  # f32[T, F]: each table's features (width and size zeroed: ``table_keys``)
    log_scale: jax.Array  # f32[T]: the log of each table's scale


class Tiered(NamedTuple):
    """Params of a model pricing a task's tables in tiered memory (``CostModel.with_tiers``): a shard whose features
    are key k's (a cached table, or one block shape of it) adds ``per_dim[k]`` x its width + ``fixed[k]`` ms."""

    inner: Any
    keys: jax.Array  # f32[K, F]: the cached tables' (and their blocks') features (``table_keys``)
    per_dim: jax.Array  # f32[K]: ms a column of a shard's misses (its rows fetched and written back)
    fixed: jax.Array  # f32[K]: ms a shard's misses cost whatever its width (per-row state, the time per missed row)


class PrecisionScaled(NamedTuple):
    """Params of a model with a scale per element size of a shard's weights (``with_precision_scales``)."""

    inner: Any
    log_scale: jax.Array  # f32[MAX_ELEMENT_BYTES + 1]: the log of the scale of a shard of b-byte weights


WRAPPERS = (Scaled, TableScaled, Tiered, PrecisionScaled)  # what a model's own params may sit under
MAX_ELEMENT_BYTES = 4


@functools.cache
def _precision_scaled(fns: CostFns) -> CostFns:
    """``fns`` over ``PrecisionScaled`` params: a shard's latent scaled by the scale of its weights' element size;
    no summed fast path (the scale is per shard)."""

    def embed(p: PrecisionScaled, feats):
        size = jnp.clip(feats[..., FEATURE_INDEX["weight_bytes"]], 0, MAX_ELEMENT_BYTES).astype(jnp.int32)
        return fns.embed(p.inner, feats) * jnp.exp(p.log_scale[size])[..., None]

    def inner(fn):
        return None if fn is None else lambda p, *args: fn(p.inner, *args)

    return CostFns(embed, inner(fns.head), inner(fns.bwd_comm), inner(fns.fwd_comm), None, inner(fns.uncertainty))


def table_matches(feats, keys) -> jax.Array:
    """f32[..., T]: 1 where a shard's features f32[..., F] are table t's (``table_keys``), else 0."""
    own = jnp.where(IDENTITY, feats, 0.0)[..., None, :]
    same = jnp.abs(own - keys) <= 1e-6 * (1.0 + jnp.abs(keys))
    return jnp.all(same, axis=-1).astype(jnp.float32)


@functools.cache
def _tiered(fns: CostFns) -> CostFns:
    """``fns`` over ``Tiered`` params: a shard's latent gains a last channel, its cache's misses in ms (0 for a
    shard of no cached table), which the searches sum with the rest and the head adds to the device's compute; no
    summed fast path."""

    def embed(p: Tiered, feats):
        matches = table_matches(feats, p.keys)
        miss = matches @ p.per_dim * feats[..., FEATURE_INDEX["dim"]] + matches @ p.fixed
        return jnp.concatenate([fns.embed(p.inner, feats), miss[..., None]], -1)

    def head(p: Tiered, latent_sums):
        return fns.head(p.inner, latent_sums[..., :-1]) + latent_sums[..., -1]

    uncertainty = None
    if fns.uncertainty is not None:

        def uncertainty(p: Tiered, latent_sums):
            return fns.uncertainty(p.inner, latent_sums[..., :-1])

    def inner(fn):
        return None if fn is None else lambda p, *args: fn(p.inner, *args)

    return CostFns(embed, head, inner(fns.bwd_comm), inner(fns.fwd_comm), None, uncertainty)


@functools.cache
def _table_scaled(fns: CostFns) -> CostFns:
    """``fns`` over ``TableScaled`` params: a shard's latent scaled by its table's scale (1 for a shard of no table
    of the task); no summed fast path (the scale is per table)."""

    def embed(p: TableScaled, feats):
        return fns.embed(p.inner, feats) * jnp.exp(table_matches(feats, p.keys) @ p.log_scale)[..., None]

    def inner(fn):
        return None if fn is None else lambda p, *args: fn(p.inner, *args)

    return CostFns(embed, inner(fns.head), inner(fns.bwd_comm), inner(fns.fwd_comm), None, inner(fns.uncertainty))


_UNSCALED: dict[CostFns, CostFns] = {}  # ``_scaled``'s functions -> the functions they scale


@functools.cache
def _scaled(fns: CostFns) -> CostFns:
    """``fns`` over ``Scaled`` params (cached: the same functions, so jitted callers compile once)."""

    def scale(p: Scaled, like):
        n, have = like.shape[-1], p.comm_scale.shape[0]  # padded device axes: scale 1 on the padding
        return p.comm_scale[:n] if have >= n else jnp.pad(p.comm_scale, (0, n - have), constant_values=1.0)

    def head(p: Scaled, latent_sums):
        return fns.head(p.inner, latent_sums) * p.compute_scale

    def bwd_comm(p: Scaled, dim_sums, device_mask):
        return fns.bwd_comm(p.inner, dim_sums, device_mask) * scale(p, dim_sums)

    def fwd_comm(p: Scaled, dim_sums, delays_ms, device_mask):
        wait = straggler_wait(delays_ms, device_mask)  # waiting for a late peer takes no bandwidth
        return wait + (fns.fwd_comm(p.inner, dim_sums, delays_ms, device_mask) - wait) * scale(p, dim_sums)

    def inner(fn):
        return None if fn is None else lambda p, *args: fn(p.inner, *args)

    out = CostFns(inner(fns.embed), head, bwd_comm, fwd_comm, inner(fns.embed_sum), inner(fns.uncertainty))
    _UNSCALED[out] = fns
    return out


def bucket(n: int, minimum: int = 4) -> int:
    """Smallest power of two >= max(n, minimum): fixed shapes, few compilations."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


FINE_ABOVE = 1024  # past this, ``fine_bucket`` steps by eighths of an octave


def fine_bucket(n: int, minimum: int = 4) -> int:
    """``bucket`` up to ``FINE_ABOVE``; past it the next multiple of an eighth of the power of two below n (5,000 ->
    5,120, not 8,192): a sequential scan over thousands of padded slots costs as much as over real ones, and the
    few more shapes compile once each."""
    if n <= FINE_ABOVE:
        return bucket(n, minimum)
    step = (1 << (int(n) - 1).bit_length()) // 16
    return -(-int(n) // step) * step
