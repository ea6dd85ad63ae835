"""The physics ensemble: a compute cost model that cannot be absurd, and knows where it is unsure.

A device's fused-kernel fwd+bwd time is a sum over its shards of a fitted roofline, each term corrected by a
bounded factor that a small Flax MLP learns, plus a kernel overhead:

    ms_k(device) = kernel_k + sum_t roof_k(t) * exp(C * tanh(net_k(x_t) / C))
    roof_k(t)    = c_table + c_lookup * L + c_gather * L * dim + c_update * U * dim + c_output * B * dim

with L = pooling factor x batch lookups, U the distinct rows one batch touches (from the access histogram),
B the batch size; every coefficient is positive (exp of a learned log), so a device's cost is positive, finite
and grows when a shard is added, and the net can move a shard's cost by at most exp(+-C) from its roofline.
With ``EnsembleConfig.cache`` a device also pays for its working set: c_cache * G * S / (S + C_cache), G the
elements its lookups gather and S the elements of the rows they touch, summed over its shards (a fused kernel's
tables share one cache: docs/results/fusion.md), C_cache a fitted cache size. A device's tables interact: every
lookup pays c_fused * f(k) more for k tables fused in one kernel, f(k) = k (``fusion="pairwise"``, checkpoints
before 2026-11-27) or 1 - 1/k (``"saturating"``: bounded however many tables a device gets).
Column slices pay what they cost on FBGEMM: every slice does every lookup (the c_lookup * L term).

The batch size is an input (``EnsembleParams.batch_size``, set from the task), so one model serves every
batch size it was trained on. The net sees the physics (log lookups, distinct rows, bytes per pass, reuse,
rows) and the histogram shares.

K members (``EnsembleParams.members``: stacked Flax states, one vmapped call) are trained on bootstrap
weightings of the data. Their spread is a device's uncertainty: where the relative spread passes
``trust_lo`` (calibrated on held-out data: its 99th percentile) the prediction blends into the members'
mean roofline, fully at ``trust_hi``; and the score a searcher minimises adds ``risk`` x the spread
(``risk`` = 0 for reported costs), so a plan is not built on an extrapolation.

Comm: the CommNets of ``neural.py``, fed the bytes each device sends (dim sums scaled by B / the comm data's
batch size), 0 for a single device.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import FEATURE_INDEX, KIND_FEATURE_NAMES, NUM_BINS
from neuroshard_jax.costs.cost_model import CostFns, CostModel
from neuroshard_jax.costs.neural import MAX_LOG_MS, MLP, CommNet, NetConfig, comm_time
from neuroshard_jax.workloads.streams import bin_bounds

ROOF_TERMS = ("table", "lookup", "gather", "update", "output")
FUSION_TERMS = ("pairwise", "saturating")
NUM_COEFS = len(ROOF_TERMS) + 2  # the terms, the kernel overhead, the lookups x shards interaction
# with the cache term, two more: its coefficient (ms per 1e6 gathered elements missed) and the cache's size (1e6
# elements of the touched rows)
NUM_CACHE_COEFS = NUM_COEFS + 2
INPUT_NAMES = (
    "log_lookups",
    "log_distinct_rows",
    "log_dim",
    "log_rows",
    "log_batch",
    "log_gather_elems",
    "log_update_elems",
    "log_output_elems",
    "log_reuse",
    "log_pooling",
    "touched_share",
) + tuple(f"bin_{k}" for k in range(NUM_BINS))
NUM_INPUTS = len(INPUT_NAMES)
# With ``EnsembleConfig.kinds``, the kernel a shard runs in (``core.features.KIND_FEATURE_NAMES``) is an input of the
# correction net and adds roofline terms: a sequence kernel's rows out (one per id: its output and the gradient it
# scatters, lookups x dim, which FBGEMM's unpooled kernels spend far more on than a pooled one's bags), a weighted
# kernel's scaled gathers (lookups x dim) and, with ``kind_terms=3``, a sequence kernel's distinct rows (its backward
# on CPU goes with the rows a batch touches, 2-3 us each whatever their width: docs/results/kernel-kinds.md, where it
# read held-out labels better and the sequence benchmark's plan devices worse, so it is not the default). Their log
# coefficients are the last ``EnsembleConfig.kind_terms`` of a member's roofline.
KIND_INPUTS = KIND_FEATURE_NAMES
KIND_TERMS = ("sequence_rows", "weighted_gathers", "sequence_distinct")


def input_names(kinds: bool) -> tuple[str, ...]:
    """The correction net's inputs: INPUT_NAMES, and the kernel kinds where the model knows them."""
    return INPUT_NAMES + (KIND_INPUTS if kinds else ())


