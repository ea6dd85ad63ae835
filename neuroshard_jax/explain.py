"""Plans that explain themselves: where each device's time goes, what binds, and what changed between two plans.

The command line only; the library is ``neuroshard_jax.measure.breakdown``."""

import hydra
from omegaconf import DictConfig

from neuroshard_jax.core.cli import one_line_errors, run_app
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.measure.breakdown import app_config, explain_file


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="explain")
@one_line_errors
def main(cfg: DictConfig) -> None:
    config = app_config(cfg)
    if not config.plan:
        raise UserError("plan: missing, expected plan=PATH of a plan.json")
    print(explain_file(config))


if __name__ == "__main__":
    run_app(main, "explain", app_config)
