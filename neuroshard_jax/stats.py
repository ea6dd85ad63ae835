"""Table statistics from the user's own data: each table's pooling factor and access histogram.

The command line only; the library is ``neuroshard_jax.workloads.statistics``."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from neuroshard_jax.core.cli import one_line_errors, resolved, run_app, writable_folder
from neuroshard_jax.core.config import typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import write_json
from neuroshard_jax.workloads.statistics import StatsConfig, file_stats, stats_file


def app_config(cfg: DictConfig) -> StatsConfig:
    return typed(StatsConfig, resolved(cfg))


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="stats")
@one_line_errors
def main(cfg: DictConfig) -> None:
    config = app_config(cfg)
    if not config.data:
        raise UserError("data: missing, expected data=PATH of an .npz of features or a DLRM benchmark file")
    if Path(config.out).is_dir():
        raise UserError(f"out: {config.out!r} is a folder, expected a file name (e.g. tables.json)")
    writable_folder(Path(config.out).parent, "out")
    tables = file_stats(
        config.data, config.batch_size, config.format, config.max_batches, config.progress, config.row_blocks
    )
    write_json(stats_file(tables, config.batch_size, Path(config.data).name), config.out)
    for t in tables:
        print(f"{t.name}: {t.rows} rows, pooling factor {t.pooling_factor:.2f}, {t.batches} batches of {t.batch_size}")
    print(f"statistics of {len(tables)} tables written to {config.out}")


if __name__ == "__main__":
    run_app(main, "stats", app_config)