_lo, _hi = bin_bounds()
BIN_MID = np.sqrt(_lo * np.minimum(_hi, 4 * _lo)).astype(np.float32)  # a typical access count of each bin


@dataclasses.dataclass(frozen=True)
class EnsembleConfig:
    """conf/train.yaml ``ensemble:``."""

    members: int = 5  # K nets, stacked parameters, one vmapped call; their spread flags unfamiliar inputs
    hidden: tuple[int, ...] = (64, 64)  # the correction MLP per shard: 28 physics inputs -> 64 -> 64 -> 1
    latent: int = 8  # per-shard latent the device head pools (interactions between a device's shards)
    head_hidden: tuple[int, ...] = (32,)  # device head: mean latent + log count + log roofline -> 32 -> 1
    max_correction: float = 1.1  # C: the net moves a shard's cost by at most exp(+-C) (3x) from its roofline
    max_device_correction: float = 0.7  # the device head moves the device's sum by at most exp(+-0.7) (2x)
    max_label_spread: float = 0.25  # drop training records whose timed runs spread more (IQR / median)
    # drop the labels of datasets taken before the workers kept freed memory (``malloc`` absent) whose output glibc
    # may have page-faulted afresh (``learn.datasets.may_have_faulted``); checkpoints trained before it kept them
    drop_faulted: bool = False
    max_dataset_weight: float = 1.0  # a smaller dataset may count up to this many times per record
    comm: NetConfig = NetConfig()  # the comm nets (as family=mlp)
    # the device's cache term (docs/results/fusion.md): its gathers slowed by the share of its working set past a
    # fitted cache size; checkpoints trained before it have none
    cache: bool = False
    # how a fused kernel's tables interact: "saturating", c * lookups * (1 - 1 / tables): nothing for one table, at
    # most c per lookup however many are fused | "pairwise", c * lookups * tables (what checkpoints trained before
    # 2026-11-27 hold; it grows past any kernel the labels held: docs/results/fusion.md)
    fusion: str = "saturating"
    # the kernel kinds (mean pooling, per-id weights, sequence lookups) as inputs and roofline terms (``KIND_TERMS``);
    # checkpoints trained before them read sum-pooled bags alone
    kinds: bool = False
    # with ``kinds``, how many of KIND_TERMS the roofline has: 2, or 3 with the sequence kernel's distinct rows
    # (checkpoints trained before it have 2)
    kind_terms: int = 2

    def __post_init__(self):
        if self.fusion not in FUSION_TERMS:
            raise UserError(f"ensemble.fusion: got {self.fusion!r}, expected one of {', '.join(FUSION_TERMS)}")
        if not 2 <= self.kind_terms <= len(KIND_TERMS):
            raise UserError(f"ensemble.kind_terms: got {self.kind_terms!r}, expected 2 to {len(KIND_TERMS)}")

    @property
    def width(self) -> int:
        """Each member's per-shard latent: corrected ms, roofline ms, lookups, the latent (Z) and, with the cache
        term, the gathered and the touched elements (1e6)."""
        return 3 + self.latent + (2 * self.cache)


def physics(feats, batch_size):
    """Per-shard physics from raw features f32[..., F] (FEATURE_NAMES) at ``batch_size`` (broadcasts with
    feats[..., 0]): lookups L, distinct rows U, dim, rows. Each f32[...]."""
    rows = jnp.maximum(feats[..., FEATURE_INDEX["rows"]], 1.0)
    dim = feats[..., FEATURE_INDEX["dim"]]
    lookups = jnp.maximum(feats[..., FEATURE_INDEX["pooling_factor"]], 0.0) * batch_size
    shares = feats[..., FEATURE_INDEX["bin_0"] : FEATURE_INDEX["bin_0"] + NUM_BINS]
    mean_count = jnp.maximum(shares @ jnp.asarray(BIN_MID), 1.0)
    distinct = jnp.minimum(jnp.minimum(rows, lookups), lookups / mean_count)
    return lookups, distinct, dim, rows


