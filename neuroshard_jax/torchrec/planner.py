"""TorchRec in, TorchRec out: a planner that stands where TorchRec's ``EmbeddingShardingPlanner`` does.

    from neuroshard_jax.torchrec.planner import NeuroShardPlanner, batch_statistics

    stats = batch_statistics(model, loader, batch_size=512 * world_size)   # KeyedJaggedTensor batches
    topology = TopologyFactory.create_topology(TrainerConfig(world_size=2), kernel_config=KernelConfig("cuda"))
    planner = NeuroShardPlanner(topology, batch_size=512, stats=stats)
    plan = planner.collective_plan(model, sharders, pg)     # rank 0 plans, every rank gets the plan
    model = DistributedModelParallel(model, plan=plan, sharders=sharders, ...)

The planner reads every ``EmbeddingBagCollection`` of the module (table names, rows, dims, features, data type),
the topology (world size, memory per device, compute device) and each table's statistics (``stats``: measured
from your batches by ``batch_statistics``, or a statistics file of ``python -m neuroshard_jax.stats``), plans them
with ``neuroshard_jax.plan`` and returns table-wise and column-wise ``ParameterSharding``s. A table without
statistics gets an estimate from its rows and pooling factor (``builders.task_from_tables``, as ``neuroshard_jax.plan``
does) and the plan says so.

Batch size, as in TorchRec: ``batch_size`` is per rank; a device looks up its tables for the whole batch of
``batch_size x world_size`` samples, which is the batch the cost model sees and the statistics are taken at.

What the planner says (the cost model it chose, the plan's per-device summary, warnings) goes to this module's
logger, the plan at INFO and warnings at WARNING, while ``verbose`` (the default). Your script shows them with
``logging.basicConfig(level=logging.INFO)`` (every library's INFO lines too), or ours alone with
``logging.basicConfig()`` and ``logging.getLogger("neuroshard_jax").setLevel(logging.INFO)``; without any logging
setup Python shows the warnings alone. ``verbose=False`` logs nothing.

This module and the worker are the only ones that import torch; nothing in the JAX core imports this one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torchrec.distributed.collective_utils import invoke_on_rank_and_broadcast_result
from torchrec.distributed.planner.constants import BATCH_SIZE, POOLING_FACTOR
from torchrec.distributed.planner.types import KernelConfig, Topology, TopologyFactory, TrainerConfig
from torchrec.distributed.sharding_plan import get_module_to_default_sharders
from torchrec.distributed.types import ShardingPlan, ShardingPlanner
from torchrec.modules.embedding_configs import DataType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.constraints import SHARDING_TYPES
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.plan_file import format_plan
from neuroshard_jax.core.schema import row_blocks_json
from neuroshard_jax.core.sharding import element_bytes
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.scoring import with_costs
from neuroshard_jax.kernels.torchrec_format import module_plan
from neuroshard_jax.measure.autotune import Entrant, first_line
from neuroshard_jax.measure.autotune_steps import autotune_steps
from neuroshard_jax.search.sharding_planner import Planned, Planner, planned, planner_from
from neuroshard_jax.search.stages import (
    Autotune,
    PlanningState,
    Stage,
    candidate_plans,
    run_stages,
    searched_records,
)
from neuroshard_jax.torchrec.group_steps import GroupSteps
from neuroshard_jax.torchrec.inputs import (
    COMPUTE_KERNELS,
    batch_statistics,
    is_number,
    positive_int,
    positive_number,
    table_stats,
)
from neuroshard_jax.torchrec.inputs import pooling_factors as pooling_factors_of
from neuroshard_jax.torchrec.shardable import (
    Collection,
    declared_optimizer,
    table_configs,
    tables_of,
)
from neuroshard_jax.workloads.builders import TaskOptions, task_from_tables
from neuroshard_jax.workloads.statistics import (
    TableStats,
)

__all__ = ["NeuroShardPlanner", "batch_statistics", "declared_optimizer", "table_configs"]  # the adapter's names

logger = logging.getLogger(__name__)
# TorchRec's planner holds back this share of every device's memory (HeuristicalStorageReservation's default): dense
# parameters, activations and the allocator's slack, which its estimator does not count; ours neither
TORCHREC_RESERVE = 0.15
PRECISIONS = {DataType.FP32: "fp32", DataType.FP16: "fp16", DataType.BF16: "bf16", DataType.INT8: "int8"}


class NeuroShardPlanner(ShardingPlanner):
    """A TorchRec ``ShardingPlanner`` backed by neuroshard_jax's searchers and cost models.

    ``topology``: TorchRec's (world size, compute device, memory per device: HBM on cuda, DDR on cpu); or ``world_size``
    and ``mem_cap_gb``. ``batch_size``: per rank (TorchRec's meaning; default TorchRec's 512). ``stats``: per table
    statistics (``batch_statistics``, a list of TableStats, or a statistics file's path), taken at the planning batch;
    ``pooling_factors``: per table (or feature) for tables without statistics, estimated with a Zipf law of exponent
    ``zipf``. ``planner``: a ``Planner`` built from its parts (``search.sharding_planner``); or, as a convenience that
    builds one, the fields of ``PlannerOptions`` as keywords, as ``neuroshard_jax.plan`` takes them
    (``searcher="grid"``, ``seed=3``; the device is the topology's): every plan runs the one ``Planner`` (calibrate ->
    row split -> search -> polish). After ``plan``, ``last_plan`` holds our ``Plan`` (predicted costs, ``to_json()``).
    The tables' memory counts the optimizer they train with (``optimizer``, else the one the model declares:
    ``declared_optimizer``, else exact SGD), their data type, and ``mem_reserve`` (a share of every device held back for
    what the plan does not hold; None: TorchRec's own 15% of the topology's memory, as its planner holds back, or none
    where ``mem_cap_gb`` gives the memory for tables).
    ``verbose``: log the chosen cost model and the plan at INFO and
    warnings at WARNING (``logging.basicConfig(level=logging.INFO)`` shows them); ``False``: log nothing.
    """

    def __init__(
        self,
        topology: Topology | None = None,
        batch_size: int | None = None,
        stats: Iterable[TableStats] | str | Path | None = None,
        *,
        world_size: int | None = None,
        mem_cap_gb: float | None = None,
        pooling_factors: Mapping[str, float] | None = None,
        zipf: float = TaskOptions.zipf,
        compute_kernel: str = "fused",
        optimizer: str | None = None,
        mem_reserve: float | None = None,
        verbose: bool = True,
        planner: Planner | None = None,
        **options,
    ):
        if topology is None and world_size is None:
            raise UserError("topology: missing, expected a TorchRec Topology or world_size=N")
        if world_size is not None and not (
            isinstance(world_size, int) and not isinstance(world_size, bool) and world_size >= 1
        ):
            raise UserError(f"world_size: got {world_size!r}, expected an integer >= 1 (the number of ranks)")
        self.topology = topology or TopologyFactory.create_topology(  # TorchRec's defaults for a GPU trainer
            TrainerConfig(world_size=world_size), kernel_config=KernelConfig(compute_device="cuda")
        )
        if self.topology.world_size < 1 or not self.topology.devices:  # TorchRec builds one of 0 ranks unasked
            raise UserError(
                f"topology: world_size {self.topology.world_size} with {len(self.topology.devices)} devices, "
                "expected at least one rank"
            )
        self.batch_size = BATCH_SIZE if batch_size is None else positive_int(batch_size, "batch_size")
        self.mem_cap_gb = None if mem_cap_gb is None else positive_number(mem_cap_gb, "mem_cap_gb")
        self.stats = {t.name: t for t in table_stats(stats)}
        self.pooling_factors = pooling_factors_of(pooling_factors)
        if not (is_number(zipf) and np.isfinite(zipf) and zipf >= 0):
            raise UserError(f"zipf: got {zipf!r:.60}, expected a finite exponent >= 0")
        self.zipf = float(zipf)
        if compute_kernel not in COMPUTE_KERNELS:
            raise UserError(
                f"compute_kernel: got {compute_kernel!r}, expected one of {', '.join(COMPUTE_KERNELS)} (TorchRec's "
                "training kernels)"
            )
        if mem_reserve is not None and not (is_number(mem_reserve) and 0 <= mem_reserve < 1):
            raise UserError(f"mem_reserve: got {mem_reserve!r}, expected a share of memory in [0, 1)")
        device = "cuda" if self.topology.compute_device == "cuda" else "cpu"
        if "device" in options:
            raise UserError(
                f"device: got {options['device']!r}, expected none (the topology's compute device, {device}, is the "
                "plan's)"
            )
        if planner is None:  # the topology says which device the plan is for; TorchRec plans any batch: so do we
            planner = planner_from({"fallback": True, **options, "device": device})
        else:  # a user's own planner plans as it was built (keywords beside it are refused)
            planner = planner_from(options, planner)
            if planner.device != device:
                raise UserError(
                    f"planner: plans for device {planner.device!r}, the topology's compute device is {device!r}; "
                    "expected a Planner built for the topology's device"
                )
        self.planner = planner
        self.seed = planner.seed
        self.compute_kernel = compute_kernel
        self.optimizer = optimizer
        self.mem_reserve = mem_reserve
        self.verbose = verbose
        self.last_plan: Plan | None = None
        self._state: PlanningState | None = None  # rank 0's state between collective_plan's stages
        self._sharders: list | None = None

    def reserve(self) -> float:
        """The share of every device held back: ``mem_reserve``, else TorchRec's default (``TORCHREC_RESERVE``) of a
        topology's memory, or 0 where ``mem_cap_gb`` is the memory for tables."""
        if self.mem_reserve is not None:
            return self.mem_reserve
        return 0.0 if self.mem_cap_gb is not None else TORCHREC_RESERVE

    @property
    def planning_batch(self) -> int:
        """Samples a device looks up per step for each of its tables: the per-rank batch x world size."""
        return self.batch_size * self.topology.world_size

    def device_mem_gb(self) -> list[float]:
        """Memory of each device for tables: ``mem_cap_gb``, else the topology's (per device: TorchRec's
        ``CustomTopologyData`` may give devices of unequal memory, which the plan then keeps)."""
        if self.mem_cap_gb is not None:
            return [self.mem_cap_gb] * self.topology.world_size
        kind = "hbm" if self.topology.compute_device in ("cuda", "mtia") else "ddr"
        return [getattr(d.storage, kind) / GIB_BYTES for d in self.topology.devices]

    def tables(self, module: torch.nn.Module) -> tuple[list[dict], str]:
        """Our table specs of the module's tables and the task's precision (a table of another data type names its
        own); a table without statistics has its pooling factor only, and ``task_from_tables`` estimates its
        histogram (as ``neuroshard_jax.plan`` does)."""
        specs, precisions = [], []
        found = tables_of(module, self._sharders)
        configs = [(path, name, config) for path, name, config, _ in found]
        self._check_stats_names(configs)
        self._check_pooling_names(configs)
        for _, name, config, collection in found:
            precision = PRECISIONS.get(config.data_type)
            if precision is None:
                raise UserError(
                    f"module: table {name!r} has data type {config.data_type}, expected one of "
                    f"{', '.join(str(t) for t in PRECISIONS)}"
                )
            precisions.append(precision)
            # statistics of a table: by its name, or by its feature's name (a file of the stats CLI names features)
            single = config.feature_names[0] if len(config.feature_names) == 1 else None
            stats = self.stats.get(name, self.stats.get(single))
            if stats is not None and stats.batch_size != self.planning_batch:
                raise UserError(
                    f"stats: table {name!r} was measured at batch {stats.batch_size}, expected the planning batch "
                    f"{self.planning_batch} (batch_size {self.batch_size} x world size {self.topology.world_size})"
                )
            spec = {"name": name, "rows": int(config.num_embeddings), "dim": int(config.embedding_dim)}
            pooling = collection.pooling(config)
            spec.update({"pooling": pooling} if pooling != "sum" else {})
            spec.update({"weighted": True} if collection.weighted else {})
            allowed = self._sharding_types(collection)
            spec.update({"sharding_types": list(allowed)} if allowed is not None else {})
            if stats is None:
                spec["pooling_factor"] = self._pooling(name, config)
            else:
                spec.update(pooling_factor=stats.pooling_factor, bins=list(stats.bins), estimated=stats.estimated)
                if stats.row_blocks and stats.rows == spec["rows"]:  # measured over the table's own rows
                    spec["row_blocks"] = row_blocks_json(stats.row_blocks)
            specs.append(spec)
        multi = [name for _, name, c in configs if len(c.feature_names) > 1]
        if multi and self.verbose:
            logger.warning(
                "%d tables are read by several features (%s): each feature adds a pooled output of the table's dim, "
                "the plan's comm counts one",
                len(multi),
                ", ".join(multi[:3]),
            )
        # the task's precision is its tables' most common data type (the widest of a tie); a table of another keeps
        # its own (its bytes, and a kernel of its own on a device, as TorchRec groups tables by data type)
        common = max(sorted(set(precisions)), key=lambda p: (precisions.count(p), element_bytes(p)))
        for spec, precision in zip(specs, precisions):
            spec.update({"precision": precision} if precision != common else {})
        return specs, common

    def _sharding_types(self, collection: Collection) -> tuple[str, ...] | None:
        """The sharding types the collection's sharder offers on the topology's device that our plans use (a
        sequence collection's sharder offers no table-row-wise), or None where it offers all of them. An
        EmbeddingBagCollection is planned as before (its sharder's list on cpu lacks the row-wise types TorchRec
        runs there all the same)."""
        if isinstance(collection.module, EmbeddingBagCollection):
            return None
        sharder = self._sharder_for(collection.module)
        offered = set(sharder.sharding_types(self.topology.compute_device))
        allowed = tuple(t for t in SHARDING_TYPES if t in offered)
        if len(allowed) == len(SHARDING_TYPES):
            return None
        if not allowed:
            raise UserError(
                f"module: {collection.path or 'the model'} ({type(collection.module).__name__}): its sharder offers "
                f"{sorted(offered)}, expected one of {', '.join(SHARDING_TYPES)}"
            )
        return allowed

    def _sharder_for(self, module: torch.nn.Module):
        """The sharder of ``module``'s type: the user's (``sharders`` of the last call), else TorchRec's default."""
        for sharder in self._sharders or ():
            if getattr(sharder, "module_type", None) is type(module):
                return sharder
        defaults = get_module_to_default_sharders()
        return defaults.get(type(module)) or next(v for k, v in defaults.items() if isinstance(module, k))

    def _check_pooling_names(self, configs) -> None:
        """``pooling_factors`` must name a table or a feature of the module (a typo would plan with the default)."""
        known = {name for _, name, _ in configs} | {f for _, _, c in configs for f in c.feature_names}
        unknown = sorted(set(self.pooling_factors) - known)
        if unknown:
            raise UserError(
                f"pooling_factors: {', '.join(map(repr, unknown[:5]))} name no table or feature of the module, "
                f"expected one of {', '.join(sorted(known)[:6])}{', ...' if len(known) > 6 else ''}"
            )

    def _check_stats_names(self, configs) -> None:
        """Statistics must name a table, or the one feature of a single-feature table."""
        known = {name for _, name, _ in configs}
        known |= {c.feature_names[0] for _, _, c in configs if len(c.feature_names) == 1}
        unknown = sorted(set(self.stats) - known)
        if unknown:
            multi = [name for _, name, c in configs if len(c.feature_names) > 1]
            hint = f"; tables read by several features ({', '.join(multi[:3])}) need batch_statistics" if multi else ""
            raise UserError(
                f"stats: {', '.join(unknown[:5])} name no table of the module, expected a table name or the feature "
                f"of a single-feature table ({', '.join(sorted(known)[:6])}){hint}"
            )

    def _pooling(self, name: str, config) -> float:
        """A table's pooling factor without data: given for the table, or the sum over its features (TorchRec's
        default 1.0 each)."""
        if name in self.pooling_factors:
            return float(self.pooling_factors[name])
        return float(sum(self.pooling_factors.get(f, POOLING_FACTOR) for f in config.feature_names))

    def task(self, module: torch.nn.Module, sharders: list | None = None) -> Task:
        """Our task of the module's tables: their specs and statistics, the topology's devices, the planning batch,
        the tables' optimizer and the memory held back."""
        self._sharders = sharders
        specs, precision = self.tables(module)
        caps = self.device_mem_gb()
        devices = None if len(set(caps)) == 1 else [{"mem_cap_gb": c} for c in caps]
        optimizer = self.optimizer or declared_optimizer(module, sharders) or "exact_sgd"
        trains = TaskOptions(
            batch_size=self.planning_batch,
            precision=precision,
            optimizer=optimizer,
            mem_reserve=self.reserve(),
            zipf=self.zipf,
        )
        return task_from_tables(specs, len(caps), max(caps), options=trains, devices=devices, seed=self.seed)

    def plan(self, module: torch.nn.Module, sharders: list | None = None) -> ShardingPlan:
        """Plan every EmbeddingBagCollection of ``module``; ``sharders``: TorchRec's (their EBC sharder, if any,
        builds the parameter shardings)."""
        planned = self.planner.run(self.task(module, sharders))
        self._said(planned)
        return self._chosen(module, planned.plan, sharders)

    def _said(self, planned: Planned) -> None:
        """The model's choice, its warnings (at WARNING) and the model's depth, logged while ``verbose``."""
        if self.verbose:
            choice = planned.choice
            if choice.instead:
                logger.warning("%s", choice.instead)
            logger.info("%s", choice.line())
            depth = planned.depth_warning()
            if depth:
                logger.warning("%s", depth)

    def _chosen(self, module: torch.nn.Module, ours: Plan, sharders: list | None, say: bool = True) -> ShardingPlan:
        """``ours`` kept as ``last_plan``, logged at INFO while ``verbose`` (and ``say``), as TorchRec's
        ``ShardingPlan``."""
        self.last_plan = ours
        if self.verbose and say:
            logger.info("%s", format_plan(ours.to_json()))
        return self.to_sharding_plan(module, ours, sharders)

    def to_sharding_plan(self, module: torch.nn.Module, ours: Plan, sharders: list | None = None) -> ShardingPlan:
        """Our plan of the module's tables as TorchRec ``ParameterSharding``s, per collection (keyed at its path, as
        TorchRec's planner keys it: a feature-processed or managed-collision collection at the wrapper's), each built
        by its type's sharder (``sharders``', else TorchRec's default)."""
        index = {spec_name: i for i, spec_name in enumerate(t.name for t in ours.task.tables)}
        # column shards, row blocks (with their rows) and data-parallel tables, as torchrec_format takes them
        per_table = dict(enumerate(ours.torchrec_shards()))
        self._sharders = sharders
        found = tables_of(module, sharders)
        modules = {}
        for collection in {c.path: c for *_, c in found}.values():
            shards = {config.name: per_table[index[name]] for path, name, config, _ in found if path == collection.path}
            modules[collection.path] = module_plan(
                collection.module,
                shards,
                ours.task.num_devices,
                self.topology.compute_device,
                self.compute_kernel,
                self._sharder_for(collection.module),
                local_size=self.topology.local_world_size,
            )
        return ShardingPlan(modules)

    def collective_plan(
        self,
        module: torch.nn.Module,
        sharders: list | None = None,
        pg=None,
        batches: Iterable | None = None,
        candidates: Mapping[str, Plan] | None = None,
    ) -> ShardingPlan:
        """Plan on rank 0 of ``pg`` (default: the world) and return the plan on every rank.

        With ``autotune="steps"`` every rank of ``pg`` takes part in choosing it (``group_steps``): rank 0 searches
        and names the candidates (the portfolio's best, TorchRec's default and table-wise + column-wise plans, and
        ``candidates``: plans of your own, e.g. the one you train with today, by name), every rank builds each in
        DistributedModelParallel on ``pg`` and times training steps of it on ``batches`` (this rank's
        KeyedJaggedTensors; default: drawn from the statistics), and the fastest slowest-rank step wins, the same
        plan on every rank. ``last_plan.autotune`` records every candidate, measured or dropped and why."""
        if pg is None:
            if not dist.is_initialized():
                raise UserError("collective_plan: torch.distributed is not initialised, expected a process group")
            pg = dist.GroupMember.WORLD
        steps = self.planner.autotune.name == "steps"
        if not steps and (batches is not None or candidates):
            given = "batches" if batches is not None else "candidates"
            raise UserError(f"{given}: given with autotune={self.planner.autotune.name!r}, expected autotune='steps'")
        if not steps:
            result = invoke_on_rank_and_broadcast_result(pg, 0, self._plan_or_error, module, sharders)
            if isinstance(result, Exception):  # rank 0 failed: every rank raises it, none waits forever
                raise result
            return result
        # the planner's own stage sequence: those before autotune on rank 0, autotune on every rank of ``pg``, those
        # after it on rank 0 again (``Planner.stages``: the order ``plan`` and the main job run)
        found = invoke_on_rank_and_broadcast_result(pg, 0, self._candidates_or_error, module, sharders, candidates)
        if isinstance(found, Exception):
            raise found
        searched = Plan.from_json(found[0])
        entrants = [Entrant(name, None if plan is None else Plan.from_json(plan), why) for name, plan, why in found[1]]
        device = torch.device("cuda", torch.cuda.current_device()) if self.planner.device == "cuda" else None
        runner = GroupSteps(
            table_configs(module),
            lambda plan: self.to_sharding_plan(module, plan, sharders),
            pg,
            device or torch.device("cpu"),
            searched.task.training.optimizer,
            sharders,
            batches,
        )
        chosen, _ = autotune_steps(entrants, self.planner.autotune, runner)
        chosen = searched_records(chosen, searched, self.seed)
        final = invoke_on_rank_and_broadcast_result(pg, 0, self._after_autotune_or_error, chosen.to_json())
        if isinstance(final, Exception):
            raise final
        # rank 0 logs the plan and the candidates' table, as ``plan`` does
        return self._chosen(module, Plan.from_json(final), sharders, runner.says())

    def _plan_or_error(self, module: torch.nn.Module, sharders: list | None):
        try:
            return self.plan(module, sharders)
        except (UserError, InfeasibleError) as err:
            return err

    def _split_stages(self) -> tuple[tuple[Stage, ...], tuple[Stage, ...]]:
        """The planner's stages before its autotune stage and after it."""
        stages = self.planner.stages()
        at = next(i for i, stage in enumerate(stages) if isinstance(stage, Autotune))
        return stages[:at], stages[at + 1 :]

    def _candidates_or_error(
        self, module: torch.nn.Module, sharders: list | None, candidates: Mapping[str, Plan] | None
    ) -> tuple[JSONDoc, list[tuple[str, JSONDoc | None, str | None]]] | Exception:
        """Rank 0's stages before autotune (the search among them) and the candidates autotune measures (the
        search's, then ``candidates``, each priced by the search's model), as plan.json objects every rank reads
        back; the state is kept for the stages after autotune."""
        try:
            before, _ = self._split_stages()
            state = run_stages(before, self.planner.start(self.task(module, sharders)))
            planned_so_far = planned(state)
            self._said(planned_so_far)
            config, model = self.planner.autotune, state.model
            found = candidate_plans(state.searched(), state.candidates, model, config, self.seed)
            for name, plan in (candidates or {}).items():
                found.append(self._own_candidate(name, plan, planned_so_far))
        except (UserError, InfeasibleError) as err:
            return err
        self._state = state
        return state.searched().to_json(), [
            (e.name, None if e.plan is None else e.plan.to_json(), e.why) for e in found
        ]

    def _after_autotune_or_error(self, chosen: JSONDoc) -> JSONDoc | Exception:
        """Rank 0's stages after autotune, on the plan every rank chose (``chosen``), as plan.json."""
        _, after = self._split_stages()
        state = dataclasses.replace(self._state, plan=Plan.from_json(chosen), ran=(*self._state.ran, Autotune.name))
        try:
            return planned(run_stages(after, state)).plan.to_json()
        except (UserError, InfeasibleError) as err:
            return err

    @staticmethod
    def _own_candidate(name: str, plan, planned: Planned) -> Entrant:
        """The caller's candidate ``name`` priced by the search's model, or an entrant without a plan, and why."""
        if not isinstance(plan, Plan):
            return Entrant(name, None, f"got {type(plan).__name__}, expected a neuroshard_jax Plan")
        if plan.task.num_devices != planned.plan.task.num_devices:
            why = f"a plan for {plan.task.num_devices} devices, the group has {planned.plan.task.num_devices}"
            return Entrant(name, None, why)
        try:
            return Entrant(name, dataclasses.replace(with_costs(planned.cost_model, plan), searcher=name))
        except (UserError, ValueError) as err:
            return Entrant(name, None, first_line(err))
