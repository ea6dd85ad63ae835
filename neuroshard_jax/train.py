"""``python -m neuroshard_jax.train [dataset=DIR out=DIR epochs=200]``: train the neural cost models.

Reads compute.jsonl (and comm.jsonl if present) from ``dataset``, trains in log space with optax,
keeps the best-validation weights, prints test MAPE / RMSE / Kendall tau next to the analytic model's,
and saves an orbax checkpoint to ``out``. Settings live in conf/train.yaml.
"""

from __future__ import annotations

import json

import hydra
from omegaconf import DictConfig, OmegaConf

from neuroshard_jax.cli import fail
from neuroshard_jax.errors import UserError


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from neuroshard_jax.neural import NetConfig
    from neuroshard_jax.training import TrainConfig, train_models

    options = OmegaConf.to_container(cfg, resolve=True)
    try:
        net = NetConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in options["net"].items()})
        train = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in options["train"].items()})
        report = train_models(options["dataset"], net, train, options["out"])
    except TypeError as err:
        fail(UserError(f"train config: {err}"))
    except UserError as err:
        fail(err)
    print(json.dumps(report, indent=1))
    print(f"checkpoint written to {options['out']}")


if __name__ == "__main__":
    main()
