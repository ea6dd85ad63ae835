"""``python -m neuroshard_jax.train [dataset=DIR out=DIR train.epochs=200]``: train the neural cost models.

Reads compute.jsonl (and comm.jsonl if present) from ``dataset``, trains in log space with optax,
keeps the best-validation weights, prints test MAPE / RMSE / Kendall tau next to the analytic model's,
and saves an orbax checkpoint to ``out``. Settings live in conf/train.yaml.
"""

from __future__ import annotations

import dataclasses
import json

import hydra
from omegaconf import DictConfig

from neuroshard_jax.cli import fail, resolved, run_app
from neuroshard_jax.config import typed
from neuroshard_jax.errors import UserError
from neuroshard_jax.neural import NetConfig
from neuroshard_jax.training import TrainConfig, train_models


@dataclasses.dataclass(frozen=True)
class TrainAppConfig:
    """conf/train.yaml."""

    dataset: str = "neuroshard_jax/data/profiles/cpu-b4096"
    out: str = "checkpoints/cpu-b4096"
    net: NetConfig = NetConfig()
    train: TrainConfig = TrainConfig()


def app_config(cfg: DictConfig) -> TrainAppConfig:
    return typed(TrainAppConfig, resolved(cfg))


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="train")
def main(cfg: DictConfig) -> None:
    try:
        config = app_config(cfg)
        report = train_models(config.dataset, config.net, config.train, config.out)
    except UserError as err:
        fail(err)
    print(json.dumps(report, indent=1))
    print(f"checkpoint written to {config.out}")


if __name__ == "__main__":
    run_app(main, "train", app_config)
