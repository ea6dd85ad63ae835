"""Cost models by name (``conf/cost_model/``): the analytic roofline, or a trained neural checkpoint.

    model = make_cost_model("neural", task)            # checked against the task's batch size and precision
    model = load_cost_model("neural")                  # the shipped checkpoint, for use in your own JAX code
    model = load_cost_model("path/to/checkpoint")      # a checkpoint of python -m neuroshard_jax.train
    model = load_cost_model("analytic", batch_size=4096)
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from neuroshard_jax.analytic import ANALYTIC_FNS, AnalyticConfig, analytic_model, analytic_params
from neuroshard_jax.checkpoints import load_checkpoint
from neuroshard_jax.config import typed
from neuroshard_jax.constants import SHIPPED_CHECKPOINT
from neuroshard_jax.cost_models import CostModel
from neuroshard_jax.datasets import package_path
from neuroshard_jax.errors import UserError
from neuroshard_jax.neural import neural_cost_model
from neuroshard_jax.types import Task


@dataclasses.dataclass(frozen=True)
class NeuralConfig:
    checkpoint: str | None = None  # None: the checkpoint shipped in the package


@functools.lru_cache(maxsize=4)
def _load_neural(path: str) -> tuple[CostModel, dict]:
    _, nets, params, meta = load_checkpoint(path)
    return neural_cost_model(nets, params), meta


def neural_checkpoint(config: NeuralConfig = NeuralConfig()) -> tuple[CostModel, dict, str]:
    """(model, meta.json, path) of the configured checkpoint (the shipped one by default)."""
    path = config.checkpoint or str(package_path(SHIPPED_CHECKPOINT))
    if not (Path(path) / "meta.json").exists():
        raise UserError(
            f"cost_model.checkpoint: no neural cost model at {path!r}; expected a checkpoint written by "
            "python -m neuroshard_jax.train (or use cost_model=analytic)"
        )
    model, meta = _load_neural(str(Path(path).resolve()))
    return model, meta, path


def neural_model(task: Task, config: NeuralConfig = NeuralConfig()) -> CostModel:
    """The trained Flax cost model; its batch size and precision must be the task's."""
    model, meta, path = neural_checkpoint(config)
    for field, trained in (("batch_size", meta["batch_size"]), ("precision", meta.get("precision", "fp32"))):
        if getattr(task, field) != trained:
            raise UserError(
                f"task.{field}: got {getattr(task, field)!r}, but the neural cost model at {path!r} was trained at "
                f"{field} {trained!r}; expected the same (or cost_model=analytic)"
            )
    return model


COST_MODELS = {"analytic": (analytic_model, AnalyticConfig), "neural": (neural_model, NeuralConfig)}


def cost_model_config(name: str, options: dict | None = None):
    """The typed config of cost model ``name`` from ``options`` (unknown names or options raise UserError)."""
    if name not in COST_MODELS:
        raise UserError(f"cost_model: got {name!r}, expected one of {', '.join(sorted(COST_MODELS))}")
    return typed(COST_MODELS[name][1], options, "cost_model")


def make_cost_model(name: str, task: Task, options: dict | None = None) -> CostModel:
    """Build a cost model by name with ``options`` (the fields of its config, from conf/cost_model/)."""
    return COST_MODELS[name][0](task, cost_model_config(name, options))


def load_cost_model(
    name_or_path: str = "neural", *, batch_size: int = 4096, precision: str = "fp32", **options
) -> CostModel:
    """A cost model to call from your own code: ``"neural"`` (the shipped checkpoint), a checkpoint directory,
    or ``"analytic"`` (at ``batch_size`` and ``precision``, with AnalyticConfig ``options``).

    A neural model scores at the batch size and precision it was trained at (``model.params`` holds them in
    the checkpoint's meta.json); ``batch_size`` and ``precision`` are ignored for it.
    """
    if name_or_path == "analytic":
        config = typed(AnalyticConfig, options, "load_cost_model")
        return CostModel("analytic", ANALYTIC_FNS, analytic_params(batch_size, precision, config))
    checkpoint = None if name_or_path == "neural" else name_or_path
    if options:
        raise UserError(f"load_cost_model: options {sorted(options)} apply to 'analytic' only")
    return neural_checkpoint(NeuralConfig(checkpoint))[0]
