"""Real FBGEMM workers on tiny shards, real gloo collectives, real crashes."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from neuroshard_jax.core.devices import Device
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import read_records, write_json
from neuroshard_jax.core.hardware import installed_stack
from neuroshard_jax.core.memory import OPTIMIZERS, shard_memory
from neuroshard_jax.core.table import Table
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.choice import CostModelSpec
from neuroshard_jax.kernels.messages import CommRequest, ComputeAnswer, ComputeRequest, MessageError
from neuroshard_jax.kernels.processes import (
    ComputeWorker,
    KernelPool,
    PoolTableRef,
    WorkerFailure,
    run_comm,
    table_ref,
)
from neuroshard_jax.kernels.worker.tbe import shard_inputs
from neuroshard_jax.learn.cost_labels import CollectConfig, collect
from neuroshard_jax.measure.evaluator import EvaluateConfig, evaluate_file, measure_plans
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.workloads.builders import TaskConfig, generate_task
from neuroshard_jax.workloads.pool import PoolSpec, load_pool, pool_streams
from neuroshard_jax.workloads.samplers import CommSamplerConfig, ComputeSamplerConfig, sample_comm, sample_shard
from searchers import make_searcher

POOL = PoolSpec(num_tables=120)
TINY = dict(batch_size=256, warmup=1, iters=3)


def _request(tables, request_id=0, **extra) -> ComputeRequest:
    return ComputeRequest(request_id, tuple(tables), pool=POOL.to_json(), **{**TINY, **extra})


@pytest.fixture
def worker():
    w = ComputeWorker("cpu")
    yield w
    w.close()


@pytest.mark.fast
def test_worker_times_a_two_table_shard(worker):
    answer = worker.request(_request([[3, 16], [7, 8]]), timeout_s=120)
    assert answer.ok and answer.id == 0
    assert answer.fwd_ms > 0 and answer.bwd_ms > 0
    assert answer.total_ms == pytest.approx(np.median(np.add(answer.fwd_runs_ms, answer.bwd_runs_ms)), rel=1e-3)
    _, streams = pool_streams(POOL)
    assert answer.num_indices == sum(len(streams.stream(t, 256)[0]) for t in (3, 7))


@pytest.mark.fast
def test_a_managed_caching_request_carries_its_load_factor_and_a_cpu_worker_refuses_it_in_one_line(worker):
    """``cache_load_factor`` (FBGEMM's managed caching, a GPU's tiered memory): in the line only where given, read
    back, refused outside (0, 1]; the real CPU worker answers a cached request with one line and then serves the next
    request (its FBGEMM keeps no GPU cache of host rows)."""
    spec = {"rows": 10_000, "pooling_factor": 2.0, "bins": [1.0] + [0.0] * 16, "dim": 8, "seed": 3}
    request = ComputeRequest("c", (spec,), batch_size=256, warmup=1, iters=2, cache_load_factor=0.2)
    assert request.to_json()["cache_load_factor"] == 0.2 and "cache_load_factor" not in _request([[3, 8]]).to_json()
    assert ComputeRequest.from_json(request.to_json()) == request
    for bad in (0.0, 1.5):
        with pytest.raises(MessageError, match=rf"cache_load_factor: got {bad}, expected a share of the rows in"):
            ComputeRequest.from_json({**request.to_json(), "cache_load_factor": bad})
    answer = worker.request(request, 120)
    assert not answer.ok and answer.error.startswith("cache_load_factor: got 0.2 on device 'cpu', expected device")
    assert worker.request(dataclasses.replace(request, cache_load_factor=None), 120).ok
    # a table's own load factor (a plan's table in tiered memory: a TBE of its own), spec or pool reference
    from neuroshard_jax.kernels.processes import PoolTableRef, SpecTableRef, table_ref
    from neuroshard_jax.kernels.worker.tbe import shard_inputs

    pooled = PoolTableRef(3, 8, cache_load_factor=0.05)
    assert pooled.to_json() == [3, 8, "cache=0.05"] and table_ref(pooled.to_json()) == pooled
    own = SpecTableRef(10_000, 2.0, tuple(spec["bins"]), 8, 3, cache_load_factor=0.5)
    assert table_ref(own.to_json()) == own
    mixed = ComputeRequest("m", (spec, own.to_json()), batch_size=256, warmup=1, iters=2)
    assert [g.cache_load_factor for g in shard_inputs(mixed)] == [None, 0.5]  # two TBEs, as TorchRec runs them
    answer = worker.request(mixed, 120)
    assert not answer.ok and answer.error.startswith("cache_load_factor: got 0.5 on device 'cpu'")
    bad = ComputeRequest("b", ({**spec, "cache_load_factor": 2},), batch_size=256, warmup=1, iters=2)
    assert worker.request(bad, 120).error.startswith("table 0: cache_load_factor 2.0, expected a share")


@pytest.mark.fast
def test_a_request_of_several_batches_times_a_training_steps_batches_one_after_another(worker):
    """``batches``: the iterations take the table's batches in turn (another bag order, other cold rows), the column
    slices of one table the same ids in each; the line carries it only where it is not 1 (labels keep their lines),
    and a count below 1 is refused."""
    spec = {"rows": 50_000, "pooling_factor": 1.0, "bins": [1.0] + [0.0] * 16, "dim": 8, "seed": 5}
    tables = [spec, {**spec, "dim": 4}, {**spec, "seed": 6}]
    request = ComputeRequest(1, tuple(tables), batch_size=512, warmup=1, iters=4, batches=3)
    assert json.loads(json.dumps(request.to_json()))["batches"] == 3 and "batches" not in _request([[3, 8]]).to_json()
    assert ComputeRequest.from_json(request.to_json()) == request
    with pytest.raises(MessageError, match="batches: got 0, expected a count >= 1"):
        ComputeRequest.from_json({**request.to_json(), "batches": 0})
    (group,) = shard_inputs(request)
    batches = group.batches(3)
    assert len(batches) == 3 and np.array_equal(batches[0][0], group.arrays()[0])
    for ids, offs in batches[1:]:
        lengths = np.diff(offs)
        slices = [ids[offs[512 * t] : offs[512 * (t + 1)]] for t in range(3)]
        assert np.array_equal(slices[0], slices[1]) and not np.array_equal(slices[0], slices[2])
        assert np.array_equal(np.sort(lengths), np.sort(np.diff(group.arrays()[1])))
    answer = worker.request(request, timeout_s=120)
    assert answer.ok and answer.total_ms > 0 and len(answer.fwd_runs_ms) == 4
    # a table no sample of the batch reads (pooling 0, an empty row block) beside one that is read: its bags alone
    unread = {"rows": 1000, "pooling_factor": 0.0, "bins": [0.0] * 17, "dim": 8, "seed": 9}
    (group,) = shard_inputs(dataclasses.replace(request, tables=(unread, spec)))
    assert [len(ids) for ids, _ in group.batches(3)] == [len(group.arrays()[0])] * 3
    assert worker.request(dataclasses.replace(request, tables=(unread, spec)), timeout_s=120).ok


def test_a_request_and_its_answer_cross_the_pipe_as_json_and_back():
    """JSON only on the worker's pipe: a request's line reads back as the same request (its tags stay on the host),
    an answer's as the same answer; a malformed request is one clear error."""
    timed = dict(protocol="timed", warmup_ms=2.0, measure_ms=20.0, max_iters=50)
    request = _request([[3, 16], {"rows": 10, "pooling_factor": 1.0, "bins": [1.0], "dim": 4, "seed": 0}], 7, **timed)
    request = request.tagged(key="k", repeat=2)
    line = json.loads(json.dumps(request.to_json()))
    assert "key" not in line and ComputeRequest.from_json(line) == request and request.tag("repeat") == 2
    answer = ComputeAnswer(7, True, fwd_ms=1.0, bwd_ms=2.0, total_ms=3.0, fwd_runs_ms=(1.0,), cpu_share=0.5)
    assert ComputeAnswer.from_json(json.loads(json.dumps(answer.to_json()))) == answer
    assert not answer.quiet and ComputeAnswer(7, True, total_ms=1.0).quiet  # no share recorded (CUDA): quiet
    for bad, says in [
        ({"tables": [[1, 8]]}, "no 'batch_size'"),
        ({"tables": "x", "batch_size": 8}, "expected a list of tables"),
        ({"tables": [], "batch_size": 8, "protocol": "timed"}, "without 'warmup_ms'"),
        ({"tables": [], "batch_size": "many"}, "batch_size: got 'many'"),
    ]:
        with pytest.raises(MessageError, match=says):
            ComputeRequest.from_json(bad)
    comm = CommRequest.of({"dim_sums": [8, 4], "row_groups": [[4, [0, 1]]], "inputs": [[[2.0], []]]}, 3, 64, [0, 1.5])
    assert CommRequest.from_json(json.loads(json.dumps(comm.to_json()))) == comm and comm.row_groups == ((4, (0, 1)),)
    with pytest.raises(MessageError, match="1 delays for 2 ranks"):
        CommRequest.from_json({"id": 4, "dim_sums": [8, 4], "delays_ms": [0.0], "batch_size": 64})
    with pytest.raises(MessageError, match="no 'batch_size'"):
        CommRequest.from_json({"id": 4, "dim_sums": [8, 4], "delays_ms": [0.0, 0.0]})


