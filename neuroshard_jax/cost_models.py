"""Cost models: the interface every model implements, the plan-cost formula, and the analytic model.

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
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from neuroshard_jax import constants as C
from neuroshard_jax.errors import UserError
from neuroshard_jax.features import FEATURE_INDEX, NUM_FEATURES
from neuroshard_jax.types import Plan, Task


class CostFns(NamedTuple):
    embed: Callable
    head: Callable
    bwd_comm: Callable
    fwd_comm: Callable
    # Optional fast path: embed_sum(params, feats f32[..., T, F], mask bool[..., T]) -> f32[..., D], equal to
    # the masked sum of embed (a model whose last embedding layer is linear sums before it: fewer FLOPs).
    embed_sum: Callable | None = None


@dataclasses.dataclass(frozen=True)
class CostModel:
    """A named cost model: static functions plus their parameters (a pytree)."""

    name: str
    fns: CostFns
    params: Any


class DeviceCosts(NamedTuple):
    """Per-device costs in ms, each f32[..., N]; padded devices are 0."""

    compute_ms: jax.Array
    fwd_comm_ms: jax.Array
    bwd_comm_ms: jax.Array
    total_ms: jax.Array


def combine_costs(fns: CostFns, params, compute_ms, dim_sums, device_mask) -> DeviceCosts:
    """The simulator formula: compute f32[..., N] and dim sums f32[..., N] -> DeviceCosts."""
    compute_ms = jnp.where(device_mask, compute_ms, 0.0)
    bwd = jnp.where(device_mask, fns.bwd_comm(params, dim_sums, device_mask), 0.0)
    ready = compute_ms + bwd
    earliest = jnp.min(jnp.where(device_mask, ready, jnp.inf), axis=-1, keepdims=True)
    delays = jnp.where(device_mask, ready - earliest, 0.0)
    fwd = jnp.where(device_mask, fns.fwd_comm(params, dim_sums, delays, device_mask), 0.0)
    return DeviceCosts(compute_ms, fwd, bwd, compute_ms + fwd + bwd)


def device_compute_ms(fns: CostFns, params, feats, table_mask):
    """Compute ms f32[..., N] of devices holding feats f32[..., N, T, F] (table_mask bool[..., N, T])."""
    if fns.embed_sum is not None:
        latent_sums = fns.embed_sum(params, feats, table_mask)
    else:
        latent_sums = jnp.where(table_mask[..., None], fns.embed(params, feats), 0.0).sum(-2)
    return jnp.where(table_mask.any(-1), fns.head(params, latent_sums), 0.0)


def device_costs(fns: CostFns, params, feats, table_mask, dim_sums, device_mask) -> DeviceCosts:
    """Per-device costs of padded plans; any leading batch dims broadcast.

    feats f32[..., N, T, F]; table_mask bool[..., N, T]; dim_sums f32[..., N]; device_mask bool[..., N].
    """
    return combine_costs(fns, params, device_compute_ms(fns, params, feats, table_mask), dim_sums, device_mask)


def plan_cost_ms(costs: DeviceCosts) -> jax.Array:
    """Plan cost f32[...]: the slowest device gates the step."""
    return costs.total_ms.max(-1)


# ---------------------------------------------------------------------------------------------
# Host-side helpers: plans to padded arrays, and scoring plans


def bucket(n: int, minimum: int = 4) -> int:
    """Smallest power of two >= max(n, minimum): fixed shapes, few compilations."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


def shard_features(task_feats: np.ndarray, table: int, dim: int) -> np.ndarray:
    """Features f64[F] of a column shard of width ``dim`` of a task table (task_feats f64[T, F])."""
    row = task_feats[table].copy()
    row[FEATURE_INDEX["dim"]] = dim
    row[FEATURE_INDEX["size"]] = row[FEATURE_INDEX["rows"]] * dim
    return row