# The log-space inputs as one linear map of five logs (lookups, distinct rows, dim, rows, batch): log L, log U,
# log d, log R, log B, log L*d, log U*d, log B*d, log L/U (reuse), log L/B (pooling). One dot instead of many
# elementwise logs keeps XLA's compile of every search kernel short.
_LOG_MAP = np.array(
    [
        [1, 0, 0, 0, 0, 1, 0, 0, 1, 1],
        [0, 1, 0, 0, 0, 0, 1, 0, -1, 0],
        [0, 0, 1, 0, 0, 1, 1, 1, 0, 0],
        [0, 0, 0, 1, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 1, 0, 0, 1, 0, -1],
    ],
    np.float32,
)


def net_inputs(feats, batch_size, kinds: bool = False):
    """The correction net's inputs f32[..., I] (``input_names(kinds)`` order), before normalisation; logs are
    log(max(x, 1))."""
    lookups, distinct, dim, rows = physics(feats, batch_size)
    batch = jnp.broadcast_to(jnp.asarray(batch_size, jnp.float32), lookups.shape)
    shares = feats[..., FEATURE_INDEX["bin_0"] : FEATURE_INDEX["bin_0"] + NUM_BINS]
    # stacked on a leading axis, then moved: XLA on CPU compiles a log over a last-axis stack ~10x slower
    logs = jnp.log(jnp.maximum(jnp.stack([lookups, distinct, dim, rows, batch]), 1.0))
    logs = jnp.moveaxis(logs, 0, -1) @ jnp.asarray(_LOG_MAP)
    kind = [_kinds(feats)] if kinds else []
    return jnp.concatenate([logs, (distinct / rows)[..., None], shares, *kind], -1)


def _kinds(feats):
    """f32[..., 3]: a shard's kernel kind columns (mean pooling, weighted, sequence)."""
    first = FEATURE_INDEX[KIND_FEATURE_NAMES[0]]
    return feats[..., first : first + len(KIND_FEATURE_NAMES)]


def roof_terms(feats, batch_size, kinds: bool = False, kind_terms: int = 2):
    """The roofline's terms f32[..., 5] (ROOF_TERMS order; elements, not bytes: the coefficients absorb the
    element size), and with ``kinds`` the first ``kind_terms`` of KIND_TERMS after them. An unused table (no
    lookups) still pays its per-table cost. A sequence shard's output is a row per id: its ``output`` term is
    lookups x dim."""
    lookups, distinct, dim, _ = physics(feats, batch_size)
    batch = jnp.broadcast_to(jnp.asarray(batch_size, jnp.float32), lookups.shape)
    if not kinds:
        terms = jnp.stack([jnp.ones_like(lookups), lookups, lookups * dim, distinct * dim, batch * dim]) * 1e-6
        return jnp.moveaxis(terms, 0, -1)
    kind = _kinds(feats)
    sequence, weighted = kind[..., 2], kind[..., 1]
    outputs = jnp.where(sequence > 0, lookups, batch) * dim
    gathers = lookups * dim
    terms = [jnp.ones_like(lookups), lookups, gathers, distinct * dim, outputs, gathers * sequence, gathers * weighted]
    terms += [distinct * sequence][: kind_terms - 2]  # the sequence kernel's distinct rows (not x dim)
    return jnp.moveaxis(jnp.stack(terms) * 1e-6, 0, -1)


def _head_map(width: int, z: int) -> np.ndarray:
    """f32[W, Z + 2]: slots 3..3+Z-1 of a per-shard latent (its Z latent values) into the head's inputs 0..Z-1."""
    out = np.zeros((width, z + 2), np.float32)
    out[3 : 3 + z, :z] = np.eye(z, dtype=np.float32)
    return out


