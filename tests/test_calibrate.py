"""Calibration (``calibrate.py``): device groups of the task's own tables within the caps; on the real kernels a
model that is off by a steady factor, calibrated on some groups, predicts other groups as measured; the main job
records the factor in plan.json and prints it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.plan_file import calibration_line
from neuroshard_jax.core.records import CalibrationProtocol, CalibrationRatios, CalibrationRecord
from neuroshard_jax.costs.choice import make_cost_model
from neuroshard_jax.kernels.executors import ExecutorConfig, open_executor
from neuroshard_jax.kernels.messages import ComputeAnswer
from neuroshard_jax.measure.calibration import CalibrateConfig, calibrate, predicted_compute_ms, sample_devices, whole
from neuroshard_jax.measure.evaluator import quiet_devices
from neuroshard_jax.measure.polish import PolishConfig
from tests.conftest import make_table, make_task, run_cli


def _task():
    tables = [make_table(i, rows=20000 + 5000 * i, dim=32 if i % 2 else 64, pooling=6.0 + 2 * i) for i in range(8)]
    return make_task(tables, num_devices=4, mem_cap_gb=0.03, batch_size=1024)


def test_groups_are_whole_tables_within_the_smallest_cap_and_seeded():
    task = _task()
    groups = sample_devices(task, 6, seed=3)
    assert len(groups) == 6 and all(groups)
    cap = task.cap_bytes().min()
    assert all(sum(task.table_mem_bytes(t) for t in g) <= cap for g in groups)
    assert groups == sample_devices(task, 6, seed=3) and groups != sample_devices(task, 6, seed=4)
    assert len({tuple(g) for g in groups}) == 6  # distinct
    one = make_task([make_table(0), make_table(1)], num_devices=1)
    assert sample_devices(one, 5, seed=0) == [[0, 1]]  # one device: one group, measured once
    huge = make_task([make_table(0, rows=10**7, dim=64)], mem_cap_gb=0.01)
    with pytest.raises(UserError, match="calibrate: no table of the task fits"):
        sample_devices(huge, 2, seed=0)


def _alike_task():
    """12 tables alike (their ids, and so their streams' seeds, differ) on 4 devices where one table fits: every
    group is one table, and a model's prediction is the same for each."""
    tables = [make_table(i, rows=40000, dim=64, pooling=12.0) for i in range(12)]
    task = make_task(tables, num_devices=4, mem_cap_gb=0.015, batch_size=1024)
    assert task.table_mem_bytes(0) <= task.cap_bytes().min() < 2 * task.table_mem_bytes(0)
    return task


@pytest.mark.fast
def test_a_model_off_by_a_factor_is_calibrated_on_the_kernels():
    """The roofline made 10x too slow, on tables alike, is a model off by one steady factor (on mixed groups the
    roofline is also off in shape, 0.3x-1.1x from group to group here: that spread is the model's, which no single
    factor mends, and it made this test read the held-out groups 2x off on CI's machine). Calibrated on 6 of the
    tables, its predictions of the other 6 are within 2x of their measurement (median |log|; 1.05-1.25x here, quiet)
    and far closer than before. The calibration and the held-out tables are measured by one worker, one after the
    other: readings of these 0.6 ms devices move by 30% on a quiet machine, and up to 9x with two busy loops beside
    it on 2 cores (the median of 6 held within 2x there)."""
    task = _alike_task()
    raw = make_cost_model("analytic", task, {"calibration": 10.0})
    config = CalibrateConfig(name="measured", samples=6, warmup=5, iters=15, executor=ExecutorConfig())
    groups = sample_devices(task, 6, seed=0)  # what calibrate measures
    others = [[t] for t in range(task.num_tables) if [t] not in groups]
    assert all(len(g) == 1 for g in groups) and len(others) == 6
    with open_executor(config.executor, config.device, config.timeout_s) as worker:  # one worker: no drift between
        record = calibrate(task, raw, config, seed=0, executor=worker)
        measured = quiet_devices(task, [whole(task, g) for g in others], config.evaluator(), worker, config.tries).ms
    assert record.devices == 6 and record.factor < 1.0
    calibrated = make_cost_model("analytic", task, {"calibration": 10.0 * record.factor})
    raw_error = np.median(np.abs(np.log(predicted_compute_ms(raw, task, others) / measured)))
    error = np.median(np.abs(np.log(predicted_compute_ms(calibrated, task, others) / measured)))
    assert error < np.log(2.0) and error < raw_error / 3, (error, raw_error)


class _Counting:
    """A kernel pool that forwards every request to the real one and counts the requests of each device."""

    def __init__(self, pool):
        self.pool, self.sent = pool, Counter()

    def map(self, requests, on_answer):
        requests = list(requests)
        self.sent.update(r.tag("key") for r in requests)
        self.pool.map(requests, on_answer)


def test_a_reading_taken_on_a_busy_machine_is_taken_again_and_counted():
    """Three busy processes per core (real ones) hold the worker to about a quarter of its core, far below the CPU
    share a quiet reading needs (MIN_CPU_SHARE): each device is read ``tries`` times, and still counted busy; the
    calibration line says so. (With two a core, one reading of a fresh clone's run once held enough of its core to
    read quiet.)"""
    task = _alike_task()
    evaluator = CalibrateConfig(name="measured", warmup=2, iters=100, executor=ExecutorConfig()).evaluator()
    with open_executor(evaluator.executor, evaluator.device, evaluator.timeout_s) as pool:
        counting = _Counting(pool)
        loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3 * (os.cpu_count() or 1))]
        try:
            time.sleep(1.0)  # the busy processes spinning before the first reading (an interpreter starts in ~0.1 s)
            readings = quiet_devices(task, [whole(task, [0]), whole(task, [1])], evaluator, counting, tries=2)
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()
    assert readings.busy == 2 and counting.sent == {"0": 2, "1": 2}, (readings, counting.sent)
    assert np.all(readings.ms > 0)
    record = CalibrationRecord(
        factor=1.0,
        ratios=CalibrationRatios(p10=1, p50=1, p90=1),
        devices=2,
        tables_per_device=1.0,
        measured_ms=tuple(readings.ms),
        predicted_ms=(1.0, 1.0),
        seconds=1.0,
        far=False,
        busy=readings.busy,
        protocol=CalibrationProtocol(device="cpu", warmup=2, iters=100, tries=2),
    )
    assert "2 of them read while the machine was busy (every try)" in calibration_line(record)
    assert CalibrationRecord.from_json(record.to_json()) == record