def plan_arrays(plan: Plan, max_tables: int | None = None):
    """Padded arrays of one plan: feats f32[N, T, F], table_mask bool[N, T], dim_sums f32[N], device_mask bool[N]."""
    task = plan.task
    n = task.num_devices
    per_device = [plan.device_shards(d) for d in range(n)]
    width = max_tables or bucket(max(len(s) for s in per_device))
    feats = np.zeros((n, width, NUM_FEATURES), dtype=np.float32)
    mask = np.zeros((n, width), dtype=bool)
    task_feats = task.features()
    for d, shards in enumerate(per_device):
        for j, s in enumerate(shards):
            feats[d, j] = shard_features(task_feats, s.table, s.dim)
            mask[d, j] = True
    return feats, mask, plan.dim_sums().astype(np.float32), np.ones(n, dtype=bool)


@functools.partial(jax.jit, static_argnums=0)
def _device_costs_jit(fns, params, feats, table_mask, dim_sums, device_mask):
    return device_costs(fns, params, feats, table_mask, dim_sums, device_mask)


def score_plan(model: CostModel, plan: Plan) -> DeviceCosts:
    """Predicted per-device costs of one plan, as numpy arrays f64[N]."""
    costs = _device_costs_jit(model.fns, model.params, *plan_arrays(plan))
    return DeviceCosts(*(np.asarray(c, dtype=np.float64) for c in costs))


def score_plans(model: CostModel, plans: list[Plan]) -> np.ndarray:
    """Predicted plan costs f64[K] of many plans of one task, in one batched call."""
    width = bucket(max(max(len(p.device_shards(d)) for d in range(p.task.num_devices)) for p in plans))
    arrays = [plan_arrays(p, width) for p in plans]
    stacked = [np.stack(a) for a in zip(*arrays)]
    pad = bucket(len(plans), 8) - len(plans)
    stacked = [np.concatenate([a, np.repeat(a[:1], pad, axis=0)]) for a in stacked]
    costs = _device_costs_jit(model.fns, model.params, *stacked)
    return np.asarray(plan_cost_ms(costs), dtype=np.float64)[: len(plans)]


# ---------------------------------------------------------------------------------------------
# The analytic model: a bandwidth roofline in the spirit of TorchRec's estimator


class AnalyticParams(NamedTuple):
    batch_size: float
    bytes_per_element: float
    mem_bw_gbps: float
    bwd_fwd_ratio: float
    kernel_overhead_ms: float
    table_overhead_ms: float
    comm_bw_gbps: float
    comm_latency_ms: float


def _analytic_embed(p: AnalyticParams, feats):
    """Latent [bytes moved by fwd+bwd, 1 table]: gathers of B*pooling rows plus the pooled output."""
    dim = feats[..., FEATURE_INDEX["dim"]]
    pooling = feats[..., FEATURE_INDEX["pooling_factor"]]
    fwd_bytes = p.batch_size * dim * (pooling * p.bytes_per_element + C.OUTPUT_BYTES_PER_ELEMENT)
    return jnp.stack([fwd_bytes * (1.0 + p.bwd_fwd_ratio), jnp.ones_like(dim)], axis=-1)


def _analytic_head(p: AnalyticParams, latent):
    ms = latent[..., 0] / (p.mem_bw_gbps * 1e9) * 1e3
    return ms + p.table_overhead_ms * latent[..., 1] + p.kernel_overhead_ms * (latent[..., 1] > 0)


def _analytic_bwd_comm(p: AnalyticParams, dim_sums, device_mask):
    """All-to-all of [B, dim_sum] split along the batch: max(bytes sent, bytes received) / bandwidth."""
    n = device_mask.sum(-1, keepdims=True).astype(jnp.float32)
    total = jnp.where(device_mask, dim_sums, 0.0).sum(-1, keepdims=True)
    sent = p.batch_size * dim_sums * (n - 1) / n
    received = p.batch_size / n * (total - dim_sums)
    bytes_ = jnp.maximum(sent, received) * C.OUTPUT_BYTES_PER_ELEMENT
    return bytes_ / (p.comm_bw_gbps * 1e9) * 1e3 + p.comm_latency_ms * (n > 1)


