"""DreamShard-style RL placement: a policy network and the estimated MDP it is trained in.

The MDP (on a cost model, no hardware inside): a task's tables in descending order of predicted
single-table compute; one step puts the next table on a device; legal devices are those where it still
fits in memory; the reward is 0 until the end, then -(predicted plan cost). When no device is legal,
the episode ends infeasible and gets a penalty reward instead (never a crash).

The policy scores every device from (a) the sum of its tables' policy latents, (b) the latent of the
table being placed (the reference never showed the policy this table), (c) the mean and max of the
device latents (context, so one set of weights serves any number of devices), and (d) cost-model
features with the gradient stopped: the device's predicted compute now and if the table joined it,
its share of the dim sum, and its memory use before and after. Masked softmax over the legal devices;
the same mask enters the loss (the reference's loss was unmasked).

Rollouts are one ``lax.scan`` over tables, ``vmap``ped over episodes and tasks.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from neuroshard_jax.core.constraints import allowed_devices, groups
from neuroshard_jax.core.features import NUM_BASE_FEATURES
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import CostFns, CostModel, DeviceArrays, bucket, combine_costs, plan_cost_ms
from neuroshard_jax.costs.neural import MLP, FeatureStats, normalize
from neuroshard_jax.costs.scoring import shards_alone
from searchers.grid import cap_units, mem_units, unit_bytes

COST_FEATURES = 5
NEG = -1e9  # logit of an illegal device


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Layer sizes (conf/train_policy.yaml, policy:)."""

    table_hidden: tuple[int, ...] = (128,)
    latent: int = 32
    score_hidden: tuple[int, ...] = (128, 64)


class Policy(nnx.Module):
    def __init__(self, config: PolicyConfig, rngs: nnx.Rngs):
        self.table_mlp = MLP((NUM_BASE_FEATURES, *config.table_hidden, config.latent), rngs)
        self.score_mlp = MLP((4 * config.latent + COST_FEATURES, *config.score_hidden, 1), rngs)

    def embed(self, normalized):
        """f32[..., F] normalised table features -> f32[..., L] table latents."""
        return self.table_mlp(normalized)

    def logits(self, device_latents, table_latent, cost_features, device_mask):
        """f32[N, L] summed device latents, f32[L], f32[N, C], bool[N] -> f32[N] (NEG where masked)."""
        count = jnp.maximum(device_mask.sum(), 1)
        masked = jnp.where(device_mask[:, None], device_latents, 0.0)
        mean = masked.sum(0) / count
        peak = jnp.where(device_mask[:, None], device_latents, -jnp.inf).max(0)
        n = device_latents.shape[0]
        context = jnp.broadcast_to(jnp.concatenate([table_latent, mean, peak]), (n, 3 * table_latent.shape[-1]))
        scores = self.score_mlp(jnp.concatenate([device_latents, context, cost_features], -1))[:, 0]
        return jnp.where(device_mask, scores, NEG)


class PolicyParams(NamedTuple):
    net: nnx.State
    stats: FeatureStats  # z-normalisation of the policy's table features (training tables)


class TaskArrays(NamedTuple):
    """One task in placement order, padded: T table slots, N device slots.

    feats f32[T, F]; z f32[T, D] cost-model latents; mem i32[T] memory units; dims i32[T]; valid bool[T];
    cap i32[N] each device's memory units (1: padding devices); speed f32[N] each device's relative compute
    speed (1: padding); device_mask bool[N]; total_dim f32[]; penalty_ms f32[] (the cost of an infeasible episode);
    allowed bool[T, N] the devices each table may go to (pin, exclude); group i32[T] its colocation group
    (0..T-1; -1: none): a group's later tables go where its first went.
    """

    feats: np.ndarray
    z: np.ndarray
    mem: np.ndarray
    dims: np.ndarray
    valid: np.ndarray
    cap: np.ndarray
    speed: np.ndarray
    device_mask: np.ndarray
    total_dim: np.ndarray
    penalty_ms: np.ndarray
    allowed: np.ndarray
    group: np.ndarray


