"""``searcher=torchrec``: TorchRec's EmbeddingShardingPlanner as the outside baseline.

The planner runs in the torch worker subprocess (``python -m neuroshard_jax.kernels.worker torchrec-plan``), the only
place torch is imported:
tables as EmbeddingBagConfigs on the meta device, a Topology of N ranks with the task's memory cap, pooling
factors as constraints, sharding types table_wise and column_wise (more when asked: ``searcher.sharding_types``),
the fused kernel (the dense one for data_parallel). ``searcher=torchrec_default`` is the planner with every sharding
type its users get by default: data_parallel, table_wise, column_wise, row_wise, table_row_wise. Its plan is
converted to ours (a table's column shards must be 2^k equal widths; a data-parallel table is one of the plan's
``data_parallel``) and then scored and measured like any other. Needs the ``torchrec`` install (docs/installing.md).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import ClassVar

from neuroshard_jax.core.constants import TORCHREC_INSTALL
from neuroshard_jax.core.constraints import max_levels
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard, row_shards, tiling_error
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.kernels.messages import PlanAnswer, PlanJob, TorchRecTable
from neuroshard_jax.kernels.processes import run_worker
from searchers.registry import Searcher, register

SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise")
DEFAULT_SHARDING_TYPES = ("table_wise", "column_wise")
RESERVATIONS = ("heuristic", "percent")


def plan_from_torchrec(task: Task, shards: list[list[dict]], tiered: bool = False) -> Plan:
    """Our plan from TorchRec's per-table shards; a table's shards must tile it by our split rule
    (``sharding.tiling_error``: 2^k equal column slices; row-wise: TorchRec's row blocks over every rank); a table
    TorchRec put in tiered memory (``fused_uvm_caching``) is so in the plan's task, at TorchRec's load factor; where
    TorchRec chose the tiered memory (``tiered``), a table it kept in the device's memory is so too."""
    out, replicated = [], []
    tables = list(task.tables)
    for t, table_shards in enumerate(shards):
        table = task.tables[t]
        cached = table_shards[0].get("cache_load_factor") if table_shards else None
        if (cached is not None or tiered) and cached != table.cache_load_factor:  # TorchRec's tiered memory
            tables[t] = dataclasses.replace(table, cache_load_factor=None if cached is None else float(cached))
        if table_shards and table_shards[0].get("data_parallel"):
            replicated.append(t)
            continue
        ours = [
            Shard(t, s["col_offset"], s["dim"], s["rank"], s.get("row_offset", 0), s.get("num_rows"))
            for s in table_shards
        ]
        if tiling_error(table.dim, table.rows, ours):
            ours = _recut_row_blocks(t, table, table_shards) or ours
        error = tiling_error(table.dim, table.rows, ours)
        if error:
            widths = [s["dim"] for s in sorted(table_shards, key=lambda s: s["col_offset"])]
            raise UserError(
                f"torchrec: table {table.id} was split into widths {widths}, expected 2^k equal column shards (the "
                f"plan format of this project): {error}"
            )
        out.extend(sorted(ours, key=lambda s: (s.col_offset, s.row_offset)))
    if tables != list(task.tables):
        task = dataclasses.replace(task, tables=tuple(tables))
    # TorchRec's plan says each table's type: its whole tables stay table-wise beside its column-wise ones
    return Plan(task, tuple(out), data_parallel=tuple(replicated), merge_column_wise=False)


def _recut_row_blocks(t: int, table, shards: list[dict]) -> list[Shard] | None:
    """TorchRec's table_row_wise cuts rows // k rows per block, the last taking the rest; its row_wise, and this
    project's row blocks, ceil(rows / k) (``sharding.row_blocks``). Whole-width blocks of the first layout become the
    second on the same ranks in the same order (each block within k rows of TorchRec's); None for anything else."""
    ordered = sorted(shards, key=lambda s: s.get("row_offset", 0))
    k = len(ordered)
    if k < 2 or any(s["col_offset"] != 0 or s["dim"] != table.dim or "num_rows" not in s for s in ordered):
        return None
    block = table.rows // k
    floor = [(i * block, block if i < k - 1 else table.rows - (k - 1) * block) for i in range(k)]
    if [(s["row_offset"], s["num_rows"]) for s in ordered] != floor:
        return None
    return list(row_shards(t, table.rows, table.dim, [s["rank"] for s in ordered]))


@register("torchrec")
@dataclasses.dataclass(frozen=True)
class TorchRecSearch(Searcher):
    sharding_types: tuple[str, ...] = DEFAULT_SHARDING_TYPES  # data_parallel, row_wise, table_row_wise: on request
    timeout_s: float = 600.0
    # heuristic: TorchRec's default reservation (15% plus its estimate of input and dense storage);
    # percent: a flat 15% (tiny, very hot tables make the heuristic reserve GBs for inputs and find no plan)
    reservation: str = "heuristic"  # heuristic: TorchRec's default (15% + inputs + dense) | percent: a flat 15%
    # what TorchRec's ParameterConstraints can say; pin, exclude and colocate it cannot (refused in one line)
    constraints: ClassVar[tuple[str, ...]] = ("no_split", "max_shards")
    # the search stage's row splits (search/ways.py) are not applied: TorchRec's planner picks its own sharding types
    own_row_splits: ClassVar[bool] = True

    def __post_init__(self):
        if self.reservation not in RESERVATIONS:
            raise UserError(
                f"searcher.reservation: got {self.reservation!r}, expected one of {', '.join(RESERVATIONS)}"
            )
        unknown = sorted(set(self.sharding_types) - set(SHARDING_TYPES))
        if unknown or not self.sharding_types:
            raise UserError(
                f"searcher.sharding_types: got {list(self.sharding_types)}, expected a non-empty subset of "
                f"{list(SHARDING_TYPES)}"
            )

    def search(self, task: Task, cost_model: CostModel, seed: int) -> Plan:
        speeds = task.speeds()
        if (speeds != 1.0).any():
            raise UserError(
                f"searcher=torchrec: TorchRec's planner takes no per-device compute speed (the task's devices have "
                f"speeds {', '.join(f'{v:g}' for v in speeds)}); expected devices of speed 1, or a project searcher"
            )
        # where our planner put tables in tiered memory (a GPU's memory short), TorchRec's planner may too, its own
        tiered = any(t.cached for t in task.tables)
        levels = max_levels(task.tables)
        tables = []
        for t, level in zip(task.tables, levels):
            constraint = {}
            if t.constraints.no_split:  # TorchRec's per-table sharding types
                constraint["sharding_types"] = ("table_wise",)
            elif t.constraints.max_shards is not None:  # column-wise shards no narrower than dim / 2^level: 2^level
                constraint["min_partition"] = t.dim >> int(level)
            tables.append(
                TorchRecTable(
                    t.rows, t.dim, pooling_factor=t.pooling_factor, kernel=t.kernel, precision=t.precision, **constraint
                )
            )
        links = None
        if task.multi_host:
            if task.local_size() is None:
                raise UserError(
                    f"searcher=torchrec: TorchRec's topology has hosts of equal size holding consecutive ranks; the "
                    f"task's devices sit in hosts {task.hosts()}; expected that layout, or a project searcher"
                )
            links = {
                "local_size": task.local_size(),
                "intra_host_gbps": task.links.intra_host_gbps,
                "inter_host_gbps": task.links.inter_host_gbps,
            }
        request = PlanJob(
            tables=tuple(tables),
            num_devices=task.num_devices,
            mem_caps_bytes=tuple(int(c) for c in task.cap_bytes()),  # per device (TorchRec's CustomTopologyData)
            # TorchRec's batch_size is per rank; a task's is the batch each device's kernels see (ranks x per rank)
            batch_size=max(1, task.batch_size // task.num_devices),
            precision=task.precision,
            sharding_types=tuple(self.sharding_types),
            reservation=self.reservation,
            links=links,
            uvm_caching=tiered,
        )
        with tempfile.TemporaryDirectory(prefix="neuroshard-torchrec-") as tmp:
            src, dst = Path(tmp) / "request.json", Path(tmp) / "plan.json"
            src.write_text(json.dumps(request.to_json()))
            run_worker(["torchrec-plan", str(src), str(dst)], self.timeout_s, "searcher=torchrec")
            answer = PlanAnswer.from_json(json.loads(dst.read_text()))
        if answer.error is not None:
            if answer.infeasible:
                raise InfeasibleError(answer.error)
            raise UserError(f"searcher=torchrec: {answer.error}; install it with {TORCHREC_INSTALL}")
        return plan_from_torchrec(task, list(answer.shards), tiered)


@register("torchrec_default")
@dataclasses.dataclass(frozen=True)
class TorchRecDefaultSearch(TorchRecSearch):
    """TorchRec's planner with the sharding types its users get by default (data_parallel, table_wise, column_wise,
    row_wise, table_row_wise): the anchor a TorchRec user compares with."""

    sharding_types: tuple[str, ...] = SHARDING_TYPES