@pytest.mark.fast
def test_worker_runs_each_optimizer_of_fbgemms_cpu_kernels_and_keeps_the_state_the_memory_model_counts(worker):
    """One spec shard, trained with each optimizer FBGEMM's CPU TBE runs: a label, and the optimizer's state as the
    kernel's allocator holds it, byte for byte what ``core.memory`` counts; a deprecated one is refused in one line
    and the worker keeps serving."""
    specs = [
        {"rows": rows, "pooling_factor": 2.0, "bins": [1.0] + [0.0] * 16, "dim": dim, "seed": 1}
        for rows, dim in ((1000, 16), (500, 8))
    ]
    request = ComputeRequest(0, tuple(specs), **TINY)
    for name, optimizer in OPTIMIZERS.items():
        if not optimizer.cpu:
            continue
        answer = worker.request(dataclasses.replace(request, optimizer=name), timeout_s=120)
        assert answer.ok and answer.optimizer == name and answer.total_ms > 0, answer
        counted = sum(shard_memory(r, d, 2.0, 256, "fp32", optimizer).state for r, d in ((1000, 16), (500, 8)))
        assert answer.state_bytes == counted, (name, answer.state_bytes, counted)
    refused = worker.request(dataclasses.replace(request, optimizer="sgd"), timeout_s=120)
    assert not refused.ok and "sgd is deprecated in FBGEMM's TBE kernels" in refused.error
    assert worker.request(request, timeout_s=120).ok


