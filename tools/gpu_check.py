"""The prepared GPU check (issue 54): plans of GPU-sized tasks measured on a lent GPU, one command there, the same
steps dry on this CPU.

    python -m tools.gpu_check pack .gpu          # here: the GPU-sized tasks, TorchRec's and the greedy plans of them
                                                 # (the GPU machine has no TorchRec), FBGEMM GPU pruned for the card
                                                 # and hydra (../shared/gpu/prepare.sh, where this workplace has it)
    OUT=$OUT bash tools/gpu_check.sh             # there (the device tool's command, carrying .gpu)
    python -m tools.gpu_check run OUT --dry      # here, on CPU, tiny: what the tests run
    python -m tools.gpu_check table OUT          # the README's GPU table from a run's files
    python -m tools.gpu_check workspace OUT      # the share FBGEMM's backward workspace adds to its plans' devices
    python -m tools.gpu_check tiers OUT          # ship the run's tiered-memory miss price (data/tiers/<gpu>.json)

``run`` takes its steps in order, each within its share of ``--budget-s`` (a step stops at its deadline and keeps
what it has), every file written as it goes:

a. ``smoke.json``: one fused TBE fwd+bwd on the device through the project's worker;
b. ``labels.tgz`` and ``labels.json``: spec labels over the GPU-sized range (``collect``, the device's protocol:
   ``queued`` on a GPU), each in one of the kernels the shipped GPU runs lack (mean-pooled, weighted, sequence:
   ``NEW_KINDS``; dry, every kind), then the first 40 requests measured again (``labels-repeat``): the labels' own
   floor;
   the folder also holds ``comm.jsonl``, the all-to-alls of the comm sampler priced by ``nvlink_ms`` (a GPU's
   all-to-all cannot be measured on one GPU; the cost model's comm nets learn the price the table reports);
c. ``model.tgz`` and ``model.json``: the ensemble trained here on those labels and the shipped GPU runs of the same
   kind of machine (``same_kind_sets``: the sum-pooled labels; ``ensemble.kinds=true``, as the CPU kinds models;
   ``python -m neuroshard_jax.train``, on the CPU beside the next step), its held-out MAPE and Kendall tau by label
   set; then beam and grid plans of the GPU tasks with it (``model-plans.jsonl``), each device's memory counted with
   FBGEMM's backward workspace (``core.memory``; ``workspace`` reads a run's plans against it);
d. ``plans.json``: every device of every plan of the GPU tasks (``workloads/gpu_tasks.py``, and task 100: task 0 on
   devices too small for its tables, ``TIERED``, each plan's tables in tiered memory measured with managed caching;
   TorchRec's default
   planner, TorchRec table-wise + column-wise and size_lookup_greedy from the pack, beam and grid from step c as they
   come) measured on the one GPU in turn, the devices least measured first, repeats for the devices that may be their
   plan's slowest; rewritten after each plan's devices. Compute is measured; the all-to-alls are priced apart. Each
   device's memory too: what its kernels held (the allocator's count) and, on a GPU, peaked at
   (``torch.cuda.max_memory_allocated``), beside ``Plan.memory``'s prediction;
e. ``loop.jsonl``: ``autotune=loop`` as a user runs it (``loop_step``), with the model trained in this run, on the GPU
   tasks in turn while the step's time lasts: every candidate's measured step, the task's balance bound, why it
   stopped; TorchRec's two plans priced alike from the plans step's measurements of their devices (no TorchRec
   runs on the GPU machine, so they are not its candidates there);
f. ``uvm.json``: FBGEMM's managed caching (TorchRec's ``fused_uvm_caching``: UVM rows with an HBM cache) timed on
   three big tables of the first GPU task whose access differs, at cache load factors 0.5, 0.2 and 0.05 beside the
   table in HBM, with the memory the kernels peaked at (``uvm``): the labels a tiered-memory cost needs, and the
   miss price fitted on them (``tiers.json``: ``core.tiers.fit_price``, judged table by table held out);
g. ``dmp.json``: the full training step in TorchRec's DistributedModelParallel on the CPU, a core per rank
   (``tools/dmp_cores.py``), foreign tasks' beam and TorchRec plans; in the background from the start, on cores of
   its own where the machine has 16 (the other steps' processes on the rest), until the budget.

and ``log.txt``. A step that fails is logged and the next one runs (the GPU steps are skipped when the smoke request
fails). ``--dry`` runs every step on the CPU, tiny (``DRY``).

Why one module of ~1,260 lines: it is one prepared run for a machine lent minutes at a time, its steps sharing
one budget, one work folder and the files that come back; reading it top to bottom is reading the run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import gzip
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from neuroshard_jax.core.assignment import comm_layout
from neuroshard_jax.core.cli import fail
from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.files import read_jsonl, write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.manifests import load_manifest, manifest_kinds, write_manifest
from neuroshard_jax.core.memory import MemoryParts
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard
from neuroshard_jax.core.table import KERNEL_KINDS
from neuroshard_jax.core.task import Task, on_device
from neuroshard_jax.core.tiers import fit_price, held_out, price_file, price_readings
from neuroshard_jax.costs.cost_model import CostModel, plan_cost_ms
from neuroshard_jax.kernels.executors import ExecutorConfig
from neuroshard_jax.kernels.messages import ComputeAnswer, ComputeRequest
from neuroshard_jax.kernels.processes import ComputeWorker, KernelPool, Timing, compute_request, default_protocol
from neuroshard_jax.learn.cost_labels import CollectConfig, collect
from neuroshard_jax.measure.autotune import AutotuneConfig
from neuroshard_jax.measure.evaluator import EvaluateConfig, device_request, plan_kernels
from neuroshard_jax.measure.polish import simulate
from neuroshard_jax.search.sharding_planner import Planned, PlannerOptions
from neuroshard_jax.workloads.gpu_tasks import (
    GpuTaskConfig,
    gpu_task,
    task_summary,
    with_stream_pool,
    write_stream_pool,
)
from neuroshard_jax.workloads.samplers import CommSamplerConfig, SpecSamplerConfig, sample_comm
from tools import dmp_cores

# of --budget-s; model runs inside plans'; loop after them, with the model trained there
SHARES = {"smoke": 0.02, "labels": 0.30, "model": 0.0, "plans": 0.47, "loop": 0.15, "uvm": 0.06}
GPU_STEPS = ("labels", "plans", "loop", "uvm")  # need the worker: skipped when the smoke request fails
LOOP_MIN_S = 20.0  # the least time left for the loop step to start another task
SEED = 54  # the GPU tasks' seed (issue 54)
PACK_SEARCHERS = ("torchrec_default", "torchrec", "size_lookup_greedy")  # planned at pack time (no model needed)
PORTFOLIO = "portfolio"  # planned there with the model trained there: its plan and each member's (beam, grid, beam:hot)
MODEL_SEARCHERS = (PORTFOLIO, "beam", "grid", "beam:hot")
AUTOTUNE = "autotune=kernels"  # not planned: chosen from the measured plans (autotune_choice)
AUTOTUNE_K = 3  # the portfolio's best distinct candidates by prediction that autotune measures
AUTOTUNE_BASELINES = ("torchrec_default", "torchrec")  # measured beside them
SEARCHERS = (*MODEL_SEARCHERS, "size_lookup_greedy", "torchrec_default", "torchrec")  # the plans measured
COLUMNS = (*SEARCHERS, AUTOTUNE)  # the table's
# TorchRec's reservation: a flat 15%, as the foreign benchmark runs it (tools/foreign_benchmark.py: its heuristic one
# reserves GBs for the inputs of tiny hot tables and finds no plan); searchers/torchrec.py plans at the per-rank batch
SEARCHER_OPTIONS = {"torchrec": {"reservation": "percent"}, "torchrec_default": {"reservation": "percent"}}
TASKS_FILE = "gpu-tasks.json.gz"
PACK_PLANS = "pack-plans.jsonl.gz"
DMP_RANKS = 8  # the full step's ranks (tools/dmp_cores.py: 8-device foreign tasks), a core each where there are 16
DMP_GRACE_S = 60.0  # past the budget, the DMP step's last task may still be closing its ranks
DMP_MIN_S = 30.0  # the full step's least time where it runs after the others (one task's plans, interleaved)
DMP_ENV = {"CUDA_VISIBLE_DEVICES": ""}  # the step runs on the CPU alone: its ranks never touch the GPU being measured
REPEATS = 3  # measurements of every device at most (the run stops early when every plan has them)
TRAIN_EPOCHS = 300  # the trainer's default; ~150 labels and 600 priced comm samples: estimated 40-90 s on 16 cores
# the labels step's kernels on a GPU: the kinds the shipped GPU runs lack (mean-pooled, weighted, sequence; issue 78),
# each label one kind; dry: every kind, sum-pooled among them
NEW_KINDS = tuple(k for k in KERNEL_KINDS if k != "sum")
PROFILES = Path(__file__).resolve().parents[1] / "neuroshard_jax" / "data" / "profiles"  # the shipped label sets
# tiered memory (issue 78): task 100 is task 0 on devices whose memory holds 1/1.5 of what its tables need on a GPU,
# planned by us and by TorchRec for the GPU (each puts tables in tiered memory: ``core.tiers``, fused_uvm_caching)
# and measured with managed caching where a plan caches a table; not in the loop step
TIERED = {100: 0}
TIERED_OVER = 1.5


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What a run measures: the GPU tasks, the label sampler, the protocol's time per request, training."""

    tasks: GpuTaskConfig
    num_tasks: int
    specs: SpecSamplerConfig
    comm: CommSamplerConfig
    comm_samples: int
    comm_batch_size: int
    warmup_ms: float
    measure_ms: float
    max_iters: int
    iters: int
    epochs: int
    max_labels: int  # labels of the first run at most (the GPU's: time-bound)
    repeat: int  # of them measured again
    # the model step trains on these shipped label sets beside the run's own (a GPU run's labels are the new kinds;
    # the shipped runs hold the sum-pooled ones), with the kinds' inputs where any label set holds another kind
    base_datasets: tuple[str, ...] = ()


