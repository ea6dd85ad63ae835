"""``python -m neuroshard_jax.loop [out=DIR rounds=3 tasks=30]``: pre-train, search, measure, learn.

The command line only; the library is ``neuroshard_jax.learn.feedback_loop``."""

import json

import hydra
from omegaconf import DictConfig

from neuroshard_jax.core.cli import one_line_errors, run_app
from neuroshard_jax.learn.feedback_loop import app_config, run_loop


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="loop")
@one_line_errors
def main(cfg: DictConfig) -> None:
    table = run_loop(app_config(cfg))
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    run_app(main, "loop", app_config)
