"""The scoring API: pure, jitted functions over padded arrays, for searchers and for other JAX code.

Every function takes ``fns`` (a ``CostFns``, static: pass ``model.fns``) and ``params`` (a pytree:
``model.params``), then arrays; any leading batch dimensions broadcast, so a whole batch of
candidate plans is scored in one call. Padded tables/devices are masked out. Same padded shapes never
recompile. Everything is differentiable with respect to the float inputs.

    from neuroshard_jax.cost_models import make_cost_model
    from neuroshard_jax import scoring
    model = make_cost_model("neural", task)                   # or "analytic"
    z = scoring.table_latents(model.fns, model.params, feats)  # f32[B, N, T, F] -> f32[B, N, T, D]
    costs = scoring.costs_from_latents(model.fns, model.params, (z * mask[..., None]).sum(-2),
                                       mask.any(-1), dim_sums, device_mask)   # DeviceCosts of f32[B, N]
    cost_ms = scoring.plan_costs(model.fns, model.params, feats, mask, dim_sums, device_mask)  # f32[B]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from neuroshard_jax.cost_models import CostFns, DeviceCosts, combine_costs, device_costs, plan_cost_ms


@functools.partial(jax.jit, static_argnums=0)
def table_latents(fns: CostFns, params, feats: jax.Array) -> jax.Array:
    """Per-table (shard) latents: raw features f32[..., F] -> f32[..., D]."""
    return fns.embed(params, feats)


@functools.partial(jax.jit, static_argnums=0)
def compute_from_latents(fns: CostFns, params, latent_sums: jax.Array, has_tables: jax.Array) -> jax.Array:
    """Fused-kernel compute ms f32[...] of devices from their summed latents f32[..., D] (head only)."""
    return jnp.where(has_tables, fns.head(params, latent_sums), 0.0)


@functools.partial(jax.jit, static_argnums=0)
def costs_from_latents(
    fns: CostFns, params, latent_sums: jax.Array, has_tables: jax.Array, dim_sums: jax.Array, device_mask: jax.Array
) -> DeviceCosts:
    """Per-device costs from summed latents f32[..., N, D], has_tables bool[..., N], dim_sums f32[..., N]."""
    compute = jnp.where(has_tables, fns.head(params, latent_sums), 0.0)
    return combine_costs(fns, params, compute, dim_sums, device_mask)


@functools.partial(jax.jit, static_argnums=0)
def plan_costs(
    fns: CostFns, params, feats: jax.Array, table_mask: jax.Array, dim_sums: jax.Array, device_mask: jax.Array
) -> jax.Array:
    """Plan costs f32[...] of padded plans: feats f32[..., N, T, F], table_mask bool[..., N, T],
    dim_sums f32[..., N], device_mask bool[..., N]."""
    return plan_cost_ms(device_costs(fns, params, feats, table_mask, dim_sums, device_mask))