# the cache term's start where a roofline fit gives none (a fine-tuned prior without it): a small coefficient and
# a 32 MiB cache (8e6 fp32 elements, in 1e6)
CACHE_PRIOR = np.log(np.array([1e-3, 8.0], np.float32))


def _slot(x, index: int, width: int):
    """x f32[...] placed in slot ``index`` of f32[..., width] (zeros elsewhere). Built by broadcasting, not by a
    last-axis concatenation, which XLA on CPU compiles several times slower inside the search kernels."""
    return x[..., None] * jnp.asarray(np.eye(width, dtype=np.float32)[index])


class MemberNet(nnx.Module):
    """One member: roofline coefficients (log, ms per 1e6 units), the per-shard MLP (a bounded correction and a
    latent) and the device head (a bounded correction of the device's sum from its shards' mean latent)."""

    def __init__(self, config: EnsembleConfig, log_coef: np.ndarray, rngs: nnx.Rngs):
        self.mlp = MLP((len(input_names(config.kinds)), *config.hidden, 1 + config.latent), rngs)
        self.head_mlp = MLP((config.latent + 2, *config.head_hidden, 1), rngs)
        self.log_coef = nnx.Param(jnp.asarray(log_coef[: len(ROOF_TERMS)], jnp.float32))
        self.log_kernel = nnx.Param(jnp.asarray(log_coef[len(ROOF_TERMS)], jnp.float32))
        self.log_interaction = nnx.Param(jnp.asarray(log_coef[len(ROOF_TERMS) + 1], jnp.float32))
        self.latent = config.latent
        self.saturating = config.fusion == "saturating"
        self.cache = config.cache
        if config.cache:
            coef = log_coef[NUM_COEFS:NUM_CACHE_COEFS] if len(log_coef) >= NUM_CACHE_COEFS else CACHE_PRIOR
            self.log_cache_coef = nnx.Param(jnp.asarray(coef[0], jnp.float32))
            self.log_cache_size = nnx.Param(jnp.asarray(coef[1], jnp.float32))
        self.kinds = config.kinds
        if config.kinds:  # the kind terms' coefficients: the last ``kind_terms`` of ``log_coef``
            self.log_kind_coef = nnx.Param(jnp.asarray(log_coef[-config.kind_terms :], jnp.float32))

    def table_latent(self, normalized, terms, max_correction: float):
        """f32[..., W]: corrected ms, roofline ms, lookups (1e6), latent of each shard (and with the cache term its
        gathered and touched elements, 1e6: the device sums them)."""
        roof = terms[..., : len(ROOF_TERMS)] @ jnp.exp(self.log_coef[...])
        if self.kinds:
            roof = roof + terms[..., len(ROOF_TERMS) :] @ jnp.exp(self.log_kind_coef[...])
        out = self.mlp(normalized)
        corrected = roof * jnp.exp(max_correction * jnp.tanh(out[..., 0] / max_correction))
        width = out.shape[-1] + 2 + 2 * self.cache
        latent = (
            out @ jnp.eye(out.shape[-1], width, 2)  # the latent into slots 3.. (slot 2 gets out[0], zeroed below)
            + _slot(corrected, 0, width)
            + _slot(roof, 1, width)
            + _slot(terms[..., 1] - out[..., 0], 2, width)
        )
        if self.cache:
            latent = latent + _slot(terms[..., 2], width - 2, width) + _slot(terms[..., 3], width - 1, width)
        return latent

    def cache_ms(self, latent_sum):
        """f32[...]: the device's gathers slowed by the share of its touched rows past the cache,
        c * G * S / (S + C) (G gathered, S touched elements of all its shards; c and C fitted). It grows with every
        lookup, width and table a device gets; 0 without the cache term."""
        if not self.cache:
            return jnp.zeros(latent_sum.shape[:-1])
        gathered, touched = latent_sum[..., -2], latent_sum[..., -1]
        missed = touched / (touched + jnp.exp(self.log_cache_size[...]))
        return jnp.exp(self.log_cache_coef[...]) * gathered * missed

    def fused(self, count):
        """The interaction's factor of a device's lookups for ``count`` tables fused: count (pairwise) or
        1 - 1/count (saturating; 0 for one table or none)."""
        if self.saturating:
            return jnp.where(count > 0, 1.0 - 1.0 / jnp.maximum(count, 1.0), 0.0)
        return count

    def device_ms(self, latent_sum, count, max_device_correction: float):
        """(ms, roofline ms) f32[...] of devices from their shards' summed latents f32[..., W] and count."""
        base = (
            jnp.exp(self.log_kernel[...]) * (count > 0)
            + jnp.exp(self.log_interaction[...]) * latent_sum[..., 2] * self.fused(count)
            + self.cache_ms(latent_sum)
        )
        roof = latent_sum[..., 1] + base
        n = jnp.maximum(count, 1.0)[..., None]
        z = self.latent
        head_in = (
            (latent_sum / n) @ jnp.asarray(_head_map(latent_sum.shape[-1], z))  # the mean latent into slots 0..Z-1
            + _slot(jnp.log(n[..., 0]), z, z + 2)
            + _slot(jnp.log1p(roof) / 5.0, z + 1, z + 2)
        )
        factor = jnp.exp(max_device_correction * jnp.tanh(self.head_mlp(head_in)[..., 0] / max_device_correction))
        return (latent_sum[..., 0] + base) * factor, roof


