"""The cost model corrected on one task's own measured devices: NeuroShard's measure-and-learn step, on the task.

``autotune=loop`` measures its candidates' devices on the real kernels, then asks the model to price those devices as
measured. It learns one number per table of the task: how much heavier or lighter that table is than the model
thinks (``CostModel.with_table_scales``: the latent of every shard of the table scaled by it), a few hundred Adam steps
on the squared log error of the measured devices, each scale held near 1 by an L2 prior. A table is a unit every plan
shares, so what the measured devices teach about a hot table moves every placement that holds it, measured or not;
the model's own weights are not touched (tuning them all fits a task's few dozen devices exactly and teaches the
search nothing about the placements it has not measured: 2026-11-29, docs/results/autotune-loop.md). How well the
correction carries to unmeasured devices is measured, not assumed: ``TaskFit.mape_held_out`` is the corrected
model's error on devices it was not fitted on (k-fold over the measured devices). Where the correction does not
lower the error on the measured devices, the model is returned as it was. JAX and optax only.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from neuroshard_jax.costs.cost_model import CostModel, Scaled, device_compute_ms

STEPS = 300  # Adam steps on the task's devices
LEARNING_RATE = 0.05  # on log scales: a table 2x off is reached in tens of steps
PRIOR = 0.02  # weight of the mean squared log scale against the mean squared log error (a 10% miss: 0.009)
FOLDS = 4  # the held-out figure: each quarter of the measured devices predicted by a fit on the rest


@dataclasses.dataclass(frozen=True)
class TaskFit:
    """What the correction did on the measured devices: their count, the model's MAPE on them before and after, and
    the corrected model's MAPE on measured devices it was not fitted on (None: too few devices to hold any out)."""

    devices: int
    mape_before: float
    mape_after: float
    mape_held_out: float | None = None

    @property
    def kept(self) -> bool:
        """Whether the corrected model replaced the model (it priced the measured devices better)."""
        return self.mape_after < self.mape_before


def _mape(predicted, measured) -> float:
    return float(np.mean(np.abs(np.asarray(predicted, np.float64) / np.asarray(measured, np.float64) - 1)))


def _with_scale(params, log_scale):
    """``TableScaled`` params (under ``Scaled``, if any) with ``log_scale`` in place."""
    if isinstance(params, Scaled):
        return params._replace(inner=params.inner._replace(log_scale=log_scale))
    return params._replace(log_scale=log_scale)


def _fitter(model: CostModel, feats, mask):
    """(fit(measured_ms, weights) -> log scales f32[T], predict(log scales) -> ms f32[D]): the per-table correction of
    ``model`` (a ``with_table_scales`` model) on devices ``feats`` f32[D, T, F] / ``mask`` bool[D, T]; ``weights``
    f32[D] says which devices it learns from (0: held out)."""
    feats, mask = jnp.asarray(feats, jnp.float32), jnp.asarray(mask, bool)
    start = (model.params.inner if isinstance(model.params, Scaled) else model.params).log_scale

    def predict(log_scale):
        return device_compute_ms(model.fns, _with_scale(model.params, log_scale), feats, mask)

    optimizer = optax.adam(LEARNING_RATE)

    @jax.jit
    def fit(measured_ms, weights):
        target = jnp.log(measured_ms)

        def loss(log_scale):
            error = jnp.log(jnp.maximum(predict(log_scale), 1e-6)) - target
            return jnp.sum(weights * error**2) / jnp.maximum(weights.sum(), 1.0) + PRIOR * jnp.mean(log_scale**2)

        def step(carry, _):
            log_scale, state = carry
            updates, state = optimizer.update(jax.grad(loss)(log_scale), state, log_scale)
            return (optax.apply_updates(log_scale, updates), state), None

        (log_scale, _), _ = jax.lax.scan(step, (start, optimizer.init(start)), None, length=STEPS)
        return log_scale

    return fit, jax.jit(predict)


def tuned_on_devices(
    model: CostModel, feats: np.ndarray, mask: np.ndarray, measured_ms: np.ndarray, keys: np.ndarray, seed: int = 0
) -> tuple[CostModel, TaskFit]:
    """``model`` with a scale per table of the task (``keys`` f32[T, F], ``cost_model.table_keys``) fitted so that
    its compute of the devices ``feats`` f32[D, T, F] (``mask`` bool[D, T]) reads ``measured_ms`` f64[D]; the fit's
    figures, the held-out one from ``FOLDS`` folds drawn by ``seed``. The search's risk term and calibration scale
    stay as they were."""
    zeros = np.zeros(len(keys), np.float32)
    expected = model.expected.with_table_scales(keys, zeros)
    fit, predict = _fitter(expected, feats, mask)
    measured = jnp.asarray(measured_ms, jnp.float32)
    d = len(measured_ms)
    log_scale = fit(measured, jnp.ones(d, jnp.float32))
    held_out = None
    if d >= 2 * FOLDS:
        fold = np.random.default_rng(seed).permutation(d) % FOLDS
        predicted = np.zeros(d)
        for k in range(FOLDS):
            scales = fit(measured, jnp.asarray(fold != k, jnp.float32))
            predicted[fold == k] = np.asarray(predict(scales))[fold == k]
        held_out = _mape(predicted, measured_ms)
    fit_figures = TaskFit(d, _mape(predict(jnp.asarray(zeros)), measured_ms), _mape(predict(log_scale), measured_ms))
    fit_figures = dataclasses.replace(fit_figures, mape_held_out=held_out)
    if not fit_figures.kept:
        return model, fit_figures
    tuned = model.with_table_scales(keys, np.asarray(log_scale))
    return dataclasses.replace(tuned, name=f"{model.name} (tables scaled on the task)"), fit_figures
