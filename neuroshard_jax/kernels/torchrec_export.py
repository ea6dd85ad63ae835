"""Our plan as a TorchRec ``ShardingPlan``, written by the torch worker (``torchrec-export``), and loaded into
DistributedModelParallel on gloo ranks to check it (``torchrec-run``): the library of ``python -m
neuroshard_jax.export`` (``neuroshard_jax/torchrec/plan_export.py`` says what the command does) and of the full step's
timing (``measure/training_steps.py``). torch is imported only in the worker processes.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from neuroshard_jax.core.constants import TORCHREC_INSTALL
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.kernels.messages import ExportAnswer, ExportJob, RunJob, RunReport, TorchRecTable
from neuroshard_jax.kernels.processes import WorkerFailure, run_ranks, run_worker
from neuroshard_jax.kernels.torchrec_format import row_split_host

FORMATS = ("torchrec",)
DEVICES = ("cuda", "cpu")
KERNELS = ("fused", "dense")


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """conf/export.yaml."""

    plan: str | None = None
    format: str = "torchrec"  # torchrec: a ShardingPlan (torch.save) for DistributedModelParallel
    output: str | None = None  # default: beside the plan, <plan>.torchrec.pt
    # the shards' device type; null: cuda, or cpu with check=true (DistributedModelParallel on this CPU)
    device: str | None = None
    compute_kernel: str = "fused"  # TorchRec's embedding compute kernel (fused: FBGEMM TBE with the optimizer fused)
    # where the EmbeddingBagCollection sits in your model, e.g. sparse_arch.embedding_bag_collection
    module_path: str = ""
    # the tables' names in your collection: {index} = position in the task, {id} = pool id
    table_names: str = "t{index}"
    check: bool = False  # load the plan into DistributedModelParallel here (gloo, one process per rank): fwd + bwd
    overwrite: bool = False  # replace ``output`` where it exists (never the plan itself)
    check_batch_size: int = 8  # bags per rank in the check's forward pass
    timeout_s: float = 600.0

    def __post_init__(self):
        if self.device is None:
            object.__setattr__(self, "device", "cpu" if self.check else "cuda")
        for name, allowed in (("format", FORMATS), ("device", DEVICES), ("compute_kernel", KERNELS)):
            if getattr(self, name) not in allowed:
                raise UserError(f"{name}: got {getattr(self, name)!r}, expected one of {', '.join(allowed)}")
        if self.check and self.device != "cpu":
            raise UserError(
                f"check: true runs DistributedModelParallel on this CPU, expected device=cpu (or none), got "
                f"{self.device!r}"
            )
        try:
            names = [self.table_names.format(index=i, id=i) for i in range(2)]
        except (KeyError, IndexError, ValueError) as err:
            raise UserError(
                f"table_names: got {self.table_names!r} ({err}), expected a pattern of {{index}} and {{id}}"
            ) from None
        if names[0] == names[1]:
            raise UserError(f"table_names: got {self.table_names!r}, expected a pattern with {{index}} or {{id}}")


def torchrec_request(plan: Plan, config: ExportConfig) -> ExportJob:
    """The worker's request: tables {name, rows, dim}, their shards in column order, the world size."""
    task = plan.task
    names = [config.table_names.format(index=i, id=t.id) for i, t in enumerate(task.tables)]
    shards = plan.torchrec_shards()
    cached = [(n, t) for n, t in zip(names, task.tables) if t.cached]
    if cached and config.device != "cuda":
        name, table = cached[0]
        raise UserError(
            f"export: table {name} is in tiered memory (cache_load_factor {table.cache_load_factor:g}) and device is "
            f"{config.device!r}, expected device=cuda (TorchRec's fused_uvm_caching keeps a GPU's cache of host rows)"
        )
    for name, table_shards in zip(names, shards):
        if "num_rows" in table_shards[0]:  # row blocks (a data-parallel table's [{data_parallel: 1}] has none)
            try:
                row_split_host(name, table_shards, task.num_devices, task.local_size() or task.num_devices)
            except ValueError as err:
                raise UserError(f"export: {err}") from None
    return ExportJob(
        tables=tuple(
            TorchRecTable(t.rows, t.dim, n, kernel=t.kernel, precision=t.precision) for n, t in zip(names, task.tables)
        ),
        shards=tuple(shards),
        world_size=task.num_devices,
        local_size=task.local_size() or task.num_devices,  # ranks per host (table_row_wise blocks stay in one)
        device=config.device,
        compute_kernel=config.compute_kernel,
        module_path=config.module_path,
    )


def export_torchrec(plan: Plan, output: str | Path, config: ExportConfig) -> tuple[ExportJob, str]:
    """Write ``plan`` as a TorchRec ShardingPlan to ``output``; returns the worker's request (tables and
    shards) and TorchRec's own printout of the plan as written."""
    request = torchrec_request(plan, config)
    names = [t.name for t in request.tables]
    if len(set(names)) != len(names):
        raise UserError(f"table_names: {config.table_names!r} gives duplicate table names, expected one per table")
    with tempfile.TemporaryDirectory(prefix="neuroshard-export-") as tmp:
        src = Path(tmp) / "request.json"
        src.write_text(json.dumps(request.to_json()))
        done = run_worker(["torchrec-export", str(src), str(output)], config.timeout_s, "export")
    answer = ExportAnswer.from_json(json.loads(done.stdout.strip().splitlines()[-1]))
    if answer.error is not None:
        hint = f"; install it with {TORCHREC_INSTALL}" if "not installed" in answer.error else ""
        raise UserError(f"export: {answer.error}{hint}")
    return request, answer.plan


def check_torchrec(
    exported: str | Path, request: ExportJob, batch_size: int, timeout_s: float, modules_bytes: int = 0
) -> list[RunReport]:
    """Load an exported (device=cpu) plan into DistributedModelParallel, one gloo process per rank, and
    run forward + backward; returns each rank's report (local shards, output shape, max abs error). Refused in one
    line before any rank starts where the ranks and their modules (``modules_bytes`` in all) would not fit here."""
    world = request.world_size
    job = RunJob(str(Path(exported).resolve()), request.tables, request.module_path, batch_size)
    with tempfile.TemporaryDirectory(prefix="neuroshard-dmp-") as tmp:
        tmp = Path(tmp)
        (tmp / "request.json").write_text(json.dumps(job.to_json()))
        try:
            args = ["torchrec-run", str(tmp / "request.json"), str(tmp / "out.{rank}")]
            run_ranks(args, world, tmp, timeout_s, modules_bytes=modules_bytes)
        except WorkerFailure as failure:
            raise UserError(f"check: DistributedModelParallel failed: {failure.reason}") from None
        return [RunReport.from_json(json.loads((tmp / f"out.{rank}").read_text())) for rank in range(world)]


def expected_local_shards(request: ExportJob, rank: int) -> list[list]:
    """[table name, col_offset, dim, row_offset, num_rows] of the shards the plan puts on ``rank``, sorted."""
    return sorted(
        [
            t.name,
            s.get("col_offset", 0),
            s.get("dim", t.dim),
            s.get("row_offset", 0),
            s.get("num_rows", t.rows),
        ]
        for t, shards in zip(request.tables, request.shards)
        for s in shards
        if s.get("data_parallel") or s["rank"] == rank  # a data-parallel table: whole on every rank
    )