class InputStats(NamedTuple):
    mean: jax.Array
    std: jax.Array


class EnsembleParams(NamedTuple):
    """A plain pytree: stacked member states (leading axis K), the comm nets, input statistics and the
    scoring settings (scalars, so a task's batch size or a risk setting is a params update, not a retrace)."""

    members: nnx.State
    fwd: nnx.State
    bwd: nnx.State
    stats: InputStats
    batch_size: jax.Array
    comm_batch_size: jax.Array
    trust_lo: jax.Array
    trust_hi: jax.Array
    risk: jax.Array


@dataclasses.dataclass(frozen=True)
class EnsembleNets:
    member: nnx.GraphDef
    fwd: nnx.GraphDef
    bwd: nnx.GraphDef
    max_correction: float
    max_device_correction: float
    width: int  # each member's per-shard latent (EnsembleConfig.width)
    kinds: bool = False  # the kernel kinds are inputs and roofline terms (EnsembleConfig.kinds)
    kind_terms: int = 2  # how many of KIND_TERMS (EnsembleConfig.kind_terms)


def init_ensemble(config: EnsembleConfig, log_coef: np.ndarray, seed: int = 0) -> tuple[EnsembleNets, EnsembleParams]:
    """K members with their own initialisations (``log_coef``: the fitted roofline, f32[7]: ROOF_TERMS, the
    kernel overhead, the lookups x shards interaction)."""
    states = []
    for k in range(config.members):
        graph, state = nnx.split(MemberNet(config, log_coef, nnx.Rngs(seed * 1000 + k)))
        states.append(state)
    members = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    rngs = nnx.Rngs(seed + 77)
    fwd_graph, fwd = nnx.split(CommNet(config.comm, rngs))
    bwd_graph, bwd = nnx.split(CommNet(config.comm, rngs))
    inputs = len(input_names(config.kinds))
    stats = InputStats(jnp.zeros(inputs), jnp.ones(inputs))
    scalar = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    params = EnsembleParams(members, fwd, bwd, stats, scalar(4096), scalar(4096), scalar(0.2), scalar(0.4), scalar(0.0))
    nets = EnsembleNets(
        graph,
        fwd_graph,
        bwd_graph,
        config.max_correction,
        config.max_device_correction,
        config.width,
        config.kinds,
        config.kind_terms,
    )
    return nets, params


def abstract_ensemble(config: EnsembleConfig, log_coef: np.ndarray) -> tuple[EnsembleNets, EnsembleParams]:
    """``init_ensemble``'s nets and the shapes of its params (no values: nothing is initialised or computed), the
    template a checkpoint is restored into: building the members for real took seconds of small eager calls. One
    member is traced and its shapes stacked K times, as ``init_ensemble`` stacks its members."""
    made = {}

    def params() -> EnsembleParams:
        made["nets"], out = init_ensemble(dataclasses.replace(config, members=1), log_coef)
        return out

    shapes = jax.eval_shape(params)
    stack = lambda a: jax.ShapeDtypeStruct((config.members, *a.shape[1:]), a.dtype)  # noqa: E731
    return made["nets"], shapes._replace(members=jax.tree.map(stack, shapes.members))


