"""The prepared GPU check runs dry on this CPU: every step, every file, the table (``tools/gpu_check.py``): the real
worker measures labels and plans, the real trainer fits a model on the tiny labels, beam and grid search with it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_cli


def test_the_gpu_check_runs_dry_and_writes_its_files_and_table(tmp_path):
    from tools.gpu_check import (
        AUTOTUNE,
        AUTOTUNE_BASELINES,
        DRY,
        PACK_SEARCHERS,
        PORTFOLIO,
        SEARCHERS,
        pack_plans,
        pack_tasks,
    )

    pack = tmp_path / "pack"
    pack.mkdir()
    pack_plans(pack, pack_tasks(pack, DRY))  # what pack carries: the tasks, TorchRec's plans (no TorchRec there)
    out = tmp_path / "out"
    done = run_cli("run", str(out), "--dry", "--budget-s", "240", "--pack", str(pack), module="tools.gpu_check")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    names = {p.name for p in out.iterdir()}
    assert {"smoke.json", "labels.json", "labels.tgz", "model.json", "model.tgz", "plans.json", "log.txt"} <= names
    # autotune=loop with the model trained in the run, on the task's own kernels (TorchRec's plans from the plans step)
    # managed caching: the tables in the device's memory timed, the cached ones refused on a CPU in one line
    tables = json.loads((out / "uvm.json").read_text())["tables"]
    readings = [r for t in tables for r in t["readings"]]
    assert tables and all(r["ok"] and r["total_ms"] > 0 for r in readings if r["cache_load_factor"] is None)
    cached = [r for r in readings if r["cache_load_factor"] is not None]
    assert cached and all(not r["ok"] and "expected device 'cuda'" in r["error"] for r in cached)
    loop = [json.loads(line) for line in (out / "loop.jsonl").read_text().splitlines()]
    assert loop and loop[0]["autotune"]["mode"] == "loop" and loop[0]["autotune"]["bound_ms"] > 0
    assert json.loads((out / "smoke.json").read_text())["answer"]["ok"]
    labels = json.loads((out / "labels.json").read_text())
    assert labels["labels"] >= 20 and labels["failed"] == 0 and labels["repeated"] > 0  # the floor: two runs
    assert labels["protocol"] == "fixed"  # the CPU's; queued on a GPU
    model = json.loads((out / "model.json").read_text())
    assert model["held_out"]["ensemble"]["count"] >= 1 and model["comm"]["fwd_comm"] is not None
    plans = json.loads((out / "plans.json").read_text())
    rows = plans["tasks"]["t00"]["plans"]
    assert set(rows) == {*SEARCHERS, AUTOTUNE} and set(PACK_SEARCHERS) < set(SEARCHERS)
    # the portfolio's plan is one of its members' (measured once: the same devices), with every candidate's price
    portfolio = rows[PORTFOLIO]["portfolio"]
    chosen = portfolio["chosen"]
    assert rows[PORTFOLIO]["compute_ms"] == rows[chosen]["compute_ms"]
    assert [c["member"] for c in portfolio["candidates"]] == ["beam", "grid", "beam:hot"]
    # autotune=kernels: the measured fastest of the portfolio's best candidates and TorchRec's two plans
    tuned = rows[AUTOTUNE]
    among = [c["member"] for c in portfolio["candidates"] if c["same_as"] is None] + list(AUTOTUNE_BASELINES)
    assert tuned["chose"] in among
    assert tuned["priced_total_ms"] == min(rows[name]["priced_total_ms"] for name in among)
    for row in rows.values():  # every device measured (twice, dry), compute and priced comm apart
        assert row["complete"] and min(row["measurements"]) >= 2
        assert row["slowest_compute_ms"] == max(row["compute_ms"]) > 0
        assert row["priced_total_ms"] > row["slowest_compute_ms"] and min(row["fwd_comm_ms"]) > 0
        memory = row["memory"]  # the allocator's count of what each device's kernels held, beside the prediction
        for predicted, held in zip(memory["predicted_bytes"], memory["held_bytes"]):
            assert 0.5 < held / predicted < 2.0
        assert memory["peak_bytes"] == [None] * len(memory["held_bytes"])  # a GPU's allocator peak: none on a CPU
        assert memory["workspace_bytes"] == [0] * len(memory["held_bytes"])  # a CPU's plan counts no workspace
    # tiered memory: task 100 (task 0 on devices too small for its tables) planned for a GPU by TorchRec's planner
    # and ours, each plan's cached tables measured with managed caching (refused on this CPU in one line)
    import gzip

    packed = [json.loads(line) for line in gzip.open(pack / "pack-plans.jsonl.gz", "rt") if '"task": 100' in line]
    assert {r["searcher"] for r in packed} == set(PACK_SEARCHERS) and any(r.get("cached") for r in packed)
    # TorchRec's storage count differs from ours: a plan of it that overflows our count is said so, not measured
    assert all(r.get("cached") or "while it trains, expected at most" in r["error"] for r in packed)
    tiered = plans["tasks"]["t100"]["plans"]
    assert {r["searcher"] for r in packed if "shards" in r} <= set(tiered) and plans["failed_devices"] > 0
    assert all("expected device 'cuda'" in why for why in plans["failures"].values())
    model_plans = [json.loads(line) for line in (out / "model-plans.jsonl").read_text().splitlines()]
    assert any(r["task"] == 100 and r.get("cached") for r in model_plans)
    # the same plans counted for a GPU: FBGEMM's backward workspace adds its share to every device
    from tools.gpu_check import workspace_share

    shares = workspace_share(out, DRY)
    assert set(shares) >= {"beam", "grid"} and all(1.0 < s["median"] <= s["worst"] for s in shares.values())
    dmp = json.loads((out / "dmp.json").read_text())  # the full step in DMP, beside the other steps
    assert set(dmp["tasks"]["dry-0"]["plans"]) == {"beam", "torchrec", "torchrec_default"}
    assert all(p["step_ms"] > 0 for p in dmp["tasks"]["dry-0"]["plans"].values())
    table = run_cli("table", str(out), module="tools.gpu_check")
    assert table.returncode == 0 and "| 2 | beam |" in table.stdout and "| t00 | 2 |" in table.stdout
    assert "torchrec_default" in table.stdout and "held out" in table.stdout
    # memory table: every device of beam's plans whose kernels were measured (task 0's two; task 100's as its plan
    # put its cached tables, which the CPU refuses), then the DMP table
    beam_devices = sum(
        bool(p) and h is not None
        for r in plans["tasks"].values()
        if r["plans"].get("beam", {}).get("memory")
        for p, h in zip(r["plans"]["beam"]["memory"]["predicted_bytes"], r["plans"]["beam"]["memory"]["held_bytes"])
    )
    assert beam_devices >= 2 and f"| beam | {beam_devices} |" in table.stdout and "| dry-0 | 1 |" in table.stdout
    assert "| t00 | " in table.stdout.split("`autotune=loop` chose")[1]  # the loop's row, against TorchRec's plans


def test_the_priced_all_to_all_follows_the_bytes():
    from tools.gpu_check import COLLECTIVE_MS, NVLINK_BYTES_PER_MS, all_to_all_ms

    balanced = all_to_all_ms([128] * 8, 32768)  # each sends 7/8 of 32768 x 128 fp32 and receives as much
    np.testing.assert_allclose(balanced, COLLECTIVE_MS + 32768 * 128 * 4 * 7 / 8 / NVLINK_BYTES_PER_MS)
    skewed = all_to_all_ms([512, 0, 0, 0], 4096)
    assert skewed[0] > skewed[1] > COLLECTIVE_MS  # the wide device sends most; the others receive its outputs
    assert not all_to_all_ms([0, 0], 4096).any() and not all_to_all_ms([64], 4096).any()


@pytest.mark.fast
def test_a_rank_runs_alone_on_the_core_it_is_given_and_bad_cores_are_refused():
    import os
    import subprocess
    import sys

    import pytest

    from neuroshard_jax.core.errors import UserError
    from neuroshard_jax.kernels.processes import CORE_ENV
    from tools.dmp_cores import parse_cores

    last = max(os.sched_getaffinity(0))
    code = "import os; from neuroshard_jax.kernels.worker.__main__ import pin_to_core; pin_to_core(); "
    code += "print(sorted(os.sched_getaffinity(0)))"
    env = {**os.environ, CORE_ENV: str(last)}
    pinned = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == f"[{last}]"
    assert parse_cores("0") == [0] and parse_cores(f"0-{last}") == list(range(last + 1))
    for bad, said in (("8-x", "core numbers and ranges"), ("0,0", "distinct cores"), ("999", "distinct cores")):
        with pytest.raises(UserError, match=said):
            parse_cores(bad)


def test_the_gpu_model_trains_on_the_shipped_runs_of_its_own_kind_only():
    """The model step adds the shipped label sets measured on the run's kind of hardware (GPU and host) and leaves
    the others out, which training would refuse to mix; a labels folder without a manifest adds none."""
    from tools.gpu_check import GPU, PROFILES, same_kind_sets

    assert {Path(d).name for d in GPU.base_datasets} == {f"h200-queued-run{i}" for i in (1, 2, 3)}
    base = (str(PROFILES / "h200-queued-run1"), str(PROFILES / "epyc-f26m2-fresh-specs"), str(PROFILES / "xeon-specs"))
    assert same_kind_sets(base, PROFILES / "epyc-f26m2-fresh-kinds") == [str(PROFILES / "epyc-f26m2-fresh-specs")]
    assert same_kind_sets(base, PROFILES / "h200-queued-run2") == [str(PROFILES / "h200-queued-run1")]
    assert same_kind_sets(base, Path("no-such-folder")) == []


def test_managed_caching_is_timed_on_big_tables_of_differing_access():
    """The uvm step's tables: three of the first GPU task within the row range, their first-bin shares (a batch's rows
    read once) spanning hot to cold."""
    from neuroshard_jax.workloads.gpu_tasks import gpu_task
    from tools.gpu_check import GPU, SEED, UVM_MAX_ROWS, UVM_MIN_ROWS, uvm_tables

    task = gpu_task(GPU.tasks, SEED, 0)
    picks = uvm_tables(task)
    shares = [task.tables[i].bins[0] for i in picks]
    assert len(set(picks)) == 3 and all(UVM_MIN_ROWS <= task.tables[i].rows <= UVM_MAX_ROWS for i in picks)
    assert shares == sorted(shares) and shares[-1] - shares[0] > 0.2


@pytest.mark.fast
def test_the_uvm_readings_fit_the_miss_price_a_plan_for_that_gpu_reads(tmp_path):
    """``uvm.json``'s cached kernels, slower than the same tables in the GPU's memory by what a known price makes of
    the misses their histograms imply, give that price back (``tiers.json``), judged table by table held out."""
    import dataclasses

    from neuroshard_jax.core import tiers
    from neuroshard_jax.core.table import Table
    from neuroshard_jax.core.task import Task
    from tools.gpu_check import fit_tiers

    truth = tiers.TierPrice(24.0, 0.3, "truth")
    rows = []
    shapes = ((2_000_000, 128, 8.0, 0.0), (4_000_000, 64, 30.0, 0.05), (9_000_000, 32, 3.0, 0.2))
    for index, (n, dim, pooling, hot) in enumerate(shapes):  # widths apart: the bytes and the missed rows told apart
        bins = [1.0 - hot] + [0.0] * 16
        bins[6] = hot
        table = Table(index, n, dim, pooling, tuple(bins))
        task = Task.uniform(1, 1.0, 16384, (table,))
        readings = [{"cache_load_factor": None, "ok": True, "total_ms": 2.0}]
        for lf in (0.5, 0.2, 0.05):
            extra = truth.ms(*tiers.miss_traffic(task, 0, lf))
            readings.append({"cache_load_factor": lf, "ok": True, "total_ms": 2.0 + float(extra)})
        readings.append({"cache_load_factor": 0.2, "ok": False, "error": "x"})  # a failed reading: left out
        rows.append({**dataclasses.asdict(table), "table": index, "readings": readings})
    doc = {"device": "cuda", "gpu": "NVIDIA H200", "batch_size": 16384, "precision": "fp32", "tables": rows}
    (tmp_path / "uvm.json").write_text(json.dumps(doc))
    fitted = fit_tiers(tmp_path)
    assert fitted["link_gibps"] == pytest.approx(24.0, rel=1e-4) and fitted["miss_us"] == pytest.approx(0.3, rel=1e-3)
    assert fitted["held_out"]["mape"] < 1e-3 and len(fitted["readings"]) == 9
    assert json.loads((tmp_path / "tiers.json").read_text())["source"].startswith("fitted on 9 managed-caching")
    assert tiers.price_file("NVIDIA H200").name == "nvidia-h200.json"
