"""Kernel processes, host side: run the torch worker subprocesses and isolate their crashes.

No torch here. ``ComputeWorker`` keeps one ``python -m neuroshard_jax.kernels.worker serve`` process and
restarts it after a crash or a timeout; ``run_comm`` launches one process per rank for a batch of
all-to-all requests. Samplers are deterministic per (seed, sample index), so a resumed collection
draws exactly the samples it would have drawn.

Why one module of ~520 lines: every way the host starts and watches the worker's processes (the serving worker, the
pool of them, the rank processes of the collectives and of DistributedModelParallel) shares their environment, the
reasons a process ended and the cleanup after it; split, each part would repeat them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from neuroshard_jax.core.constants import BYTES_PER_ELEMENT, MIN_CPU_SHARE
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.core.hardware import check_rank_room
from neuroshard_jax.core.manifests import TIMED_KEYS
from neuroshard_jax.core.table import KERNEL_KINDS
from neuroshard_jax.kernels.messages import (
    CACHE_WORD,
    CommAnswer,
    CommRequest,
    ComputeAnswer,
    ComputeRequest,
    ref_words,
)
from neuroshard_jax.workloads.pool import PoolSpec

# glibc's allocator hands blocks above 32 MB back to the OS when they are freed, so a kernel whose output is larger (a
# sequence kernel writes a row per id: 15.5e6 floats for 483k ids of dim 32) page-faults that output afresh on each
# call, or reuses a free block of the heap, by what the process freed before: the same request's forward read 27 ms or
# 4.5 ms (AMD EPYC family 25 model 17, 2026-11-30; docs/results/kernel-kinds.md). Fixed thresholds keep freed memory
# for reuse, as a caching allocator does (CUDA's, jemalloc's): every worker and rank process times the warm kernel.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}
# the batches a request's iterations take in turn (``ComputeRequest.batches``): the warm-up and the timed iterations
# of the fixed protocol each another batch of the same statistics, as in training (docs/results/batches.md)
BATCHES = 16
MALLOC_PROTOCOL = "reuse" if sys.platform.startswith("linux") else "os"  # glibc reads MALLOC_ENV; others ignore it
# One thread per process everywhere below torch (FBGEMM, OpenMP, MKL); the allocator as above.
CORE_ENV = "NEUROSHARD_CORE"  # a rank process runs on this core alone (worker.__main__.pin_to_core)
WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **MALLOC_ENV}
PARENT_ENV = "NEUROSHARD_PARENT_PID"  # a worker dies with the process that started it (worker.die_with_parent)


def without_unset(env: Mapping[str, str | None]) -> dict[str, str]:
    """``env`` without the keys set to None (``ComputeWorker``'s ``extra_env`` unsets a variable so)."""
    return {k: v for k, v in env.items() if v is not None}


class WorkerFailure(Exception):
    """The worker died or timed out on a request; ``reason`` says how."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _exit_reason(returncode: int | None) -> str:
    if returncode is None:
        return "worker stopped answering"
    if returncode < 0:
        sig = signal.Signals(-returncode).name
        hint = " (likely out of memory)" if sig == "SIGKILL" else ""
        return f"worker killed by {sig}{hint}"
    return f"worker exited with code {returncode}"


class ComputeWorker:
    """A persistent profiling worker. ``request`` returns the answer or raises WorkerFailure."""

    def __init__(
        self,
        device: str = "cpu",
        log_path: str | Path | None = None,
        extra_env: dict | None = None,
        core: int | None = None,
    ):
        self.device = device
        self.log_path = Path(log_path) if log_path else None
        self.extra_env = extra_env or {}
        self.core = core  # pinned to this CPU core (Linux), else the scheduler moves it
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.served = 0  # requests answered by the running process (0: a cold process)

    def _start(self) -> None:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "neuroshard_jax.kernels.worker", "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=without_unset({**os.environ, **WORKER_ENV, PARENT_ENV: str(os.getpid()), **self.extra_env}),
        )
        if log is not subprocess.DEVNULL:
            log.close()
        self.served = 0
        if self.core is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(self.proc.pid, {self.core})

    def ensure_started(self) -> None:
        """Start the process unless it runs (from the thread that should own it: on Linux it dies with that
        thread, ``worker.die_with_parent``)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()

    def request(self, request: ComputeRequest, timeout_s: float) -> ComputeAnswer:
        """The worker's answer to ``request`` (JSON on its pipe only); WorkerFailure where it dies or times out."""
        self.ensure_started()
        try:
            self.proc.stdin.write((json.dumps(request.to_json()) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._fail(_exit_reason(self.proc.wait())) from None
        line = self._readline(timeout_s)
        if line is None:
            self._kill()
            raise self._fail(f"timeout after {timeout_s:.0f} s")
        if not line:
            raise self._fail(_exit_reason(self.proc.wait()))
        self.served += 1
        return ComputeAnswer.from_json(json.loads(line))

    def _readline(self, timeout_s: float) -> bytes | None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                return None
        return self.proc.stdout.readline()

    def _fail(self, reason: str) -> WorkerFailure:
        self.proc = None
        self.restarts += 1
        return WorkerFailure(reason)

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill()
        self.proc = None


@dataclasses.dataclass(frozen=True)
class PoolTableRef:
    """A table of a pool task as the worker measures it: pool table ``table_id`` (its real stream) at width ``dim``,
    whole or the row block [row_offset, row_offset + num_rows), in the kernel ``kernel`` (``core.table.KERNEL_KINDS``:
    a device runs one per kind and data type), its weights of ``precision`` where not the request's. The worker's
    form: [table_id, dim(, row_offset, num_rows)(, kernel)(, precision)(, "cache=LF")], the kernel named where it is not
    sum, the cache's load factor where it is in tiered memory."""

    table_id: int
    dim: int
    row_offset: int | None = None
    num_rows: int | None = None
    kernel: str = "sum"
    precision: str | None = None  # ``constants.BYTES_PER_ELEMENT``; None: the request's
    cache_load_factor: float | None = None  # tiered memory (``Table.cache_load_factor``); None: the request's

    def to_json(self) -> list:
        block = [] if self.num_rows is None else [self.row_offset, self.num_rows]
        named = ([self.kernel] if self.kernel != "sum" else []) + ([self.precision] if self.precision else [])
        if self.cache_load_factor is not None:
            named.append(f"{CACHE_WORD}{self.cache_load_factor!r}")
        return [self.table_id, self.dim, *block, *named]

    def order(self) -> tuple:
        """A canonical sort key (a device's tables are measured in this order)."""
        named = self.kernel, self.precision or "", self.cache_load_factor or 0.0
        return self.table_id, self.dim, self.row_offset or 0, self.num_rows or 0, *named


@dataclasses.dataclass(frozen=True)
class SpecTableRef:
    """A table the worker synthesises from its statistics: ``rows``, ``pooling_factor``, the access histogram
    ``bins`` (``workloads.streams.request_spec``), width ``dim``, its stream seeded by ``seed``; whole or the row
    block [row_offset, row_offset + num_rows); ``stream_batch``: the batch its histogram describes, of which the
    request runs the first bags (a data-parallel table's slice; None: the request's batch). The worker's form:
    {rows, pooling_factor, bins, dim, seed(, row_offset, num_rows)(, stream_batch)}."""

    rows: int
    pooling_factor: float
    bins: tuple[float, ...]
    dim: int
    seed: int
    row_offset: int | None = None
    num_rows: int | None = None
    stream_batch: int | None = None
    kernel: str = "sum"  # the kernel it runs in (``core.table.KERNEL_KINDS``)
    precision: str | None = None  # its weights' data type where not the request's
    cache_load_factor: float | None = None  # tiered memory (``Table.cache_load_factor``); None: the request's

    def to_json(self) -> JSONDoc:
        out = {
            "rows": self.rows,
            "pooling_factor": self.pooling_factor,
            "bins": list(self.bins),
            "dim": self.dim,
            "seed": self.seed,
        }
        if self.num_rows is not None:
            out.update(row_offset=self.row_offset, num_rows=self.num_rows)
        if self.stream_batch is not None:
            out["stream_batch"] = self.stream_batch
        if self.kernel != "sum":
            out["kernel"] = self.kernel
        if self.precision:
            out["precision"] = self.precision
        if self.cache_load_factor is not None:
            out["cache_load_factor"] = self.cache_load_factor
        return out


TableRef = PoolTableRef | SpecTableRef


def table_ref(obj, where: str = "table") -> TableRef:
    """A table of a request or a label (the worker's JSON form) as its host type; UserError naming ``where`` on a
    malformed one."""
    try:
        if isinstance(obj, dict):
            num_rows = obj.get("num_rows")
            return SpecTableRef(
                int(obj["rows"]),
                float(obj["pooling_factor"]),
                tuple(obj["bins"]),
                int(obj["dim"]),
                int(obj.get("seed", 0)),
                None if num_rows is None else int(obj["row_offset"]),
                None if num_rows is None else int(num_rows),
                None if obj.get("stream_batch") is None else int(obj["stream_batch"]),
                _kernel(obj.get("kernel", "sum")),
                _precision(obj.get("precision")),
                None if obj.get("cache_load_factor") is None else float(obj["cache_load_factor"]),
            )
        numbers, named = ref_words(obj)  # a kernel, a data type and a cache, named by their own words
        table_id, dim, *block = (int(x) for x in numbers)
        if len(block) not in (0, 2):
            raise ValueError
        cached = None if "cache_load_factor" not in named else float(named["cache_load_factor"])
        kernel, precision = _kernel(named.get("kernel", "sum")), named.get("precision")
        return PoolTableRef(table_id, dim, *block, kernel=kernel, precision=precision, cache_load_factor=cached)
    except (KeyError, TypeError, ValueError):
        raise UserError(
            f"{where}: got {obj!r:.80}, expected [pool table id, dim(, row_offset, num_rows)(, kernel)(, precision)] "
            "or a table spec {rows, pooling_factor, bins, dim(, seed, row_offset, num_rows)}"
        ) from None


def _kernel(name) -> str:
    if name not in KERNEL_KINDS:
        raise ValueError(name)
    return name


def _precision(name) -> str | None:
    if name is not None and name not in BYTES_PER_ELEMENT:
        raise ValueError(name)
    return name


def record_tables(record: dict) -> list[TableRef]:
    """A label's tables (a request's, as the worker took them) as their host types."""
    return [table_ref(t, f"record {record.get('id')!r}: tables[{i}]") for i, t in enumerate(record["tables"])]


def quiet(label: Mapping) -> bool:
    """``label`` (a collected record) was timed on a quiet machine: its worker held at least MIN_CPU_SHARE of its
    core (``ComputeAnswer.quiet`` for a worker's answer); a record without the share (CUDA, older labels) is."""
    return float(label.get("cpu_share", 1.0)) >= MIN_CPU_SHARE


def worker_tables(tables) -> list:
    """``tables`` in the worker's JSON form: a ``TableRef`` converted, a table already in that form (a sampler's
    draw, which is what collect records as the label's tables) as it is."""
    return [t.to_json() if isinstance(t, (PoolTableRef, SpecTableRef)) else t for t in tables]


def compute_request(
    request_id,
    tables: list,
    pool: PoolSpec | None,
    batch_size: int,
    device: str = "cpu",
    optimizer: str = "exact_sgd",
    precision: str = "fp32",
    warmup: int = 5,
    iters: int = 10,
    timing: Timing | None = None,
    pooling: str = "sum",
    weighted: bool = False,
    batches: int = BATCHES,
    cache_load_factor: float | None = None,
) -> ComputeRequest:
    """A worker request: time one fused TBE over ``tables`` (``PoolTableRef``s with the ``pool``, or
    ``SpecTableRef``s with pool None; or either already in the worker's form, ``worker_tables``). ``timing``: the
    fields of another protocol than warm-up + ``iters`` (``timing_fields``); ``pooling``, ``weighted``: the kernel's
    kind (``core.table.kernel_kind``; a sequence kernel's tables share one dim); ``batches``: the batches its
    iterations take in turn (``BATCHES``: a training step's, one after another; 1: the same batch every time, as
    every label before commit 28c6a8b, 2026-11-30, was timed); ``cache_load_factor``: FBGEMM's managed caching (a
    GPU's tiered memory) with that share of the rows cached (None: the tables in the device's memory)."""
    return ComputeRequest(
        request_id,
        tuple(worker_tables(tables)),
        batch_size,
        pool.to_json() if pool is not None else None,
        device,
        optimizer,
        precision,
        warmup,
        iters,
        **dataclasses.asdict(timing or Timing()),
        pooling=pooling,
        weighted=weighted,
        batches=batches,
        cache_load_factor=cache_load_factor,
    )


PROTOCOLS = ("fixed", "timed", "queued", "graph")  # queued, graph: CUDA only


def default_protocol(device: str) -> str:
    """The label protocol of a device unless one is named: ``queued`` on a GPU, ``fixed`` on a CPU. Measured on an
    H200 (``tools/gpu_check.py``, 44 spec requests measured twice): the same request's label changed by 0.1% (median;
    p90 0.24%) between two runs under ``queued``, by 16% under ``fixed`` and 14% under ``timed``, whose per-iteration
    synchronisation times the host's launch gaps (more than half of a sub-millisecond label)."""
    return "queued" if device == "cuda" else "fixed"


@dataclasses.dataclass(frozen=True)
class Timing:
    """A request's protocol beyond ``warmup`` and ``iters``: ``fixed`` (the CPU's default), or another with its warm-up
    and measured kernel time and its most iterations (the worker's ``timed_runs`` says what each protocol does)."""

    protocol: str = "fixed"
    warmup_ms: float | None = None
    measure_ms: float | None = None
    max_iters: int | None = None

    def to_json(self) -> JSONDoc:
        """As a dataset's settings record it: nothing for ``fixed`` (older datasets resume)."""
        if self.protocol == "fixed":
            return {}
        return {"protocol": self.protocol, **{k: getattr(self, k) for k in TIMED_KEYS}}

    @classmethod
    def from_json(cls, settings: Mapping) -> Timing:
        """The protocol a dataset's settings record (absent: ``fixed``)."""
        protocol = settings.get("protocol", "fixed")
        return cls() if protocol == "fixed" else cls(protocol, *(settings[k] for k in TIMED_KEYS))


def timing_fields(protocol: str | None, warmup_ms: float, measure_ms: float, max_iters: int, device: str) -> Timing:
    """A request's protocol fields beyond ``warmup`` and ``iters`` (none for ``fixed``, the CPU's default; None:
    the device's default); the worker's ``timed_runs`` says what each protocol does."""
    protocol = protocol or default_protocol(device)
    if protocol not in PROTOCOLS:
        raise UserError(f"protocol: got {protocol!r}, expected one of {', '.join(PROTOCOLS)}")
    if protocol in ("queued", "graph") and device != "cuda":
        raise UserError(f"protocol: got {protocol!r} with device={device}, expected device=cuda (GPU time only)")
    if protocol == "fixed":
        return Timing()
    return Timing(protocol, warmup_ms, measure_ms, max_iters)


def measure_on(worker: ComputeWorker, request: ComputeRequest, timeout_s: float, warm: bool = True) -> ComputeAnswer:
    """``worker``'s answer to ``request``; a crash or timeout becomes an answer not ``ok`` saying why (the worker
    restarts on its next request). ``warm``: a cold process (new or restarted) first runs a timed request
    once at one iteration and throws the answer away: a cold process's first measurement reads 4-5% high
    (``tools/measure_noise.py protocols``)."""
    try:
        if warm and worker.served == 0:
            worker.request(dataclasses.replace(request, id="warm-up", protocol="fixed", warmup=1, iters=1), timeout_s)
        return worker.request(request, timeout_s)
    except WorkerFailure as failure:
        return ComputeAnswer.failed(request.id, failure.reason)


def pinned_cores(count: int) -> list[int | None]:
    """A distinct core of this process's allowed cores for each of ``count`` workers, the last cores first (the
    driver tends to run on the first); no pinning (None each) where there are fewer cores than workers."""
    if not hasattr(os, "sched_getaffinity"):
        return [None] * count
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < count:
        return [None] * count
    return allowed[len(allowed) - count :]


class KernelPool:
    """``workers`` persistent kernel workers (one thread each feeds one): started on first use, kept across
    ``map`` calls (a polishing loop measures a few devices at a time), closed by ``close`` or ``with``."""

    def __init__(
        self,
        workers: int,
        device: str,
        timeout_s: float,
        log_dir: Path | None = None,
        pin: bool = False,
        warm: bool = True,
    ):
        """``pin``: each CPU worker on a core of its own (``pinned_cores``), where there are enough cores.
        ``warm``: warm up cold worker processes (``measure_on``)."""
        self.device, self.timeout_s, self.warm = device, timeout_s, warm
        count = max(1, workers)
        cores = pinned_cores(count) if pin and device == "cpu" else [None] * count
        self.workers = [
            ComputeWorker(device, log_dir / f"worker-{w}.log" if log_dir else None, core=cores[w]) for w in range(count)
        ]

    def map(
        self, requests: Iterable[ComputeRequest], on_answer: Callable[[ComputeRequest, ComputeAnswer], None]
    ) -> None:
        """Send requests to the workers; ``on_answer(request, answer)`` gets each answer.

        A crash or timeout becomes an answer not ``ok`` saying why, and the worker restarts;
        an exception raised by ``on_answer`` (or a Ctrl-C while waiting) stops every worker's feed and is re-raised
        here.
        """
        jobs = iter(requests)  # drawn lazily: a sampler's requests are built as workers free up
        lock = threading.Lock()
        errors: list[BaseException] = []

        def work(worker: ComputeWorker) -> None:
            try:
                while not errors:
                    with lock:
                        request = next(jobs, None)
                    if request is None:
                        return
                    answer = measure_on(worker, request, self.timeout_s, self.warm)
                    on_answer(request, answer)
            except BaseException as err:
                errors.append(err)

        for worker in self.workers:  # started here, not in the feeding threads, so they outlive this call
            worker.ensure_started()
        threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in self.workers]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        except BaseException as err:  # Ctrl-C while waiting: every feed stops after its request, then the caller's
            errors.append(err)  # exit closes the workers (a feed left running would restart each one closed)
            raise
        if errors:
            raise errors[0]

    def comm(self, requests: list[CommRequest], world: int, timeout_s: float) -> dict[int | str, list[CommAnswer]]:
        """A comm batch on ``world`` rank processes of this host (``run_comm``)."""
        return run_comm(requests, world, timeout_s, self.device)

    def close(self) -> None:
        for worker in self.workers:
            worker.close()

    def __enter__(self) -> KernelPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@functools.cache
def worker_versions() -> JSONDoc:
    """Library versions the worker sees (torch, fbgemm_gpu), asked of a subprocess once per process (a start of
    torch: seconds of a core, which a measuring worker beside it would lose)."""
    code = (
        "import json, torch, fbgemm_gpu; print(json.dumps({'torch': torch.__version__, "
        "'fbgemm_gpu': getattr(fbgemm_gpu, '__version__', 'unknown'), 'cuda': torch.cuda.is_available()}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **WORKER_ENV}
    )
    if done.returncode != 0:
        raise UserError(
            "profiling needs torch and fbgemm_gpu: install the 'cpu' (or 'gpu') extra, e.g. pip install -e '.[cpu]'"
        )
    return json.loads(done.stdout)


# ---------------------------------------------------------------------------------------------
# All-to-all benchmark


def run_worker(args: list[str], timeout_s: float, what: str) -> subprocess.CompletedProcess:
    """Run one ``python -m neuroshard_jax.kernels.worker ARGS`` command to completion; a timeout or a failed exit
    is a one-line UserError naming ``what`` ran."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "neuroshard_jax.kernels.worker", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"{what}: the torch worker ran past its timeout of {timeout_s} s") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"{what}: the torch worker failed (exit {done.returncode}): {tail}")
    return done


def run_ranks(
    command: list[str],
    world: int,
    tmp: Path,
    timeout_s: float,
    cores: Sequence[int] | None = None,
    modules_bytes: int = 0,
) -> None:
    """Run ``python -m neuroshard_jax.kernels.worker COMMAND RANK WORLD INIT ...`` for every rank and wait for all;
    ``{rank}`` in an argument is replaced by the rank; rank r runs on core ``cores[r]`` alone where cores are given
    (one per rank). Refused before any rank starts where the ranks and ``modules_bytes`` (what their modules hold in
    all) would not fit this machine (``hardware.check_rank_room``). Raises WorkerFailure if a rank crashes or the
    ranks run past ``timeout_s`` (all are killed)."""
    check_rank_room(world, modules_bytes, command[0])
    if cores is not None and len(cores) < world:
        raise UserError(f"cores: got {len(cores)} ({list(cores)}), expected one for each of the {world} ranks")
    init = f"file://{tmp / 'rendezvous'}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "neuroshard_jax.kernels.worker",
                command[0],
                str(rank),
                str(world),
                init,
                *(arg.replace("{rank}", str(rank)) for arg in command[1:]),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / f"err.{rank}", "wb"),
            env={
                **os.environ,
                **WORKER_ENV,
                PARENT_ENV: str(os.getpid()),
                **({CORE_ENV: str(cores[rank])} if cores is not None else {}),
            },
        )
        for rank in range(world)
    ]
    deadline = time.monotonic() + timeout_s
    failure = None
    try:
        failure = first_failure(procs, deadline, tmp)
        if failure is None and any(proc.poll() is None for proc in procs):
            failure = f"{command[0]} timeout after {timeout_s:.0f} s"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if failure:
        raise WorkerFailure(failure)


RANKS_GRACE_S = 5.0  # after a rank fails, how long the others have to end (their collectives see it closed)


def first_failure(procs: list, deadline: float, tmp: Path) -> str | None:
    """Wait for the ranks until all end or ``deadline``; the rank that failed first and why, or None. A rank killed
    by a signal (the kernel's out-of-memory killer sends SIGKILL) is named before the ranks that then lost their
    peer ("Connection closed by peer"), whichever exited first."""
    failed: list[tuple[int, int]] = []  # (rank, code) in the order seen
    until = deadline
    while time.monotonic() < until:
        running = False
        for rank, proc in enumerate(procs):
            code = proc.poll()
            if code is None:
                running = True
            elif code != 0 and all(r != rank for r, _ in failed):
                failed.append((rank, code))
                until = min(until, time.monotonic() + RANKS_GRACE_S)
        if not running:
            break
        time.sleep(0.05)
    if not failed:
        return None
    rank, code = next(((r, c) for r, c in failed if c < 0), failed[0])
    tail = (tmp / f"err.{rank}").read_text(errors="replace").strip().splitlines()[-1:] or [""]
    return f"rank {rank}: {_exit_reason(code)} {tail[0]}".strip()


def run_comm(
    requests: list[CommRequest], world: int, timeout_s: float, device: str = "cpu"
) -> dict[int | str, list[CommAnswer]]:
    """Run comm requests on ``world`` rank processes (on ``device``); returns request id -> each rank's answer.

    Raises WorkerFailure if any rank crashes or the batch exceeds ``timeout_s`` (all ranks are killed).
    """
    with tempfile.TemporaryDirectory(prefix="neuroshard-comm-") as tmp:
        tmp = Path(tmp)
        lines = (json.dumps(dataclasses.replace(r, device=device).to_json()) + "\n" for r in requests)
        (tmp / "requests.jsonl").write_text("".join(lines))
        run_ranks(["comm", str(tmp / "requests.jsonl"), str(tmp / "out.{rank}")], world, tmp, timeout_s)
        results: dict[int | str, list[CommAnswer]] = {r.id: [None] * world for r in requests}
        for rank in range(world):
            for line in (tmp / f"out.{rank}").read_text().splitlines():
                answer = CommAnswer.from_json(json.loads(line))
                results[answer.id][rank] = answer
        return results
