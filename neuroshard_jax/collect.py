"""Collect cost labels on real kernels.

The command line only; the library is ``neuroshard_jax.learn.cost_labels``."""

import signal
import sys

import hydra
from omegaconf import DictConfig

from neuroshard_jax.core.cli import one_line_errors, run_app
from neuroshard_jax.learn.cost_labels import collect, config_from, stop_on_sigterm


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="collect")
@one_line_errors
def main(cfg: DictConfig) -> None:
    signal.signal(signal.SIGTERM, stop_on_sigterm)  # a polite stop still updates the manifest
    try:
        summary = collect(config_from(cfg))
    except KeyboardInterrupt:
        print("stopped; rerun the same command to continue", file=sys.stderr)
        sys.exit(130)
    print(f"{summary['records']} records ({summary['failed']} failed) in {summary['path']}", file=sys.stderr)


if __name__ == "__main__":
    run_app(main, "collect", config_from)