def task_arrays(
    task: Task, model: CostModel, num_tables: int | None = None, num_devices: int | None = None, penalty: float = 2.0
) -> tuple[TaskArrays, np.ndarray]:
    """Arrays of ``task`` for rollouts (padded to ``num_tables`` / ``num_devices`` if given) and the
    placement order (task table indices, i64[T_task])."""
    t_pad = num_tables or bucket(task.num_tables)
    n_pad = num_devices or task.num_devices
    feats = task.features().astype(np.float32)
    z, single = shards_alone(model, feats)
    order = np.argsort(-single, kind="stable")
    t = task.num_tables

    def pad(a, dtype):
        out = np.zeros((t_pad, *a.shape[1:]), dtype=dtype)
        out[:t] = a[order]
        return out

    unit = unit_bytes(task)
    mem = mem_units([task.table_mem_bytes(i) for i in range(t)], unit)
    group_index = np.full(t, -1)
    for g, members in enumerate(groups(task.tables).values()):
        group_index[members] = g
    arrays = TaskArrays(
        feats=pad(feats, np.float32),
        z=pad(z, np.float32),
        mem=pad(mem, np.int32),
        dims=pad(np.array([tb.width(tb.dim) for tb in task.tables]), np.int32),
        valid=np.arange(t_pad) < t,
        cap=_pad_values(cap_units(task.cap_bytes(), unit), n_pad, 1, np.int32),
        speed=_pad_values(task.speeds(), n_pad, 1.0, np.float32),
        device_mask=np.arange(n_pad) < task.num_devices,
        total_dim=np.float32(sum(tb.width(tb.dim) for tb in task.tables)),
        penalty_ms=np.float32(penalty * single.sum()),
        allowed=_pad_devices(pad(allowed_devices(task.tables, task.num_devices), bool), n_pad, t),
        group=np.where(np.arange(t_pad) < t, pad(group_index, np.int32), -1).astype(np.int32),
    )
    return arrays, order


def _pad_values(values: np.ndarray, n_pad: int, fill, dtype) -> np.ndarray:
    """[N_task] -> [n_pad], padding devices get ``fill``."""
    out = np.full(n_pad, fill, dtype=dtype)
    out[: len(values)] = values
    return out


def _pad_devices(allowed: np.ndarray, n_pad: int, t: int) -> np.ndarray:
    """bool[T, N_task] -> bool[T, n_pad]; padding tables may go anywhere (they are never placed)."""
    out = np.zeros((allowed.shape[0], n_pad), dtype=bool)
    out[:, : allowed.shape[1]] = allowed
    out[t:] = True
    return out


def stack_tasks(arrays: list[TaskArrays]) -> TaskArrays:
    return TaskArrays(*(np.stack(field) for field in zip(*arrays)))


class Rollout(NamedTuple):
    cost_ms: jax.Array  # predicted plan cost (penalty_ms where infeasible)
    feasible: jax.Array
    log_prob: jax.Array  # sum over the episode's decisions
    entropy: jax.Array  # mean over the episode's decisions
    actions: jax.Array  # i32[T] device per table slot (placement order), -1 for padding / after failure


