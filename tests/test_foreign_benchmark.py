"""The foreign benchmark's generators (valid, deterministic, their own laws) and its report arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from neuroshard_jax.core.task import Task
from neuroshard_jax.learn.metrics import ranking_tau
from tools import foreign_benchmark as fb


@pytest.mark.parametrize("family", fb.FAMILIES)
def test_every_family_draws_valid_tables_deterministically(family):
    draw = lambda: fb.family_tables(family, np.random.default_rng([fb.BASE_SEED, 99, fb.FAMILIES.index(family)]))  # noqa: E731
    tables = draw()
    assert tables == draw() and len(tables) >= 12
    fb.fit_measurable(tables, 4)
    task = Task.from_json(
        {
            "num_devices": 4,
            "mem_cap_gb": fb.device_cap_gib(tables, 4),
            "batch_size": fb.BATCH_SIZE,
            "tables": [{**t, "id": i} for i, t in enumerate(tables)],
        }
    )
    assert fb.device_cap_gib(tables, 4) <= fb.MAX_DEVICE_GIB
    assert all(abs(sum(t.bins) - 1) < 1e-3 for t in task.tables if t.pooling_factor > 0)
    if family == "tiny_hot":
        assert sum(t.rows <= 2000 and t.pooling_factor >= 50 for t in task.tables) >= len(tables) - 4
    if family == "extreme_pooling":
        assert any(t.pooling_factor > 100 for t in task.tables) and any(t.pooling_factor < 1 for t in task.tables)


def _entry(measured, predicted=None):
    entry = {"family": "f", "measured": measured, "predicted": predicted or measured, "noise": 0.01}
    return {**entry, "time_s": 2.0, "measurements": 6}


def test_report_ratios_wins_bounds_and_errors_by_hand():
    tasks = {"d4-00": ("f", None), "d4-01": ("f", None)}

    class _Task:
        num_devices = 4

    tasks = {k: ("f", _Task()) for k in tasks}
    by_task = {
        "d4-00": {
            "torchrec": _entry([10, 10, 10, 10]),
            "beam": _entry([8, 8, 7, 7], predicted=[8, 16, 7, 3.5]),  # one device 2x over, one 2x under
            "grid": _entry([8.1, 6, 6, 6]),  # within 3% of beam's 8: tied
            "rl": {"family": "f", "infeasible": "no room"},
            "size_greedy": _entry([9, 9, 9, 9]),
        },
        "d4-01": {"torchrec": _entry([5, 5, 5, 5]), "beam": _entry([6, 4, 4, 4]), "grid": _entry([5, 5, 4, 4])},
    }
    summary = fb.summarise(by_task, tasks, tie=0.03)[4]
    beam, grid, rl = (summary["searchers"][s] for s in ("beam", "grid", "rl"))
    assert beam.slowest_vs_torchrec == pytest.approx((0.8 + 1.2) / 2)
    assert grid.slowest_vs_torchrec == pytest.approx((8.1 / 10 + 1.0) / 2)
    assert beam.best_or_tied == 1 and grid.best_or_tied == 2
    # against the best greedy baseline, over the tasks where one was measured (d4-00 only)
    assert beam.no_worse_than_best_greedy == 1 and beam.greedy_tasks == 1
    assert summary["searchers"]["size_greedy"].best_or_tied == 0
    assert rl.infeasible == 1 and rl.slowest_vs_torchrec is None
    assert beam.devices_off_2x == 0  # exactly 2x is within the bound
    assert beam.device_mape == pytest.approx((0 + 1 + 0 + 0.5) / 8)
    # the balance bound: the lowest mean device compute of any plan, over TorchRec's slowest device
    assert summary["balance_bound_vs_torchrec"] == pytest.approx((26.1 / 4 / 10 + 18 / 4 / 5) / 2)
    assert beam.slowest_vs_bound == pytest.approx((8 / (26.1 / 4) + 6 / (18 / 4)) / 2)
    assert beam.mean_time_s == 2.0 and beam.mean_measurements == 6


def test_geometric_means_and_the_worst_task_against_the_better_torchrec_plan_in_compute_and_in_step():
    class _Task:
        num_devices = 4

    tasks = {k: ("f", _Task()) for k in ("d4-00", "d4-01")}

    def entry(slowest, step):
        return {**_entry([slowest, 1, 1, 1]), "step": step}

    by_task = {  # (a) the slowest device's compute; (b) ``step``: with the collectives priced alike
        "d4-00": {"torchrec": entry(10, 20), "torchrec_default": entry(8, 30), "portfolio": entry(4, 15)},
        "d4-01": {"torchrec": entry(5, 10), "torchrec_default": entry(10, 10), "portfolio": entry(5, 11)},
    }
    ours = fb.summarise(by_task, tasks, tie=0.03)[4]["searchers"]["portfolio"]
    assert ours.geo_vs_torchrec == pytest.approx((4 / 10 * 5 / 5) ** 0.5)
    assert ours.geo_vs_torchrec_default == pytest.approx((4 / 8 * 5 / 10) ** 0.5)
    assert ours.worst_vs_better_torchrec == pytest.approx(1.0)  # d4-01: TW+CW's 5
    assert ours.step_geo_vs_torchrec == pytest.approx((15 / 20 * 11 / 10) ** 0.5)
    assert ours.step_geo_vs_torchrec_default == pytest.approx((15 / 30 * 11 / 10) ** 0.5)
    assert ours.step_worst_vs_better_torchrec == pytest.approx(1.1)  # d4-01: 11 against the better 10


def test_plan_ranking_counts_only_pairs_apart_by_more_than_the_tie():
    assert ranking_tau([(1.0, 10.0), (2.0, 20.0), (3.0, 30.0)], 0.03) == 1.0
    assert ranking_tau([(3.0, 10.0), (2.0, 20.0), (1.0, 30.0)], 0.03) == -1.0
    assert ranking_tau([(1.0, 10.0), (2.0, 10.1)], 0.03) is None  # within the tie: no order to get right
    assert ranking_tau([(1.0, 10.0), (2.0, 20.0), (1.5, 30.0)], 0.03) == pytest.approx(1 / 3)  # 2 right, 1 wrong


def test_drift_labels_take_turns_and_their_speed_is_the_quiet_median():
    requests = tuple({"id": f"d/probe-{i}"} for i in range(5))
    drift = fb.DriftLabels(requests, {r["id"]: 10.0 for r in requests}, ("d",), per_task=2)
    batches = [[r["id"] for r in drift.batch(i)] for i in range(3)]
    assert batches == [["d/probe-0", "d/probe-1"], ["d/probe-2", "d/probe-3"], ["d/probe-4", "d/probe-0"]]
    rows = [{"drift": f"d/probe-{i}", "label_ms": 10.0, "total_ms": ms} for i, ms in enumerate((9.0, 11.0, 12.0))]
    rows.append({"drift": "d/probe-3", "label_ms": 10.0, "total_ms": 30.0, "cpu_share": 0.5})  # beside other work
    speed = fb.label_speed(rows)
    assert speed["speed_median"] == pytest.approx(1.1) and speed["retimings"] == 3 and speed["labels"] == 3
    assert fb.label_speed([]) is None


def test_the_drift_corrected_error_scales_predictions_by_the_speed():
    class _Task:
        num_devices = 4

    entry = _entry([10, 10, 10, 10], predicted=[8, 8, 8, 8])
    by_task = {"d4-00": {"torchrec": {**entry, "drift_corrected": [10, 10, 10, 10.5]}}}
    summary = fb.summarise(by_task, {"d4-00": ("f", _Task())}, tie=0.03)[4]
    assert summary["model_signed_error"] == pytest.approx(-0.2) and summary["model_worst_device"] == pytest.approx(1.25)
    assert summary["drift_corrected_device_mape"] == pytest.approx(0.0125)
    assert summary["drift_corrected_signed_error"] == pytest.approx(0.0125)


def test_calibration_is_judged_on_rounds_later_than_the_one_it_was_taken_from():
    """Round 0 calibrates (on the task's tables, or on the model's own plan's devices), rounds 1.. judge every plan's
    devices; a busy reading is left out; a device lacking a later reading is not judged."""
    from tools import held_out_in_time as ht

    rows = {
        "a": [{"repeat": 0, "total_ms": 10.0}, {"repeat": 1, "total_ms": 12.0}, {"repeat": 2, "total_ms": 14.0}],
        "b": [{"repeat": 0, "total_ms": 5.0}, {"repeat": 1, "total_ms": 9.0, "cpu_share": 0.5}],  # round 1 busy
        "c": [{"repeat": 0, "total_ms": 20.0}, {"repeat": 1, "total_ms": 18.0}],
    }
    rounds = ht.rounds_of(rows, 0.9)
    assert rounds["b"] == {0: 5.0}
    assert ht.first_and_later(rounds, ["a", "c"]) == (30.0, 31.0)  # 10 + 20; median(12, 14) + 18
    assert ht.first_and_later(rounds, ["a", "b"]) == (15.0, None)
    by_task = {
        "d4-00": {
            # the model's plan: round 0 read 2x its predictions, so on plan's factor is 2
            "beam": {
                "predicted": [5.0, 10.0],
                "first": [10.0, 20.0],
                "later": [12.0, 22.0],
                "measured": [11.0, 21.0],
                "own": True,
            },
            "torchrec": {
                "predicted": [8.0, 4.0],
                "first": [14.0, None],
                "later": [16.0, None],
                "measured": [15.0, None],
                "own": False,
            },
        }
    }
    judged = ht.judged(by_task, {"d4-00": 4}, {"d4-00": 1.5}, {"speed_median": 1.1})[4]
    assert judged["plan_factors"] == {"d4-00": 2.0}
    assert judged["on plan"]["devices"] == 3  # the torchrec device without a later reading is left out
    assert judged["on plan"]["mape"] == pytest.approx(np.mean([2 / 12, 2 / 22, 0.0]))
    assert judged["on plan"]["worst"] == pytest.approx(12 / 10)
    assert judged["on tables"]["signed"] == pytest.approx(np.mean([7.5 / 12 - 1, 15 / 22 - 1, 12 / 16 - 1]))
    assert judged["as trained"]["worst"] == pytest.approx(12 / 5)
    assert judged["x drift"]["mape"] == pytest.approx(np.mean([1 - 5.5 / 12, 1 - 11 / 22, 1 - 8.8 / 16]))
    # the devices' own readings: each device's round-0 reading against its later ones (10 vs 12, 20 vs 22, 14 vs 16)
    assert judged["devices"]["devices"] == 3
    assert judged["devices"]["mape"] == pytest.approx(np.mean([2 / 12, 2 / 22, 2 / 16]))
    assert judged["devices"]["signed"] == pytest.approx(np.mean([-2 / 12, -2 / 22, -2 / 16]))
    # the exact model: each device's run median x round 0's speed (the median first / measured: 14 / 15)
    k = 14 / 15
    assert judged["exact"]["devices"] == 3
    assert judged["exact"]["signed"] == pytest.approx(np.mean([11 * k / 12 - 1, 21 * k / 22 - 1, 15 * k / 16 - 1]))
    unread = {"d4-00": {"beam": {"predicted": [5.0], "later": [12.0], "own": True}}}  # no round 0: no floor
    assert ht.judged(unread, {"d4-00": 4}, {}, None)[4]["devices"] is None
    assert ht.judged(unread, {"d4-00": 4}, {}, None)[4]["exact"] is None
    assert ht.judged(unread, {"d4-00": 4}, {}, None)[4]["as trained"]["devices"] == 1
    no_drift = ht.judged(by_task, {"d4-00": 4}, {}, None)[4]
    assert no_drift["x drift"] is None and no_drift["on tables"] is None and no_drift["on plan"]["devices"] == 3
    assert no_drift["labels"] is None  # no label re-timed: no floor
    # the floor: labels re-timed, x round 0's median ratio (1.2), judged on the later rounds' re-timings
    retimed = [
        {"task": "d4-00", "repeat": 0, "label_ms": 10.0, "total_ms": 12.0},
        {"task": "d4-00", "repeat": 0, "label_ms": 5.0, "total_ms": 6.0},
        {"task": "d4-00", "repeat": 1, "label_ms": 10.0, "total_ms": 15.0},
        {"task": "d4-00", "repeat": 2, "label_ms": 5.0, "total_ms": 6.0},
        {"task": "d8-00", "repeat": 1, "label_ms": 5.0, "total_ms": 50.0},  # another size's
    ]
    floor = ht.judged(by_task, {"d4-00": 4, "d8-00": 8}, {}, None, retimed)[4]["labels"]
    assert floor["devices"] == 2 and floor["mape"] == pytest.approx(np.mean([3 / 15, 0.0]))


def test_the_report_reads_the_model_by_the_tables_a_device_holds():
    """``device_shapes``: a row block of a tiny table, a tiny table, a row block, a cold table, or none, the first
    that applies; ``by_shape``: the model as trained over the measured devices of each shape."""
    from neuroshard_jax.core.plan import Plan
    from neuroshard_jax.core.sharding import Shard
    from tests.conftest import make_table, make_task
    from tools import held_out_in_time as ht

    tables = [make_table(0, 10, 16, 50.0), make_table(1, 2_000_000, 16, 0.5), make_table(2, 5000, 16, 3.0)]
    task = make_task(tables, num_devices=5, mem_cap_gb=4.0)
    shards = (
        Shard(0, 0, 16, 0, 0, 5),  # device 0: a tiny table's row block, beside half of table 2
        Shard(0, 0, 16, 1, 5, 5),  # device 1: the other block, beside the cold table
        Shard(1, 0, 16, 1),
        Shard(2, 0, 16, 0, 0, 2500),
        Shard(2, 0, 16, 2, 2500, 2500),  # device 2: a row block alone
    )
    plan = Plan(task, shards)
    assert ht.device_shapes(plan) == ["tiny block", "tiny block", "row block", "other", "other"]
    whole = Plan(task, (Shard(0, 0, 16, 0), Shard(1, 0, 16, 1), Shard(2, 0, 16, 2)))
    assert ht.device_shapes(whole) == ["tiny", "cold", "other", "other", "other"]
    replicated = Plan(task, (Shard(1, 0, 16, 1), Shard(2, 0, 16, 2)), data_parallel=(0,))  # the tiny table everywhere
    assert ht.device_shapes(replicated) == ["tiny"] * 5
    by_task = {
        "d5-00": {
            "a": {"shapes": ["tiny", "cold", "other"], "predicted": [2.0, 3.0, 1.0], "measured": [1.0, 4.0, None]},
            "b": {"shapes": ["tiny", "other"], "predicted": [3.0, 2.0], "measured": [2.0, 2.0]},
        }
    }
    shapes = ht.by_shape(by_task)
    assert set(shapes) == {"tiny", "cold", "other"}  # shapes without a measured device are left out
    assert shapes["tiny"]["devices"] == 2 and shapes["tiny"]["mape"] == pytest.approx((1.0 + 0.5) / 2)
    assert shapes["cold"]["signed"] == pytest.approx(-0.25) and shapes["other"]["devices"] == 1