@pytest.mark.fast
def test_worker_times_every_kernel_kind_torchrec_runs_and_counts_a_sequence_kernels_rows(worker):
    """The kernels of each table kind (mean pooling, per-id weights, unpooled sequence lookups) timed on the same
    tables; a sequence kernel's outputs are a row per id (the memory it reports), and its refusals are one line."""
    specs = tuple(
        {"rows": rows, "pooling_factor": 2.0, "bins": [1.0] + [0.0] * 16, "dim": 16, "seed": 2} for rows in (8000, 3000)
    )
    base = ComputeRequest(0, specs, memory=True, **TINY)
    answers = {}
    for pooling, weighted in (("sum", False), ("mean", False), ("sum", True), ("mean", True), ("none", False)):
        request = dataclasses.replace(base, pooling=pooling, weighted=weighted)
        assert ComputeRequest.from_json(request.to_json()) == request
        answer = worker.request(request, timeout_s=120)
        assert answer.ok and answer.total_ms > 0, answer
        answers[pooling, weighted] = answer
    ids = answers["sum", False].num_indices
    assert all(a.num_indices == ids for a in answers.values())
    pooled_outputs = answers["sum", False].memory["held_bytes"] - answers["sum", False].memory["module_bytes"]
    sequence_outputs = answers["none", False].memory["held_bytes"] - answers["none", False].memory["module_bytes"]
    # the same ids and offsets; outputs and their gradients: 256 bags x 2 tables x 16 (pooled), ids x 16 (sequence)
    assert sequence_outputs - pooled_outputs == 2 * 4 * 16 * (ids - 2 * 256)
    assert "pooling" not in base.to_json() and "weighted" not in base.to_json()  # the labels' lines as they were
    # a device's tables of several kinds run one kernel each (a sequence kernel per dim), as TorchRec runs them
    device = (specs[0], {**specs[1], "kernel": "sequence"}, {**specs[1], "dim": 8, "kernel": "sequence"})
    mixed = worker.request(dataclasses.replace(base, tables=device), timeout_s=120)
    apart = [worker.request(dataclasses.replace(base, tables=(t,)), timeout_s=120) for t in device]
    assert mixed.ok and all(a.ok for a in apart) and mixed.total_ms > 0, mixed
    assert mixed.num_indices == sum(a.num_indices for a in apart)
    held = lambda a: a.memory["held_bytes"] - a.memory["module_bytes"]  # noqa: E731  ids, offsets, outputs, grads
    assert held(mixed) == sum(held(a) for a in apart)
    assert mixed.memory["module_bytes"] == sum(a.memory["module_bytes"] for a in apart)
    odd = worker.request(dataclasses.replace(base, tables=({**specs[0], "dim": 6},)), timeout_s=120)
    assert odd.ok and odd.total_ms > 0, odd  # a 6-wide table (TorchRec takes it) is timed at FBGEMM's 8
    refused = worker.request(dataclasses.replace(base, tables=({**specs[0], "kernel": "max"},)), timeout_s=120)
    assert not refused.ok and "table 0: kernel 'max', expected one of sum, mean" in refused.error
    refused = worker.request(dataclasses.replace(base, pooling="max"), timeout_s=120)
    assert not refused.ok and "pooling 'max', expected one of sum, mean, none" in refused.error
    with pytest.raises(MessageError, match="request.weighted: got 'yes', expected true or false"):
        ComputeRequest.from_json({**base.to_json(), "weighted": "yes"})