# The GPU run: 10 tasks (5 of 8 devices, 5 of 16; 400-512 tables, batch 16k-64k); labels at the same batches,
# 2-48 tables a sample, pooling factors 0.5-40 (log-uniform, mean 9: the tasks' 8.3 and its tail), rows up to 4e7.
# Each request times 8 warm-up iterations and 16 timed ones in one queue (queued's batches): ~0.1-0.2 s of GPU time
# for a device of 10-30M lookups, whose host side (a slice of the cached streams) takes about as long.
GPU = Sizes(
    tasks=GpuTaskConfig(),
    num_tasks=10,
    specs=SpecSamplerConfig(
        min_tables=2,
        max_tables=48,
        log10_rows=(3.0, 7.6),
        log10_pooling=(-0.3, 1.6),
        dims=(16, 32, 64, 128),
        batch_sizes=(16384, 32768, 65536),
        mem_cap_gb=40.0,
        kernels=NEW_KINDS,
    ),
    comm=CommSamplerConfig(world_sizes=(8, 16), min_tables=400, max_tables=1280, dims=(32, 64, 128)),
    comm_samples=600,
    comm_batch_size=32768,
    warmup_ms=20.0,
    measure_ms=30.0,
    max_iters=16,
    iters=8,
    epochs=TRAIN_EPOCHS,
    max_labels=100_000,
    repeat=40,
    base_datasets=tuple(f"{PROFILES}/h200-queued-run{i}" for i in (1, 2, 3)),
)
DRY = Sizes(
    tasks=GpuTaskConfig(device_counts=(2,), tables=(6, 8), batch_sizes=(1024,), dims=(8, 16), log10_rows_max=5.0),
    num_tasks=1,
    specs=SpecSamplerConfig(
        max_tables=3, log10_rows=(2.0, 4.0), dims=(8, 16), batch_sizes=(1024,), kernels=KERNEL_KINDS
    ),
    comm=CommSamplerConfig(world_sizes=(2,), min_tables=4, max_tables=8, dims=(8, 16)),
    comm_samples=40,
    comm_batch_size=1024,
    warmup_ms=5.0,
    measure_ms=10.0,
    max_iters=16,
    iters=10,  # a CPU's fixed protocol: enough runs that the trainer's spread filter keeps most labels
    epochs=5,
    max_labels=60,
    repeat=6,
)