class _Scripted:
    """Answers each device's n-th request with the n-th (total ms, CPU share) of its script: the re-reading policy
    on shares a real machine cannot be made to give on cue (the busy test above reads real kernels)."""

    def __init__(self, script):
        self.script, self.sent = script, Counter()

    def map(self, requests, on_answer):
        for request in list(requests):
            key = request.tag("key")
            ms, share = self.script[key][self.sent[key]]
            self.sent[key] += 1
            on_answer(request, ComputeAnswer(request.id, True, total_ms=ms, cpu_share=share))


def test_the_quiet_reading_or_else_the_least_disturbed_one_is_kept():
    task = _alike_task()
    devices = [whole(task, [t]) for t in range(5)]
    script = {
        "0": [(1.0, 0.95)],  # quiet at once: read once
        "1": [(5.0, 0.3), (1.1, 0.92)],  # quiet on the second try: that reading
        "2": [(3.0, 0.6), (9.0, 0.2), (4.0, 0.5)],  # never quiet: the least disturbed reading
        "3": [(2.0, None)],  # no CPU share (a CUDA reading): quiet
        "4": [(2.5, 0.9)],  # exactly the labels' bound: quiet
    }
    evaluator = CalibrateConfig(name="measured").evaluator()
    scripted = _Scripted(script)
    readings = quiet_devices(task, devices, evaluator, scripted, tries=3)
    assert readings.ms.tolist() == [1.0, 1.1, 3.0, 2.0, 2.5] and readings.busy == 1
    assert scripted.sent == {"0": 1, "1": 2, "2": 3, "3": 1, "4": 1}
    once = _Scripted(script)  # one try: each device read once, as every measurement was before
    assert quiet_devices(task, devices, evaluator, once, tries=1).ms.tolist() == [1.0, 5.0, 3.0, 2.0, 2.5]
    assert set(once.sent.values()) == {1}
    with pytest.raises(UserError, match="quiet_devices: tries 0, expected at least 1"):
        quiet_devices(task, devices, evaluator, scripted, tries=0)


def test_the_main_job_records_and_prints_its_calibration(tmp_path):
    run = run_cli(
        "searcher=size_lookup_greedy",
        "cost_model=analytic",
        "calibrate=measured",
        "calibrate.samples=2",
        "calibrate.warmup=1",
        "calibrate.iters=2",
        "task.num_tables=6",
        "task.num_devices=2",
        "task.batch_size=512",
        f"hydra.run.dir={tmp_path}",
    )
    assert run.returncode == 0, run.stderr
    assert "calibrated on this machine: predicted compute x" in run.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    record = plan["calibration"]
    assert record["devices"] == 2 and record["factor"] > 0
    assert record["protocol"]["tries"] == 3 and 0 <= record["busy"] <= 2
    assert record["factor"] == pytest.approx(np.median(np.divide(record["measured_ms"], record["predicted_ms"])), 1e-2)


