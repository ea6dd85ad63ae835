"""``python -m neuroshard_jax.adapt budget_min=10 [device=cuda]``: a cost model of this machine in minutes.

The command line only; the library is ``neuroshard_jax.learn.fine_tune``."""

import signal
import sys

import hydra
from omegaconf import DictConfig

from neuroshard_jax.core.cli import one_line_errors, run_app
from neuroshard_jax.learn.cost_labels import stop_on_sigterm
from neuroshard_jax.learn.fine_tune import adapt, app_config


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="adapt")
@one_line_errors
def main(cfg: DictConfig) -> None:
    signal.signal(signal.SIGTERM, stop_on_sigterm)  # a polite stop keeps the time spent
    try:
        report = adapt(app_config(cfg))
    except KeyboardInterrupt:
        print("stopped; rerun the same command to continue", file=sys.stderr)
        sys.exit(130)
    if report.get("registered"):
        print(f"model: {report['registered']}")
    else:
        why = report.get("worse") or "register=false"
        print(f"model: {report['name']} (not registered: {why})")


if __name__ == "__main__":
    run_app(main, "adapt", app_config)
