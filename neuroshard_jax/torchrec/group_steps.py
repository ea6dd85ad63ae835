"""``autotune=steps`` on the user's live process group: every rank builds each candidate plan in
DistributedModelParallel and times a few training steps of it, together.

``NeuroShardPlanner.collective_plan`` with ``autotune="steps"``: rank 0 searches and names the candidates (the
portfolio's ``k`` best, TorchRec's default and table-wise + column-wise plans, the caller's own ``candidates``), every
rank gets them, and every rank runs ``autotune_steps.autotune_steps`` with a ``GroupSteps``: the same candidates in
the same order, each built (the module's embedding collections alone, rebuilt from their configs on the meta device:
the caller's module is never touched, and its dense layers are the same under every plan), stepped ``warmup`` +
``steps`` times (a barrier before each step; forward, the sum of the pooled outputs, backward with the tables'
optimizer fused into it) and freed before the next is built. A step's time is its slowest rank's (an all-reduce of
every rank's times); the memory check, a candidate's failure and the clock are agreed by all ranks, so every rank
takes the same decisions and returns the same plan.

Batches: the caller's (``batches``: each rank's own ``KeyedJaggedTensor``s, or objects with ``sparse_features``, at
the per-rank batch), else drawn from the tables' statistics (each rank its slice of the planning batch, as the local
ranks of ``measure.training_steps`` take theirs). A failure before the steps (building the sharded modules, a batch
that does not fit them) is caught on every rank and the candidate dropped; a failure inside a collective on one rank
alone (one rank out of memory mid-step) leaves the others waiting in it until the process group's timeout.
"""

from __future__ import annotations

import gc
import itertools
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.hardware import MEMORY_SHARE, available_bytes
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.kernels.worker.torchrec_jobs import optimizer_class, rank_features
from neuroshard_jax.measure.autotune import first_line
from neuroshard_jax.measure.training_steps import torchrec_tables

KEPT_BATCHES = 8  # of the caller's batches, the first this many are kept on the device and stepped in turn


class _Collections(torch.nn.Module):
    """The embedding collections of a model at their module paths; its output is the sum of every pooled output."""

    def __init__(self, collections: Sequence[tuple[str, EmbeddingBagCollection]]):
        super().__init__()
        self.paths = [path for path, _ in collections]
        for path, collection in collections:
            *parents, name = path.split(".")
            parent = self
            for part in parents:
                if not hasattr(parent, part):
                    parent.add_module(part, torch.nn.Module())
                parent = getattr(parent, part)
            parent.add_module(name, collection)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return sum(self.get_submodule(path)(features).values().sum() for path in self.paths)