def log(out: Path, line: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {line}"
    print(line, flush=True)
    with open(out / "log.txt", "a") as f:
        f.write(line + "\n")


# ---------------------------------------------------------------------------------------------
# The all-to-alls, priced: one GPU cannot run them

NVLINK_BYTES_PER_MS = 600 * 1024**3 / 1000  # TorchRec's INTRA_NODE_BANDWIDTH (planner/constants.py, torchrec 1.8.0)
COLLECTIVE_MS = 0.02  # a fixed cost per collective (NCCL's small-message latency on one node; assumed, not measured)
OUTPUT_BYTES = 4  # fp32 pooled embeddings and their gradients
ID_BYTES = 8  # int64 ids (TorchRec's BIGINT_DTYPE)
COMM_MODEL = (
    f"one NVLink domain of N GPUs at TorchRec's INTRA_NODE_BANDWIDTH ({NVLINK_BYTES_PER_MS / 1e6:.0f} GB/s a GPU, "
    f"each way) plus {COLLECTIVE_MS} ms per collective; a device's time in an all-to-all is the larger of what it "
    "sends and receives over the bandwidth (pooled outputs fp32: it sends its tables' outputs for every other "
    "device's batch slice, receives its slice of every other device's; the ids int64 likewise before them, one "
    "exchange per sharding type as TorchRec runs them); row-wise groups a ring reduce-scatter forward and all-gather "
    "backward; the step: the slowest device's compute + backward, then the forward all-to-alls (which wait for the "
    "slowest peer)"
)


def exchange_ms(send_bytes: np.ndarray, recv_bytes: np.ndarray) -> np.ndarray:
    """f64[N] ms of one collective in which device d sends ``send_bytes[d]`` and receives ``recv_bytes[d]``."""
    return COLLECTIVE_MS + np.maximum(send_bytes, recv_bytes) / NVLINK_BYTES_PER_MS


def all_to_all_ms(widths, batch_size: int) -> np.ndarray:
    """f64[N] ms of the pooled-output all-to-all of per-device widths (sum of the dims of its shards)."""
    widths = np.asarray(widths, np.float64)
    n = len(widths)
    if n < 2 or not widths.any():
        return np.zeros(n)
    share = (n - 1) / n
    send = batch_size * widths * OUTPUT_BYTES * share
    recv = batch_size / n * (widths.sum() - widths) * OUTPUT_BYTES
    return exchange_ms(send, recv)


def nvlink_ms(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(fwd, bwd) f64[N] priced ms of a plan's collectives (``COMM_MODEL``), as ``comm_layout`` lays them out."""
    n, batch = plan.task.num_devices, plan.task.batch_size
    layout = comm_layout(plan)
    fwd, bwd = np.zeros(n), np.zeros(n)
    if n < 2:
        return fwd, bwd
    column_wise = np.asarray(layout.column_wise or [0] * n, np.float64)
    for widths in (np.asarray(layout.dim_sums, np.float64) - column_wise, column_wise):
        fwd += all_to_all_ms(widths, batch)
        bwd += all_to_all_ms(widths, batch)
    for width, devices in layout.row_groups:
        k = len(devices)
        moved = np.zeros(n)
        moved[devices] = batch * width * OUTPUT_BYTES * (k - 1) / k
        cost = np.where(moved > 0, exchange_ms(moved, moved), 0.0)
        fwd += cost
        bwd += cost
    for per_device in layout.inputs:
        ids = np.array([sum(p) for p in per_device], np.float64)  # ids per sample each device's features take
        recv = batch * ids * ID_BYTES * (n - 1) / n
        send = batch / n * (ids.sum() - ids) * ID_BYTES
        fwd += exchange_ms(send, recv)
    return fwd, bwd


def priced_total_ms(compute_ms, fwd_ms, bwd_ms) -> float:
    """The step of measured compute and priced comm: the slowest device's compute + backward all-to-all, then the
    forward all-to-all, which waits for the slowest peer (the project's plan-cost formula with the straggler wait)."""
    return float(np.max(np.add(compute_ms, bwd_ms)) + np.max(fwd_ms))


def priced_comm_records(sizes: Sizes, seed: int = 0) -> list[dict]:
    """Comm samples of the comm sampler (dim sums over 8 and 16 devices, straggler delays) priced by
    ``all_to_all_ms``, as ``collect kind=comm`` writes measured ones: the forward includes the wait for the
    latest peer."""
    out = []
    for i in range(sizes.comm_samples):
        sample = sample_comm(sizes.comm, seed, i)
        transfer = all_to_all_ms(sample["dim_sums"], sizes.comm_batch_size)
        delays = np.asarray(sample["delays_ms"])
        fwd = delays.max() - delays + transfer
        row = {"id": i, **sample, "batch_size": sizes.comm_batch_size, "ok": True}
        out.append({**row, "fwd_ms": np.round(fwd, 5).tolist(), "bwd_ms": np.round(transfer, 5).tolist()})
    return out


def write_priced_comm(folder: Path, sizes: Sizes, device: str) -> None:
    """``comm.jsonl`` and its manifest in a label folder: priced all-to-alls, said so in the manifest."""
    records = priced_comm_records(sizes)
    (folder / "comm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    settings = {
        "kind": "comm",
        "seed": 0,
        "device": device,
        "batch_size": sizes.comm_batch_size,
        "comm": dataclasses.asdict(sizes.comm),
        "priced": COMM_MODEL,
    }
    how = "priced, not measured: tools/gpu_check.py nvlink_ms (one GPU cannot run an all-to-all)"
    write_manifest(folder / "manifest-comm.json", settings, {"how": how, "num_records": len(records), "num_failed": 0})


# ---------------------------------------------------------------------------------------------
# Steps


def smoke(out: Path, device: str) -> None:
    spec = {"rows": 100_000, "pooling_factor": 20.0, "bins": [0.2] * 4 + [0.1] * 2 + [0.0] * 11, "dim": 64, "seed": 1}
    worker = ComputeWorker(device)
    try:
        answer = worker.request(compute_request("smoke", [spec], None, 4096, device, warmup=5, iters=10), 120)
    finally:
        worker.close()
    write_json({"device": device, "answer": answer.to_json(), "hardware": hardware()}, out / "smoke.json")
    if not answer.ok:
        raise UserError(f"smoke: the worker failed on {device}: {answer.error}")


CACHE_LOAD_FACTORS = (None, 0.5, 0.2, 0.05)  # None: the table in the GPU's memory (the reference)
UVM_TABLES = 3  # tables of the first GPU task, by how their lookups concentrate: steepest, middle, flattest
UVM_MIN_ROWS = 1_000_000  # tables big enough that a GPU would hold them in UVM
UVM_MAX_ROWS = 10_000_000  # and small enough that one request builds and fills it in seconds (UVM weights are host's)
UVM_REPEATS = 2


def uvm_tables(task: Task, count: int = UVM_TABLES) -> list[int]:
    """``count`` of ``task``'s tables of ``UVM_MIN_ROWS`` to ``UVM_MAX_ROWS`` rows (the largest where none has)
    whose access differs most: ordered by the share of the rows a batch reads that it reads once (its histogram's
    first bin: near 1 a cold, flat access a cache barely helps; low, a few hot rows a small cache holds), the two
    ends and the middle."""
    big = [i for i, t in enumerate(task.tables) if UVM_MIN_ROWS <= t.rows <= UVM_MAX_ROWS] or sorted(
        range(task.num_tables), key=lambda i: -task.tables[i].rows
    )[:count]
    spread = sorted(big, key=lambda i: task.tables[i].bins[0])
    picks = np.unique(np.round(np.linspace(0, len(spread) - 1, min(count, len(spread)))).astype(int))
    return [spread[i] for i in picks]


def uvm(out: Path, tasks: dict[int, Task], sizes: Sizes, device: str, deadline: float) -> None:
    """FBGEMM's managed caching (TorchRec's ``fused_uvm_caching``: the rows in host memory through UVM, a share of
    them cached in the GPU's) timed on tables of the first GPU task whose access differs (``uvm_tables``), at each
    of ``CACHE_LOAD_FACTORS`` (None: in the GPU's memory, the reference), ``UVM_REPEATS`` times, with the memory the
    kernels peaked at: ``uvm.json``, the labels a tiered-memory cost needs. On a CPU the cached requests are refused
    by the worker (its answer is kept): the dry run checks the path."""
    first = tasks[min(tasks)]
    timing = Timing(default_protocol(device), sizes.warmup_ms, sizes.measure_ms, sizes.max_iters)
    rows = []
    worker = ComputeWorker(device)
    try:
        for index in uvm_tables(first):
            table = first.tables[index]
            spec = {"rows": table.rows, "pooling_factor": table.pooling_factor, "bins": list(table.bins)}
            spec |= {"dim": table.dim, "seed": SEED * 1000 + index}
            row = {"table": index, "rows": table.rows, "dim": table.dim, "pooling_factor": table.pooling_factor}
            row |= {"read_once_share": round(float(table.bins[0]), 6), "bins": list(table.bins), "readings": []}
            for repeat in range(UVM_REPEATS):
                for factor in CACHE_LOAD_FACTORS:
                    if time.monotonic() > deadline:
                        break
                    request = compute_request(
                        f"uvm/{index}/{factor}/{repeat}",
                        [spec],
                        None,
                        first.batch_size,
                        device,
                        iters=sizes.iters,
                        timing=timing,
                        cache_load_factor=factor,
                    )
                    request = dataclasses.replace(request, memory=True)
                    answer = worker.request(request, 300)
                    reading = {"cache_load_factor": factor, "repeat": repeat, "ok": answer.ok}
                    if answer.ok:
                        reading |= {"fwd_ms": answer.fwd_ms, "bwd_ms": answer.bwd_ms, "total_ms": answer.total_ms}
                        reading["memory"] = answer.memory
                    else:
                        reading["error"] = (answer.error or "")[:300]
                    row["readings"].append(reading)
            rows.append(row)
            doc = {"device": device, "gpu": hardware().get("gpu"), "batch_size": first.batch_size}
            doc |= {"precision": first.precision, "optimizer": "exact_sgd", "tables": rows}
            write_json(doc, out / "uvm.json")
    finally:
        worker.close()
    done = sum(r["ok"] for row in rows for r in row["readings"])
    log(out, f"uvm: {done} of {sum(len(row['readings']) for row in rows)} requests answered")
    try:
        fitted = fit_tiers(out)
        log(
            out,
            f"uvm: miss price {fitted['link_gibps']:.3g} GiB/s + {fitted['miss_us']:.3g} us a missed row, "
            f"held out by table {fitted['held_out']['mape']:.1%}",
        )
    except UserError as err:  # a CPU refuses every cached reading: no price to fit
        log(out, f"uvm: no miss price fitted ({err})")


def fit_tiers(out: Path) -> dict:
    """The miss price of tiered memory fitted on a run's ``uvm.json`` (``core.tiers.fit_price``: the cached kernels'
    extra ms over the same tables in the GPU's memory against the traffic and missed rows the access histograms
    imply), judged table by table held out; written as ``tiers.json``. UserError where the readings fit none."""
    doc = json.loads((out / "uvm.json").read_text())
    readings = price_readings(doc)
    source = f"fitted on {len(readings)} managed-caching readings of {doc.get('gpu') or doc['device']} (uvm.json)"
    price = fit_price(readings, source)
    fitted = {**price.to_json(), "gpu": doc.get("gpu"), "readings": readings}
    fitted["held_out"] = held_out(readings, source) if len({r["table"] for r in readings}) > 1 else None
    write_json(fitted, out / "tiers.json")
    return fitted


def ship_tiers(out: Path) -> Path:
    """A run's fitted miss price (``tiers.json``, fitted again from its ``uvm.json``) shipped for its GPU:
    ``neuroshard_jax/data/tiers/<gpu>.json`` (``core.tiers.price_file``, which a plan for a GPU of that name reads)
    with how, where and when it was made."""
    fitted = fit_tiers(out)
    if not fitted["gpu"]:
        raise UserError(f"{out / 'uvm.json'}: names no GPU, expected a GPU run's readings")
    made = {"run": out.name, "command": f"python -m tools.gpu_check tiers {out.name}", "gpu": fitted["gpu"]}
    made["made"] = time.strftime("%Y-%m-%d", time.gmtime((out / "uvm.json").stat().st_mtime))
    path = price_file(fitted["gpu"])
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_json({**{k: fitted[k] for k in ("link_gibps", "miss_us", "source", "held_out")}, **made}, path)


def label_config(sizes: Sizes, device: str, out_dir: Path, seed: int = 0) -> CollectConfig:
    return CollectConfig(
        seed=seed,
        kind="compute",
        source="specs",
        device=device,
        num_samples=sizes.max_labels,
        out_dir=str(out_dir),
        executor=ExecutorConfig(workers=1),
        pin=False,
        protocol=default_protocol(device),
        warmup_ms=sizes.warmup_ms,
        measure_ms=sizes.measure_ms,
        max_iters=sizes.max_iters,
        iters=sizes.iters,
        specs=sizes.specs,
        progress=False,
    )


def labels(out: Path, work: Path, sizes: Sizes, device: str, deadline: float, seed: int = 0) -> Path:
    """Spec labels until 75% of the step's time is spent, then the first ``sizes.repeat`` of them again into a folder of
    their own; ``labels.tgz`` (both, and the priced comm) and ``labels.json`` (counts and the run-to-run floor).
    ``seed``: the spec sampler's (another seed, other samples: a second run adds labels, it does not repeat them)."""
    folder = work / "gpu-labels"
    config = label_config(sizes, device, folder, seed)
    started = time.monotonic()
    first_until = started + 0.75 * (deadline - started)
    collect(config, range(config.num_samples), until=first_until)
    first_s = time.monotonic() - started
    write_priced_comm(folder, sizes, device)
    first = {r["id"]: r for r in read_jsonl(folder / "compute.jsonl")}
    repeat_ids = sorted(i for i, r in first.items() if r.get("ok"))[: sizes.repeat]
    repeat = work / "gpu-labels-repeat"
    collect(dataclasses.replace(config, out_dir=str(repeat)), repeat_ids, until=deadline)
    second = {r["id"]: r for r in read_jsonl(repeat / "compute.jsonl")} if (repeat / "compute.jsonl").exists() else {}
    both = [i for i in repeat_ids if second.get(i, {}).get("ok")]
    ratio = np.array([second[i]["total_ms"] / first[i]["total_ms"] for i in both])
    measured = [r["total_ms"] for r in first.values() if r.get("ok")]
    summary = {
        "device": device,
        "protocol": config.protocol,
        "timing": {k: getattr(config, k) for k in ("warmup_ms", "measure_ms", "max_iters", "iters")},
        "specs": dataclasses.asdict(sizes.specs),
        "seed": seed,
        "labels": len(first),
        "failed": sum(1 for r in first.values() if not r.get("ok")),
        "seconds": round(first_s, 1),
        "median_label_ms": round(float(np.median(measured)), 4) if measured else None,
        "repeated": len(both),
        "run_to_run_median": round(float(np.median(np.abs(ratio - 1))), 5) if both else None,
        "run_to_run_p90": round(float(np.quantile(np.abs(ratio - 1), 0.9)), 5) if both else None,
        "second_over_first_median": round(float(np.median(ratio)), 5) if both else None,
        "comm": "priced: " + COMM_MODEL,
    }
    write_json(summary, out / "labels.json")
    with tarfile.open(out / "labels.tgz", "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
        if repeat.exists():
            tar.add(repeat, arcname=repeat.name)
    return folder


def plan_task(task: Task, searcher: str, cost_model: str, options: dict | None, device: str) -> Planned:
    """One planning run through the project's planner (the one call site of its API here)."""
    planner = PlannerOptions(
        searcher=searcher,
        cost_model=cost_model,
        searcher_options=SEARCHER_OPTIONS.get(searcher) or {},
        cost_model_options=options or {},
        device=device,
    ).planner()
    return planner.run(task)


def plan_record(index: int, searcher: str, plan: Plan | None, error: str | None = None) -> dict:
    """A plan as the pack and the model step carry it: the task's index, shards, data-parallel tables, the tables
    it put in tiered memory (``cached``: [table, load factor])."""
    if plan is None:
        return {"id": f"{index}/{searcher}", "task": index, "searcher": searcher, "error": error}
    shards = [[s.table, s.col_offset, s.dim, s.device, s.row_offset, s.num_rows] for s in plan.shards]
    costs = plan.costs
    return {
        "id": f"{index}/{searcher}",
        "task": index,
        "searcher": searcher,
        "shards": shards,
        "data_parallel": list(plan.data_parallel),
        "cached": [[i, t.cache_load_factor] for i, t in enumerate(plan.task.tables) if t.cached],
        "search_s": None if plan.search_time_s is None else round(plan.search_time_s, 2),
        "predicted_compute_ms": None if costs is None else [round(float(x), 4) for x in costs.compute_ms],
        "portfolio": None if plan.portfolio is None else plan.portfolio.to_json(),
    }


def rebuilt(task: Task, record: dict) -> Plan:
    """The plan of ``record`` on ``task``, its tables in tiered memory as it put them (on a GPU's count)."""
    shards = tuple(Shard(*s) for s in record["shards"])
    cached = dict(record.get("cached") or [])
    if cached:
        tables = tuple(dataclasses.replace(t, cache_load_factor=cached.get(i)) for i, t in enumerate(task.tables))
        task = on_device(dataclasses.replace(task, tables=tables), "cuda")
    return Plan(task, shards, data_parallel=tuple(record["data_parallel"])).validate()


def tiered_variant(task: Task, over: float = TIERED_OVER) -> Task:
    """``task`` on devices (as many, alike) whose memory holds 1/``over`` of its tables' rows (weights and optimizer
    state), beside their step buffers on a GPU (``core.task``'s count, FBGEMM's backward workspace in it) and each
    device's slice of the batch: a GPU task whose tables do not fit its devices' memory."""
    gpu = on_device(task, "cuda")
    parts = [gpu.rows_memory(i, t.rows, t.dim) for i, t in enumerate(gpu.tables)]
    need = sum(p.buffers for p in parts) + sum(p.weights + p.state for p in parts) / over
    cap = (need / task.num_devices + gpu.step_memory().total) / GIB_BYTES
    return Task.uniform(task.num_devices, round(cap, 4), task.batch_size, task.tables, task.precision)


def plan_device(index: int, device: str) -> str:
    """The device a task is planned for: the tiered task's is a GPU's wherever it is planned (its plans put tables
    in tiered memory; a dry run's CPU measures the others and refuses the cached tables in one line)."""
    return "cuda" if index in TIERED else device


class ModelJob:
    """The model step beside the plans step, in a process of its own (``model`` stage: train, then search; stopped
    at the run's end): its plans are read from ``model-plans.jsonl`` as they come."""

    def __init__(self, out: Path, work: Path, labels_dir: Path, pack: Path | None, dry: bool):
        self.path = out / "model-plans.jsonl"
        args = [sys.executable, "-m", "tools.gpu_check", "model", str(out), "--labels", str(labels_dir)]
        args += ["--work", str(work), *(["--pack", str(pack)] if pack else []), *(["--dry"] if dry else [])]
        self.proc = subprocess.Popen(args, start_new_session=True)  # its own group: stop() ends training too

    def records(self) -> list[dict]:
        return read_jsonl(self.path) if self.path.exists() else []

    def done(self) -> bool:
        return self.proc.poll() is not None

    def stop(self) -> None:
        if not self.done():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def same_kind_sets(base: tuple[str, ...], labels_dir: Path) -> list[str]:
    """The shipped label sets of ``base`` measured on the kind of hardware the run's labels were (a GPU and its host:
    training refuses to mix kinds, ``ensemble_fit.check_one_hardware``); none where the run's labels have no
    manifest."""
    if not (labels_dir / "manifest-compute.json").exists():
        return []
    here = set(manifest_kinds(load_manifest(labels_dir, "compute")))
    return [d for d in base if Path(d).is_dir() and here & set(manifest_kinds(load_manifest(Path(d), "compute")))]


def train_model(out: Path, labels_dir: Path, checkpoint: Path, sizes: Sizes) -> None:
    """``python -m neuroshard_jax.train`` on the labels (compute.jsonl measured, comm.jsonl priced), on the CPU;
    ``model.tgz`` (the checkpoint) and ``model.json`` (held-out MAPE and tau, the seconds, the command)."""
    started = time.monotonic()
    # the shipped sets as paths from where the run started (the repository's root): no machine's folders in records
    shipped = [
        os.path.relpath(d) if not os.path.relpath(d).startswith("..") else d
        for d in same_kind_sets(sizes.base_datasets, labels_dir)
    ]
    datasets = [*shipped, str(labels_dir)]
    kinds = tuple(sizes.specs.kernels) != ("sum",)  # the kinds' inputs, as the CPU kinds models are trained
    args = [
        sys.executable,
        "-m",
        "neuroshard_jax.train",
        f"datasets=[{','.join(datasets)}]",
        f"out={checkpoint}",
        "name=gpu-queued",
        f"train.epochs={sizes.epochs}",
        "train.progress=false",
        *(["ensemble.kinds=true", "ensemble.kind_terms=3"] if kinds else []),
    ]
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    seconds = round(time.monotonic() - started, 1)
    if done.returncode != 0:
        raise UserError(f"training failed after {seconds} s: {done.stderr[-1500:]}")
    meta = json.loads((checkpoint / "meta.json").read_text())
    held_out = meta["metrics"]["compute"][labels_dir.name]
    summary = {
        "seconds": seconds,
        "command": " ".join(args[1:]),
        "datasets": datasets,
        "kernels": list(sizes.specs.kernels),
        "held_out": held_out,
        "held_out_by_set": {Path(d).name: meta["metrics"]["compute"].get(Path(d).name) for d in datasets},
        "samples": meta["metrics"]["compute"].get("samples"),
        "batch_sizes": meta.get("batch_sizes"),
        "comm": {k: meta["metrics"].get(k) for k in ("fwd_comm", "bwd_comm")},
        "comm_note": "comm nets fitted to priced all-to-alls: " + COMM_MODEL,
    }
    write_json(summary, out / "model.json")
    with tarfile.open(out / "model.tgz", "w:gz") as tar:
        tar.add(checkpoint, arcname=checkpoint.name)
    log(out, f"model: trained in {seconds} s, held out {held_out.get('ensemble')}")


def model_stage(out: Path, labels_dir: Path, work: Path, pack: Path | None, dry: bool) -> None:
    """The model step's process: train, then beam and grid plans of every task with the model, one JSONL line each
    (task order, so that a deadline leaves whole tasks)."""
    sizes = DRY if dry else GPU
    device = "cpu" if dry else "cuda"
    checkpoint = work / "gpu-model"
    try:
        train_model(out, labels_dir, checkpoint, sizes)
    except UserError as err:
        log(out, f"model failed: {err}")
        raise
    options = {"checkpoint": str(checkpoint)}
    for index, task in carried_tasks(pack, sizes).items():
        try:  # the portfolio's plan and its members' own (one search: the runs they share are searched once)
            planned = plan_task(task, PORTFOLIO, "neural", options, plan_device(index, device))
            made = {PORTFOLIO: planned.plan, **planned.candidates}
            records = [plan_record(index, s, made.get(s), None if s in made else "no plan") for s in MODEL_SEARCHERS]
        except (UserError, InfeasibleError) as err:
            records = [plan_record(index, searcher, None, str(err)[:300]) for searcher in MODEL_SEARCHERS]
        with open(out / "model-plans.jsonl", "a") as f:
            f.write("".join(json.dumps(record) + "\n" for record in records))


def stream_pools(tasks: dict[int, Task], sizes: Sizes, folder: Path, workers: int) -> dict:
    """Write every task's streams (``write_stream_pool``) in ``workers`` processes; task index -> future of its
    pool path. Started first: the host's spare cores write them while the GPU measures labels."""
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    futures = {
        i: pool.submit(write_stream_pool, sizes.tasks, SEED, i, task, folder / f"gpu-task-{i}.json")
        for i, task in tasks.items()
        if i not in TIERED
    }
    futures |= {i: futures[base] for i, base in TIERED.items() if i in tasks and base in futures}  # its base's
    pool.shutdown(wait=False)
    return futures


class Measurements:
    """Every device of every plan (``plan_kernels``), measured on one worker; the summary of ``plans.json``."""

    def __init__(self, device: str, config: EvaluateConfig):
        self.device, self.config = device, config
        self.plans: dict[tuple[int, str], dict] = {}  # (task, searcher) -> plan, kernel keys per device, record
        self.jobs: dict[str, tuple[Task, list]] = {}
        self.answers: dict[str, list[float]] = {}
        self.memory: dict[str, dict] = {}  # key -> the worker's memory answer (its first measurement's)
        self.failed: dict[str, str] = {}

    def add(self, index: int, task: Task, record: dict) -> None:
        plan = rebuilt(task, record)
        keys = []
        for kernels in plan_kernels(plan):
            for key, at, tables in kernels:
                self.jobs.setdefault(key, (at, tables))
                self.answers.setdefault(key, [])
            keys.append([key for key, _, _ in kernels])
        comm = nvlink_ms(plan)  # priced once: comm_layout walks every shard
        self.plans[index, record["searcher"]] = {"plan": plan, "keys": keys, "record": record, "comm": comm}

    def device_ms(self, keys: list[str]) -> float | None:
        if any(not self.answers[k] for k in keys):
            return None
        return sum(statistics.median(self.answers[k]) for k in keys)

    def next_batch(self, ready: set[int]) -> list[str]:
        """The devices to measure next: of the plans whose tasks' streams are ready, the least measured device set
        (a plan's devices together), first the devices never measured (task order, then searcher order), then
        again those that may be their plan's slowest (within 3% of it), then the rest."""
        best, best_rank = [], None
        for (index, searcher), entry in self.plans.items():
            if index not in ready:
                continue
            measured = [self.device_ms(keys) for keys in entry["keys"]]
            slowest = max((m for m in measured if m is not None), default=None)
            for keys, ms in zip(entry["keys"], measured):
                todo = [k for k in keys if k not in self.failed]
                if not todo:
                    continue
                count = min(len(self.answers[k]) for k in todo)
                contender = ms is None or slowest is None or ms >= 0.97 * slowest
                rank = (count, not contender, index, SEARCHERS.index(searcher))
                if best_rank is None or rank < best_rank:
                    best, best_rank = [], rank
                if rank == best_rank:
                    best += [k for k in todo if len(self.answers[k]) == count and k not in best]
        return best

    def measure(self, pool: KernelPool, keys: list[str]) -> None:
        requests = [
            dataclasses.replace(device_request(key, *self.jobs[key], self.config), memory=True).tagged(key=key)
            for key in keys
        ]

        def record(request: ComputeRequest, answer: ComputeAnswer) -> None:
            key = request.tag("key")
            if answer.ok:
                self.answers[key].append(float(answer.total_ms))
                self.memory.setdefault(key, answer.memory or {})
            else:
                self.failed[key] = str(answer.error)[:300]

        pool.map(requests, record)

    def device_memory(self, plan: Plan, keys: list[list[str]]) -> dict:
        """Per device: the bytes ``Plan.memory`` predicts its shards hold while they train (weights, state, their
        buffers; not the batch slice's, which no kernel request holds), and what its kernels held and peaked at
        (the sums over its kernels, each request measured alone; None until every one of them answered)."""

        def measured(field: str) -> list[int | None]:
            sums = []
            for ks in keys:
                got = [self.memory.get(k, {}).get(field) for k in ks]
                sums.append(sum(got) if got and None not in got else None)
            return sums

        predicted, without = workspace_counts(plan, self.device)
        return {
            "predicted_bytes": [p.total for p in predicted],
            "workspace_bytes": [p.total - w.total for p, w in zip(predicted, without)],
            "held_bytes": measured("held_bytes"),
            "peak_bytes": measured("peak_bytes"),
        }

    def summary(self, tasks: dict[int, Task]) -> dict:
        rows: dict[str, dict] = {}
        for (index, searcher), entry in sorted(self.plans.items()):
            plan, keys = entry["plan"], entry["keys"]
            measured = [self.device_ms(k) for k in keys]
            complete = all(m is not None for m in measured)
            fwd, bwd = entry["comm"]
            row = {
                "compute_ms": [None if m is None else round(m, 4) for m in measured],
                "measurements": [min((len(self.answers[k]) for k in ks), default=0) for ks in keys],
                "predicted_compute_ms": entry["record"].get("predicted_compute_ms"),
                "search_s": entry["record"].get("search_s"),
                "fwd_comm_ms": np.round(fwd, 4).tolist(),
                "bwd_comm_ms": np.round(bwd, 4).tolist(),
                "complete": complete,
                "data_parallel": len(plan.data_parallel),
                "row_split": sum(1 for s in plan.shards if s.num_rows is not None),
                "memory": self.device_memory(plan, keys),
            }
            if complete:
                row["slowest_compute_ms"] = round(max(measured), 4)
                row["priced_total_ms"] = round(priced_total_ms(measured, fwd, bwd), 4)
            if entry["record"].get("portfolio"):
                row["portfolio"] = entry["record"]["portfolio"]
            task_row = rows.setdefault(f"t{index:02d}", {"summary": task_summary(tasks[index]), "plans": {}})
            task_row["plans"][searcher] = row
        for task_row in rows.values():
            chose = autotune_choice(task_row["plans"])
            if chose is not None:
                task_row["plans"][AUTOTUNE] = {**task_row["plans"][chose], "chose": chose}
        failed = {k: v for k, v in list(self.failed.items())[:5]}
        return {"tasks": rows, "failed_devices": len(self.failed), "failures": failed}


def autotune_choice(plans: dict[str, dict]) -> str | None:
    """What ``autotune=kernels`` returns from a task's measured plans: of the portfolio's ``AUTOTUNE_K`` best distinct
    candidates by the model's score and TorchRec's two plans, the least measured priced total (the slowest device's
    measured compute and the priced all-to-alls); None until every one of them is measured. The chosen plan's figure
    is the measurement it was chosen by (``queued`` reads a device to 0.1-0.2%: the winner's bias is that small)."""
    record = plans.get(PORTFOLIO, {}).get("portfolio")
    if not record:
        return None
    distinct = [c for c in record["candidates"] if c["error"] is None and c["same_as"] is None]
    best = [c["member"] for c in sorted(distinct, key=lambda c: c["score_ms"])[:AUTOTUNE_K]]
    measured = {name: plans.get(name, {}).get("priced_total_ms") for name in (*best, *AUTOTUNE_BASELINES)}
    if any(value is None for value in measured.values()):
        return None
    return min(measured, key=measured.get)


def plans(
    out: Path,
    pack: Path | None,
    tasks: dict[int, Task],
    pools: dict,
    sizes: Sizes,
    device: str,
    deadline: float,
    model: ModelJob | None,
    dry: bool,
    streams: dict[int, Task | None] | None = None,
) -> None:
    """Measure the devices of the pack's plans and, as they come, the model's, until the deadline; ``plans.json``
    rewritten after each set of devices. ``streams``: filled with each task as its streams are written (None: that
    task's failed), for the loop step after it."""
    config = EvaluateConfig(
        device=device,
        executor=ExecutorConfig(workers=1),
        protocol=default_protocol(device),
        warmup_ms=sizes.warmup_ms,
        measure_ms=sizes.measure_ms,
        max_iters=sizes.max_iters,
        iters=sizes.iters,
        timeout_s=300.0,
    )
    records = [json.loads(line) for line in gzip.open(pack / PACK_PLANS, "rt")] if pack else []
    measuring = Measurements(device, config)
    streams = {} if streams is None else streams
    taken = 0
    head = {
        "device": device,
        "gpu": hardware().get("gpu"),
        "protocol": config.protocol,
        "timing": {k: getattr(config, k) for k in ("warmup_ms", "measure_ms", "max_iters", "iters")},
        "comm_model": COMM_MODEL,
        "model": "gpu-queued (model.json)" if model else None,
    }
    errors, seen = [], set()
    with KernelPool(1, device, config.timeout_s, log_dir=out) as pool:  # the worker's stderr: out/worker-0.log
        while time.monotonic() < deadline:
            for index, future in pools.items():
                if index not in streams and future.done():
                    try:
                        streams[index] = with_stream_pool(tasks[index], future.result())
                    except Exception as err:  # noqa: BLE001 - that task is left out, the others measured
                        streams[index] = None
                        log(out, f"plans: task {index}'s streams failed: {err}")
            if model is not None:
                got = model.records()
                records += got[taken:]
                taken = len(got)
            for record in records:
                key = (record["task"], record["searcher"])
                if key in seen or streams.get(record["task"]) is None:
                    continue
                seen.add(key)
                if "shards" in record:
                    measuring.add(record["task"], streams[record["task"]], record)
                else:  # a searcher that found no plan of the task (said in plans.json)
                    errors.append(record)
            ready = {i for i, t in streams.items() if t is not None}
            batch = measuring.next_batch(ready)
            waiting = (model is not None and not model.done()) or len(streams) < len(pools)
            if not batch or measuring_done(measuring, 2 if dry else REPEATS):
                if not waiting:
                    break
                time.sleep(0.5)
                continue
            measuring.measure(pool, batch)
            write_json({**head, **measuring.summary(tasks), "errors": errors}, out / "plans.json")
    write_json({**head, **measuring.summary(tasks), "errors": errors}, out / "plans.json")


def baseline_steps(measured: dict, records: list[dict], index: int, task: Task, model: CostModel) -> dict[str, float]:
    """TorchRec's plans of task ``index`` (the pack's ``records``) priced as ``autotune`` prices its candidates
    (``polish.simulate``: each device's compute as the plans step measured it, ``measured`` of ``plans.json``, with
    ``model``'s collectives); only plans whose every device was measured."""
    rows = measured.get(f"t{index:02d}", {}).get("plans", {})
    steps = {}
    for record in records:
        row = rows.get(record["searcher"], {})
        if record["task"] != index or "shards" not in record or not row.get("complete"):
            continue
        plan = rebuilt(task, record)
        costs = simulate(model, [plan], np.asarray([row["compute_ms"]], np.float64))
        steps[record["searcher"]] = round(float(plan_cost_ms(costs)[0]), 4)
    return steps


def loop_step(
    out: Path,
    work: Path,
    tasks: dict[int, Task],
    pools: dict,
    streams: dict[int, Task | None],
    pack: Path | None,
    device: str,
    deadline: float,
) -> None:
    """``autotune=loop`` as a user runs it with the model trained in this run (issue 75's loop on GPU-sized tasks):
    the portfolio's best candidates measured on this device's kernels, the model tuned on them, searched again,
    the new devices measured, until the loop stops or the step's time is spent; one ``loop.jsonl`` line a task
    (its record: every candidate's measured step, the task's balance bound, why it stopped). TorchRec's plans are
    not among its candidates here (no TorchRec on the GPU machine): the table reads them from the plans step's
    measurements of the same devices, on the same device and protocol."""
    checkpoint = work / "gpu-model"
    if not (out / "model.json").exists() or not (checkpoint / "meta.json").exists():
        log(out, "loop: skipped (no model trained in this run)")
        return
    # TorchRec's plans and what the plans step measured of them, read once for every task's row
    records = [json.loads(line) for line in gzip.open(pack / PACK_PLANS, "rt")] if pack else []
    measured = json.loads((out / "plans.json").read_text())["tasks"] if (out / "plans.json").exists() else {}
    for index in sorted(i for i in tasks if i not in TIERED):
        if index not in streams and index in pools:  # the plans step did not run: its streams, written for it
            try:
                streams[index] = with_stream_pool(tasks[index], pools[index].result())
            except Exception as err:  # noqa: BLE001 - that task is left out, the others run
                streams[index] = None
                log(out, f"loop: task {index}'s streams failed: {err}")
        task = streams.get(index)
        left = deadline - time.monotonic()
        if task is None or left < LOOP_MIN_S:
            continue
        autotune = AutotuneConfig(
            name="loop", device=device, baselines=(), budget_s=0.8 * left, executor=ExecutorConfig(workers=1)
        )
        started = time.monotonic()
        planned = (
            PlannerOptions(
                searcher=PORTFOLIO,
                cost_model="neural",
                cost_model_options={"checkpoint": str(checkpoint)},
                device=device,
                autotune=autotune,
            )
            .planner()
            .run(task)
        )
        record = planned.plan.autotune
        row = {"id": f"t{index:02d}", "task": index, "wall_s": round(time.monotonic() - started, 1)}
        row["baselines_ms"] = baseline_steps(measured, records, index, task, planned.cost_model.expected)
        with open(out / "loop.jsonl", "a") as f:
            f.write(json.dumps({**row, "autotune": record.to_json()}) + "\n")
        log(out, f"loop: task {index}: {record.chosen} ({record.rounds} rounds, {record.stopped}; {row['wall_s']} s)")


def dmp_apart() -> bool:
    """Whether this machine has cores for the full step's ranks apart from the other steps' (16 or more)."""
    return len(os.sched_getaffinity(0)) >= 2 * DMP_RANKS


def start_dmp(out: Path, pack: Path | None, dry: bool, budget_s: float) -> subprocess.Popen:
    """The full step on one core per rank (``tools/dmp_cores.py``), on the CPU alone, for ``budget_s``. Where the
    machine has cores for its ranks and the other steps (``dmp_apart``), rank r runs on one of the last
    ``DMP_RANKS`` cores and every process the other steps start runs on the rest. Its log: ``dmp-log.txt``."""
    cores = sorted(os.sched_getaffinity(0))
    command = [sys.executable, "-m", "tools.dmp_cores", "run", str(out), "--budget-s", f"{budget_s:.0f}"]
    command += ["--pack", str(pack)] if pack is not None else []
    command += ["--dry"] if dry else []
    apart = dmp_apart()
    if apart:
        command += ["--cores", ",".join(str(c) for c in cores[-DMP_RANKS:])]
    log(out, f"dmp: started, {'ranks on cores ' + str(cores[-DMP_RANKS:]) if apart else 'on any core'}")
    with open(out / "dmp-log.txt", "ab") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, **DMP_ENV})
    if apart:
        os.sched_setaffinity(proc.pid, set(cores[-DMP_RANKS:]))
        os.sched_setaffinity(0, set(cores[:-DMP_RANKS]))  # the other steps' processes start from this thread
    return proc


def finish_dmp(out: Path, proc: subprocess.Popen, until: float) -> bool:
    """Wait for the DMP step (it stops at the run's budget); True if it ended well."""
    try:
        code = proc.wait(timeout=max(1.0, until - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    log(out, f"dmp: done (exit {code}); dmp.json has what it timed, dmp-log.txt what it said")
    return code == 0


def measuring_done(measuring: Measurements, repeats: int) -> bool:
    """Every device of the plans so far measured ``repeats`` times (or failed)."""
    return all(len(a) >= repeats for k, a in measuring.answers.items() if k not in measuring.failed)


def carried_tasks(pack: Path | None, sizes: Sizes) -> dict[int, Task]:
    """The GPU tasks: read from the pack (generating them takes a minute), else generated."""
    if pack is not None and (pack / TASKS_FILE).exists():
        rows = json.loads(gzip.open(pack / TASKS_FILE, "rt").read())
        return {r["index"]: Task.from_json(r["task"]) for r in rows}
    return made_tasks(sizes)


def made_tasks(sizes: Sizes) -> dict[int, Task]:
    """The GPU tasks, and the tiered one (``TIERED``: a task on devices too small for its tables)."""
    tasks = {i: gpu_task(sizes.tasks, SEED, i) for i in range(sizes.num_tasks)}
    return tasks | {i: tiered_variant(tasks[base]) for i, base in TIERED.items() if base in tasks}


def task_at(sizes: Sizes, index: int) -> Task:
    """GPU task ``index`` (``made_tasks``'), made alone."""
    if index in TIERED:
        return tiered_variant(gpu_task(sizes.tasks, SEED, TIERED[index]))
    return gpu_task(sizes.tasks, SEED, index)


def run(
    out: Path, dry: bool, budget_s: float, pack: Path | None, only: tuple[str, ...] = (), label_seed: int = 0
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if dry else "cuda"
    sizes = DRY if dry else GPU
    start = time.monotonic()
    deadline = start
    log(out, f"gpu check on {hardware().get('gpu') or hardware().get('cpu')}, device={device}, budget {budget_s} s")
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    tasks = carried_tasks(pack, sizes)
    wants_dmp = not only or "dmp" in only
    # with cores of its own, the full step runs beside the others from the start; else after them, so that its 8
    # ranks disturb none of their measurements (on a 2-core machine they made the labels too noisy to train on).
    # A dry run's readings are no result (it checks the code path): its full step starts beside the model and the
    # plans once the labels are taken (the labels it would disturb are trained on).
    dmp = start_dmp(out, pack, dry, budget_s) if wants_dmp and dmp_apart() else None
    try:
        pools, streams = {}, {}
        if not only or "plans" in only or "loop" in only:
            workers = 1 if dry else max(1, min(8, len(os.sched_getaffinity(0)) - 2))
            pools = stream_pools(tasks, sizes, work / "streams", workers)
        labels_dir: list[Path] = []
        model: list[ModelJob] = []
        steps = {
            "smoke": lambda until: smoke(out, device),
            "labels": lambda until: labels_dir.append(labels(out, work, sizes, device, until, label_seed)),
            "model": lambda until: (
                model.append(ModelJob(out, work, labels_dir[-1], pack, dry))
                if labels_dir
                else log(out, "model: skipped (no labels in this run)")
            ),
            "plans": lambda until: plans(
                out, pack, tasks, pools, sizes, device, until, model[-1] if model else None, dry, streams
            ),
            "loop": lambda until: loop_step(out, work, tasks, pools, streams, pack, device, until),
            "uvm": lambda until: uvm(out, tasks, sizes, device, until),
        }
        failed = set()
        for name, step in steps.items():
            if only and name not in only:
                continue
            deadline += SHARES[name] * budget_s / sum(SHARES[n] for n in [n for n in only if n in SHARES] or SHARES)
            if name in GPU_STEPS and "smoke" in failed:
                log(out, f"{name}: skipped (the smoke request failed)")
                continue
            log(out, f"{name}: until {deadline - start:.0f} s")
            try:
                step(deadline)
            except Exception as err:  # noqa: BLE001 - one failed step must not cost the others their device time
                failed.add(name)
                detail = str(err) if isinstance(err, UserError) else traceback.format_exc()
                log(out, f"{name} failed: {detail}")
            log(out, f"{name}: done at {time.monotonic() - start:.0f} s")
            if dry and name == "labels" and wants_dmp and dmp is None:
                dmp = start_dmp(out, pack, dry, max(start + budget_s - time.monotonic(), DMP_MIN_S))
        if model and not model[-1].done():
            log(out, "model: stopped at the deadline; the plans it made are in model-plans.jsonl")
            model[-1].stop()
        shutil.rmtree(work / "streams", ignore_errors=True)
        if wants_dmp and dmp is None:
            dmp = start_dmp(out, pack, dry, max(start + budget_s - time.monotonic(), DMP_MIN_S))
        if dmp is not None and not finish_dmp(out, dmp, start + budget_s + DMP_GRACE_S):
            failed.add("dmp")
        if failed:
            raise UserError(f"the GPU check's steps {', '.join(sorted(failed))} failed; {out / 'log.txt'} says why")
    except BaseException:
        if dmp is not None:
            dmp.kill()  # the run failed outside its steps: its background step goes with it
        raise


# ---------------------------------------------------------------------------------------------
# The table


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def table(out: Path) -> str:
    """The README's GPU table from a run's files: the labels and the model, then per device count each searcher's
    slowest device's compute and priced total against TorchRec's default planner and TorchRec table-wise +
    column-wise (median of the per-task ratios over the tasks where both are complete), then every task."""
    read = {
        name: json.loads((out / f"{name}.json").read_text())
        for name in ("labels", "model", "plans")
        if (out / f"{name}.json").exists()
    }
    lines = []
    lab, mod = read.get("labels"), read.get("model")
    if lab:
        lines += [
            f"labels: {lab['labels']} ({lab['failed']} failed) in {lab['seconds']} s, protocol {lab['protocol']}, "
            f"median label {lab['median_label_ms']} ms; the first {lab['repeated']} again: run to run "
            f"{fmt_pct(lab['run_to_run_median'])} (median), {fmt_pct(lab['run_to_run_p90'])} (p90)"
        ]
    if mod:
        held = mod["held_out"]
        lines += [
            f"model: trained in {mod['seconds']} s on {mod['samples']}; held out: ensemble MAPE "
            f"{fmt_pct(held['ensemble']['mape'])}, Kendall tau {held['ensemble']['kendall_tau']:.3f} "
            f"({held['ensemble']['count']} labels), roofline alone {fmt_pct(held['roofline']['mape'])}"
        ]
    rows = read.get("plans", {}).get("tasks", {})
    if lines:
        lines.append("")
    lines += [
        "| devices | searcher | slowest compute / TorchRec default | / TorchRec TW+CW "
        "| priced total / TorchRec default | / TorchRec TW+CW | tasks |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    counts = sorted({r["summary"]["devices"] for r in rows.values()})
    for n in counts:
        for s in COLUMNS:
            cells, used = [], set()
            for metric in ("slowest_compute_ms", "priced_total_ms"):
                for base in ("torchrec_default", "torchrec"):
                    ratios = []
                    for task_id, r in rows.items():
                        if r["summary"]["devices"] != n:
                            continue
                        value = ratio(r["plans"].get(s, {}).get(metric), r["plans"].get(base, {}).get(metric))
                        if value is not None:
                            ratios.append(value)
                            used.add(task_id)
                    cells.append(f"{statistics.median(ratios):.1%}" if ratios else "-")
            lines.append(f"| {n} | {s} | " + " | ".join(cells) + f" | {len(used)} |")
    lines += [
        "",
        "| task | devices | tables | batch | GiB / device | "
        + " | ".join(f"{s}: compute / priced ms" for s in COLUMNS)
        + " |",
        "| --- " * (5 + len(COLUMNS)) + "|",
    ]
    for task_id, r in rows.items():
        s_ = r["summary"]
        cells = []
        for s in COLUMNS:
            p = r["plans"].get(s, {})
            done = "slowest_compute_ms" in p
            chose = f" ({p['chose']})" if "chose" in p else ""
            cells.append(f"{p['slowest_compute_ms']:.2f} / {p['priced_total_ms']:.2f}{chose}" if done else "-")
        lines.append(
            f"| {task_id} | {s_['devices']} | {s_['tables']} | {s_['batch_size']} | {s_['table_gib_per_device']} | "
            + " | ".join(cells)
            + " |"
        )
    lines += memory_lines(rows)
    lines += loop_lines(out)
    if (out / "dmp.json").exists():
        lines += ["", dmp_cores.table(out)]
    return "\n".join(lines)


def loop_lines(out: Path) -> list[str]:
    """``autotune=loop``'s tasks (``loop.jsonl``): what it chose, its measured step against the task's balance bound
    and against TorchRec's two plans priced alike (``baseline_steps``: their devices' compute as the plans step
    measured it, the same device and protocol: a GPU's ``queued`` labels repeat within 0.1-0.4%)."""
    path = out / "loop.jsonl"
    if not path.exists():
        return []
    lines = [
        "",
        "| task | `autotune=loop` chose | measured step / bound (ms) | / TorchRec default | / TW+CW | stopped | wall |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for line in path.read_text().splitlines():
        row = json.loads(line)
        a = row["autotune"]
        pick = next((c for c in a["candidates"] if c["name"] == a["chosen"]), None)
        if pick is None or pick.get("measured_ms") is None:
            continue
        step, bound = pick["measured_ms"], a.get("bound_ms")
        vs = [ratio(step, row.get("baselines_ms", {}).get(name)) for name in ("torchrec_default", "torchrec")]
        cells = [f"{x:.3f}x" if x is not None else "-" for x in vs]
        against = f"{step:.3f} / {bound:.3f} = {step / bound:.3f}" if bound else f"{step:.3f} / -"
        tail = f"{a['stopped']} | {row['wall_s']} s"
        lines.append(f"| {row['id']} | {a['chosen']} | {against} | {cells[0]} | {cells[1]} | {tail} |")
    return lines


def memory_lines(rows: dict) -> list[str]:
    """Per searcher, the devices' measured memory against ``Plan.memory``'s prediction (their shards' part, with the
    device's backward workspace: ``core.memory.FBGEMM_GPU_WORKSPACE_BYTES`` a lookup on a GPU): the allocator's count
    of what the kernels held (below 100% by the workspace: freed when the backward ends), and on a GPU its peak over
    the request. A peak above 100% is memory the planner did not see: the worst one is what a user's out-of-memory
    would come from."""
    lines = [
        "",
        "| searcher | devices | held / predicted: median (worst) | peak / predicted: median (worst) | peak over |",
        "| --- | --- | --- | --- | --- |",
    ]
    found = False
    for s in SEARCHERS:
        held, peak = [], []
        for r in rows.values():
            memory = r["plans"].get(s, {}).get("memory")
            if not memory:
                continue
            for p, h, k in zip(memory["predicted_bytes"], memory["held_bytes"], memory["peak_bytes"]):
                if p and h is not None:
                    held.append(h / p)
                if p and k is not None:
                    peak.append(k / p)
        if not held:
            continue
        found = True
        cell = f"{statistics.median(peak):.1%} ({max(peak):.1%})" if peak else "- (no GPU)"
        over = f"{sum(x > 1 for x in peak)}" if peak else "-"
        lines.append(f"| {s} | {len(held)} | {statistics.median(held):.1%} ({max(held):.1%}) | {cell} | {over} |")
    return lines if found else []


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2%}"


# ---------------------------------------------------------------------------------------------
# The pack


def pack_plans(out: Path, tasks: dict[int, Task], searchers: tuple[str, ...] = PACK_SEARCHERS) -> None:
    """The plans that need no model of the GPU (TorchRec's, the greedy), made here (the GPU machine has no TorchRec);
    scored with the roofline (their predictions are not used), written as ``PACK_PLANS``."""
    records = []
    for index, task in tasks.items():
        for searcher in searchers:
            started = time.monotonic()
            try:
                # TorchRec's: at the per-rank batch; the tiered task's for a GPU (its tiered memory offered)
                plan = plan_task(task, searcher, "analytic", None, plan_device(index, "cpu")).plan
                records.append(plan_record(index, searcher, plan))
            except (UserError, InfeasibleError) as err:
                records.append(plan_record(index, searcher, None, str(err)[:300]))
            print(f"pack: task {index} {searcher}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    with gzip.open(out / PACK_PLANS, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))


def workspace_counts(plan: Plan, device: str) -> tuple[list[MemoryParts], list[MemoryParts]]:
    """Each device's memory as a plan for ``device`` counts it (on a GPU with FBGEMM's backward workspace,
    ``core.task.on_device``), and the same without any workspace."""
    task = on_device(plan.task, "cuda" if any(t.cached for t in plan.task.tables) else device)
    bare = dataclasses.replace(task, training=dataclasses.replace(task.training, workspace=0.0))
    return task.device_memory(plan.shards, plan.data_parallel), bare.device_memory(plan.shards, plan.data_parallel)


def workspace_share(folder: Path, sizes: Sizes = GPU) -> dict[str, dict]:
    """Per searcher, over the devices of a run's model plans (``model-plans.jsonl[.gz]`` of ``folder``): the plan's
    memory count for a GPU (with FBGEMM's backward workspace) over the count without it, the share the workspace adds
    to each device, median and worst (the ratio a run's measured peak / the count without it is read against)."""
    path = next((folder / n for n in ("model-plans.jsonl", "model-plans.jsonl.gz") if (folder / n).exists()), None)
    if path is None:
        raise UserError(f"{folder}: holds no model-plans.jsonl[.gz], expected a GPU run's folder")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        records = [json.loads(line) for line in f if line.strip()]
    tasks: dict[int, Task] = {}
    ratios: dict[str, list[float]] = {}
    for record in records:
        if "shards" not in record:
            continue
        index = record["task"]
        if index not in tasks:
            tasks[index] = task_at(sizes, index)
        counted, without = workspace_counts(rebuilt(tasks[index], record), "cuda")
        ratios.setdefault(record["searcher"], []).extend(c.total / w.total for c, w in zip(counted, without) if w.total)
    return {
        s: {"devices": len(v), "median": round(statistics.median(v), 4), "worst": round(max(v), 4)}
        for s, v in ratios.items()
    }


def pack_tasks(out: Path, sizes: Sizes) -> dict[int, Task]:
    tasks = made_tasks(sizes)
    rows = [{"index": i, "summary": task_summary(t), "task": t.to_json()} for i, t in tasks.items()]
    with gzip.open(out / TASKS_FILE, "wt") as f:
        f.write(json.dumps(rows))
    return tasks


def pack(out: Path, sizes: Sizes = GPU) -> None:
    out.mkdir(parents=True, exist_ok=True)
    pack_plans(out, pack_tasks(out, sizes))
    dmp_cores.pack(out)  # the DMP step's plans, and TorchRec's wheels beside FBGEMM's and hydra's
    prepare = Path(__file__).resolve().parents[1].parent / "shared" / "gpu" / "prepare.sh"
    if prepare.exists():
        subprocess.run(["bash", str(prepare), str(out.resolve())], check=True)  # it cds
    else:
        print(f"no {prepare}: pack FBGEMM GPU (pruned for the card) and hydra into {out} by hand", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("pack", "run", "table", "model", "workspace", "tiers"))
    parser.add_argument("out")
    parser.add_argument("--dry", action="store_true", help="run: every step on this CPU, tiny")
    parser.add_argument("--budget-s", type=float, default=450.0, help="run: wall seconds for every step together")
    parser.add_argument("--pack", default=None, help="run: the folder pack made (the tasks, TorchRec's plans)")
    parser.add_argument("--labels", default=None, help="model (run's own): the label folder")
    parser.add_argument("--work", default=None, help="model (run's own): the run's work folder")
    parser.add_argument(
        "--steps", default="", help=f"run: these steps only, comma-separated ({', '.join([*SHARES, 'dmp'])})"
    )
    parser.add_argument("--label-seed", type=int, default=0, help="run: the spec sampler's seed of the labels step")
    args = parser.parse_args()
    try:
        if args.stage == "pack":
            pack(Path(args.out))
        elif args.stage == "run":
            only = tuple(step for step in args.steps.split(",") if step)
            if set(only) - set(SHARES) - {"dmp"}:
                raise UserError(f"--steps: got {args.steps!r}, expected some of {', '.join([*SHARES, 'dmp'])}")
            run(Path(args.out), args.dry, args.budget_s, Path(args.pack) if args.pack else None, only, args.label_seed)
        elif args.stage == "model":
            model_stage(
                Path(args.out), Path(args.labels), Path(args.work), Path(args.pack) if args.pack else None, args.dry
            )
        elif args.stage == "tiers":
            print(f"miss price written to {ship_tiers(Path(args.out))}")
        elif args.stage == "workspace":
            for searcher, share in workspace_share(Path(args.out)).items():
                print(
                    f"{searcher}: {share['devices']} devices, the count with the backward's workspace / without: "
                    f"median {share['median']:.1%}, worst {share['worst']:.1%}"
                )
        else:
            print(table(Path(args.out)))
    except UserError as err:
        fail(err)


if __name__ == "__main__":
    main()
