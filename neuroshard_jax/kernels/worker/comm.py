"""One rank of the all-to-all (and row-group reduce-scatter / all-gather) benchmark, on gloo or NCCL."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Sequence

from neuroshard_jax.kernels.messages import CommAnswer, CommRequest
from neuroshard_jax.kernels.worker.tbe import setup_torch


def batch_splits(batch_size: int, world: int) -> list[int]:
    """Rows of the batch each rank owns after the forward all-to-all (the batch split evenly)."""
    return [batch_size // world + (r < batch_size % world) for r in range(world)]


def run_rank(rank: int, world: int, init: str, requests_path: str, out_path: str) -> None:
    """One rank of the comm benchmark; writes one JSON line per request to ``out_path``.

    Forward: sleep this rank's straggler delay, then all_to_all_single of the pooled outputs
    [B, dim_sum_rank] split along the batch; the time includes waiting for the slowest peer.
    Backward: the gradients go the other way, no delay. Raw collectives on preallocated buffers. A request's
    ``column_wise`` (per rank, the part of ``dim_sums`` that is column-wise tables) makes that part an all-to-all of its
    own after the table-wise one, as TorchRec runs one per sharding type (``all_to_alls``), and ``row_wise`` (the part
    that is sequence tables' row blocks: the rows their ids looked up) another after it.
    A request's ``row_groups`` ([[width, [ranks]], ...]: the row-split tables, TorchRec's row_wise and
    table_row_wise) add, for each group this rank is in, a reduce-scatter of its partial pooled sums [B, width]
    over the group to the forward (each rank keeps its batch slice) and the mirror all-gather of the gradients to
    the backward, after the all-to-all, in the group's order (the same on every rank); their time is also
    reported apart (``fwd_rows_ms``, ``bwd_rows_ms``).
    A request's ``inputs`` (per sharding type, per rank, the ids per sample of each feature that rank's tables take)
    add TorchRec's input distribution to the forward, one ``KJTAllToAll`` per type (``_input_dists``): the splits
    exchange, the lengths' and the ids' all-to-alls and the recat permute of what arrived, timed from the step's
    start (after the barrier, before the straggler delay: the wait for the slowest peer stays in the pooled
    all-to-all) and reported apart (``fwd_inputs_ms``).
    """
    requests = [CommRequest.from_json(json.loads(line)) for line in open(requests_path) if line.strip()]
    device = requests[0].device if requests else "cpu"
    torch = setup_torch(device)
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    target = torch.device(f"cuda:{rank}" if device == "cuda" else "cpu")
    # a rank sends B x its dim sum and receives its batch slice of every peer's outputs: ceil(B / world) x the sum
    # of the dim sums, which is more than B x the largest dim sum when the batch does not split evenly
    largest = max(
        (max(r.batch_size * max(r.dim_sums), batch_splits(r.batch_size, world)[0] * sum(r.dim_sums)) for r in requests),
        default=1,
    )
    send_buf = torch.full((largest,), 1e-3, device=target)
    recv_buf = torch.zeros(largest, device=target)
    sync = (lambda: torch.cuda.synchronize(target)) if device == "cuda" else (lambda: None)
    # every rank creates every subgroup, in one order (torch.distributed's rule); the whole world is the default group
    members = sorted({ranks for r in requests for _, ranks in r.row_groups if len(ranks) < world})
    subgroups = {ranks: dist.new_group(list(ranks)) for ranks in members}
    inputs = _InputDists(torch, rank, world) if any(r.inputs for r in requests) else None
    with open(out_path, "w") as out:
        for request in requests:
            rows = batch_splits(request.batch_size, world)
            # my pooled outputs, one batch slice per peer; my batch slice of every peer's outputs: per all-to-all
            splits = [
                ([rows[j] * dims[rank] for j in range(world)], [rows[rank] * dims[j] for j in range(world)])
                for dims in all_to_alls(request.dim_sums, request.column_wise, request.row_wise)
            ]
            reduced = _row_group_buffers(torch, request, rank, world, subgroups, target)
            dists = inputs.prepare(request.inputs, rows[rank]) if request.inputs else []
            delay_s = request.delays_ms[rank] / 1e3
            fwd_runs, bwd_runs, fwd_rows, bwd_rows, fwd_inputs = [], [], [], [], []
            for step in range(request.warmup + request.iters):
                dist.barrier()
                ti = time.perf_counter()
                for a2a, features in dists:
                    a2a(features).wait().wait()
                sync()
                inputs_s = time.perf_counter() - ti
                time.sleep(delay_s)
                t0 = time.perf_counter()
                for fwd_in, fwd_out in splits:
                    dist.all_to_all_single(recv_buf[: sum(fwd_out)], send_buf[: sum(fwd_in)], fwd_out, fwd_in)
                sync()
                ta = time.perf_counter()
                for partial, slice_, group in reduced:
                    dist.reduce_scatter_tensor(slice_, partial, group=group)
                sync()
                t1 = time.perf_counter()
                dist.barrier()
                t2 = time.perf_counter()
                for fwd_in, fwd_out in reversed(splits):
                    dist.all_to_all_single(send_buf[: sum(fwd_in)], recv_buf[: sum(fwd_out)], fwd_in, fwd_out)
                sync()
                tb = time.perf_counter()
                for partial, slice_, group in reduced:
                    dist.all_gather_into_tensor(partial, slice_, group=group)
                sync()
                t3 = time.perf_counter()
                if step >= request.warmup:
                    fwd_runs.append((t1 - t0 + inputs_s) * 1e3)
                    fwd_inputs.append(inputs_s * 1e3)
                    bwd_runs.append((t3 - t2) * 1e3)
                    fwd_rows.append((t1 - ta) * 1e3)
                    bwd_rows.append((t3 - tb) * 1e3)
            answer = CommAnswer(
                request.id,
                rank,
                statistics.median(fwd_runs),
                statistics.median(bwd_runs),
                # of which the row groups' reduce-scatters and all-gathers (0 without row groups)
                fwd_rows_ms=statistics.median(fwd_rows),
                bwd_rows_ms=statistics.median(bwd_rows),
                # and the input distribution (0 without inputs)
                fwd_inputs_ms=statistics.median(fwd_inputs),
            )
            out.write(json.dumps(answer.to_json()) + "\n")
            out.flush()
    leave_rank()


def leave_rank() -> None:
    """Every rank is done: leave without the interpreter's teardown, where a still-joinable C++ thread of the
    distributed stack occasionally aborts the process (SIGABRT, "terminate called without an active exception") after
    the work succeeded (seen after TorchRec's collectives: its DMP steps, its input distribution). Every rank of every
    distributed job leaves this way, its results already written and closed."""
    import torch.distributed as dist

    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def all_to_alls(
    dim_sums: Sequence[int], column_wise: Sequence[int] = (), row_wise: Sequence[int] = ()
) -> list[list[int]]:
    """The widths of each all-to-all a request runs, in order: the table-wise one (``dim_sums`` less the others),
    then the column-wise one, then the sequence row-wise one (TorchRec runs one per sharding type); one that would
    move nothing is left out, and a request without ``column_wise`` or ``row_wise`` runs its one all-to-all as it
    always did."""
    dims = [int(d) for d in dim_sums]
    apart = [[int(d) for d in part] for part in (column_wise, row_wise) if any(part)]
    if not apart:
        return [dims]
    table_wise = [d - sum(p[i] for p in apart) for i, d in enumerate(dims)]
    return [part for part in (table_wise, *apart) if any(part)]


def _row_group_buffers(torch, request: CommRequest, rank: int, world: int, subgroups: dict, target) -> list[tuple]:
    """(partial sums [k x ceil(B / k) x width], this rank's slice, process group) of each row group of ``request``
    that holds ``rank``; the batch is padded to a multiple of the group's size k."""
    out = []
    for width, ranks in request.row_groups:
        if rank not in ranks:
            continue
        rows = -(-request.batch_size // len(ranks))
        partial = torch.full((len(ranks) * rows * width,), 1e-3, device=target)
        out.append((partial, torch.zeros(rows * width, device=target), subgroups.get(ranks)))
    return out


class _InputDists:
    """TorchRec's input distribution, one ``KJTAllToAll`` per sharding type: every rank sends its batch slice of each
    feature to the rank whose table takes it (an id per lookup), and the receiver regroups what arrived by feature."""

    def __init__(self, torch, rank: int, world: int):
        import torch.distributed as dist
        from torchrec.distributed.dist_data import KJTAllToAll
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        self.torch, self.rank, self.pg = torch, rank, dist.group.WORLD
        self.kjt, self.a2a = KeyedJaggedTensor, KJTAllToAll

    def prepare(self, inputs: Sequence[list], rows: int) -> list[tuple]:
        """(all-to-all module, this rank's features) per type of ``inputs`` ([type][rank] = ids per sample of each
        feature that rank takes); ``rows``: this rank's batch slice. A feature of p ids per sample has floor((i + 1) p)
        - floor(i p) ids in bag i: p on average."""
        torch = self.torch
        out = []
        for per_rank in inputs:
            poolings = [float(p) for features in per_rank for p in features]
            if not poolings:
                continue
            bags = torch.arange(rows + 1, dtype=torch.float64)
            lengths = torch.cat([(bags[1:] * p).floor() - (bags[:-1] * p).floor() for p in poolings]).int()
            seeded = torch.Generator().manual_seed(self.rank)
            values = torch.randint(0, 1 << 20, (int(lengths.sum()),), generator=seeded)
            keys = [f"f{i}" for i in range(len(poolings))]
            features = self.kjt.from_lengths_sync(keys=keys, values=values, lengths=lengths)
            out.append((self.a2a(self.pg, [len(f) for f in per_rank]), features))
        return out