@pytest.mark.fast
def test_a_devices_tables_of_two_data_types_run_a_kernel_each_at_their_own_bytes(worker):
    """fp16 and fp32 tables on one device run a fused kernel per data type (TorchRec groups tables by data type):
    the fp16 table's weights take half the bytes, the pair holds what each holds alone; a pool table names its data
    type after its kernel, and an unknown one is refused in one line."""
    spec = {"rows": 4000, "pooling_factor": 2.0, "bins": [1.0] + [0.0] * 16, "dim": 16, "seed": 3}
    base = ComputeRequest(0, (spec,), memory=True, **TINY)
    half = {**spec, "precision": "fp16"}
    alone = [worker.request(dataclasses.replace(base, tables=(t,)), timeout_s=120) for t in (spec, half)]
    both = worker.request(dataclasses.replace(base, tables=(spec, half)), timeout_s=120)
    assert both.ok and all(a.ok for a in alone) and both.total_ms > 0, both
    weights = [a.memory["module_bytes"] for a in alone]
    assert weights[0] - weights[1] == 4000 * 16 * 2  # fp32 weights 4 bytes an element, fp16 2
    assert both.memory["module_bytes"] == sum(weights)
    assert table_ref([7, 16, "mean", "fp16"]) == PoolTableRef(7, 16, kernel="mean", precision="fp16")
    assert table_ref(PoolTableRef(7, 16, precision="bf16").to_json()).precision == "bf16"
    refused = worker.request(dataclasses.replace(base, tables=({**spec, "precision": "fp8"},)), timeout_s=120)
    assert not refused.ok and "table 0: precision 'fp8', expected one of fp32, fp16, bf16" in refused.error


@pytest.mark.fast
def test_the_timed_protocol_fills_a_kernel_time_and_keeps_a_sample_of_its_runs(worker):
    """``protocol=timed``: warm-up and timed iterations by kernel time, at least ``iters``, at most ``max_iters``; a
    row keeps at most 64 evenly spaced runs, its medians are over all of them."""
    timed = dict(protocol="timed", warmup_ms=2.0, measure_ms=20.0, max_iters=200)
    answer = worker.request(_request([[3, 8]], **timed), timeout_s=120)
    assert answer.ok and answer.protocol == "timed" and answer.timed_iters >= TINY["iters"]
    runs = np.add(answer.fwd_runs_ms, answer.bwd_runs_ms)
    assert len(runs) == min(answer.timed_iters, 64)
    assert answer.timed_iters == 200 or answer.timed_iters * np.median(runs) >= 20.0 * 0.5
    capped = worker.request(_request([[3, 8]], **{**timed, "measure_ms": 1e6, "max_iters": 5}), timeout_s=120)
    assert capped.timed_iters == 5 and len(capped.fwd_runs_ms) == 5
    fixed = worker.request(_request([[3, 8]]), timeout_s=120)
    assert fixed.protocol is None and len(fixed.fwd_runs_ms) == TINY["iters"]
    for gpu_only in ("graph", "queued"):  # the GPU's own time: refused on a CPU, the worker keeps serving
        answer = worker.request(_request([[3, 8]], **{**timed, "protocol": gpu_only}), timeout_s=120)
        assert not answer.ok and f"protocol {gpu_only!r}" in answer.error and "needs device 'cuda'" in answer.error


