"""Plans that explain themselves (neuroshard_jax.explain): shares that add up, split gains that are real score
differences, a diff that names what moved, a chart on disk."""

import dataclasses
import json

import numpy as np
import pytest

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard, column_shards
from neuroshard_jax.costs.analytic import analytic_model
from neuroshard_jax.costs.scoring import score_plan, score_plans
from neuroshard_jax.measure.breakdown import ExplainConfig, constraint_binds, explain_file, explanation, split_gains
from neuroshard_jax.measure.diff import TableChange, plan_diff

from .conftest import make_table, make_task


@pytest.fixture(scope="module")
def plan_and_model():
    tables = [make_table(i, rows=2000 * (i + 1), dim=32, pooling=1.0 + 3 * i) for i in range(6)]
    task = make_task(tables, num_devices=3, mem_cap_gb=1.0, batch_size=512)
    shards = (
        *column_shards(0, 32, [0, 1]),
        Shard(1, 0, 32, 1),
        Shard(2, 0, 32, 2),
        *column_shards(3, 32, [2, 0, 1, 2]),
        Shard(4, 0, 32, 0),
        Shard(5, 0, 32, 1),
    )
    return Plan(task, shards).validate(), analytic_model(task)


@pytest.mark.fast
def test_table_shares_add_up_and_split_gains_are_score_differences(plan_and_model):
    plan, model = plan_and_model
    expl = explanation(plan, model, top=3)
    costs = score_plan(model, plan)
    np.testing.assert_allclose(np.sum(expl.table_compute_ms, axis=1), costs.compute_ms, rtol=1e-5)
    assert expl.critical_device == int(np.argmax(costs.total_ms)) and len(expl.top_tables) <= 3
    gains = split_gains(model, plan)
    assert set(gains) == {0, 3}  # the two split tables
    whole = Shard(0, 0, 32, gains[0].whole_on)
    variant = dataclasses.replace(plan, shards=(whole, *[s for s in plan.shards if s.table != 0]))
    expected = score_plans(model, [variant])[0] - score_plans(model, [plan])[0]
    assert gains[0].gain_ms == pytest.approx(expected, rel=1e-5)


@pytest.mark.fast
def test_explain_file_prints_measured_costs_and_writes_a_chart(plan_and_model, tmp_path):
    plan, model = plan_and_model
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_json()))
    devices = [{"device": d, "compute": 1.0 + d, "fwd_comm": 0.1, "bwd_comm": 0.1, "total": 1.2 + d} for d in range(3)]
    evaluation = {"plan": str(path), "predicted_cost_ms": None, "devices": devices}  # the plan has no costs
    (tmp_path / "evaluation.json").write_text(json.dumps(evaluation))
    text = explain_file(ExplainConfig(plan=str(path), model="analytic"))
    assert "measured: evaluation.json" in text and "3.200" in text  # device 2's measured total
    assert "<- slowest" in text and "split tables" in text and "imbalance: max/mean" in text
    assert (tmp_path / "plan.png").stat().st_size > 10_000
    # an evaluation.json that is a FIFO (its read would block) or /dev/zero (it never ends): one line, at once
    import os

    (tmp_path / "evaluation.json").unlink()
    os.mkfifo(tmp_path / "evaluation.json")
    with pytest.raises(UserError, match=r"evaluation.json' is not a regular file, expected an evaluation.json of"):
        explain_file(ExplainConfig(plan=str(path), model="analytic"))


def test_diff_names_moved_and_split_tables(plan_and_model):
    plan, model = plan_and_model
    base = dataclasses.replace(
        plan,
        shards=tuple(dataclasses.replace(s, device=0) if s.table == 5 else s for s in plan.shards if s.table != 0)
        + (Shard(0, 0, 32, 2),),
    )
    diff = plan_diff(plan, base.validate(), model)
    by_table = {c.table: c for c in diff.changes}
    assert set(by_table) == {"0", "5"}
    assert by_table["0"].change == "split" and by_table["0"].slices == [1, 2]
    assert by_table["5"] == TableChange("5", "moved", [0], [1], [1, 1])
    other = Plan(make_task([make_table(0)], num_devices=3), (Shard(0, 0, 16, 0),))
    with pytest.raises(UserError, match="base: its task's tables differs"):
        plan_diff(plan, other, model)


def test_explain_command_takes_a_model_and_refuses_a_foreign_base(plan_and_model, tmp_path):
    from .conftest import run_cli

    plan, _ = plan_and_model
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_json()))
    done = run_cli(f"plan={path}", "model=analytic", "chart=false", module="neuroshard_jax.explain")
    assert done.returncode == 0, done.stderr
    assert "predicted by cost_model=analytic" in done.stdout and not (tmp_path / "plan.png").exists()
    other = tmp_path / "other.json"
    obj = plan.to_json()
    obj["task"]["batch_size"] = 1024
    other.write_text(json.dumps(obj))
    bad = run_cli(f"plan={path}", f"base={other}", "model=analytic", module="neuroshard_jax.explain")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: base: its task's batch_size differs from the plan's, expected two plans of one task"
    )


