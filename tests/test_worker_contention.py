"""``tools.worker_contention``: a plan's devices and a model's labels read on real kernel workers, alone (one pinned
worker) and beside a neighbour (two), and the model's error under each."""

from __future__ import annotations

import json

import numpy as np

from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard
from tests.conftest import make_table, make_task


def test_a_plans_devices_and_the_models_labels_are_read_alone_and_beside_a_neighbour(tiny_ensemble, tmp_path):
    from tools.worker_contention import main, plans_of, run

    _, checkpoint, _ = tiny_ensemble
    task = make_task([make_table(i, rows=2000 * (i + 1), dim=8) for i in range(3)], num_devices=2, batch_size=256)
    plan = Plan(task, (Shard(0, 0, 8, 0), Shard(1, 0, 8, 1), Shard(2, 0, 8, 1)))
    plans = tmp_path / "plans.jsonl"
    rows = [
        {
            "id": "d2-00/grid",
            "task": "d2-00",
            "searcher": "grid",
            "model": f"neural:{checkpoint.name}",
            "plan": plan.to_json(),
        }
    ]
    rows.append(
        {**rows[0], "id": "d2-00/grid/another", "model": "neural:another"}
    )  # another model's plan of the same task: not read
    plans.write_text("".join(json.dumps(r) + "\n" for r in rows))
    chosen = plans_of(plans, "grid", str(checkpoint), 0)
    assert [t for t, _ in chosen] == ["d2-00"]
    result = run(chosen, str(checkpoint), labels=2, rounds=2)
    for name in ("alone", "beside"):
        figures = result["protocols"][name]
        assert figures["2_devices"]["devices"] == 2 and figures["2_devices"]["mape"] >= 0
        low, mid, high = figures["labels_now_over_recorded"].values()
        assert 0 < low <= mid <= high
        assert len(result["readings"][name]) == 4  # two device kernels and two labels
        assert all(len(v) == 2 and min(v) > 0 for v in result["readings"][name].values())  # one reading a round
    assert np.isfinite(result["beside_over_alone"]["devices"]["p50"]) and result["rounds"] == 2
    assert main(["--plans", str(plans), "--checkpoint", str(checkpoint), "--rounds", "0"]) == 2
    assert main(["--plans", str(plans), "--checkpoint", str(checkpoint), "--searcher", "beam"]) == 2


def test_a_device_is_read_fused_and_table_by_table_beside_the_models_predictions(tiny_ensemble, tmp_path, capsys):
    """``tools.fused_or_alone``: a plan's device re-timed as one fused kernel and each table alone, on a real worker;
    a device holding nothing or a task with no plan is one line and exit 2."""
    from tools.fused_or_alone import fused_or_alone, main

    _, checkpoint, _ = tiny_ensemble
    task = make_task([make_table(i, rows=2000 * (i + 1), dim=8) for i in range(3)], num_devices=2, batch_size=256)
    plan = Plan(task, (Shard(0, 0, 8, 1), Shard(1, 0, 8, 1), Shard(2, 0, 8, 1)))
    rows = fused_or_alone(plan, 1, str(checkpoint), repeats=1)
    assert [name for name, _, _ in rows] == ["fused", "t0", "t1", "t2"]
    assert all(p > 0 and m > 0 for _, p, m in rows)
    plans = tmp_path / "plans.jsonl"
    row = {"id": "d2-00/grid", "task": "d2-00", "searcher": "grid", "model": f"neural:{checkpoint.name}"}
    plans.write_text(json.dumps({**row, "plan": plan.to_json()}) + "\n")
    args = ["--plans", str(plans), "--checkpoint", str(checkpoint), "--searcher", "grid", "--repeats", "1"]
    assert main([*args, "--task", "d2-00", "--device", "0"]) == 2  # device 0 holds nothing
    assert main([*args, "--task", "d2-01", "--device", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "device 0 of this plan holds no shard" in err[0] and "'d2-01'" in err[1]
