"""executor=ray on a real local Ray cluster (one per test module, started here on localhost): the same samples as
the local pool, a killed actor process retried without loss or duplicates, a killed driver resumed."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JsonlLog
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.costs.choice import CostModelSpec
from neuroshard_jax.kernels.executors import ExecutorConfig, RayExecutor
from neuroshard_jax.learn.cost_labels import collect
from neuroshard_jax.measure.evaluator import EvaluateConfig, measure_plans
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.workloads.builders import TaskConfig, generate_task
from neuroshard_jax.workloads.pool import load_pool
from searchers import make_searcher
from tests.test_profiling import POOL, _collect_config

ray = pytest.importorskip("ray")
RAY = ExecutorConfig(name="ray", workers=2)


@pytest.fixture(scope="module")
def cluster():
    """A local cluster of 8 logical CPUs (an 8-rank all-to-all fits, oversubscribed as locally)."""
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _actor_pids() -> list[int]:
    """Processes of this machine running a KernelActor (Ray names a worker process after its actor)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"ray::KernelActor" in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def test_ray_collection_draws_the_local_samples_and_survives_a_killed_actor(cluster, tmp_path, monkeypatch):
    """Specs are drawn by the driver per (seed, index): Ray and the local pool label the same shards. An actor
    process SIGKILLed mid-run: its request goes to a fresh actor, counted in the row; nothing lost or doubled."""
    local = collect(_collect_config(tmp_path / "local", 10, pin=False))
    assert local["failed"] == 0
    out = tmp_path / "ray"
    killed: list[int] = []
    earlier = set(_actor_pids())  # other tests' actors on the shared cluster: killing an idle one retries nothing
    append = JsonlLog.write_record

    def append_then_kill(log: JsonlLog, record: dict) -> None:
        """The kill happens in the driver's second append, with 8 requests left: whichever actor it hits has a
        request in flight or gets the next one (a kill timed from another thread could land after the last)."""
        append(log, record)
        if not killed and log.path == out / "compute.jsonl" and log.path.read_text().count("\n") == 2:
            [pid, *_] = [p for p in _actor_pids() if p not in earlier]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    monkeypatch.setattr(JsonlLog, "write_record", append_then_kill)
    summary = collect(dataclasses.replace(_collect_config(out, 10, executor=RAY), iters=20))
    assert killed, "no actor process was found to kill"
    rows = _records(out / "compute.jsonl")
    assert sorted(r["id"] for r in rows) == list(range(10)) and summary["failed"] == 0
    assert sum(r.get("retries", 0) for r in rows) >= 1  # the killed actor's request, sent again
    tables = {r["id"]: r["tables"] for r in _records(tmp_path / "local" / "compute.jsonl")}
    assert all(r["tables"] == tables[r["id"]] for r in rows)
    settings = json.loads((out / "manifest-compute.json").read_text())["settings"]
    assert "pin" not in settings  # a Ray dataset records the unpinned protocol


def test_ray_measures_a_plan_with_its_all_to_all(cluster):
    pool = load_pool(POOL, 256)
    config = TaskConfig(num_tables=4, num_devices=2, mem_cap_gb=0.05, dims=(4, 8, 16), pool=POOL, batch_size=256)
    task = generate_task(pool, config, 0)
    plan = Plan.from_json(
        search_plan(task, make_searcher("size_greedy"), CostModelSpec("analytic").for_task(task), 0).to_json()
    )
    evaluate = EvaluateConfig(executor=RAY, warmup=1, iters=3, comm_warmup=1, comm_iters=3)
    [result] = measure_plans([plan], evaluate)
    assert all(d["compute"] > 0 and d["fwd_comm"] > 0 and d["bwd_comm"] > 0 for d in result["devices"])
    with RayExecutor(RAY, "cpu", 60) as executor, pytest.raises(UserError, match="needs 9 CPUs on one node"):
        executor.comm([], 9, 60)


def test_ray_driver_killed_with_kill_9_resumes(cluster, tmp_path):
    """The collection's driver (its own process, joining this cluster) SIGKILLed mid-run; rerun, it completes
    with every sample exactly once and every line whole."""
    args = [
        f"out_dir={tmp_path}",
        "num_samples=24",
        "progress=false",
        "executor=ray",
        "executor.address=auto",
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
    deadline = time.time() + 180
    while time.time() < deadline and (not log.exists() or log.read_text().count("\n") < 3):
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)  # the driver only: its actors die with their owner, the cluster lives on
    proc.wait()
    before = log.read_text().count("\n")
    assert 3 <= before < 24
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = _records(log)
    assert sorted(r["id"] for r in rows) == list(range(24)) and all(r["ok"] for r in rows)


@pytest.mark.fast
def test_bad_executor_options_are_one_line_errors():
    from neuroshard_jax.core.config import typed

    with pytest.raises(UserError, match=r"executor.name: got 'slurm', expected one of local, ray"):
        typed(ExecutorConfig, {"name": "slurm"}, "executor")
    with pytest.raises(UserError, match=r"executor.address: set with executor=local"):
        typed(ExecutorConfig, {"address": "auto"}, "executor")
    with pytest.raises(UserError, match=r"pin: got true with executor=ray, expected pin=false"):
        dataclasses.replace(_collect_config("unused", 1, pin=True), executor=RAY)
    # pin left out is what the executor supports: pinned local workers, unpinned Ray actors
    assert _collect_config("unused", 1).pinned() and not _collect_config("unused", 1, executor=RAY).pinned()