def rollout(graph: nnx.GraphDef, params: PolicyParams, fns: CostFns, cost_params, task: TaskArrays, key, greedy):
    """One episode of one task. ``greedy``: argmax decoding, else sampling with ``key``."""
    policy = nnx.merge(graph, params.net)
    table_latents = policy.embed(normalize(task.feats, params.stats))  # [T, L]
    n = task.device_mask.shape[0]
    keys = jax.random.split(key, task.valid.shape[0])

    def step(carry, x):
        cost_latents, policy_latents, used, dim_sums, compute, ok, log_prob, entropy, group_device = carry
        table_latent, z, m, d, valid, k, allowed, g = x
        slot = jnp.maximum(g, 0)
        joined = jnp.where(g >= 0, group_device[slot], -1)  # the device of this table's group, if placed
        legal = task.device_mask & allowed & (used + m <= task.cap) & ((joined < 0) | (jnp.arange(n) == joined))
        found = legal.any()
        if_added = jnp.where(task.device_mask, fns.head(cost_params, cost_latents + z) / task.speed, 0.0)
        cap = jnp.maximum(task.cap, 1).astype(jnp.float32)  # a cap below one unit: features stay finite
        cost_features = jax.lax.stop_gradient(
            jnp.stack(
                [
                    jnp.log1p(compute),
                    jnp.log1p(if_added),
                    dim_sums / task.total_dim,
                    used / cap,
                    (used + m) / cap,
                ],
                -1,
            )
        )
        logits = jnp.where(legal, policy.logits(policy_latents, table_latent, cost_features, task.device_mask), NEG)
        log_p = jax.nn.log_softmax(logits)
        action = jnp.where(greedy, jnp.argmax(logits), jax.random.categorical(k, logits))
        take = valid & found & ok
        onehot = (jnp.arange(n) == action) & take
        p = jnp.exp(log_p)
        carry = (
            cost_latents + onehot[:, None] * z,
            policy_latents + onehot[:, None] * table_latent,
            used + onehot * m,
            dim_sums + onehot * d,
            jnp.where(onehot, if_added, compute),
            ok & (found | ~valid),
            log_prob + jnp.where(take, log_p[action], 0.0),
            entropy + jnp.where(take, -jnp.sum(jnp.where(legal, p * log_p, 0.0)), 0.0),
            group_device.at[slot].set(jnp.where(take & (g >= 0), action, group_device[slot])),
        )
        return carry, jnp.where(take, action, -1)

    d_cost = task.z.shape[-1]
    init = (
        jnp.zeros((n, d_cost)),
        jnp.zeros((n, table_latents.shape[-1])),
        jnp.zeros(n, jnp.int32),
        jnp.zeros(n, jnp.int32),
        jnp.zeros(n),
        jnp.array(True),
        jnp.array(0.0),
        jnp.array(0.0),
        jnp.full(task.valid.shape[0], -1, jnp.int32),
    )
    xs = (table_latents, task.z, task.mem, task.dims, task.valid, keys, task.allowed, task.group)
    (_, _, _, dim_sums, compute, ok, log_prob, entropy, _), actions = jax.lax.scan(step, init, xs)
    costs = combine_costs(fns, cost_params, compute, DeviceArrays(dim_sums.astype(jnp.float32), task.device_mask))
    cost = jnp.where(ok, plan_cost_ms(costs), task.penalty_ms)
    steps = jnp.maximum(task.valid.sum(), 1)
    return Rollout(cost, ok, log_prob, entropy / steps, actions)


def batch_rollouts(graph, params, fns, cost_params, tasks: TaskArrays, keys, greedy: bool) -> Rollout:
    """Episodes of a batch of tasks: tasks with leading dim B, keys [B, E, 2] -> Rollout of [B, E]."""

    def per_task(task, task_keys):
        return jax.vmap(lambda k: rollout(graph, params, fns, cost_params, task, k, greedy))(task_keys)

    return jax.vmap(per_task)(tasks, keys)


decode = jax.jit(batch_rollouts, static_argnums=(0, 2, 6))


def reinforce_loss(graph, params, fns, cost_params, tasks: TaskArrays, keys, entropy_weight: float):
    """REINFORCE with returns standardised per task over its episodes, plus an entropy bonus."""
    out = batch_rollouts(graph, params, fns, cost_params, tasks, keys, False)
    returns = -out.cost_ms  # [B, E]
    advantage = (returns - returns.mean(1, keepdims=True)) / (returns.std(1, keepdims=True) + 1e-6)
    advantage = jax.lax.stop_gradient(advantage)
    loss = -(advantage * out.log_prob).mean() - entropy_weight * out.entropy.mean()
    return loss, out


def plan_from_actions(task: Task, order: np.ndarray, actions: np.ndarray) -> Plan:
    """The table-wise plan of an episode (actions per placement-order slot)."""
    devices = [0] * task.num_tables
    for slot, table in enumerate(order):
        devices[int(table)] = int(actions[slot])
    return Plan.from_assignment(task, [1] * task.num_tables, [[d] for d in devices])
