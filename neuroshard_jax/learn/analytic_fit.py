"""The analytic (roofline) model's constants fitted to a measured dataset, so that it is a fair baseline.

    python -m neuroshard_jax.train family=analytic datasets=[neuroshard_jax/data/profiles/cpu-b4096] steps=3000

Fits memory bandwidth, kernel and per-table overheads (compute labels) and all-to-all bandwidth and latency (comm
labels) by minimising the squared log error on the training split (the same seeded 80/10/10 split as the neural
model); reports the test split's metrics and the constants, which ``cost_model=analytic cost_model.NAME=VALUE``
takes (the shipped defaults are ``core.constants``' ``ANALYTIC_*``). The backward/forward byte ratio stays at
TorchRec's 2 (it is not identifiable from fwd+bwd totals apart from the bandwidth).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.paths import resolve_dataset
from neuroshard_jax.costs.analytic import ANALYTIC_FNS, AnalyticConfig, AnalyticParams, analytic_params
from neuroshard_jax.costs.cost_model import device_compute_ms
from neuroshard_jax.learn.datasets import comm_arrays, compute_arrays, split_indices
from neuroshard_jax.learn.metrics import metrics
from neuroshard_jax.learn.trainer import TrainConfig

FITTED = ("mem_bw_gbps", "kernel_overhead_ms", "table_overhead_ms", "comm_bw_gbps", "comm_latency_ms")


def params_of(log_values, base: AnalyticParams) -> AnalyticParams:
    return base._replace(**{name: jnp.exp(log_values[i]) for i, name in enumerate(FITTED)})


def fit_analytic(dataset: str, steps: int, split: tuple[float, float, float] = TrainConfig().split) -> JSONDoc:
    """The fitted constants, the final training loss and the test split's metrics (compute, fwd and bwd comm)."""
    dataset = resolve_dataset(dataset)
    feats, mask, target, manifest = compute_arrays(dataset)
    dims, delays, cmask, fwd_ms, bwd_ms, _ = comm_arrays(dataset)
    train, _, test = split_indices(len(target), split, 0)
    ctrain, _, ctest = split_indices(len(dims), split, 0)
    settings = manifest["settings"]
    start = AnalyticConfig()
    base = analytic_params(int(settings["batch_size"]), settings.get("precision", "fp32"), start)

    def predict(p, idx, cidx):
        compute = device_compute_ms(ANALYTIC_FNS, p, feats[idx], mask[idx])
        bwd = ANALYTIC_FNS.bwd_comm(p, dims[cidx], cmask[cidx])
        fwd = ANALYTIC_FNS.fwd_comm(p, dims[cidx], delays[cidx], cmask[cidx])
        return compute, fwd, bwd

    def loss(log_values):
        compute, fwd, bwd = predict(params_of(log_values, base), train, ctrain)
        m = cmask[ctrain]

        def comm_err(pred, true):
            err = (jnp.log(jnp.maximum(pred, 1e-4)) - jnp.log(jnp.maximum(true, 1e-3))) ** 2
            return jnp.sum(jnp.where(m, err, 0.0)) / m.sum()

        compute_err = jnp.mean((jnp.log(compute) - jnp.log(target[train])) ** 2)
        return compute_err + comm_err(fwd, fwd_ms[ctrain]) + comm_err(bwd, bwd_ms[ctrain])

    tx = optax.adam(0.02)
    value_and_grad = jax.jit(jax.value_and_grad(loss))

    def step(carry, _):
        log_values, state = carry
        value, grad = value_and_grad(log_values)
        updates, state = tx.update(grad, state)
        return (optax.apply_updates(log_values, updates), state), value

    log_values = jnp.log(jnp.array([getattr(start, name) for name in FITTED]))
    (log_values, _), losses = jax.lax.scan(step, (log_values, tx.init(log_values)), None, length=steps)
    fitted = params_of(log_values, base)
    compute, fwd, bwd = predict(fitted, test, ctest)
    m = cmask[ctest]
    return {
        "constants": {name: round(float(getattr(fitted, name)), 4) for name in FITTED},
        "train_loss": float(losses[-1]),
        "test": {
            "compute": metrics(np.asarray(compute), target[test]),
            "fwd_comm": metrics(np.asarray(fwd)[m], fwd_ms[ctest][m]),
            "bwd_comm": metrics(np.asarray(bwd)[m], bwd_ms[ctest][m]),
        },
    }
