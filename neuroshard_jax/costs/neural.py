"""Neural cost models (Flax NNX) and their pure-function form for scoring.

* ``ComputeNet``: a per-table MLP (features -> latent), a sum over the shard's tables, a head MLP
  (-> log ms of the fused kernel's fwd+bwd). Sum pooling: order-free, and a search adds a table to a
  device by adding its latent and rerunning the head only. Each latent carries a count channel (1 per
  table), and the head sees the *mean* latent and log(count) rather than the raw sum: a ReLU head on
  raw sums in log space extrapolates exponentially in the number of tables (a device of 20 tables,
  beyond the 1..15 of the training shards, was predicted 11x too slow); with mean + log count the
  test MAPE on 11..15-table shards of a model trained on <= 10 tables fell from 14.2% to 6.8%.
* ``CommNet``: all-to-all cost per device for any number of devices. Each device is described by
  its own inputs (dim sum, share of the total, straggler delay for the forward net) plus a context
  pooled over the devices (mean and max of the device latents, DreamShard's idea), so one set of
  weights serves N = 2, 4, 8, ... Outputs log ms per device.

``neural_cost_model`` wraps trained nets as a ``CostModel``: ``params`` is a plain pytree
(``NeuralParams``), the functions are pure and jittable, so other JAX code can call them directly.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from neuroshard_jax.core.features import FEATURE_INDEX, NUM_BASE_FEATURES
from neuroshard_jax.costs.cost_model import CostFns, CostModel, straggler_wait

LOG_FEATURES = tuple(FEATURE_INDEX[name] for name in ("rows", "dim", "pooling_factor", "size"))
COMM_INPUTS = 4  # log1p(dim_sum), dim_sum / total, tanh(delay / 10 ms), log(N)


@dataclasses.dataclass(frozen=True)
class NetConfig:
    """Layer sizes (conf/train.yaml). Defaults as the paper: 21 -> 128 -> 32 and a 64-unit head (33 -> 64 -> 1 here:
    the mean latent plus log count)."""

    table_hidden: tuple[int, ...] = (128,)
    latent: int = 32
    head_hidden: tuple[int, ...] = (64,)
    comm_hidden: tuple[int, ...] = (64,)
    comm_latent: int = 32
    comm_head_hidden: tuple[int, ...] = (64,)


class MLP(nnx.Module):
    """Linear layers with ReLU between them (none after the last)."""

    def __init__(self, sizes: tuple[int, ...], rngs: nnx.Rngs):
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:])])

    def __call__(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = jax.nn.relu(x)
        return x


class ComputeNet(nnx.Module):
    def __init__(self, config: NetConfig, rngs: nnx.Rngs):
        self.table_mlp = MLP((NUM_BASE_FEATURES, *config.table_hidden, config.latent), rngs)
        self.head_mlp = MLP((config.latent + 1, *config.head_hidden, 1), rngs)

    def embed(self, normalized):
        """f32[..., F] normalised features -> f32[..., D + 1] table latents (the last channel counts tables)."""
        z = self.table_mlp(normalized)
        return jnp.concatenate([z, jnp.ones_like(z[..., :1])], -1)

    def embed_sum(self, normalized, mask):
        """The masked sum of ``embed`` over tables, f32[..., T, F], bool[..., T] -> f32[..., D + 1], summing
        before the last (linear) layer: sum_t (W h_t + b) = W sum_t h_t + count * b."""
        *hidden, last = self.table_mlp.layers
        h = normalized
        for layer in hidden:
            h = jax.nn.relu(layer(h))
        h = jnp.where(mask[..., None], h, 0.0).sum(-2)
        count = mask.sum(-1, keepdims=True).astype(h.dtype)
        return jnp.concatenate([h @ last.kernel[...] + count * last.bias[...], count], -1)

    def head(self, latent_sum):
        """f32[..., D + 1] summed latents -> f32[...] log ms, from the mean latent and log(count)."""
        count = jnp.maximum(latent_sum[..., -1:], 1.0)
        return self.head_mlp(jnp.concatenate([latent_sum[..., :-1] / count, jnp.log(count)], -1))[..., 0]

    def __call__(self, normalized, mask):
        """f32[..., T, F], bool[..., T] -> f32[...] log ms of each shard."""
        return self.head(self.embed_sum(normalized, mask))


class CommNet(nnx.Module):
    def __init__(self, config: NetConfig, rngs: nnx.Rngs):
        self.device_mlp = MLP((COMM_INPUTS, *config.comm_hidden, config.comm_latent), rngs)
        self.head_mlp = MLP((3 * config.comm_latent, *config.comm_head_hidden, 1), rngs)

    def __call__(self, inputs, mask):
        """f32[..., N, 4] per-device inputs, bool[..., N] -> f32[..., N] log ms."""
        latents = jax.nn.relu(self.device_mlp(inputs))
        count = jnp.maximum(mask.sum(-1, keepdims=True), 1)[..., None]
        mean = jnp.where(mask[..., None], latents, 0.0).sum(-2, keepdims=True) / count
        peak = jnp.where(mask[..., None], latents, -jnp.inf).max(-2, keepdims=True)
        context = jnp.broadcast_to(jnp.concatenate([mean, peak], -1), latents.shape[:-1] + (2 * latents.shape[-1],))
        return self.head_mlp(jnp.concatenate([latents, context], -1))[..., 0]


class FeatureStats(NamedTuple):
    """z-normalisation of transformed table features (fitted on the training split). f32[F] each."""

    mean: jax.Array
    std: jax.Array


LOG_MASK = tuple(i in LOG_FEATURES for i in range(NUM_BASE_FEATURES))


def transform_features(feats):
    """log1p of the size-like features (rows, dim, pooling, size); shares unchanged. f32[..., F] -> f32[..., 21]:
    this family reads the base features alone (kernel kinds are the ensemble's: ``ensemble.py``)."""
    feats = feats[..., :NUM_BASE_FEATURES]
    return jnp.where(jnp.asarray(LOG_MASK), jnp.log1p(jnp.maximum(feats, 0.0)), feats)  # elementwise, no scatter


def fit_stats(feats, mask) -> FeatureStats:
    """Mean and std (guarded against zero) of transformed features over the unmasked rows."""
    x = transform_features(jnp.asarray(feats))[jnp.asarray(mask)]
    return FeatureStats(x.mean(0), jnp.maximum(x.std(0), 1e-6))


def normalize(feats, stats: FeatureStats):
    return (transform_features(feats) - stats.mean) / stats.std


def comm_inputs(dim_sums, delays_ms, mask):
    """Per-device comm inputs f32[..., N, 4] from dim sums and delays f32[..., N]."""
    dims = jnp.where(mask, dim_sums, 0.0)
    total = jnp.maximum(dims.sum(-1, keepdims=True), 1.0)
    n = jnp.broadcast_to(jnp.log(jnp.maximum(mask.sum(-1, keepdims=True), 1)), dims.shape)
    delay = jnp.tanh(jnp.where(mask, delays_ms, 0.0) / 10.0)  # bounded: no extrapolation beyond the sampled delays
    return jnp.stack([jnp.log1p(dims), dims / total, delay, n], -1)


MAX_LOG_MS = 13.8  # log(~1e6 ms): a net far outside its training data never predicts inf (exp overflows f32 past 88)


def bounded_exp(log_ms):
    """ms from the nets' log-ms outputs, capped at exp(MAX_LOG_MS): finite costs keep argmin/min decisions
    well defined (an inf, or the NaN of inf - inf, made the vectorised and the oracle greedy disagree)."""
    return jnp.exp(jnp.minimum(log_ms, MAX_LOG_MS))


def comm_time(net: CommNet, dim_sums, delays_ms, mask):
    """ms f32[..., N] of an all-to-all: the wait for the slowest peer (known exactly from the delays) plus
    the net's transfer time. Learning only the transfer keeps the model linear in the delays: a net on
    the whole time, trained on delays up to 20 ms, predicted 10x too much at the ~60 ms of real plans."""
    return straggler_wait(delays_ms, mask) + bounded_exp(net(comm_inputs(dim_sums, delays_ms, mask), mask))


class NeuralParams(NamedTuple):
    compute: nnx.State
    fwd: nnx.State
    bwd: nnx.State
    stats: FeatureStats


@dataclasses.dataclass(frozen=True)
class NeuralNets:
    """Graph definitions of the three nets (static), so that params travel as a plain pytree."""

    compute: nnx.GraphDef
    fwd: nnx.GraphDef
    bwd: nnx.GraphDef


def init_nets(config: NetConfig, seed: int = 0) -> tuple[NeuralNets, NeuralParams]:
    rngs = nnx.Rngs(seed)
    graphs, states = zip(
        *(nnx.split(net) for net in (ComputeNet(config, rngs), CommNet(config, rngs), CommNet(config, rngs)))
    )
    stats = FeatureStats(jnp.zeros(NUM_BASE_FEATURES), jnp.ones(NUM_BASE_FEATURES))
    return NeuralNets(*graphs), NeuralParams(*states, stats)


def neural_fns(nets: NeuralNets) -> CostFns:
    """The CostFns of trained nets: pure functions of (params, arrays)."""

    def embed(p: NeuralParams, feats):
        return nnx.merge(nets.compute, p.compute).embed(normalize(feats, p.stats))

    def embed_sum(p: NeuralParams, feats, mask):
        return nnx.merge(nets.compute, p.compute).embed_sum(normalize(feats, p.stats), mask)

    def head(p: NeuralParams, latent_sum):
        return bounded_exp(nnx.merge(nets.compute, p.compute).head(latent_sum))

    def bwd_comm(p: NeuralParams, dim_sums, device_mask):
        return comm_time(nnx.merge(nets.bwd, p.bwd), dim_sums, jnp.zeros_like(dim_sums), device_mask)

    def fwd_comm(p: NeuralParams, dim_sums, delays_ms, device_mask):
        return comm_time(nnx.merge(nets.fwd, p.fwd), dim_sums, delays_ms, device_mask)

    return CostFns(embed, head, bwd_comm, fwd_comm, embed_sum)


def neural_cost_model(nets: NeuralNets, params: NeuralParams, name: str = "neural") -> CostModel:
    return CostModel(name, neural_fns(nets), params)