class GroupSteps:
    """``measure.autotune_steps.StepRunner`` on every rank of the live process group ``pg``. ``configs``: the module's
    tables as (collection path, table name, EmbeddingBagConfig) (``planner.table_configs``); ``sharding``: a plan of
    them as TorchRec's ``ShardingPlan``; ``optimizer``: the tables' fused optimizer (FBGEMM's name). Its steps are
    never judged busy: the group's ranks are the job's own processes, which on one machine load each other's cores
    (``hardware.OtherLoad`` would count them as another user's work)."""

    busy = False

    def __init__(
        self,
        configs: Sequence[tuple[str, str, object]],
        sharding: Callable[[Plan], ShardingPlan],
        pg,
        device: torch.device,
        optimizer: str,
        sharders: list | None = None,
        batches: Iterable | None = None,
    ):
        self.configs = list(configs)
        self.sharding = sharding
        self.pg = pg
        self.rank, self.world = dist.get_rank(pg), dist.get_world_size(pg)
        self.torch_device = device
        self.device = device.type
        self.optimizer = optimizer
        self.sharders = list(sharders or []) or [EmbeddingBagCollectionSharder()]
        self.features = [f for _, _, config in self.configs for f in config.feature_names]
        self.batches = None if batches is None else self._kept(batches)
        self.drawn: KeyedJaggedTensor | None = None
        self.pinned = self._pinned()
        self.started = time.perf_counter()

    def _gather(self, value) -> list:
        """``value`` of every rank, in rank order (every rank calls it)."""
        out = [None] * self.world
        dist.all_gather_object(out, value, group=self.pg)
        return out

    def _agree(self, why: str | None, what: str) -> None:
        """UserError on every rank where any rank says ``why`` (the first such rank named)."""
        said = [(r, w) for r, w in enumerate(self._gather(why)) if w is not None]
        if said:
            rank, first = said[0]
            raise UserError(f"{what} on rank {rank}: {first}")

    def _kept(self, batches: Iterable) -> list[KeyedJaggedTensor]:
        kept = [getattr(b, "sparse_features", b) for b in itertools.islice(iter(batches), KEPT_BATCHES)]
        why = None
        if not kept:
            why = "got none, expected this rank's KeyedJaggedTensor batches"
        elif not all(isinstance(b, KeyedJaggedTensor) for b in kept):
            why = f"got {type(kept[0]).__name__}, expected KeyedJaggedTensors (or batches with sparse_features)"
        else:
            missing = sorted(set(self.features) - set(kept[0].keys()))
            if missing:
                why = f"features {', '.join(missing[:5])} missing, expected every feature of the module's tables"
        self._agree(why, "batches")
        return [b.to(self.torch_device) for b in kept]

    def _pinned(self) -> bool:
        """Whether every rank has its own cores (CPU) or GPU (CUDA), apart from the other ranks of its host."""
        if self.device == "cuda":
            held = self._gather((socket.gethostname(), torch.cuda.current_device()))
            return len(set(held)) == len(held)
        held = self._gather((socket.gethostname(), sorted(os.sched_getaffinity(0))))
        by_host: dict[str, list[set]] = {}
        for host, cores in held:
            by_host.setdefault(host, []).append(set(cores))
        return all(sum(map(len, sets)) == len(set().union(*sets)) for sets in by_host.values())

    def admits(self, plan: Plan) -> str | None:
        """Why the ranks of a host (CPU: the ranks share its memory) or a rank's GPU could not hold ``plan``'s
        part of it, or None; the same answer on every rank."""
        need = plan.memory()[self.rank].total
        if self.device == "cuda":
            room = torch.cuda.mem_get_info(self.torch_device)[0]
        else:
            room = available_bytes()
        needs: dict[str, int] = {}
        rooms: dict[str, list[int]] = {}
        for r, (host, need_r, room_r) in enumerate(self._gather((socket.gethostname(), need, room))):
            key = f"{host} rank {r}" if self.device == "cuda" else host  # a GPU each, or the host's memory shared
            needs[key] = needs.get(key, 0) + need_r
            rooms.setdefault(key, []).extend([room_r] if room_r is not None else [])
        for key, total in needs.items():
            if rooms[key] and total > MEMORY_SHARE * min(rooms[key]):
                room = min(rooms[key]) / GIB_BYTES
                return f"its ranks on {key} need {total / GIB_BYTES:.1f} GiB, {room:.1f} GiB available"
        return None

    def _mismatch(self, plan: Plan) -> str | None:
        """Why ``plan`` is not a plan of the module's tables, or None."""
        ours = [(name, int(c.num_embeddings), int(c.embedding_dim)) for _, name, c in self.configs]
        its = [(t.name, t.rows, t.dim) for t in plan.task.tables]
        if ours == its:
            return None
        if len(ours) != len(its):
            return f"it plans {len(its)} tables, the module has {len(ours)}"
        name, rows, dim = next(b for a, b in zip(ours, its) if a != b)
        return f"its table {name!r} ({rows} x {dim}) is not the module's table of its place"

    def _batch(self, plan: Plan, step: int) -> KeyedJaggedTensor:
        """The caller's batches in turn, else this rank's slice of bags drawn from the tables' statistics (each
        table's bags under its first feature; a table's other features empty)."""
        if self.batches is not None:
            return self.batches[step % len(self.batches)]
        if self.drawn is None:
            task = plan.task
            tables = torchrec_tables(plan, [t.name for t in task.tables])
            pool = task.pool.to_json() if task.pool is not None else None
            firsts = [config.feature_names[0] for _, _, config in self.configs]
            kjt = rank_features(tables, pool, task.batch_size, self.rank, self.world, firsts)
            rest = [f for f in self.features if f not in firsts]
            local = task.batch_size // self.world
            empty = torch.zeros(len(rest) * local, dtype=kjt.lengths().dtype)
            self.drawn = KeyedJaggedTensor.from_lengths_sync(
                keys=firsts + rest, values=kjt.values(), lengths=torch.cat([kjt.lengths(), empty])
            ).to(self.torch_device)
        return self.drawn

    def _model(self, plan: Plan):
        """The candidate's sharded collections and the optimizer of its data-parallel tables (None: none)."""
        by_path: dict[str, list] = {}
        for path, _, config in self.configs:
            by_path.setdefault(path, []).append(config)
        collections = [(p, EmbeddingBagCollection(tables=c, device=torch.device("meta"))) for p, c in by_path.items()]
        root = collections[0][1] if list(by_path) == [""] else _Collections(collections)
        apply_optimizer_in_backward(optimizer_class(self.optimizer), root.parameters(), {"lr": 0.01})
        model = DistributedModelParallel(
            module=root,
            env=ShardingEnv.from_process_group(self.pg),
            device=self.torch_device,
            plan=self.sharding(plan),
            sharders=self.sharders,
        )
        # a data-parallel table is a dense parameter of DMP: the fused update does not reach it (a training loop's
        # dense optimizer does)
        dense = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
        return model, (torch.optim.SGD(dense, lr=0.01) if dense else None)

    def step_ms(self, plan: Plan, warmup: int, steps: int) -> float:
        model = dense = None
        times, error = [], None
        try:
            why = self._mismatch(plan)
            if why is not None:
                raise UserError(f"not a plan of the module's tables: {why}")
            model, dense = self._model(plan)
            for i in range(warmup + steps):
                batch = self._batch(plan, i)
                dist.barrier(group=self.pg)
                start = time.perf_counter()
                out = model(batch)
                (out if isinstance(out, torch.Tensor) else out.values().sum()).backward()
                if dense is not None:
                    dense.step()
                    dense.zero_grad()
                if self.device == "cuda":
                    torch.cuda.synchronize(self.torch_device)
                if i >= warmup:
                    times.append((time.perf_counter() - start) * 1e3)
        except Exception as err:  # noqa: BLE001 - a candidate never ends the job: every rank says why, and it is dropped
            error = first_line(err)
        finally:
            del model, dense
            gc.collect()
            if self.device == "cuda":
                torch.cuda.empty_cache()
        self._agree(error, "DistributedModelParallel steps failed")
        slowest = torch.tensor(times, dtype=torch.float64, device=self.torch_device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=self.pg)
        return float(np.median(slowest.cpu().numpy()))

    def elapsed_s(self) -> float:
        """The slowest rank's seconds since the measuring started (every rank the same)."""
        elapsed = torch.tensor([time.perf_counter() - self.started], dtype=torch.float64, device=self.torch_device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=self.pg)
        return float(elapsed.item())

    def says(self) -> bool:
        return self.rank == 0
