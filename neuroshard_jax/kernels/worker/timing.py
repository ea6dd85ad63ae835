"""How the worker times a request's kernels: the protocols (``fixed``, ``timed``; on CUDA ``graph`` and ``queued``), a
step's forward and backward timers, the iterations a label keeps."""

from __future__ import annotations

import time

from neuroshard_jax.kernels.messages import ComputeRequest


class RequestError(Exception):
    """A request the worker refuses (answered, the worker keeps serving)."""


GPU_PROTOCOLS = {"graph": "CUDA graph replay", "queued": "the host enqueues ahead of the GPU"}


def graphed_step(torch, tbe, timer):
    """The ``graph`` protocol's step: forward and backward (with its fused optimizer update) each captured once as a
    CUDA graph, then replayed between the timer's events; the L2 flush runs outside the graphs. A replay is one
    launch, so the label is the kernels' GPU time without the host's per-kernel launch gaps, as in a training step
    whose host runs ahead of the GPU (or that replays graphs itself)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream before capture, as torch.cuda.graphs asks
        for _ in range(3):
            out = tbe.forward()
            grad = tbe.grads(out)
            tbe.backward(out, grad)
    torch.cuda.current_stream().wait_stream(side)
    forward, backward = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    phase = "forward"
    try:  # relaxed: calls that are unsafe only for other threads' captures do not end this one
        with torch.cuda.graph(forward, capture_error_mode="relaxed"):
            out = tbe.forward()
        phase = "backward"
        with torch.cuda.graph(backward, pool=forward.pool(), capture_error_mode="relaxed"):
            tbe.backward(out, grad)
    except RuntimeError as err:
        raise RequestError(f"protocol 'graph': FBGEMM's {phase} cannot be captured as a CUDA graph: {err}") from None

    def step() -> tuple[float, float]:
        tbe.advance()  # the next batch into the inputs the graphs captured
        timer.flush()
        timer.start()
        forward.replay()
        timer.mark()
        backward.replay()
        return timer.stop()

    return step


MAX_KEPT_RUNS = 64  # timed runs a row keeps (evenly spaced; the medians are over all of them)


def timed_runs(step, request: ComputeRequest) -> tuple[list[tuple[float, float]], float]:
    """The (fwd, bwd) ms of the timed iterations of ``step`` under the request's protocol, and the CPU share of the
    timed part (below 1: something else took the core).

    ``fixed`` (the default): ``warmup`` iterations, then ``iters`` timed. ``timed``: iterations until ``warmup_ms``
    of kernel time has run (clocks and caches warm whatever the shard's size), then timed iterations until
    ``measure_ms`` of kernel time is filled, at least ``iters`` and at most ``max_iters`` (a 0.9 ms GPU shard gets
    ~110 timed iterations at 100 ms, a 200 ms CPU shard ``iters``). CUDA only: ``graph``, ``timed`` over CUDA-graph
    replays of the step (``graphed_step``); ``queued``, the GPU's time with the host ahead (``queued_runs``)."""
    if request.protocol == "fixed":
        for _ in range(request.warmup):
            step()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        runs = [step() for _ in range(request.iters)]
    else:

        def one(_size: int) -> list[tuple[float, float]]:  # the timed protocol's batch: one synchronised iteration
            return [step()]

        _warm_up(one, request, 1)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        runs = _fill(one, request, 1)
    return runs, (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)


def _warm_up(batch, request: ComputeRequest, size: int) -> None:
    """Run ``batch(size)`` (it returns its iterations' (fwd, bwd) ms) until ``warmup_ms`` of kernel time has run."""
    warmed = 0.0
    while warmed < request.warmup_ms or warmed == 0.0:
        warmed += sum(f + b for f, b in batch(size))


def _fill(batch, request: ComputeRequest, size: int) -> list[tuple[float, float]]:
    """Timed iterations from ``batch(k)``, at most ``size`` a call, until ``measure_ms`` of kernel time is filled: at
    least ``iters``, at most ``max_iters``."""
    runs, filled = [], 0.0
    least, most = request.iters, request.max_iters
    while (filled < request.measure_ms or len(runs) < least) and len(runs) < most:
        got = batch(min(size, most - len(runs)))
        runs += got
        filled += sum(f + b for f, b in got)
    return runs


def queued_runs(torch, tbe, timer, request: ComputeRequest) -> tuple[list[tuple[float, float]], float]:
    """The ``queued`` protocol (CUDA only): ``timed``'s warm-up and measuring time, but the GPU's own time. Each
    batch of iterations starts behind a GPU sleep long enough for the host to enqueue the whole batch (flush, events,
    fwd, bwd) before the GPU reaches it; one synchronisation per batch. The kernels then run back to back, as in a
    training step whose host runs ahead of the GPU, and the host's launch jitter is out of the label. Also returns
    the share of batches the host stayed ahead in (below 1: something in the step waited for the GPU)."""
    grad = tbe.grads(tbe.forward())
    cycles_per_ms = 2.0e6  # at the H100/H200's top SM clock (1.98 GHz); a slower clock only sleeps longer

    def enqueue(events) -> None:
        tbe.advance()
        timer.flush()
        events[0].record()
        out = tbe.forward()
        events[1].record()
        tbe.backward(out, grad)
        events[2].record()

    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(3):
        enqueue([torch.cuda.Event(enable_timing=True) for _ in range(3)])
    host_ms = (time.perf_counter() - started) * 1e3 / 3  # the host's time to enqueue one iteration
    torch.cuda.synchronize()
    ahead = []

    def batch(count: int) -> list[tuple[float, float]]:
        events = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(count)]
        asleep = torch.cuda.Event()
        torch.cuda._sleep(int(2.0 * host_ms * count * cycles_per_ms) + 10_000)
        asleep.record()
        for e in events:
            enqueue(e)
        ahead.append(not asleep.query())  # the GPU still asleep: the host enqueued the batch ahead of it
        torch.cuda.synchronize()
        return [(a.elapsed_time(b), b.elapsed_time(c)) for a, b, c in events]

    _warm_up(batch, request, 8)
    ahead.clear()
    runs = _fill(batch, request, 32)
    return runs, sum(ahead) / len(ahead)


class CpuTimer:
    def flush(self):
        pass

    def start(self):
        self.t0 = time.perf_counter()

    def mark(self):
        self.t1 = time.perf_counter()

    def stop(self):
        t2 = time.perf_counter()
        return (self.t1 - self.t0) * 1e3, (t2 - self.t1) * 1e3


class CudaTimer:
    """CUDA events around fwd and bwd, with the L2 cache flushed by writing a buffer on the GPU itself."""

    def __init__(self, torch):
        self.torch = torch
        l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 * 2**20)
        self.flush_buffer = torch.empty(2 * l2_bytes // 4, dtype=torch.float32, device="cuda")
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]

    def flush(self):
        self.flush_buffer.zero_()

    def start(self):
        self.events[0].record()

    def mark(self):
        self.events[1].record()

    def stop(self):
        self.events[2].record()
        self.torch.cuda.synchronize()
        return self.events[0].elapsed_time(self.events[1]), self.events[1].elapsed_time(self.events[2])