def test_a_dataset_keeps_one_protocol(tmp_path):
    """The timed protocol is recorded in the manifest (the fixed one is not: older datasets resume), and a rerun
    with another protocol is refused; timed is for compute labels only."""
    timed = dict(protocol="timed", warmup_ms=2.0, measure_ms=10.0, max_iters=50)
    collect(_collect_config(tmp_path, 2, **timed))
    manifest = json.loads((tmp_path / "manifest-compute.json").read_text())
    assert manifest["settings"]["protocol"] == "timed" and manifest["settings"]["measure_ms"] == 10.0
    assert all(r["protocol"] == "timed" for r in read_records(tmp_path / "compute.jsonl"))
    with pytest.raises(UserError, match="protocol: got None, but the dataset .* was collected with 'timed'"):
        collect(_collect_config(tmp_path, 3))
    # the worker keeps freed memory for reuse (processes.MALLOC_ENV), and says so; a dataset of labels taken before
    # (none recorded: glibc's default, outputs above 32 MB page-faulted afresh or not) is not resumed under it
    from neuroshard_jax.kernels.processes import MALLOC_PROTOCOL

    assert manifest["settings"].get("malloc") == (None if MALLOC_PROTOCOL == "os" else MALLOC_PROTOCOL)
    if MALLOC_PROTOCOL != "os":
        before = {**manifest, "settings": {k: v for k, v in manifest["settings"].items() if k != "malloc"}}
        (tmp_path / "manifest-compute.json").write_text(json.dumps(before))
        with pytest.raises(
            UserError, match="malloc: got 'reuse', but the dataset .* was collected with 'os' \\(not recorded\\)"
        ):
            collect(_collect_config(tmp_path, 3, **timed))
    # a training step's batches in turn (``BATCHES``), recorded; a dataset of one batch resumes only with batches=1
    from neuroshard_jax.kernels.processes import BATCHES

    assert manifest["settings"]["batches"] == BATCHES > 1
    one = tmp_path / "one"
    collect(_collect_config(one, 2, batches=1))
    assert "batches" not in json.loads((one / "manifest-compute.json").read_text())["settings"]
    says = f"batches: got {BATCHES}, .* with 1 \\(not recorded\\); expected the same settings \\(batches=1\\)"
    with pytest.raises(UserError, match=says):
        collect(_collect_config(one, 3))
    collect(_collect_config(one, 3, batches=1))
    assert len(read_records(one / "compute.jsonl")) == 3
    with pytest.raises(UserError, match="protocol: got 'timed' with kind=comm, expected fixed"):
        CollectConfig(kind="comm", **timed)
    with pytest.raises(UserError, match="protocol: got 'graphs', expected one of fixed, timed, queued, graph"):
        CollectConfig(protocol="graphs")
    with pytest.raises(UserError, match="protocol: got 'graph' with device=cpu, expected device=cuda"):
        CollectConfig(protocol="graph")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator variables, read from /proc")
def test_workers_keep_freed_memory_for_reuse_and_the_probe_can_start_one_without(worker):
    """Every worker runs with glibc's thresholds fixed (``MALLOC_ENV``: a big output is not page-faulted afresh on
    some calls only); ``tools/malloc_probe.py``'s other worker unsets them (``extra_env`` None), and both answer."""
    from neuroshard_jax.kernels.processes import MALLOC_ENV
    from tools.malloc_probe import SETTINGS

    def environ(w):
        text = open(f"/proc/{w.proc.pid}/environ", "rb").read().decode(errors="replace")
        return dict(line.split("=", 1) for line in text.split("\0") if "=" in line)

    assert worker.request(_request([[3, 8]]), timeout_s=120).ok
    assert {k: environ(worker).get(k) for k in MALLOC_ENV} == MALLOC_ENV
    glibc = ComputeWorker("cpu", extra_env=SETTINGS["os"])
    try:
        assert glibc.request(_request([[3, 8]]), timeout_s=120).ok
        assert not set(MALLOC_ENV) & set(environ(glibc)) and environ(glibc)["OMP_NUM_THREADS"] == "1"
    finally:
        glibc.close()


@pytest.mark.fast
def test_a_pinned_pool_puts_each_worker_on_a_core_of_its_own():
    """KernelPool(pin=True): each worker process runs on one distinct allowed core (none pinned with too few)."""
    count = 2
    with KernelPool(count, "cpu", 120, pin=True) as pool:
        answers = []
        pool.map([_request([[3, 8]], i) for i in range(count)], lambda request, answer: answers.append(answer))
        cores = [os.sched_getaffinity(w.proc.pid) for w in pool.workers]
    assert all(a.ok for a in answers)
    if len(os.sched_getaffinity(0)) >= count:
        assert all(len(c) == 1 for c in cores) and len(set.union(*cores)) == count
    else:
        assert all(c == os.sched_getaffinity(0) for c in cores)


