"""The analytic cost model: a bandwidth roofline in the spirit of TorchRec's estimator.

Compute: the bytes a fused TBE moves (row gathers of B x pooling rows plus the pooled output, backward a
fixed multiple of forward) over a memory bandwidth, plus a fixed cost per table and per kernel. Comm: an
all-to-all of [B, dim_sum] split along the batch, max(bytes sent, received) over a bandwidth plus a latency.
The defaults are fitted to the shipped CPU dataset (``python -m neuroshard_jax.train family=analytic``;
``constants.py``).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp

from neuroshard_jax.core import constants as C
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import FEATURE_INDEX
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import CostFns, CostModel, straggler_wait


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
    """Latent [bytes moved by fwd+bwd, 1 table]: gathers of B*pooling rows (of the table's own element bytes where
    its features give them, else the params') plus the pooled output."""
    dim = feats[..., FEATURE_INDEX["dim"]]
    pooling = feats[..., FEATURE_INDEX["pooling_factor"]]
    given = feats[..., FEATURE_INDEX["weight_bytes"]]
    element = jnp.where(given > 0, given, p.bytes_per_element)
    fwd_bytes = p.batch_size * dim * (pooling * element + C.OUTPUT_BYTES_PER_ELEMENT)
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


def _analytic_fwd_comm(p: AnalyticParams, dim_sums, delays_ms, device_mask):
    """Same transfer as backward, plus waiting for the slowest peer to arrive."""
    return _analytic_bwd_comm(p, dim_sums, device_mask) + straggler_wait(delays_ms, device_mask)


ANALYTIC_FNS = CostFns(_analytic_embed, _analytic_head, _analytic_bwd_comm, _analytic_fwd_comm)


@dataclasses.dataclass(frozen=True)
class AnalyticConfig:
    mem_bw_gbps: float = C.ANALYTIC_MEM_BW_GBPS  # GB/s of row gathers and updates
    bwd_fwd_ratio: float = C.ANALYTIC_BWD_FWD_RATIO  # backward bytes over forward bytes
    kernel_overhead_ms: float = C.ANALYTIC_KERNEL_OVERHEAD_MS  # per fused TBE call (fwd + bwd)
    table_overhead_ms: float = C.ANALYTIC_TABLE_OVERHEAD_MS  # per table in the fused kernel
    comm_bw_gbps: float = C.ANALYTIC_COMM_BW_GBPS  # all-to-all GB/s per device
    comm_latency_ms: float = C.ANALYTIC_COMM_LATENCY_MS  # per all-to-all


def analytic_params(batch_size: int, precision: str, config: AnalyticConfig = AnalyticConfig()) -> AnalyticParams:
    """The roofline's params pytree at ``batch_size`` and weight ``precision``."""
    for name in ("mem_bw_gbps", "comm_bw_gbps"):
        if not getattr(config, name) > 0:
            raise UserError(f"cost_model.{name}: got {getattr(config, name)}, expected a number > 0")
    if precision not in C.BYTES_PER_ELEMENT:
        raise UserError(f"precision: got {precision!r}, expected one of {', '.join(C.BYTES_PER_ELEMENT)}")
    return AnalyticParams(float(batch_size), float(C.BYTES_PER_ELEMENT[precision]), **dataclasses.asdict(config))


def analytic_model(task: Task, config: AnalyticConfig = AnalyticConfig()) -> CostModel:
    """The roofline model at the task's batch size and precision."""
    return CostModel("analytic", ANALYTIC_FNS, analytic_params(task.batch_size, task.precision, config))