def test_constraints_that_bind_are_named(plan_and_model):
    plan, _ = plan_and_model
    tables = list(plan.task.tables)
    tables[2] = tables[2].constrained(pin=2)  # on device 2 in the plan
    tables[4] = tables[4].constrained(exclude=(1,))  # on device 0
    tables[3] = tables[3].constrained(max_shards=4)  # 4 slices already
    constrained = dataclasses.replace(plan, task=dataclasses.replace(plan.task, tables=tuple(tables))).validate()
    assert constraint_binds(constrained, critical=2, fastest=1) == [
        "pin: tables 2 may only be on device 2",
        "no_split/max_shards: tables 3 may not be split further",
    ]
    assert constraint_binds(constrained, critical=0, fastest=1)[0] == (
        "exclude: tables 4 may not move to the least loaded device 1"
    )


@pytest.mark.fast
def test_a_device_never_binds_against_itself():
    """On one device the slowest is the least loaded: no table "cannot move from device 0 to device 0"."""
    big = make_task([make_table(0, rows=10_000, dim=16), make_table(1, rows=20_000, dim=16)], num_devices=1)
    tight = dataclasses.replace(big, devices=(dataclasses.replace(big.devices[0], mem_cap_gb=0.003),))
    plan = Plan.from_assignment(tight, [1, 1], [[0], [0]])
    words = explanation(plan, analytic_model(tight)).binds
    assert not any("cannot move" in w for w in words), words


def test_a_plan_names_its_model_and_explain_uses_it(plan_and_model, tmp_path):
    """plan.json records the model that planned by its own name (not its family's ``neural``), and ``explain`` with
    no ``model`` explains with that model; one this machine does not have gives way, with a warning that says so."""
    from neuroshard_jax.costs.choice import CostModelSpec
    from neuroshard_jax.costs.scoring import with_costs

    small, _ = plan_and_model
    plan = Plan(dataclasses.replace(small.task, batch_size=4096), small.shards).validate()  # the shipped model's batch
    shipped = CostModelSpec("xeon-union").for_task(plan.task)
    assert shipped.name == "xeon-union" and CostModelSpec("neural", {}).for_task(plan.task).name == "xeon-union"
    path = tmp_path / "plan.json"
    for model, says in ((analytic_model(plan.task), "analytic"), (shipped, "xeon-union")):
        path.write_text(json.dumps(with_costs(model, plan).to_json()))
        assert json.loads(path.read_text())["cost_model"] == says
        text = explain_file(ExplainConfig(plan=str(path), chart=False))
        assert f"predicted by cost_model={says}" in text and "warning" not in text, text
    elsewhere = {**json.loads(path.read_text()), "cost_model": "a-model-of-another-machine"}
    path.write_text(json.dumps(elsewhere))
    text = explain_file(ExplainConfig(plan=str(path), chart=False))
    assert text.startswith("warning: the plan's cost model 'a-model-of-another-machine' is not on this machine")


def test_explain_says_which_kernels_each_device_runs():
    """A device of sequence and weighted tables runs a kernel of each kind; the printout names them where any device
    runs another kernel than sum-pooled bags."""
    from neuroshard_jax.measure.breakdown import format_explanation

    tables = [
        make_table(0, rows=3000, dim=16),
        dataclasses.replace(make_table(1, rows=5000, dim=16, pooling=20.0), pooling="none"),
        dataclasses.replace(make_table(2, rows=800, dim=16), weighted=True),
    ]
    task = make_task(tables, num_devices=2, mem_cap_gb=1.0, batch_size=512)
    plan = Plan(task, (Shard(0, 0, 16, 0), Shard(1, 0, 16, 1), Shard(2, 0, 16, 1))).validate()
    expl = explanation(plan, analytic_model(task))
    assert [d.kernels for d in expl.devices] == [("sum",), ("sequence", "sum_weighted")]
    text = format_explanation(expl)
    assert "kernels" in text.splitlines()[0] or any(line.rstrip().endswith("kernels") for line in text.splitlines())
    assert "sequence+sum_weighted" in text
    # the sequence table's all-to-all is a row per id: 20 lookups x 16 columns a sample
    assert plan.dim_sums().tolist() == [16, 20 * 16 + 16]
    # a table of another data type than the task's runs a kernel of its own, named with it
    half = dataclasses.replace(task, tables=(*tables, dataclasses.replace(make_table(3, rows=900), precision="fp16")))
    plan = Plan(half, (*plan.shards, Shard(3, 0, 16, 0))).validate()
    assert [d.kernels for d in explanation(plan, analytic_model(half)).devices][0] == ("sum", "sum/fp16")