def test_the_python_api_calibrates_and_polishes_too():
    """The API runs the main job's planner: calibrate, search, polish, each recorded in the plan."""
    import neuroshard_jax as nsj

    bins = [0.6, 0.3, 0.1] + [0.0] * 14
    tables = [{"rows": 20000 + 1000 * i, "dim": 16, "pooling_factor": 4.0, "bins": bins} for i in range(6)]
    config = CalibrateConfig(name="measured", samples=2, warmup=1, iters=2, executor=ExecutorConfig())
    polish = PolishConfig(
        name="measured", max_measurements=12, repeats=1, warmup=1, iters=2, anchors=1, executor=ExecutorConfig()
    )
    plan = nsj.plan(
        tables, num_devices=2, searcher="size_lookup_greedy", cost_model="analytic", calibrate=config, polish=polish
    )
    assert plan.calibration.devices == 2 and plan.to_json()["calibration"]["factor"] == plan.calibration.factor
    assert plan.polish.measurements <= 12 and plan.to_json()["polish"] == plan.polish.to_json()
    with pytest.raises(nsj.UserError, match="polish: got 'yes', expected True, False, a PolishConfig or a mode's name"):
        nsj.plan(tables, num_devices=2, polish="yes")


def test_calibration_on_the_plan_measures_its_devices_searches_again_and_checks_the_plan():
    """``calibrate.on=plan``: the roofline made 10x too slow, calibrated on the devices of the portfolio's plan and
    its members' plans (each distinct device once), is searched with again; the returned plan's own devices are
    read (kernels not read before) against the calibrated predictions; plan.json keeps it all and the line says so."""
    import neuroshard_jax as nsj
    from neuroshard_jax.core.plan_file import calibration_line

    bins = [0.6, 0.3, 0.1] + [0.0] * 14
    tables = [
        {"rows": 20000 + 3000 * i, "dim": 16 * (1 + i % 2), "pooling_factor": 4.0 + i, "bins": bins} for i in range(6)
    ]
    config = CalibrateConfig(name="measured", on="plan", warmup=2, iters=4, executor=ExecutorConfig())
    plan = nsj.plan(
        tables, num_devices=2, cost_model="analytic", cost_model_options={"calibration": 10.0}, calibrate=config
    )
    record = plan.calibration
    # the model as trained is what is calibrated: its factor is this machine's (about 1), far from the 10x given
    assert record.on == "plan" and 0 < record.factor < 3.0 and record.devices >= 2
    assert record.factor == pytest.approx(np.median(np.divide(record.measured_ms, record.predicted_ms)), 1e-2)
    check = record.plan_devices
    assert check.searched_again and len(check.measured_ms) == sum(bool(plan.device_shards(d)) for d in range(2))
    ratios = np.divide(check.predicted_ms, check.measured_ms)
    assert np.median(np.abs(np.log(ratios))) < np.log(2.0), (check, record.factor)
    assert check.worst == pytest.approx(np.max(np.maximum(ratios, 1 / ratios)), rel=1e-2)
    # the plan's predictions are the calibrated model's (x factor, not x10): the check reads the same numbers
    used = [d for d in range(2) if plan.device_shards(d)]
    assert np.allclose([plan.costs.compute_ms[d] for d in used], check.predicted_ms, rtol=1e-2, atol=1e-3)
    assert CalibrationRecord.from_json(plan.to_json()["calibration"]) == record
    line = calibration_line(record)
    assert "devices of the searched plans" in line and f"on its own {len(check.measured_ms)} devices" in line
    with pytest.raises(UserError, match="calibrate.on: got 'plans', expected one of tables, plan"):
        CalibrateConfig(name="measured", on="plans")


