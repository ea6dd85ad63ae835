"""The cost model corrected on one task's own measured devices: NeuroShard's measure-and-learn step, on the task.

``autotune=loop`` measures its candidates' devices on the real kernels, then asks the model to price those devices as
measured. It learns one number per table of the task: how much heavier or lighter that table is than the model
thinks (``CostModel.with_table_scales``: the latent of every shard of the table scaled by it), a few hundred Adam steps
on the squared log error of the measured devices, each scale held near 1 by an L2 prior. A table is a unit every plan
shares, so what the measured devices teach about a hot table moves every placement that holds it, measured or not;
the model's own weights are not touched (tuning them all fits a task's few dozen devices exactly and teaches the
search nothing about the placements it has not measured: 2026-11-29, docs/results/autotune-loop.md). How well the
correction carries to unmeasured devices is measured, not assumed: ``TaskFit.mape_held_out`` is the corrected
model's error on devices it was not fitted on (k-fold over the measured devices), and where that is no better than the
model's own error on them, the model is returned as it was. JAX and optax only.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from neuroshard_jax.core.records import fit_words
from neuroshard_jax.costs.cost_model import CostModel, Scaled, device_compute_ms

STEPS = 300  # Adam steps on the task's devices
LEARNING_RATE = 0.05  # on log scales: a table 2x off is reached in tens of steps
# the weights of the mean squared log scale against the mean squared log error (a 10% miss: 0.009) tried; the one
# whose fits predict held-out devices best is used, and only where that beats the model as it is
PRIORS = (0.002, 0.02, 0.2)
FOLDS = 4  # the held-out figure: each quarter of the measured devices predicted by a fit on the rest


@dataclasses.dataclass(frozen=True)
class TaskFit:
    """What the correction did on the measured devices: their count, the model's MAPE on them before and after, the
    corrected model's MAPE on measured devices it was not fitted on (the best prior's; None: fewer than 2 x FOLDS
    devices, too few to hold any out, so nothing is corrected), and that prior (None: the model kept as it was). Its
    fields are ``LoopRecord``'s: autotune=loop records the last fit as it is."""

    devices: int
    mape_before: float
    mape_after: float
    mape_held_out: float | None = None
    prior: float | None = None

    def words(self) -> str:
        """What the fit did, in a clause (``records.fit_words``)."""
        return fit_words(self.devices, self.mape_before, self.mape_after, self.mape_held_out, self.prior)

    @property
    def kept(self) -> bool:
        """Whether the corrected model replaced the model: it priced devices it was not fitted on better than the
        model as it is prices them."""
        return self.prior is not None


def _mape(predicted, measured) -> float:
    return float(np.mean(np.abs(np.asarray(predicted, np.float64) / np.asarray(measured, np.float64) - 1)))


def _with_scale(params, log_scale):
    """``TableScaled`` params (under ``Scaled``, if any) with ``log_scale`` in place."""
    if isinstance(params, Scaled):
        return params._replace(inner=params.inner._replace(log_scale=log_scale))
    return params._replace(log_scale=log_scale)


@functools.partial(jax.jit, static_argnums=0)
def _predict(fns, params, log_scale, feats, mask):
    return device_compute_ms(fns, _with_scale(params, log_scale), feats, mask)


@functools.partial(jax.jit, static_argnums=0)
def _fit(fns, params, feats, mask, measured_ms, weights, prior):
    """f32[T]: the log scales of a ``with_table_scales`` model's tables that make its compute of the devices ``feats``
    f32[D, T, F] / ``mask`` bool[D, T] read ``measured_ms`` f32[D]; ``weights`` f32[D] says which devices it learns
    from (0: held out); ``prior`` the weight of the scales' L2 prior. Everything is an argument (no constants for XLA
    to fold, one compilation for every prior and fold)."""
    start = (params.inner if isinstance(params, Scaled) else params).log_scale
    optimizer = optax.adam(LEARNING_RATE)
    target = jnp.log(measured_ms)

    def loss(log_scale):
        error = jnp.log(jnp.maximum(_predict(fns, params, log_scale, feats, mask), 1e-6)) - target
        return jnp.sum(weights * error**2) / jnp.maximum(weights.sum(), 1.0) + prior * jnp.mean(log_scale**2)

    def step(carry, _):
        log_scale, state = carry
        updates, state = optimizer.update(jax.grad(loss)(log_scale), state, log_scale)
        return (optax.apply_updates(log_scale, updates), state), None

    (log_scale, _), _ = jax.lax.scan(step, (start, optimizer.init(start)), None, length=STEPS)
    return log_scale


def tuned_on_devices(
    model: CostModel, feats: np.ndarray, mask: np.ndarray, measured_ms: np.ndarray, keys: np.ndarray, seed: int = 0
) -> tuple[CostModel, TaskFit]:
    """``model`` with a scale per table of the task (``keys`` f32[T, F], ``cost_model.table_keys``) fitted so that
    its compute of the devices ``feats`` f32[D, T, F] (``mask`` bool[D, T]) reads ``measured_ms`` f64[D]; the fit's
    figures. Each prior of ``PRIORS`` is tried on ``FOLDS`` folds drawn by ``seed`` (each fold's devices predicted by
    a fit on the others); the best one is fitted on every device and used only where its held-out MAPE beats the
    model's own MAPE on the devices: a correction that does not carry to devices it did not see is not made. The
    search's risk term and calibration scale stay as they were."""
    zeros = np.zeros(len(keys), np.float32)
    expected = model.expected.with_table_scales(keys, zeros)
    feats, mask = jnp.asarray(feats, jnp.float32), jnp.asarray(mask, bool)
    measured = jnp.asarray(measured_ms, jnp.float32)
    d = len(measured_ms)

    def fit(weights, prior):
        return _fit(expected.fns, expected.params, feats, mask, measured, weights, jnp.float32(prior))

    def predict(log_scale):
        return np.asarray(_predict(expected.fns, expected.params, log_scale, feats, mask))

    before = _mape(predict(jnp.asarray(zeros)), measured_ms)
    if d < 2 * FOLDS:  # nothing to hold out: a correction that cannot be checked is not made
        return model, TaskFit(d, before, before)
    fold = np.random.default_rng(seed).permutation(d) % FOLDS
    held_out = {}
    for prior in PRIORS:
        predicted = np.zeros(d)
        for k in range(FOLDS):
            predicted[fold == k] = predict(fit(jnp.asarray(fold != k, jnp.float32), prior))[fold == k]
        held_out[prior] = _mape(predicted, measured_ms)
    prior = min(PRIORS, key=lambda p: held_out[p])  # the first of equals: the weakest prior
    log_scale = fit(jnp.ones(d, jnp.float32), prior)
    after = _mape(predict(log_scale), measured_ms)
    if held_out[prior] >= before:  # it carries to no device it did not see better than the model as it is
        return model, TaskFit(d, before, before, held_out[prior])
    tuned = model.with_table_scales(keys, np.asarray(log_scale))
    fitted = TaskFit(d, before, after, held_out[prior], prior)
    return dataclasses.replace(tuned, name=f"{model.name} (tables scaled on the task)"), fitted