@pytest.mark.fast
def test_worker_refuses_bad_shards_and_keeps_serving(worker):
    bad_id = worker.request(_request([[999, 16]]), timeout_s=60)
    assert not bad_id.ok and "table id 999" in bad_id.error
    bad_dim = worker.request(_request([[1, 0]]), timeout_s=60)
    assert not bad_dim.ok and "table 0: dim 0, expected a positive width" in bad_dim.error
    assert worker.request(_request([[1, 8]]), timeout_s=60).ok
    malformed = worker.request(_request([[1, 8]], protocol="timed"), timeout_s=60)  # its timing missing
    assert not malformed.ok and "protocol 'timed' without 'warmup_ms'" in malformed.error
    worker.proc.stdin.write(b"{not json\n")  # a line that is no request at all: answered, the worker serves on
    worker.proc.stdin.flush()
    garbled = ComputeAnswer.from_json(json.loads(worker._readline(60)))
    assert not garbled.ok and garbled.error.startswith("request: not JSON"), garbled
    impossible = {"rows": 5, "pooling_factor": 10.0, "bins": [1.0] + [0.0] * 16, "dim": 8}
    refused = worker.request(_request([impossible]), timeout_s=60)
    assert not refused.ok and "table 0: its histogram cannot hold" in refused.error
    spec = {"rows": 2000, "pooling_factor": 3.0, "bins": [0.6, 0.3, 0.1] + [0.0] * 14, "dim": 8, "seed": 1}
    answer = worker.request(_request([spec, [1, 8]]), timeout_s=60)  # specs mix with pool ids
    assert answer.ok and answer.num_indices > 0


@pytest.mark.parametrize("fault, reason", [("segfault", "SIGSEGV"), ("exit", "code 3"), ("hang", "timeout")])
def test_a_crashing_request_costs_only_itself(monkeypatch, fault, reason):
    monkeypatch.setenv("NEUROSHARD_WORKER_FAULTS", f"1:{fault}")
    w = ComputeWorker("cpu")
    try:
        assert w.request(_request([[2, 8]], 0), timeout_s=60).ok
        with pytest.raises(WorkerFailure, match=reason):
            w.request(_request([[2, 8]], 1), timeout_s=5 if fault == "hang" else 60)
        assert w.request(_request([[2, 8]], 2), timeout_s=60).ok  # restarted
        assert w.restarts == 1
    finally:
        w.close()


def test_the_rank_the_kernel_killed_is_named_not_the_peer_that_lost_it(tmp_path):
    """Rank processes as the DMP tools start them: rank 1 killed by SIGKILL (the out-of-memory killer's signal), rank
    2 exiting first because its peer went ("Connection closed by peer"), rank 0 still waiting in a collective; the
    failure names rank 1 and the waiting rank is stopped after the grace."""
    import subprocess
    import sys
    import time

    from neuroshard_jax.kernels.processes import RANKS_GRACE_S, first_failure

    codes = [
        "import time; time.sleep(60)",
        "import os, signal, time; time.sleep(0.6); os.kill(os.getpid(), signal.SIGKILL)",
        "import sys, time; time.sleep(0.2); print('Connection closed by peer', file=sys.stderr); sys.exit(1)",
    ]
    procs = []
    for rank, code in enumerate(codes):
        with open(tmp_path / f"err.{rank}", "wb") as err:
            procs.append(subprocess.Popen([sys.executable, "-c", code], stderr=err))
    started = time.monotonic()
    try:
        said = first_failure(procs, started + 60, tmp_path)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert said == "rank 1: worker killed by SIGKILL (likely out of memory)", said
    assert time.monotonic() - started < RANKS_GRACE_S + 10 and procs[2].returncode == 1


def _collect_config(out_dir, num_samples, **extra):
    sampler = ComputeSamplerConfig(max_tables=3, dims=(4, 8), mem_cap_gb=0.05)
    return CollectConfig(
        kind="compute",
        num_samples=num_samples,
        out_dir=str(out_dir),
        pool=POOL,
        sampler=sampler,
        timeout_s=60,
        progress=False,
        **TINY,
        **extra,
    )


