"""tools/bench_plan_accuracy.py's arithmetic on hand-made measurements: device errors by group (split devices
included), the per-task ranking, a scale applied to predictions, and the searched plans against TorchRec's and the
balance bound."""

from __future__ import annotations

import numpy as np
import pytest

from neuroshard_jax.core.assignment import plan_of
from neuroshard_jax.costs.cost_model import DeviceCosts
from neuroshard_jax.learn.plan_labels import device_errors, plan_entry, row_plans
from neuroshard_jax.measure.evaluator import device_key, device_tables
from tests.conftest import make_table, make_task
from tools import bench_plan_accuracy as bpa


def _case():
    """Three plans of 4 dim-16 tables on 2 devices; a device's measured ms is 10 per whole table (5 per half)."""
    task = make_task([make_table(i, rows=1000 + i, dim=16) for i in range(4)], num_devices=2)
    layouts = {
        "torchrec": ((0,), (0,), (1,), (1,)),  # 20 / 20
        "beam": ((0, 1), (0,), (1,), (1,)),  # table 0 split: 15 / 25
        "beam~move1": ((0,), (0,), (0,), (1,)),  # 30 / 10
    }
    measured, rows_plans, truth = {}, [], []
    for name, layout in layouts.items():
        plan = plan_of(task, layout)
        ms = [sum(10.0 * s.dim / 16 for s in plan.device_shards(d)) for d in range(2)]
        for d in range(2):
            measured[device_key(task, device_tables(task, plan.device_shards(d)))] = ms[d]
        costs = DeviceCosts(*(np.asarray(x) for x in (ms, [0.0, 0.0], [0.0, 0.0], ms)))
        searcher, variant = (name.split("~")[0], "move" if "~" in name else "searched")
        rows_plans.append(plan_entry(name, searcher, variant, plan, costs))
        truth.append(ms)
    row = {"id": "2/0", "round": 0, "task": task.to_json(), "plans": rows_plans}
    return task, row, measured, np.asarray(truth)


def test_device_errors_group_split_devices_and_find_the_slowest():
    task, row, measured, truth = _case()
    _, plans = row_plans(row)
    errors, slowest = device_errors(task, row["plans"][1], plans[1], truth[1] * 1.2, measured)
    assert errors["all"] == pytest.approx([0.2, 0.2]) and errors["split devices"] == pytest.approx([0.2, 0.2])
    assert set(errors) == {"keys", "all", "beam", "searched", "split devices"}
    assert slowest == pytest.approx((30.0, 25.0))
    assert device_errors(task, row["plans"][1], plans[1], truth[1], {}) == ({}, None)  # a device not measured


def test_figures_scale_rank_and_bound():
    _, row, measured, truth = _case()
    high = bpa.model_figures([row], [row_plans(row)], [truth * 1.1], measured, 0.03, [1.0])["2"]
    assert high["device_error"]["all"]["mape"] == pytest.approx(0.1)
    assert high["device_error"]["variants"]["mean_signed"] == pytest.approx(0.1)
    assert high["per_task_tau"] == 1.0 and high["tasks_with_tau"] == 1
    scaled = bpa.model_figures([row], [row_plans(row)], [truth * 1.1], measured, 0.03, [1 / 1.1])["2"]
    assert scaled["device_error"]["all"]["mape"] == pytest.approx(0.0, abs=1e-12)
    wrong = truth[::-1].copy()  # the slowest plan predicted fastest and the other way round
    assert bpa.model_figures([row], [row_plans(row)], [wrong], measured, 0.03, [1.0])["2"]["per_task_tau"] == -1.0
    quality = bpa.plan_quality([row], [row_plans(row)], measured)["2"]
    assert quality["beam"]["vs_torchrec"] == pytest.approx(25 / 20) and quality["beam"]["vs_bound"] == pytest.approx(
        25 / 20
    )
    assert quality["beam"]["max_over_mean"] == pytest.approx(25 / 20) and quality["beam"]["mean_vs_bound"] == 1.0
    assert quality["torchrec"] == {
        "vs_torchrec": 1.0,
        "vs_bound": 1.0,
        "max_over_mean": 1.0,
        "mean_vs_bound": 1.0,
        "tasks": 1,
        "of_tasks": 1,
    }
    assert quality[bpa.BEST]["vs_bound"] == 1.0  # TorchRec's plan, balanced, has the lowest slowest device here


def test_polished_plans_are_ranked_with_what_polishing_cost():
    _, row, measured, _ = _case()
    balanced = dict(row["plans"][0], name="beam+polish", searcher="beam+polish")  # polishing balanced beam's plan
    record = {"measurements": 40, "time_s": 30.0, "changes_kept": 1, "reverted": False, "compute_improvement": 0.2}
    row = dict(row, plans=[*row["plans"], balanced | {"polish": record}])
    quality = bpa.plan_quality([row], [row_plans(row)], measured)["2"]
    assert quality["beam+polish"]["vs_torchrec"] == 1.0 and quality["beam"]["vs_torchrec"] == pytest.approx(1.25)
    assert quality["beam+polish"]["polish_measurements"] == 40 and quality["beam+polish"]["polish_time_s"] == 30
    assert "polish_time_s" not in quality["beam"]
    assert bpa.polish_cost(quality["beam+polish"]) == " (40 measurements, 30 s)" and not bpa.polish_cost({})


def test_polished_entries_are_plans_with_their_polishing_record():
    """Real kernels: ``--polish``'s entries are the searched plan polished (here an unbalanced one), named
    SEARCHER+polish, a searched plan of the row, with the record and its steps; a searcher without a plan is
    skipped."""
    from neuroshard_jax.kernels.executors import ExecutorConfig
    from neuroshard_jax.measure.polish import PolishConfig

    tables = [make_table(i, rows=20000 + 4000 * i, dim=32 if i % 2 else 64, pooling=8.0 + 2 * i) for i in range(6)]
    task = make_task(tables, num_devices=3, mem_cap_gb=0.2, batch_size=2048)
    plan = plan_of(task, [(0,)] * 6).validate()
    zeros = [0.0] * 3
    entries = [plan_entry("beam", "beam", "searched", plan, DeviceCosts(*(np.asarray(zeros) for _ in range(4))))]
    config = PolishConfig(name="measured", max_measurements=24, repeats=2, warmup=1, iters=3, executor=ExecutorConfig())
    out = bpa.polished(task, entries, ["beam", "grid"], "xeon-union", config, 0)
    assert [(e["name"], e["searcher"], e["variant"]) for e in out] == [("beam+polish", "beam+polish", "searched")]
    record = out[0]["polish"]
    assert record["steps"] and record["measurements"] <= 24 and len(record["devices"]) == 3
    _, plans = row_plans({"task": task.to_json(), "plans": entries + out})
    plans[1].validate()
    assert max(out[0]["compute"]) > 0


def test_task_speeds_are_the_median_reference_ratio_per_task():
    records = [
        {"id": "a@4/1", "reference": True, "task": "4/1", "label_ms": 10.0, "total_ms": 11.0},
        {"id": "b@4/1", "reference": True, "task": "4/1", "label_ms": 20.0, "total_ms": 21.0},
        {"id": "c@4/1", "reference": True, "task": "4/1", "label_ms": 5.0, "total_ms": 9.0},
        {"id": "a@8/1", "reference": True, "task": "8/1", "label_ms": 10.0, "total_ms": 9.0},
        {"id": "k", "task": "8/1", "total_ms": 30.0},  # a plan's device, not a reference
    ]
    assert bpa.task_speeds(records) == pytest.approx({"4/1": 1.1, "8/1": 0.9})