def straggler_wait(delays_ms, device_mask):
    """ms f32[..., N] a device waits in the forward all-to-all for the slowest peer: max delay - own delay."""
    latest = jnp.where(device_mask, delays_ms, -jnp.inf).max(-1, keepdims=True)
    return jnp.where(device_mask, latest - delays_ms, 0.0)


def _analytic_fwd_comm(p: AnalyticParams, dim_sums, delays_ms, device_mask):
    """Same transfer as backward, plus waiting for the slowest peer to arrive."""
    return _analytic_bwd_comm(p, dim_sums, device_mask) + straggler_wait(delays_ms, device_mask)


ANALYTIC_FNS = CostFns(_analytic_embed, _analytic_head, _analytic_bwd_comm, _analytic_fwd_comm)


@dataclasses.dataclass(frozen=True)
class AnalyticConfig:
    mem_bw_gbps: float = C.ANALYTIC_MEM_BW_GBPS
    bwd_fwd_ratio: float = C.ANALYTIC_BWD_FWD_RATIO
    kernel_overhead_ms: float = C.ANALYTIC_KERNEL_OVERHEAD_MS
    table_overhead_ms: float = C.ANALYTIC_TABLE_OVERHEAD_MS
    comm_bw_gbps: float = C.ANALYTIC_COMM_BW_GBPS
    comm_latency_ms: float = C.ANALYTIC_COMM_LATENCY_MS


def analytic_model(task: Task, config: AnalyticConfig = AnalyticConfig()) -> CostModel:
    """The roofline model at the task's batch size and precision."""
    for name in ("mem_bw_gbps", "comm_bw_gbps"):
        if not getattr(config, name) > 0:
            raise UserError(f"cost_model.{name}: got {getattr(config, name)}, expected a number > 0")
    params = AnalyticParams(float(task.batch_size), float(task.bytes_per_element), **dataclasses.asdict(config))
    return CostModel("analytic", ANALYTIC_FNS, params)


@dataclasses.dataclass(frozen=True)
class NeuralConfig:
    checkpoint: str | None = None  # None: the checkpoint shipped in the package


SHIPPED_CHECKPOINT = "data/models/cpu-b4096"


@functools.lru_cache(maxsize=4)
def _load_neural(path: str):
    from neuroshard_jax.checkpoints import load_checkpoint
    from neuroshard_jax.neural import neural_cost_model

    _, nets, params, meta = load_checkpoint(path)
    return neural_cost_model(nets, params), meta


def neural_model(task: Task, config: NeuralConfig = NeuralConfig()) -> CostModel:
    """The trained Flax cost model; its batch size and precision must be the task's."""
    from importlib import resources
    from pathlib import Path

    path = config.checkpoint or str(resources.files("neuroshard_jax") / SHIPPED_CHECKPOINT)
    if not (Path(path) / "meta.json").exists():
        raise UserError(
            f"cost_model.checkpoint: no neural cost model at {path!r}; expected a checkpoint written by "
            "python -m neuroshard_jax.train (or use cost_model=analytic)"
        )
    model, meta = _load_neural(str(Path(path).resolve()))
    for field, trained in (("batch_size", meta["batch_size"]), ("precision", meta.get("precision", "fp32"))):
        if getattr(task, field) != trained:
            raise UserError(
                f"task.{field}: got {getattr(task, field)!r}, but the neural cost model at {path!r} was trained at "
                f"{field} {trained!r}; expected the same (or cost_model=analytic)"
            )
    return model


COST_MODELS = {"analytic": (analytic_model, AnalyticConfig), "neural": (neural_model, NeuralConfig)}


def make_cost_model(name: str, task: Task, options: dict | None = None) -> CostModel:
    """Build a cost model by name with ``options`` (the fields of its config, from conf/cost_model/)."""
    if name not in COST_MODELS:
        raise UserError(f"cost_model: got {name!r}, expected one of {', '.join(sorted(COST_MODELS))}")
    factory, config_cls = COST_MODELS[name]
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(options or {}) - known)
    if unknown:
        raise UserError(
            f"cost_model.{unknown[0]}: unknown option for {name!r}, expected one of {', '.join(sorted(known))}"
        )
    return factory(task, config_cls(**(options or {})))
