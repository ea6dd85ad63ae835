"""Data-parallel tables: the plan model, their price, the search stage that chooses them, their measurement, and
their export to TorchRec's DistributedModelParallel."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from neuroshard_jax.core.assignment import comm_layout, row_groups
from neuroshard_jax.core.errors import PlanError, UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.analytic import analytic_model
from neuroshard_jax.costs.choice import CostModelSpec, make_cost_model
from neuroshard_jax.costs.scoring import device_row_ms, score_plan
from neuroshard_jax.kernels.executors import ExecutorConfig
from neuroshard_jax.kernels.torchrec_export import ExportConfig, check_torchrec, expected_local_shards, export_torchrec
from neuroshard_jax.measure.evaluator import EvaluateConfig, measure_plans, plan_kernels
from neuroshard_jax.search.pipeline import search_plan
from searchers import make_searcher
from searchers.torchrec import plan_from_torchrec

from .conftest import make_table, make_task


def hot_table(table_id: int, rows: int = 300, dim: int = 8, pooling: float = 300.0, batch: int = 4096):
    """A small table looked up very often: every row about batch x pooling / rows times a step."""
    bins = np.zeros(17)
    bins[int(np.ceil(np.log2(batch * pooling / rows)))] = 1.0
    return dataclasses.replace(make_table(table_id, rows, dim, pooling), bins=tuple(bins))


@pytest.fixture(scope="module")
def hot_task() -> Task:
    """4 devices: one tiny very hot table (alone more than a device's share of the step) and 11 ordinary ones."""
    rng = np.random.default_rng(3)
    tables = [hot_table(0)] + [
        make_table(i, rows=int(rng.integers(10_000, 100_000)), dim=int(rng.choice([16, 32, 64])), pooling=4.0)
        for i in range(1, 12)
    ]
    return make_task(tables, num_devices=4, batch_size=4096)  # within the shipped models' batch sizes


@pytest.mark.fast
def test_a_data_parallel_table_is_whole_on_every_device_and_round_trips(hot_task):
    shards = tuple(Shard(t, 0, hot_task.tables[t].dim, t % 4) for t in range(1, 12))
    plan = Plan(hot_task, shards, data_parallel=(0,)).validate()
    replica = hot_task.table_mem_bytes(0)  # its weights (300 x 8 x 4 B) and the step's buffers, on every device
    assert hot_task.rows_memory(0, 300, 8).weights == 300 * 8 * 4
    alone = Plan(hot_task, shards + (Shard(0, 0, 8, 0),)).validate()
    assert plan.replicated_bytes() == replica
    assert (plan.mem_bytes() - alone.mem_bytes()).tolist() == [0, replica, replica, replica]  # counts everywhere
    assert plan.placement()[0] == [(0, 8, d) for d in range(4)]
    written = plan.to_json()
    assert written["data_parallel"] == [0] and written["devices"][0]["num_shards"] == 2  # tables 4 and 8
    assert Plan.from_json(json.loads(json.dumps(written))) == plan
    assert "data_parallel" not in alone.to_json()  # a plan without any writes the file it always did
    assert Plan.from_json(alone.to_json()).data_parallel == ()
    with pytest.raises(PlanError, match="table 0 is data-parallel .* and also has shards"):
        Plan(hot_task, alone.shards, data_parallel=(0,)).validate()
    with pytest.raises(UserError, match=r"plan.data_parallel: got \[99\], expected a list of distinct table ids"):
        Plan.from_json({**written, "data_parallel": [99]})
    assert plan.torchrec_shards()[0] == [{"data_parallel": 1}]


def test_sharding_types_say_what_a_table_may_be(hot_task):
    raw = hot_task.to_json()
    raw["tables"][0]["sharding_types"] = ["column_wise", "table_wise"]
    task = Task.from_json(raw)
    assert task.tables[0].constraints.sharding_types == ("table_wise", "column_wise") and task.to_json() == raw | {
        "tables": [dict(raw["tables"][0], sharding_types=["table_wise", "column_wise"]), *raw["tables"][1:]]
    }
    shards = tuple(Shard(t, 0, task.tables[t].dim, t % 4) for t in range(1, 12))
    with pytest.raises(PlanError, match="table 0: data_parallel .* which its constraints do not allow"):
        Plan(task, shards, data_parallel=(0,)).validate()
    raw["tables"][0]["sharding_types"] = ["data_parallel"]
    forced = Task.from_json(raw)
    with pytest.raises(PlanError, match=r"table 0: sharding_types \[data_parallel\], but it is sharded"):
        Plan(forced, shards + (Shard(0, 0, 8, 0),)).validate()
    for bad, message in ((["dp"], "expected a non-empty list of distinct names"), (["row_wise"], "row blocks alone")):
        raw["tables"][0]["sharding_types"] = bad
        with pytest.raises(UserError, match=rf"task.tables\[0\].sharding_types: got .*{message}"):
            Task.from_json(raw)


@pytest.mark.fast
def test_a_replica_costs_its_lookups_on_every_device_and_an_all_reduce(hot_task):
    shards = tuple(Shard(t, 0, hot_task.tables[t].dim, t % 4) for t in range(1, 12))
    model = analytic_model(hot_task)
    alone = score_plan(model, Plan(hot_task, shards + (Shard(0, 0, 8, 0),)))
    replicated = score_plan(model, Plan(hot_task, shards, data_parallel=(0,)))
    hot_ms = alone.compute_ms[0] - score_plan(model, Plan(hot_task, shards + (Shard(0, 0, 8, 1),))).compute_ms[0]
    share = replicated.compute_ms[1:] - alone.compute_ms[1:]  # what each other device now does of it
    assert hot_ms > 0 and np.all(share > 0) and np.allclose(share, share[0], rtol=0.05)
    assert share[0] < hot_ms * 0.75  # a quarter of the lookups each, the same rows and outputs
    # its gradients' all-reduce: a reduce-scatter and an all-gather over every device, priced by the row groups' fit
    plan = Plan(hot_task, shards, data_parallel=(0,))
    assert row_groups(plan) == [(1, [0, 1, 2, 3])]  # 300 x 8 elements: one column at batch 4,096
    assert comm_layout(plan).row_groups == [[1, [0, 1, 2, 3]]]  # what the comm benchmark measures
    fitted = make_cost_model("xeon-union", hot_task)
    fwd, bwd = device_row_ms(fitted.row_comm, plan)
    assert np.all(fwd > 0) and np.all(bwd > 0)


def test_beam_and_grid_replicate_a_hot_small_table_the_baselines_keep_their_rules(hot_task):
    for searcher in ("grid", "beam"):
        plan = search_plan(hot_task, make_searcher(searcher), CostModelSpec("xeon-union").for_task(hot_task), 0)
        assert plan.data_parallel == (0,), searcher
        assert (
            search_plan(hot_task, make_searcher(searcher), CostModelSpec("xeon-union").for_task(hot_task), 0) == plan
        )  # the same seed, the same plan
        kept = dataclasses.replace(
            hot_task,
            tables=(hot_task.tables[0].constrained(sharding_types=("table_wise", "column_wise")),)
            + hot_task.tables[1:],
        )
        sharded = search_plan(kept, make_searcher(searcher), CostModelSpec("xeon-union").for_task(kept), 0)
        assert sharded.data_parallel == () and sharded.costs.cost_ms > plan.costs.cost_ms  # the model's choice
    assert (
        search_plan(
            hot_task, make_searcher("size_lookup_greedy"), CostModelSpec("xeon-union").for_task(hot_task), 0
        ).data_parallel
        == ()
    )
    forced = dataclasses.replace(
        hot_task,
        tables=hot_task.tables[:5]
        + (hot_task.tables[5].constrained(sharding_types=("data_parallel",)),)
        + hot_task.tables[6:],
    )
    assert (
        5
        in search_plan(
            forced, make_searcher("size_lookup_greedy"), CostModelSpec("xeon-union").for_task(forced), 0
        ).data_parallel
    )


def test_the_evaluator_measures_the_replicas_kernel_on_every_device_and_their_all_reduce():
    tables = [hot_table(0, rows=64, dim=8, pooling=20.0, batch=64), make_table(1, rows=500, dim=8)]
    task = make_task(tables, num_devices=2, batch_size=64)
    plan = Plan(task, (Shard(1, 0, 8, 0),), data_parallel=(0,)).validate()
    kernels = plan_kernels(plan)
    assert len(kernels[0]) == 2 and len(kernels[1]) == 1  # device 1 runs the replica's kernel only
    assert kernels[1][0][1].batch_size == 32  # its slice of the batch
    config = EvaluateConfig(warmup=1, iters=3, comm_warmup=1, comm_iters=2, executor=ExecutorConfig(workers=1))
    measured = measure_plans([plan], config)[0]["devices"]
    assert measured[1]["compute"] > 0 and measured[0]["compute"] > measured[1]["compute"] * 0.5
    assert all(d["bwd_comm"] > 0 for d in measured)


def test_a_data_parallel_table_runs_in_distributed_model_parallel(tmp_path):
    tables = [make_table(10, rows=60, dim=16), hot_table(11, rows=40, dim=8), make_table(12, rows=90, dim=32)]
    task = make_task(tables, num_devices=2)
    plan = Plan(task, (Shard(0, 0, 16, 0), Shard(2, 0, 16, 1), Shard(2, 16, 16, 0)), data_parallel=(1,))
    request, printed = export_torchrec(plan.validate(), tmp_path / "plan.pt", ExportConfig(device="cpu"))
    assert "data_parallel" in printed
    for report in check_torchrec(tmp_path / "plan.pt", request, 4, 300):
        assert sorted(report.local_shards) == expected_local_shards(request, report.rank)
        assert ["t1", 0, 8, 0, 40] in report.local_shards  # whole on every rank
        assert report.max_abs_error < 1e-4 and report.output_shape == [4, 56]


def test_plans_of_one_task_are_timed_in_distributed_model_parallel_steps():
    """tools.dmp_steps: two plans of one task (the hot table on rank 0, or data-parallel) trained side by side in
    DMP on 2 gloo ranks; each rank holds what its plan gives it, the replica whole on both; plans of other tasks are
    refused before any rank starts."""
    from neuroshard_jax.measure.training_steps import dmp_steps

    tables = [hot_table(0, batch=1024), make_table(1, rows=3000, dim=16), make_table(2, rows=2500, dim=32)]
    task = make_task(tables, num_devices=2, batch_size=1024)
    sharded = Plan(task, (Shard(0, 0, 8, 0), Shard(1, 0, 16, 1), Shard(2, 0, 32, 0))).validate()
    replicated = Plan(task, (Shard(1, 0, 16, 1), Shard(2, 0, 32, 0)), data_parallel=(0,)).validate()
    results = dmp_steps([sharded, replicated], warmup=1, steps=3, timeout_s=300)
    for r in results:
        q1, q3 = r["step_ms_q1_q3"]
        assert 0 < q1 <= r["step_ms"] <= q3 and len(r["rank_ms"]) == 2 and max(r["rank_ms"]) >= r["step_ms"] * 0.5
    hot, cold, warm = (t.rows * t.dim * 4 / 2**30 for t in tables)
    assert results[0]["local_gb"] == pytest.approx([hot + warm, cold])
    assert results[1]["local_gb"] == pytest.approx([hot + warm, cold + hot])  # the replica on both ranks
    other = make_task(tables[:2], num_devices=2, batch_size=1024)
    with pytest.raises(UserError, match=r"plans\[1\]: its task differs from plans\[0\]'s"):
        dmp_steps([sharded, Plan(other, (Shard(0, 0, 8, 0), Shard(1, 0, 16, 1)))])
    # plans whose ranks' modules, built together, would not fit this machine: refused before any rank starts
    from neuroshard_jax.core.hardware import available_bytes

    rows = int(0.5 * available_bytes() / (512 * 4))  # a table of half the available memory, every plan holds it
    big = make_task([make_table(0, rows=rows, dim=512), make_table(1, rows=100, dim=8)], 2, 2.0**20, 1024)
    twice = [Plan(big, (Shard(0, 0, 512, d), Shard(1, 0, 8, 1 - d))).validate() for d in (0, 1)]
    with pytest.raises(UserError, match=r"GiB together, this machine has .* GiB available; expected fewer plans"):
        dmp_steps(twice)


def test_torchrec_plans_with_replicas_and_table_row_wise_blocks_become_ours():
    task = make_task([make_table(0, rows=194, dim=32), make_table(1, rows=40, dim=8)], num_devices=4)
    # TorchRec's table_row_wise cuts 194 rows as 48, 48, 48, 50; ours (and its row_wise) 49, 49, 49, 47
    blocks = [
        {"col_offset": 0, "dim": 32, "rank": r, "row_offset": 48 * r, "num_rows": 48 if r < 3 else 50} for r in range(4)
    ]
    plan = plan_from_torchrec(task, [blocks, [{"data_parallel": 1}]]).validate()
    assert plan.data_parallel == (1,)
    assert [(s.device, s.row_offset, s.rows(194)) for s in plan.shards_of(0)] == [
        (0, 0, 49),
        (1, 49, 49),
        (2, 98, 49),
        (3, 147, 47),
    ]


def test_torchrec_default_plans_with_every_sharding_type(hot_task):
    """TorchRec's planner with its default types (a subprocess): its plan converts to ours, valid, and loads back."""
    searcher = make_searcher("torchrec_default", {"reservation": "percent"})
    plan = search_plan(hot_task, searcher, CostModelSpec("analytic").for_task(hot_task), 0)
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan.validate()
    rows = hot_task.table_rows()
    for t in range(hot_task.num_tables):  # each table: data-parallel, row blocks, or 2^k column slices
        shards = plan.shards_of(t)
        assert (t in plan.data_parallel) != bool(shards)
        assert all(s.whole_rows(rows[t]) for s in shards) or len({s.device for s in shards}) == len(shards)
