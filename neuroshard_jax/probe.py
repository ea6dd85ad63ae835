"""Is this machine the kind of hardware a dataset was measured on? Re-measure some of its records here and compare.

    python -m neuroshard_jax.probe dataset=DATASET_DIR [samples=24 workers=2 seed=0 out=FILE record=true]

The command line only; the library is ``neuroshard_jax.measure.hardware_probe``."""

import sys

import hydra
from omegaconf import DictConfig

from neuroshard_jax.core.cli import one_line_errors, run_app
from neuroshard_jax.measure.hardware_probe import app_config, probe


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="probe")
@one_line_errors
def main(cfg: DictConfig) -> None:
    try:
        result, out = probe(app_config(cfg))
    except KeyboardInterrupt:
        sys.exit(130)
    verdict = "measures like" if result["same_kind"] else "does NOT measure like"
    stats = result["ratio_here_over_there"]
    print(
        f"this machine ({result['here']['kind']}) {verdict} {result['dataset']} ({result['there']['kind']}): "
        f"here/there median {stats['median']} (p10 {stats['p10']}, p90 {stats['p90']}) over {result['quiet']} "
        f"records; {out}"
    )


if __name__ == "__main__":
    run_app(main, "probe", app_config)
