"""Export a plan to TorchRec.

The command line only; the library is ``neuroshard_jax.torchrec.plan_export``."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from neuroshard_jax.core.cli import one_line_errors, run_app
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import output_file
from neuroshard_jax.core.hardware import check_rank_room
from neuroshard_jax.core.plan_file import load_plan
from neuroshard_jax.kernels.torchrec_export import check_torchrec, expected_local_shards, export_torchrec
from neuroshard_jax.torchrec.plan_export import app_config


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="export")
@one_line_errors
def main(cfg: DictConfig) -> None:
    config = app_config(cfg)
    if not config.plan:
        raise UserError("plan: missing, expected plan=PATH of a plan.json")
    plan = load_plan(config.plan)
    output = output_file(config.output or Path(config.plan).with_suffix(".torchrec.pt"), "output")
    if output.resolve() == Path(config.plan).resolve():
        raise UserError(f"output: {str(output)!r} is the plan being exported, expected another file")
    if output.exists() and not config.overwrite:  # never a file this run did not write, unless told
        raise UserError(f"output: {str(output)!r} exists, expected a new file (overwrite=true replaces it)")
    modules = sum(part.total for part in plan.memory())  # what the check's ranks build, all of them
    if config.check:
        check_rank_room(plan.task.num_devices, modules, "check")
    request, _ = export_torchrec(plan, output, config)
    tables, ranks = len(request.tables), request.world_size
    print(f"TorchRec ShardingPlan of {tables} tables on {ranks} ranks written to {output}")
    if config.check:
        for report in check_torchrec(output, request, config.check_batch_size, config.timeout_s, modules):
            rank = report.rank
            if report.local_shards != expected_local_shards(request, rank):
                raise UserError(f"check: rank {rank} holds {report.local_shards}, expected the plan's shards")
            if report.max_abs_error > 1e-4:
                raise UserError(f"check: rank {rank} outputs differ by {report.max_abs_error:.2e}")
            print(
                f"rank {rank}: {len(report.local_shards)} shards, forward {report.output_shape} "
                f"(max abs error {report.max_abs_error:.1e}), backward ok"
            )


if __name__ == "__main__":
    run_app(main, "export", app_config)
