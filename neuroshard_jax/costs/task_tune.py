"""The cost model fine-tuned on one task's own measured devices: NeuroShard's measure-and-learn step, on the task.

``autotune=loop`` measures its candidates' devices on the real kernels, then asks the model to price those devices as
measured: every float parameter of the model's compute (its table and device networks, an ensemble's members and
roofline terms) takes a few hundred Adam steps on the squared log error of the measured devices, held near where it
started by an L2 anchor (the task's few dozen devices must not unlearn the thousands of labels it was trained on). The
tuned model then searches the same task again. The devices it is tuned on are the task's, so it learns what it got
wrong about these tables on this machine (a hot table priced 20% light, a kernel kind it reads slow), which is the
point; it is not a model to keep. Where tuning does not lower the error on the measured devices, the model is returned
as it was. JAX and optax only.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from neuroshard_jax.costs.cost_model import CostModel, Scaled, device_compute_ms

STEPS = 300  # Adam steps on the task's devices
LEARNING_RATE = 3e-3
ANCHOR = 1.0  # weight of the mean squared change of the parameters (in their own units) against the log error


@dataclasses.dataclass(frozen=True)
class TaskFit:
    """What tuning did on the measured devices: their count and the model's MAPE on them before and after."""

    devices: int
    mape_before: float
    mape_after: float

    @property
    def kept(self) -> bool:
        """Whether the tuned model replaced the model (it priced the measured devices better)."""
        return self.mape_after < self.mape_before


def _trainable(leaf) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray)) and jnp.issubdtype(leaf.dtype, jnp.floating)


def tuned_on_devices(
    model: CostModel, feats: np.ndarray, mask: np.ndarray, measured_ms: np.ndarray, seed: int = 0
) -> tuple[CostModel, TaskFit]:
    """``model`` fine-tuned so that its compute of the devices ``feats`` f32[D, T, F] (``mask`` bool[D, T]) reads
    ``measured_ms`` f64[D]; the fit's figures. The search's risk term and calibration scale stay as they were."""
    expected = model.expected
    start = expected.own_params
    leaves, treedef = jax.tree_util.tree_flatten(start)
    where = [i for i, leaf in enumerate(leaves) if _trainable(leaf)]
    first = [jnp.asarray(leaves[i]) for i in where]
    feats, mask = jnp.asarray(feats, jnp.float32), jnp.asarray(mask, bool)
    target = jnp.log(jnp.asarray(measured_ms, jnp.float32))

    def rebuilt(base_leaves, train):
        out = list(base_leaves)
        for i, value in zip(where, train):
            out[i] = value
        return treedef.unflatten(out)

    def params_of(train):
        inner = rebuilt(leaves, train)
        return expected.params._replace(inner=inner) if isinstance(expected.params, Scaled) else inner

    def predicted(train):
        return device_compute_ms(expected.fns, params_of(train), feats, mask)

    def loss(train):
        error = jnp.mean((jnp.log(jnp.maximum(predicted(train), 1e-6)) - target) ** 2)
        moved = sum(jnp.mean((t - t0) ** 2) for t, t0 in zip(train, first)) / max(len(first), 1)
        return error + ANCHOR * moved

    optimizer = optax.adam(LEARNING_RATE)

    @jax.jit
    def step(train, state):
        grads = jax.grad(loss)(train)
        updates, state = optimizer.update(grads, state, train)
        return optax.apply_updates(train, updates), state

    def mape(train) -> float:
        pred = np.asarray(predicted(train), np.float64)
        return float(np.mean(np.abs(pred / np.asarray(measured_ms, np.float64) - 1)))

    train, state = list(first), optimizer.init(list(first))
    for _ in range(STEPS):
        train, state = step(train, state)
    fit = TaskFit(int(len(measured_ms)), mape(first), mape(train))
    if not fit.kept:
        return model, fit
    own = model.own_params  # the model's own (with its risk term): the tuned leaves put in place
    own_leaves = jax.tree_util.tree_flatten(own)[0]
    tuned = rebuilt(own_leaves, train)
    params = model.params._replace(inner=tuned) if isinstance(model.params, Scaled) else tuned
    return dataclasses.replace(model, params=params, name=f"{model.name} (tuned on the task)"), fit