def test_first_contact_scales_another_kinds_model_once_and_later_runs_reuse_it(tmp_path, monkeypatch):
    """A machine kind no model was trained on, simulated honestly: this kind's models left out of the choice, so the
    run plans with another kind's; first contact measures its fixed spec kernels on the real worker (seconds), scales
    the model, says so in the model line and plan.json, and keeps the factor; the next run reads it back and measures
    nothing; first_contact=false plans unscaled; a model the user named is never scaled."""
    import time

    from neuroshard_jax.core.hardware import hardware, hardware_kind
    from neuroshard_jax.costs.choice import models_of_kind, shipped_names
    from neuroshard_jax.measure.first_contact import COMM_SAMPLES, COMM_WORLDS, comm_plans, predicted_comm
    from neuroshard_jax.search.sharding_planner import PlannerOptions

    monkeypatch.setenv("NEUROSHARD_CACHE_DIR", str(tmp_path / "cache"))  # this machine met for the first time
    here = hardware_kind(hardware())
    own = models_of_kind(here, shipped_names())
    task = make_task([make_table(i, 20_000 + 5_000 * i, 16, 2.0) for i in range(8)], num_devices=2, batch_size=4096)
    options = PlannerOptions(searcher="grid", cost_model_options={"exclude": own})
    started = time.perf_counter()
    first = options.planner().run(task)
    first_s = time.perf_counter() - started
    record = first.plan.calibration
    assert record.on == "first_contact" and record.devices == 12 and not first.choice.matches
    assert record.seconds < 60 and first.cost_model.calibration == record.factor  # the target: 30 s on 2 cores
    assert "scaled to this machine by first contact" in first.choice.line() and "measured now" in first.choice.line()
    # the collectives too: exchanges at 2 and 4 gloo ranks, every collective the model prices scaled by their factor
    comm, pairs = record.comm, 2 * COMM_SAMPLES  # the two-rank exchanges' devices come first
    assert comm is not None and comm.worlds == COMM_WORLDS == (2, 4) and len(comm.measured_ms) == comm.devices
    assert comm.devices == sum(COMM_SAMPLES * w for w in COMM_WORLDS)
    ratios = np.divide(comm.measured_ms, comm.predicted_ms)
    assert comm.factors == pytest.approx([np.median(ratios[:pairs]), np.median(ratios[pairs:])], rel=1e-2)
    assert comm.factor_at(2) == pytest.approx(comm.factors[0]) and comm.factor_at(4) == pytest.approx(comm.factors[1])
    assert min(comm.factors) - 1e-6 <= comm.factor_at(3) <= max(comm.factors) + 1e-6
    assert comm.factor_at(64) == pytest.approx(comm.factor_at(8)) == pytest.approx(comm.factors[-1])  # not extended
    assert f"collectives x{comm.factors[0]:.3g} at 2, x{comm.factors[1]:.3g} at 4 ranks" in first.choice.line()
    exchange, factor = comm_plans(2)[-1], comm.factors[0]  # the task has 2 devices
    trained = first.cost_model.with_compute_scale(1.0, np.ones(2)).with_comm_factor(1.0 / factor, np.full(2, factor))
    as_measured = np.array(comm.predicted_ms[pairs - 2 : pairs])
    assert np.allclose(predicted_comm(trained, exchange), as_measured, rtol=1e-2)  # the model as trained, as measured
    assert np.allclose(predicted_comm(first.cost_model, exchange), factor * as_measured, rtol=1e-2)  # and as scaled
    assert CalibrationRecord.from_json(first.plan.to_json()["calibration"]) == record  # plan.json keeps it all
    # explain prices the plan with the factors it was searched with: its collectives as the plan has them
    from neuroshard_jax.core.files import write_json
    from neuroshard_jax.measure.breakdown import ExplainConfig, explain_file

    saved = write_json(first.plan.to_json(), tmp_path / "plan.json")
    said = explain_file(ExplainConfig(plan=str(saved), chart=False))
    assert all(f"{ms:>9.3f}" in said for ms in first.plan.costs.bwd_comm_ms if ms > 0)
    assert first.choice.name not in own
    started = time.perf_counter()
    again = options.planner().run(task)
    assert "kept from an earlier run" in again.choice.line() and again.plan.calibration == record
    assert time.perf_counter() - started < first_s - 0.5 * record.seconds  # nothing measured again
    assert again.plan.shards == first.plan.shards  # the same seed, the same scale: the same plan
    off = PlannerOptions(searcher="grid", cost_model_options={"exclude": own}, first_contact=False)
    assert off.planner().run(task).plan.calibration is None
    named = PlannerOptions(searcher="grid", cost_model=first.choice.name).planner().run(task)
    assert named.plan.calibration is None  # a model the user named is theirs as it is


@pytest.mark.fast
def test_the_comm_worlds_probe_refuses_bad_worlds_in_one_line(capsys):
    """``tools.contact_comm_worlds`` (first contact's exchanges at more worlds): ranks below 2 or not numbers are one
    line and exit 2, before any model is read or rank started."""
    from tools.contact_comm_worlds import main

    assert main(["--model", "epyc-f25m17", "--worlds", "1,4"]) == 2
    assert main(["--model", "epyc-f25m17", "--worlds", "two"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "got [1, 4], expected ranks >= 2" in lines[0] and "'two'" in lines[1]
