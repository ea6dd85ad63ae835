"""``python -m neuroshard_jax.train_policy [out=DIR train.rounds=8 refine.plans_per_round=2]``: train the
DreamShard-style placement policy (conf/train_policy.yaml).

The command line only; the library is ``neuroshard_jax.learn.policy_training``."""

import json

import hydra
from omegaconf import DictConfig

from neuroshard_jax.core.cli import one_line_errors, run_app
from neuroshard_jax.learn.policy_training import app_config, train_policy


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="train_policy")
@one_line_errors
def main(cfg: DictConfig) -> None:
    config = app_config(cfg)
    result = train_policy(config.out, config.policy, config.train, config.tasks, config.refine, config.cost_model)
    print(json.dumps(result.history[-1:], indent=1))
    print(f"policy written to {config.out} (rounds done: {result.rounds_done})")


if __name__ == "__main__":
    run_app(main, "train_policy", app_config)
