"""Compare searchers from a Hydra multirun directory: a markdown table and PNG plots.

    python -m neuroshard_jax.compare sweep=multirun/compare/<time> [out=DIR]

The command line only; the library is ``neuroshard_jax.measure.searcher_comparison``."""

import hydra
from omegaconf import DictConfig

from neuroshard_jax.core.cli import one_line_errors, run_app
from neuroshard_jax.measure.searcher_comparison import app_config, compare_sweep


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="compare")
@one_line_errors
def main(cfg: DictConfig) -> None:
    print(compare_sweep(app_config(cfg)), end="")


if __name__ == "__main__":
    run_app(main, "compare", app_config)
