"""Two cost models or more on the suite's held-out tasks, measured side by side: is a new default a regression?

    python -m neuroshard_jax.compare_models models=[xeon-union,MY_CHECKPOINT] [devices=[8] tasks=10 repeats=3]

The command line only; the library is ``neuroshard_jax.search.model_comparison``."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from neuroshard_jax.core.cli import one_line_errors, run_app
from neuroshard_jax.core.files import write_json
from neuroshard_jax.search.model_comparison import app_config, compare_models


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="compare_models")
@one_line_errors
def main(cfg: DictConfig) -> None:
    config = app_config(cfg)
    result = compare_models(config)
    write_json(result, Path(config.out))
    for n, summary in result["summary"].items():
        print(f"{n} devices: {summary}")
    print(f"written to {config.out}")


if __name__ == "__main__":
    run_app(main, "compare_models", app_config)
