"""The supervised training loop every neural cost model shares: AdamW with cosine decay over a jitted step on
``(graphdef, state)``, seeded shuffles, full batches only (one compiled shape), the best-validation weights kept."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from neuroshard_jax.core.config import bounded, check_bounds
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.progress import progress_bar


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    epochs: int = bounded(at_least=1, default=300)
    # small batches generalise better here (test MAPE 7.4% vs 11.5% at 256)
    batch_size: int = bounded(at_least=1, default=32)
    learning_rate: float = bounded(above=0, default=3e-3)  # AdamW, cosine decay to final_lr_fraction x this
    weight_decay: float = bounded(at_least=0, default=1e-4)  # AdamW
    # cosine decay of the learning rate to this fraction at the last epoch
    final_lr_fraction: float = bounded(at_least=0, default=0.01)
    seed: int = bounded(at_least=0, default=0)
    split: tuple[float, float, float] = (0.8, 0.1, 0.1)
    progress: bool = True

    def __post_init__(self):
        check_bounds(self, "train.")
        if len(self.split) != 3 or min(self.split) < 0 or not self.split[0] > 0 or abs(sum(self.split) - 1) > 1e-6:
            raise UserError(f"train.split: got {list(self.split)}, expected 3 shares >= 0 summing to 1, train > 0")


def fit(
    graphdef: nnx.GraphDef | None,
    state: nnx.State,
    loss_fn: Callable,
    arrays: tuple[np.ndarray, ...],
    train_idx: np.ndarray,
    val_idx: np.ndarray,
    config: TrainConfig,
    desc: str,
    until: float | None = None,
) -> tuple[nnx.State, list[dict]]:
    """AdamW with cosine decay on ``loss_fn(model, *batch)`` (``model``: the merged module, or the raw state when
    ``graphdef`` is None); returns the best-validation state and the history. ``until``: a ``time.monotonic()``
    deadline after which no epoch is started (the first always runs; the history says how many did)."""
    batch_size = min(config.batch_size, len(train_idx))
    steps = config.epochs * max(1, len(train_idx) // batch_size)
    schedule = optax.cosine_decay_schedule(config.learning_rate, steps, alpha=config.final_lr_fraction)
    tx = optax.adamw(schedule, weight_decay=config.weight_decay)
    opt_state = tx.init(state)

    model = (lambda s: s) if graphdef is None else (lambda s: nnx.merge(graphdef, s))

    @jax.jit
    def step(state, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda s: loss_fn(model(s), *batch))(state)
        updates, opt_state = tx.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss

    @jax.jit
    def evaluate(state, batch):
        return loss_fn(model(state), *batch)

    val = tuple(jnp.asarray(a[val_idx]) for a in arrays)
    rng = np.random.default_rng([config.seed, 99])
    best_state, best_loss, history = state, np.inf, []
    bar = progress_bar(range(config.epochs), enabled=config.progress, desc=desc)
    for epoch in bar:
        if epoch and until is not None and time.monotonic() >= until:
            break
        order = rng.permutation(train_idx)
        losses = []
        for start in range(0, len(order) - batch_size + 1, batch_size):  # full batches: one compiled shape
            idx = order[start : start + batch_size]
            state, opt_state, loss = step(state, opt_state, tuple(jnp.asarray(a[idx]) for a in arrays))
            losses.append(float(loss))
        val_loss = float(evaluate(state, val)) if len(val_idx) else float(np.mean(losses))
        if val_loss < best_loss:
            best_state, best_loss = state, val_loss
        history.append({"epoch": epoch, "train_loss": float(np.mean(losses)), "val_loss": val_loss})
        bar.set_postfix(train=f"{np.mean(losses):.4f}", val=f"{val_loss:.4f}", best=f"{best_loss:.4f}")
    return best_state, history