def member_latents(nets: EnsembleNets, members, stats: InputStats, feats, batch_size):
    """Per-shard latents f32[K, ..., W] of every member (``MemberNet.table_latent``)."""
    normalized = (net_inputs(feats, batch_size, nets.kinds) - stats.mean) / stats.std
    terms = roof_terms(feats, batch_size, nets.kinds, nets.kind_terms)
    return jax.vmap(lambda s: nnx.merge(nets.member, s).table_latent(normalized, terms, nets.max_correction))(members)


def member_devices(nets: EnsembleNets, members, latent_sum, count):
    """(ms, roofline ms) f32[K, ...] of devices: latent_sum f32[K, ..., W], count f32[...]."""
    return jax.vmap(lambda s, z: nnx.merge(nets.member, s).device_ms(z, count, nets.max_device_correction))(
        members, latent_sum
    )


def device_stats(nets: EnsembleNets, p: EnsembleParams, latent_sum):
    """(mean, spread, roofline) ms f32[...] of devices from summed flat latents f32[..., K * W + 1]."""
    k = p.members["log_kernel"].shape[0]
    count = latent_sum[..., -1]
    per_member = jnp.moveaxis(latent_sum[..., :-1].reshape(*latent_sum.shape[:-1], k, nets.width), -2, 0)
    devices, roof = member_devices(nets, p.members, per_member, count)
    return devices.mean(0), devices.std(0), roof.mean(0)


def trust(p: EnsembleParams, mean, spread):
    """Weight in [0, 1] of the nets (1 - the roofline's) from the relative spread."""
    rel = spread / jnp.maximum(mean, 1e-6)
    return jnp.clip((p.trust_hi - rel) / jnp.maximum(p.trust_hi - p.trust_lo, 1e-6), 0.0, 1.0)


def ensemble_fns(nets: EnsembleNets) -> CostFns:
    def embed(p: EnsembleParams, feats):
        latents = jnp.moveaxis(member_latents(nets, p.members, p.stats, feats, p.batch_size), 0, -2)
        flat = latents.reshape(*latents.shape[:-2], -1)  # [..., K * W]
        width = flat.shape[-1] + 1
        return flat @ jnp.eye(width - 1, width) + _slot(jnp.ones(flat.shape[:-1]), width - 1, width)

    def head(p: EnsembleParams, latent_sum):
        mean, spread, roof = device_stats(nets, p, latent_sum)
        w = trust(p, mean, spread)
        return jnp.minimum(w * mean + (1.0 - w) * roof + p.risk * spread, np.exp(MAX_LOG_MS))

    def uncertainty(p: EnsembleParams, latent_sum):
        mean, spread, _ = device_stats(nets, p, latent_sum)
        return spread / jnp.maximum(mean, 1e-6), trust(p, mean, spread)

    def comm_dims(p: EnsembleParams, dim_sums):
        return dim_sums * (p.batch_size / p.comm_batch_size)  # the same bytes at the comm data's batch size

    def bwd_comm(p: EnsembleParams, dim_sums, device_mask):
        single = device_mask.sum(-1, keepdims=True) > 1
        ms = comm_time(nnx.merge(nets.bwd, p.bwd), comm_dims(p, dim_sums), jnp.zeros_like(dim_sums), device_mask)
        return jnp.where(single, ms, 0.0)

    def fwd_comm(p: EnsembleParams, dim_sums, delays_ms, device_mask):
        single = device_mask.sum(-1, keepdims=True) > 1
        ms = comm_time(nnx.merge(nets.fwd, p.fwd), comm_dims(p, dim_sums), delays_ms, device_mask)
        return jnp.where(single, ms, 0.0)

    return CostFns(embed, head, bwd_comm, fwd_comm, uncertainty=uncertainty)


def ensemble_cost_model(nets: EnsembleNets, params: EnsembleParams, name: str) -> CostModel:
    return CostModel(name, ensemble_fns(nets), params)