def test_collection_records_failures_and_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("NEUROSHARD_WORKER_FAULTS", "2:segfault")
    summary = collect(_collect_config(tmp_path, 5))
    records = [json.loads(line) for line in (tmp_path / "compute.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == [0, 1, 2, 3, 4] and summary["failed"] == 1
    failed = [r for r in records if not r["ok"]]
    assert failed[0]["id"] == 2 and "SIGSEGV" in failed[0]["error"]
    manifest = json.loads((tmp_path / "manifest-compute.json").read_text())
    # the torch and FBGEMM that timed the labels: this environment's (1.8.0 by default, 1.9.0 in make test-newest)
    assert manifest["settings"]["batch_size"] == 256
    assert manifest["versions"]["fbgemm_gpu"] == installed_stack()["fbgemm_gpu"]
    assert manifest["num_records"] == 5 and manifest["num_failed"] == 1


def test_kill_9_then_resume_loses_and_duplicates_nothing(tmp_path):
    args = [
        f"out_dir={tmp_path}",
        "num_samples=60",
        "progress=false",
        "pool.num_tables=120",
        "batch_size=256",
        "warmup=1",
        "iters=20",
        "sampler.max_tables=3",
        "sampler.mem_cap_gb=0.05",
    ]
    cmd = [sys.executable, "-m", "neuroshard_jax.collect", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    log = tmp_path / "compute.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not log.exists() or log.read_text().count("\n") < 3):
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # collector and its workers, mid-run
    proc.wait()
    with open(log, "a") as f:
        f.write('{"id": 9, "tables": [[1')  # and a torn line, as a kill during a write leaves
    before = log.read_text().count("\n")
    assert 3 <= before < 60
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line whole
    assert sorted(r["id"] for r in records) == list(range(60))
    assert all(r["ok"] for r in records)


@pytest.mark.fast
def test_resume_with_other_settings_is_refused(tmp_path):
    collect(_collect_config(tmp_path, 1))
    with pytest.raises(UserError, match="batch_size: got 512"):
        collect(dataclasses.replace(_collect_config(tmp_path, 2), batch_size=512))


@pytest.mark.fast
def test_samplers_are_deterministic_and_within_memory():
    rows, _ = pool_streams(POOL)
    config = ComputeSamplerConfig(mem_cap_gb=0.05)
    for i in range(20):
        shard = sample_shard(rows, config, 0, i)
        assert shard == sample_shard(rows, config, 0, i)
        assert 1 <= len(shard) <= 15 and len({t for t, _ in shard}) == len(shard)
        assert sum(rows[t] * d * 4 for t, d in shard) <= 0.05 * 2**30
        comm = sample_comm(CommSamplerConfig(), 0, i)
        assert min(comm["delays_ms"]) == 0 and len(comm["dim_sums"]) == comm["world"]


@pytest.mark.fast
def test_gloo_all_to_all_waits_for_the_straggler():
    requests = [CommRequest.of({"dim_sums": [64, 128]}, 0, 256, [0.0, 30.0], 1, 3)]
    # a batch that does not split evenly: rank 0 receives 129 rows x 1024 columns, more than 257 x 512 (a buffer sized
    # by the batch x the largest dim sum failed here: "Split sizes doesn't match total dim 0 size")
    requests.append(CommRequest.of({"dim_sums": [512, 512]}, 1, 257, [0, 0], 1, 2))
    answers = run_comm(requests, world=2, timeout_s=120)
    ranks = answers[0]
    fwd = [r.fwd_ms for r in ranks]
    assert fwd[0] >= 25 and fwd[1] < fwd[0]  # rank 0 waits for rank 1's 30 ms delay
    assert all(r.bwd_ms > 0 for r in ranks)
    assert len(answers[1]) == 2 and all(r.fwd_ms > 0 and r.bwd_ms > 0 for r in answers[1])


def test_evaluator_measures_a_two_device_plan(tmp_path):
    pool = load_pool(POOL, 256)
    task = generate_task(
        pool, TaskConfig(num_tables=4, num_devices=2, mem_cap_gb=0.05, dims=(4, 8, 16), pool=POOL, batch_size=256), 0
    )
    plan = search_plan(task, make_searcher("size_greedy"), CostModelSpec("analytic").for_task(task), 0).to_json()
    write_json(plan, tmp_path / "plan.json")
    result = evaluate_file(tmp_path / "plan.json", EvaluateConfig(warmup=1, iters=3, comm_warmup=1, comm_iters=3))
    assert len(result["devices"]) == 2
    for d in result["devices"]:
        for key in ("compute", "fwd_comm", "bwd_comm", "total"):
            assert np.isfinite(d[key]) and d[key] > 0
        assert d["predicted"]["total"] > 0
    assert result["cost_ms"] == max(d["total"] for d in result["devices"])
    assert json.loads((tmp_path / "evaluation.json").read_text())["cost_ms"] == result["cost_ms"]


def test_evaluator_measures_a_task_without_a_pool_from_its_table_specs():
    """A user's task file names no pool: each table's stream is synthesised from its rows, pooling and bins. The
    same plan on devices of speeds 1 and 4 (measured in the same batch): device 1's compute is divided by 4."""
    pool = load_pool(POOL, 256)
    specs = [(int(pool.rows[t]), float(pool.pooling_factor[t]), tuple(pool.bins[t])) for t in (3, 5, 7)]
    task = Task.uniform(2, 0.05, 256, tuple(Table(i, r, 8, p, b, name=f"t{i}") for i, (r, p, b) in enumerate(specs)))
    plan = search_plan(task, make_searcher("size_greedy"), CostModelSpec("analytic").for_task(task), 0)
    fast = dataclasses.replace(plan, task=Task([Device(0.05, 1.0), Device(0.05, 4.0)], 256, task.tables))
    result, scaled = measure_plans([plan, fast], EvaluateConfig(warmup=1, iters=3, comm_warmup=1, comm_iters=3))
    for d in result["devices"]:
        assert (d["compute"] > 0) == bool(plan.device_shards(d["device"])) and d["bwd_comm"] > 0
    assert [d["compute"] for d in scaled["devices"]] == [
        result["devices"][0]["compute"],
        result["devices"][1]["compute"] / 4,
    ]
    assert "divided by its speed" in scaled["speed_note"] and "speed_note" not in result


def test_evaluator_measures_many_plans_in_one_batch():
    """Plans of 2 and 3 devices measured together: every device of every plan gets its own costs."""
    pool = load_pool(POOL, 256)
    plans = []
    for seed, n in ((0, 2), (1, 3), (2, 2)):
        config = TaskConfig(num_tables=5, num_devices=n, mem_cap_gb=0.05, dims=(4, 8), pool=POOL, batch_size=256)
        plans.append(
            search_plan(
                generate_task(pool, config, seed),
                make_searcher("size_greedy"),
                CostModelSpec("analytic").for_task(generate_task(pool, config, seed)),
                0,
            )
        )
    results = measure_plans(plans, EvaluateConfig(warmup=1, iters=3, comm_warmup=1, comm_iters=3))
    assert [len(r["devices"]) for r in results] == [2, 3, 2]
    for plan, result in zip(plans, results):
        for d in result["devices"]:
            assert d["bwd_comm"] > 0 and d["fwd_comm"] > 0
            assert (d["compute"] > 0) == bool(plan.device_shards(d["device"]))
        assert result["cost_ms"] == max(d["total"] for d in result["devices"])


def test_kernel_drift_times_a_plans_device_beside_its_tables_sum_pooled_in_fresh_workers(tmp_path):
    """``tools/kernel_drift.py``: a sequence device of a plan in a plans.jsonl, one round (a fresh worker): the
    device's readings and its tables' in a sum-pooled kernel, both real; a plan it cannot find, one line."""
    from neuroshard_jax.core.plan import Plan
    from neuroshard_jax.core.sharding import Shard
    from tests.conftest import make_table, make_task
    from tools.kernel_drift import main

    sequence = dataclasses.replace(make_table(0, rows=5000, dim=8, pooling=3.0), pooling="none")
    task = make_task([sequence, make_table(1, rows=300, dim=8)], num_devices=2, batch_size=256)
    plan = Plan(task, (Shard(0, 0, 8, 0), Shard(1, 0, 8, 1))).validate()
    plans = tmp_path / "plans.jsonl"
    plans.write_text(json.dumps({"id": "t0/grid", "task": "t0", "searcher": "grid", "plan": plan.to_json()}) + "\n")
    out = tmp_path / "drift.json"
    main(["--plans", str(plans), "--task", "t0", "--searcher", "grid", "--device", "0", "--minutes", "0.001"]
         + ["--repeats", "2", "--out", str(out)])  # fmt: skip
    record = json.loads(out.read_text())
    [reading] = record["rounds"]
    assert len(reading["device"]) == len(reading["pooled"]) == 2
    assert all(fwd > 0 and bwd > 0 for fwd, bwd in reading["device"] + reading["pooled"])
    assert record["protocol"]["fresh_worker_each_round"] and record["device"] == 0
    with pytest.raises(SystemExit, match="no plan of task 't9' by 'grid'"):
        main(["--plans", str(plans), "--task", "t9", "--searcher", "grid", "--device", "0", "--out", str(out)])


def test_sequence_backward_times_sequence_and_sum_kernels_of_the_same_ids(tmp_path):
    """``tools/sequence_backward.py`` on a tiny table: every read-count case the table's rows can hold, timed as a
    sequence kernel and as a sum-pooled one by a real worker; distinct rows fall as rows are read more often; a bad
    option refused in one line."""
    from tools.sequence_backward import main

    out = tmp_path / "seq.json"
    main(["--rounds", "1", "--rows", "600", "--ids", "2", "--batch", "256", "--out", str(out)])
    record = json.loads(out.read_text())
    distinct = [case["distinct_rows"] for name, case in record["cases"].items() if name.startswith("dim 16")]
    assert distinct == sorted(distinct, reverse=True) and len(distinct) >= 3 and distinct[0] <= 512
    for case in record["cases"].values():
        assert all(ms > 0 for kernel in ("sequence", "sum") for ms in case[kernel]["fwd_ms"] + case[kernel]["bwd_ms"])
    with pytest.raises(SystemExit, match="--rows 0: expected at least 1"):
        main(["--rows", "0", "--out", str(out)])
