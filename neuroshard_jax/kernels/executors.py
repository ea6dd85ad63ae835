"""Where kernel measurements run: ``executor=local`` (worker processes on this host, the default) or
``executor=ray`` (Ray actors on a cluster, ``executor.address``).

Both take the same requests (``profiling.compute_request``; comm batches as ``profiling.run_comm`` takes them) and
run the same torch worker wall (``python -m neuroshard_jax.kernels.worker``): an executor only decides where the worker
processes live. The driver gets every answer back (``on_answer`` runs in the calling thread for Ray, in one
feeding thread per worker for the local pool, under the caller's own lock discipline as before), so the driver
alone writes datasets: exactly-once and resumability are the caller's, unchanged. On Ray, a request whose actor
died (its process killed, its node lost) is retried on a fresh actor, which Ray places wherever the resources
are, up to ``max_retries`` times; the answer carries ``retries`` so the dataset row counts it.

Ray is imported only here, inside functions: nothing else pays for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

from neuroshard_jax.core.config import bounded, check_bounds
from neuroshard_jax.core.errors import UserError, first_line
from neuroshard_jax.core.files import JSONDoc
from neuroshard_jax.kernels.messages import CommAnswer, CommRequest, ComputeAnswer, ComputeRequest
from neuroshard_jax.kernels.processes import (
    MALLOC_PROTOCOL,
    ComputeWorker,
    KernelPool,
    WorkerFailure,
    measure_on,
    run_comm,
)

NAMES = ("local", "ray")
LOCAL_CLUSTER_MIN_CPUS = 8  # a comm request asks for its N <= 8 ranks on one node (oversubscribed, as locally)


@dataclasses.dataclass(frozen=True)
class ExecutorConfig:
    """conf/executor/{local,ray}.yaml."""

    name: str = "local"  # local: worker processes on this host | ray: Ray actors on a cluster
    # kernel workers measuring in parallel (one torch thread each; one GPU each on cuda)
    workers: int = bounded(at_least=1, default=1)
    address: str | None = None  # ray: null starts a local cluster here, "auto" joins a running one, or ray://HOST:PORT
    num_cpus: int | None = None  # ray, a local cluster only: logical CPUs declared (default max(cores, 8))
    # ray: a request whose actor died is retried on a fresh actor this many times
    max_retries: int = bounded(at_least=0, default=3)
    connect_timeout_s: float = 30.0  # ray: an address where no cluster answers within this is one error line

    def __post_init__(self):
        if self.name not in NAMES:
            raise UserError(f"executor.name: got {self.name!r}, expected one of {', '.join(NAMES)}")
        check_bounds(self, "executor.")
        if not self.connect_timeout_s > 0:
            raise UserError(f"executor.connect_timeout_s: got {self.connect_timeout_s}, expected seconds > 0")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise UserError(f"executor.num_cpus: got {self.num_cpus}, expected an integer >= 1 or null")
        if self.name == "local" and (self.address is not None or self.num_cpus is not None):
            key = "address" if self.address is not None else "num_cpus"
            raise UserError(f"executor.{key}: set with executor=local, expected executor=ray (or leave it null)")
        if self.address is not None and self.num_cpus is not None:
            raise UserError(
                f"executor.num_cpus: got {self.num_cpus} with executor.address={self.address!r}; a running "
                "cluster declares its own CPUs (num_cpus is for the local cluster that address=null starts)"
            )


class Executor(Protocol):
    """Runs kernel requests somewhere; ``KernelPool`` (local) and ``RayExecutor`` implement it."""

    def map(
        self, requests: Iterable[ComputeRequest], on_answer: Callable[[ComputeRequest, ComputeAnswer], None]
    ) -> None: ...

    def comm(self, requests: list[CommRequest], world: int, timeout_s: float) -> dict[int | str, list[CommAnswer]]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc) -> None: ...


def open_executor(
    config: ExecutorConfig, device: str, timeout_s: float, log_dir: Path | None = None, pin: bool = False
) -> Executor:
    """The executor ``config`` names. ``pin`` (local CPU workers on cores of their own) has no Ray equivalent:
    Ray assigns logical CPUs, not cores, so a Ray run is unpinned (its records say which protocol)."""
    if config.name == "local":
        return KernelPool(config.workers, device, timeout_s, log_dir, pin=pin)
    return RayExecutor(config, device, timeout_s)


def map_requests(
    requests: Iterable[ComputeRequest],
    on_answer: Callable[[ComputeRequest, ComputeAnswer], None],
    executor: ExecutorConfig,
    device: str,
    timeout_s: float,
    log_dir: Path | None = None,
    pin: bool = False,
) -> None:
    """``Executor.map`` on an executor opened for these requests and closed after them."""
    with open_executor(executor, device, timeout_s, log_dir, pin) as pool:
        pool.map(requests, on_answer)


@contextlib.contextmanager
def opened(
    executor: Executor | None, config: ExecutorConfig, device: str, timeout_s: float, pin: bool = False
) -> Iterator[Executor]:
    """``executor`` if the caller holds one open (it stays open), else one opened for this block."""
    if executor is not None:
        yield executor
        return
    with open_executor(config, device, timeout_s, pin=pin) as fresh:
        yield fresh


def pinned(pin: bool | None, executor: ExecutorConfig) -> bool:
    """``pin``, or where it is null what the executor supports: pinned local workers, unpinned Ray actors (Ray
    places them on logical CPUs, not cores)."""
    return executor.name == "local" if pin is None else pin


def protocol(executor: ExecutorConfig, pin: bool, device: str) -> JSONDoc:
    """What a dataset records about where its labels were measured: pinning (it holds only for local CPU workers) and
    the host allocator's reuse of freed memory (``processes.MALLOC_ENV``; a CPU's kernels only, absent: ``os``)."""
    pinned = {"pin": True} if pin and device == "cpu" and executor.name == "local" else {}
    return {**pinned, **({"malloc": MALLOC_PROTOCOL} if device == "cpu" and MALLOC_PROTOCOL != "os" else {})}


# ---------------------------------------------------------------------------------------------
# Ray


def _ray():
    try:
        import ray
    except ImportError:
        raise UserError("executor=ray needs Ray: pip install 'ray==2.60.0' (it is in the dev extra)") from None
    return ray


@functools.cache
def _actor_class():
    ray = _ray()

    @ray.remote(max_restarts=0, max_task_retries=0)
    class KernelActor:
        """One persistent torch kernel worker (a subprocess of the actor, on the actor's node)."""

        def __init__(self, device: str):
            self.worker = ComputeWorker(device)

        def pid(self) -> int:
            return os.getpid()

        def measure(self, request: ComputeRequest, timeout_s: float) -> ComputeAnswer:
            return measure_on(self.worker, request, timeout_s, warm=True)

        def close(self) -> None:
            self.worker.close()

    return KernelActor


@functools.cache
def _comm_task():
    return _ray().remote(max_retries=0)(run_comm)


def connect(config: ExecutorConfig) -> bool:
    """Reach the executor's cluster before anything is written: on Ray, join ``address`` (or start a local cluster
    for ``address=null``) unless this process is joined already; an address where no cluster answers within
    ``connect_timeout_s`` is one UserError (Ray itself retries for ever). Returns whether this call started the
    connection (its opener shuts it down). Local workers need nothing."""
    if config.name != "ray":
        return False
    ray = _ray()
    if ray.is_initialized():
        return False
    deadline = time.monotonic() + config.connect_timeout_s
    address = config.address
    if address in (None, "auto") and os.environ.get("RAY_ADDRESS"):  # where ray.init would go, waited on alike
        address = os.environ["RAY_ADDRESS"]
    if address not in (None, "auto"):
        _answers(address, config.connect_timeout_s)
    local = address is None
    cpus = config.num_cpus or max(os.cpu_count() or 1, LOCAL_CLUSTER_MIN_CPUS) if local else None
    done: dict = {}

    def start() -> None:
        try:
            ray.init(
                address=address,
                num_cpus=cpus,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        except Exception as err:  # handed to the caller's thread
            done["error"] = err
        done["ok"] = True

    if local:  # nothing to wait on: Ray starts its processes here
        start()
    else:  # Ray's worker warns that a thread cannot set its SIGTERM handler: ours is the caller's own
        logging.getLogger("ray._private.worker").setLevel(logging.ERROR)
        thread = threading.Thread(target=start, daemon=True, name="ray-connect")
        thread.start()
        thread.join(max(deadline - time.monotonic(), 1.0))
    if "ok" not in done:
        raise UserError(
            f"executor.address: got {address!r}, no Ray cluster answered within {config.connect_timeout_s:g} s "
            "(executor.connect_timeout_s); expected a running cluster's address, auto on one of its nodes, or null "
            "for a local cluster"
        )
    if "error" in done:
        err = done["error"]
        raise UserError(f"executor.address: got {address!r}, Ray could not connect: {first_line(err)}")
    return True


@contextlib.contextmanager
def connected(config: ExecutorConfig) -> Iterator[None]:
    """``connect`` for the block; a Ray connection it started (a local cluster included) is shut down after."""
    started = connect(config)
    try:
        yield
    finally:
        if started:
            _ray().shutdown()


def _answers(address: str, timeout_s: float) -> None:
    """Fail in one line unless something accepts a TCP connection at ``address`` (``HOST:PORT`` or
    ``ray://HOST:PORT``) within ``timeout_s``: the quick answer for a wrong host or port."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:6379
    if not host or not port.isdigit():
        raise UserError(f"executor.address: got {address!r}, expected HOST:PORT, ray://HOST:PORT, auto or null")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else (err.strerror or first_line(err))
        raise UserError(
            f"executor.address: got {address!r}, nothing answers there ({reason}); expected a running Ray "
            "cluster's address (ray start --head prints it), auto on one of its nodes, or null for a local cluster"
        ) from None


class RayExecutor:
    """``workers`` Ray actors, each feeding one torch kernel worker; the driver keeps one request in flight per
    actor, draws requests lazily, and hands each answer to ``on_answer`` in the calling thread."""

    def __init__(self, config: ExecutorConfig, device: str, timeout_s: float):
        self.config, self.device, self.timeout_s = config, device, timeout_s
        self.owns_cluster = connect(config)
        self.retried = 0  # requests sent again after their actor died
        self.actors = [self._actor() for _ in range(config.workers)]

    def _actor(self):
        resources = {"num_gpus": 1} if self.device == "cuda" else {"num_cpus": 1}
        return _actor_class().options(**resources).remote(self.device)

    def pids(self) -> list[int]:
        """The actors' process ids (for logs, and for tests that kill one)."""
        ray = _ray()
        return ray.get([a.pid.remote() for a in self.actors])

    def map(
        self, requests: Iterable[ComputeRequest], on_answer: Callable[[ComputeRequest, ComputeAnswer], None]
    ) -> None:
        ray = _ray()
        lost = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.ObjectLostError)
        jobs = iter(requests)
        pending: dict = {}  # object ref -> (actor slot, request, retries so far)

        def submit(slot: int, request: ComputeRequest, retries: int) -> None:
            pending[self.actors[slot].measure.remote(request, self.timeout_s)] = (slot, request, retries)

        for slot in range(len(self.actors)):
            request = next(jobs, None)
            if request is None:
                break
            submit(slot, request, 0)
        while pending:
            [ref], _ = ray.wait(list(pending), num_returns=1)
            slot, request, retries = pending.pop(ref)
            try:
                answer = ray.get(ref)
            except lost as err:
                self.retried += 1
                ray.kill(self.actors[slot], no_restart=True)
                self.actors[slot] = self._actor()
                if retries < self.config.max_retries:
                    submit(slot, request, retries + 1)
                    continue
                reason = f"ray: its actor died {retries + 1} times ({type(err).__name__})"
                answer = ComputeAnswer.failed(request.id, reason)
            if retries:
                answer = dataclasses.replace(answer, retries=retries)
            on_answer(request, answer)  # an exception here stops the feed; the actors' requests finish unread
            request = next(jobs, None)
            if request is not None:
                submit(slot, request, 0)

    def comm(self, requests: list[CommRequest], world: int, timeout_s: float) -> dict[int | str, list[CommAnswer]]:
        """A comm batch as one Ray task that asks for its ``world`` ranks on one node (CPUs, or GPUs on cuda)."""
        ray = _ray()
        key = "GPU" if self.device == "cuda" else "CPU"
        largest = max((n["Resources"].get(key, 0) for n in ray.nodes() if n["Alive"]), default=0)
        if largest < world:
            raise UserError(
                f"executor=ray: a {world}-rank all-to-all needs {world} {key}s on one node; the largest node has "
                f"{largest:g} (a local cluster: executor.num_cpus>={world})"
            )
        resources = {"num_gpus": world} if self.device == "cuda" else {"num_cpus": world}
        try:
            return ray.get(_comm_task().options(**resources).remote(requests, world, timeout_s, self.device))
        except ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, WorkerFailure):
                raise WorkerFailure(err.cause.reason) from None
            raise WorkerFailure(f"ray: the comm task failed: {err.cause!r:.200}") from None
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as err:
            raise WorkerFailure(f"ray: the comm task's node or worker died ({type(err).__name__})") from None

    def close(self) -> None:
        ray = _ray()
        for actor in self.actors:
            try:
                ray.get(actor.close.remote(), timeout=30)
            except Exception:  # a dead actor has nothing to close
                pass
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self.owns_cluster:
            ray.shutdown()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
