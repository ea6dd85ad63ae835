"""Row splits: TorchRec's row layout, a row block's own lookups measured on the real kernels, and the search stage
that cuts tables larger than every device into rows."""

import dataclasses

import numpy as np
import pytest

from neuroshard_jax.core.assignment import comm_layout
from neuroshard_jax.core.devices import Device
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.features import FEATURE_INDEX
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard, row_blocks, row_shards, shard_features, tiling_error
from neuroshard_jax.core.table import RowBlockStats, Table
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.choice import CostModelSpec, make_cost_model
from neuroshard_jax.costs.scoring import plan_arrays, score_plan
from neuroshard_jax.kernels.messages import CommRequest, ComputeRequest
from neuroshard_jax.kernels.processes import ComputeWorker
from neuroshard_jax.measure.evaluator import EvaluateConfig, device_tables, measure_plans
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.search.ways import hot_tables, oversized, row_split_choices, search_with_rows
from neuroshard_jax.workloads.pool import PoolSpec, load_pool, pool_streams
from neuroshard_jax.workloads.streams import TableSpec, restrict_rows, spec_stream
from searchers import make_searcher

POOL = PoolSpec(num_tables=120)


def test_row_blocks_follow_torchrec_and_tile_with_column_slices():
    # TorchRec's own examples (_calculate_rw_shard_sizes_and_offsets): 10 rows in 4 -> 3,3,3,1; 5 -> 2,2,1,0
    assert [n for _, n in row_blocks(10, 4)] == [3, 3, 3, 1]
    assert row_blocks(5, 4) == ((0, 2), (2, 2), (4, 1), (5, 0))
    grid = row_shards(0, 10, 8, [0, 1]) + row_shards(0, 10, 8, [2, 3], col_offset=8)
    assert tiling_error(16, 10, grid) is None
    assert "row blocks" in tiling_error(16, 10, row_shards(0, 10, 8, [0, 1]) + row_shards(0, 10, 8, [2, 3, 1], 8))
    assert "2 row blocks" in tiling_error(16, 10, grid[:1] + (Shard(0, 0, 8, 1, 4, 6),) + grid[2:])
    # a block does the share of the lookups that lands in its rows: the pooling factor scales, the rest stays
    feats = shard_features(np.array([1000.0, 16, 8.0] + [1.0] + [0.0] * 16 + [16000.0]), 16, 250)
    assert feats[:3].tolist() == [250, 16, 2.0] and feats[-1] == 250 * 16


def test_a_row_block_gets_exactly_the_lookups_in_its_rows():
    rng = np.random.default_rng(0)
    lengths = rng.poisson(5, size=64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    indices = rng.integers(0, 1001, size=int(offsets[-1]))
    bags = [sorted(indices[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]
    got: list[list[int]] = [[] for _ in bags]
    for start, count in row_blocks(1001, 3):
        sub, sub_offsets = restrict_rows(indices, offsets, start, count)
        assert len(sub_offsets) == 65 and np.all((sub >= 0) & (sub < count))
        for b, (lo, hi) in enumerate(zip(sub_offsets[:-1], sub_offsets[1:])):
            got[b].extend((sub[lo:hi] + start).tolist())
    assert [sorted(g) for g in got] == bags


@pytest.mark.fast
def test_the_worker_measures_a_row_block_on_its_own_lookups():
    _, streams = pool_streams(POOL)
    whole = len(streams.stream(3, 256)[0])
    spec = TableSpec(5000, 6.0, (0.3, 0.3, 0.4) + (0.0,) * 14, 256)
    spec_lookups = len(spec_stream(spec, 4)[0])
    table = {"rows": 5000, "pooling_factor": 6.0, "bins": list(spec.bins), "dim": 8, "seed": 4}
    worker = ComputeWorker("cpu")
    try:

        def ask(tables):
            request = ComputeRequest(0, tuple(tables), 256, POOL.to_json(), warmup=1, iters=2)
            return worker.request(request, timeout_s=120)

        rows = int(load_pool(POOL, 256).rows[3])
        blocks = row_blocks(rows, 2)
        answers = [ask([[3, 16, start, count]]) for start, count in blocks]
        assert all(a.ok and a.total_ms > 0 for a in answers)
        assert sum(a.num_indices for a in answers) == whole
        specs = [ask([{**table, "row_offset": s, "num_rows": n}]) for s, n in row_blocks(5000, 4)]
        assert sum(a.num_indices for a in specs) == spec_lookups
        bad = ask([[3, 16, rows - 5, 10]])
        assert not bad.ok and "row block" in bad.error
        assert ask([[3, 16]]).ok  # and it keeps serving
    finally:
        worker.close()


def _big_task(num_devices=4):
    """A cap of 2.25 MiB: table 0 (dim 4, 3.2 MB) fits no device even in its narrowest slice, table 1 (dim 64, 2.6 MB)
    fits as column slices or as rows, the rest fit whole (batch 128: a row block carries its table's whole pooled
    output, so the step's buffers stay ~0.3 MB in all)."""
    tables = [
        Table(0, 200_000, 4, 3.0, (0.2, 0.3, 0.5) + (0.0,) * 14, name="huge"),
        Table(1, 10_000, 64, 12.0, (0.4, 0.3, 0.3) + (0.0,) * 14, name="wide"),
        *(Table(2 + i, 3000 + 500 * i, 16, 2.0 + i, (1.0,) + (0.0,) * 16) for i in range(6)),
    ]
    return Task.uniform(num_devices, 2.25 / 1024, 128, tuple(tables))


@pytest.mark.fast
@pytest.mark.parametrize("searcher", ["beam", "grid", "size_lookup_greedy", "random"])
def test_searchers_cut_a_table_larger_than_every_device_into_rows(searcher):
    task = _big_task()
    assert oversized(task) == ([0], [1])
    plan = search_plan(task, make_searcher(searcher), CostModelSpec("analytic").for_task(task), 0).validate()
    huge = plan.shards_of(0)
    assert [(s.device, s.row_offset, s.num_rows) for s in huge] == [(d, 50_000 * d, 50_000) for d in range(4)]
    assert np.all(plan.mem_bytes() <= task.cap_bytes())
    # table 1 is tried both ways and the plan the search's model scores cheaper is kept
    rest = dataclasses.replace(task, tables=task.tables[1:])
    auto = search_plan(rest, make_searcher(searcher), CostModelSpec("analytic").for_task(rest), 0)
    try:
        off = search_plan(rest, make_searcher(searcher), CostModelSpec("analytic").for_task(rest), 0, row_split="off")
    except InfeasibleError:  # a searcher of whole tables (grid, the greedy baselines): table 1 fits only as rows
        assert len(auto.shards_of(0)) == 4 and not auto.shards_of(0)[0].whole_rows(10_000)
    else:
        assert auto.costs.cost_ms <= off.costs.cost_ms + 1e-9
        assert all(s.whole_rows(10_000) for s in off.shards_of(0))
    again = Plan.from_json(plan.to_json())
    assert set(again.shards) == set(plan.shards) and again.placement()["huge"][1] == (0, 4, 1, 50_000, 50_000)


def test_choices_add_large_then_hot_tables_to_those_only_rows_fit():
    task = _big_task()
    # a device's fair share of 10 + 1 + 1 + 0 ms over 4 devices is 3 ms: table 0 alone is past it
    assert hot_tables([10.0, 1.0, 1.0, 0.0], 4) == [0] and hot_tables([5.0], 1) == []
    assert row_split_choices(task, "hot", hot=[5]) == [(0,), (0, 1), (0, 1, 5)]
    assert row_split_choices(task, "fit", hot=[5]) == [(0,), (0, 1)]
    assert row_split_choices(task, "hot", hot=[]) == [(0,), (0, 1)]
    capped = dataclasses.replace(task, tables=(*task.tables[:5], task.tables[5].constrained(max_shards=2)))
    assert row_split_choices(capped, "hot", hot=[5]) == [(0,), (0, 1)]  # a constrained table is not cut by choice


@pytest.mark.fast
def test_row_split_off_or_a_constraint_refuses_what_only_rows_fit():
    task = _big_task()
    with pytest.raises(InfeasibleError, match="table 0 .* narrowest column slices; expected row_split=fit"):
        search_plan(task, make_searcher("beam"), CostModelSpec("analytic").for_task(task), 0, row_split="off")
    for constraint, message in (({"pin": 1}, r"pinned to device 1 \(huge\)"), ({"exclude": (0,)}, "rule out the row")):
        constrained = task.tables[0].constrained(**constraint)
        with pytest.raises(InfeasibleError, match=message):
            bound = dataclasses.replace(task, tables=(constrained, *task.tables[1:]))
            search_plan(bound, make_searcher("size_greedy"), CostModelSpec("analytic").for_task(bound), 0)
    with pytest.raises(UserError, match="row_split: got 'rows', expected one of fit, hot, off"):
        search_plan(task, make_searcher("beam"), CostModelSpec("analytic").for_task(task), 0, row_split="rows")
    tiny = dataclasses.replace(task, devices=[Device(1 / 1024)] * 2)  # 1.6 MB blocks on 1 MiB devices
    with pytest.raises(InfeasibleError, match="table 0 needs .* no split fits .column slices, or row blocks"):
        search_plan(tiny, make_searcher("beam"), CostModelSpec("analytic").for_task(tiny), 0)


def test_a_row_split_plan_is_measured_block_by_block():
    """A task without a pool: each device measures its row block of the spec's stream, restricted to its rows; the
    comm benchmark reduce-scatters the row-split table's partial sums over the devices holding its blocks."""
    plan = search_plan(
        _big_task(), make_searcher("size_lookup_greedy"), CostModelSpec("analytic").for_task(_big_task()), 0
    )
    layout = comm_layout(plan)
    # the huge table (dim 4) has a block on every device; row-split tables over one set of devices are fused
    assert [d for _, d in layout.row_groups] == [[0, 1, 2, 3]] and layout.row_groups[0][0] >= 4
    assert sum(layout.dim_sums) + sum(w * len(d) for w, d in layout.row_groups) == sum(plan.dim_sums())
    result = measure_plans([plan], EvaluateConfig(warmup=1, iters=2, comm_warmup=1, comm_iters=2))[0]
    assert all(d["compute"] > 0 and d["fwd_comm"] > 0 for d in result["devices"])


@pytest.mark.fast
def test_the_comm_benchmark_reduce_scatters_row_groups_on_gloo():
    """Real gloo ranks: the same all-to-all with a wide row-split table over 2 of 3 ranks (a subgroup) takes
    longer on those two, forward (reduce-scatter) and backward (all-gather); the third rank, outside the group, is
    done sooner."""
    from neuroshard_jax.kernels.executors import ExecutorConfig, open_executor

    plain = {"dim_sums": [16, 16, 16]}
    wide = {**plain, "row_groups": [[1024, [0, 2]]]}
    requests = [CommRequest.of(layout, i, 4096, [0.0] * 3, 2, 5) for i, layout in enumerate((plain, wide))]
    with open_executor(ExecutorConfig(), "cpu", 300) as pool:
        out = pool.comm(requests, 3, 300)
    before, after = out[0], out[1]
    for rank in (0, 2):  # 16 MB of partial sums each
        assert after[rank].fwd_ms > before[rank].fwd_ms + 1.0
        assert after[rank].bwd_ms > before[rank].bwd_ms + 1.0
        assert after[1].fwd_ms < after[rank].fwd_ms


def test_a_forced_row_split_cuts_exactly_those_tables_and_is_scored():
    task = _big_task()
    plan = search_with_rows(
        task, make_searcher("size_lookup_greedy"), CostModelSpec("analytic").for_task(task), 0, (0, 1)
    )
    cut = {s.table for s in plan.shards if not s.whole_rows(task.tables[s.table].rows)}
    assert cut == {0, 1} and plan.costs is not None and plan.validate() is plan


def test_measured_block_statistics_price_and_measure_each_block_as_its_own():
    """A table whose row blocks were measured (``stats``: ids sorted by frequency, the hot rows in block 0): the
    model scores each block with its own statistics and the evaluator measures it as them; a block count without
    statistics keeps the table's scaled to its rows."""
    hot = (0.4, 0.3, 0.3) + (0.0,) * 14  # rows hit up to 4 times
    cold = (1.0,) + (0.0,) * 16
    blocks = RowBlockStats(2, (9.0, 1.0), (hot, cold))
    table = Table(0, 100_000, 16, 10.0, (0.5,) + (0.0,) * 9 + (0.5,) + (0.0,) * 6, row_blocks=(blocks,))
    task = Task.uniform(2, 1.0, 512, (table, Table(1, 1000, 16, 1.0, cold)))
    assert Task.from_json(task.to_json()) == task
    plan = Plan(task, (*row_shards(0, 100_000, 16, [0, 1]), Shard(1, 0, 16, 1))).validate()
    feats = plan_arrays(plan).feats
    (start, rows), (start1, rows1) = row_blocks(100_000, 2)
    np.testing.assert_allclose(feats[0, 0], shard_features(task.features()[0], 16, rows, (9.0, hot)))
    np.testing.assert_allclose(feats[1, 0], shard_features(task.features()[0], 16, rows1, (1.0, cold)))
    assert feats[0, 0, FEATURE_INDEX["pooling_factor"]] == 9.0 and feats[1, 0, FEATURE_INDEX["pooling_factor"]] == 1.0
    compute = score_plan(make_cost_model("analytic", task), plan).compute_ms
    blind = dataclasses.replace(task, tables=(dataclasses.replace(table, row_blocks=()), task.tables[1]))
    shared = score_plan(make_cost_model("analytic", blind), Plan(blind, plan.shards)).compute_ms
    assert (
        compute[0] > shared[0] and compute[1] < shared[1]
    )  # the hot block dearer than its rows' share, the cold cheaper
    specs = device_tables(task, plan.device_shards(1))
    assert specs[0].to_json() == {"rows": rows1, "pooling_factor": 1.0, "bins": list(cold), "dim": 16, "seed": 0}
    four = Plan(
        task,
        (*row_shards(0, 100_000, 8, [0, 1, 0, 1], 0), *row_shards(0, 100_000, 8, [1, 0, 1, 0], 8), Shard(1, 0, 16, 0)),
    ).validate()
    quarter = plan_arrays(four).feats[0, 0]  # four blocks: no statistics for that count, the table's share of lookups
    assert quarter[FEATURE_INDEX["pooling_factor"]] == pytest.approx(10.0 * row_blocks(100_000, 4)[0][1] / 100_000)
    assert device_tables(task, four.device_shards(0))[0].row_offset is not None


@pytest.mark.fast
@pytest.mark.parametrize("speeds", [(1.0, 1.0, 1.0, 1.0), (2.0, 1.0, 1.0, 1.0), (1.0, 1.0, 1.0, 2.0)])
def test_the_searcher_plans_around_a_hot_row_block_it_knows_of(speeds):
    """Block 0 of a table holds its hot rows (its own statistics): the other tables are planned on the room the
    blocks leave each device, so the plan's slowest device (priced with the statistics) beats the plan made
    without them, which spreads the rest as if the blocks were alike."""
    hot, cold = (0.0,) * 10 + (1.0,) + (0.0,) * 6, (1.0,) + (0.0,) * 16
    stats = RowBlockStats(4, (30.0, 4.0, 3.0, 3.0), (hot, cold, cold, cold))
    big = Table(0, 400_000, 32, 40.0, (0.5,) + (0.0,) * 9 + (0.5,) + (0.0,) * 6, row_blocks=(stats,))
    small = [Table(1 + i, 20_000 + 3000 * i, 32, 3.0 + i, cold) for i in range(12)]
    devices = [Device(1.0, speed) for speed in speeds]  # a faster device, holding the hot block or not
    task = Task(devices, 4096, (big, *small))
    blind = Task(devices, 4096, (dataclasses.replace(big, row_blocks=()), *small))
    model = make_cost_model("analytic", task)
    knowing = search_with_rows(
        task, make_searcher("size_lookup_greedy"), CostModelSpec("analytic").for_task(task), 0, (0,)
    )
    unknowing = Plan(
        task,
        search_with_rows(
            blind, make_searcher("size_lookup_greedy"), CostModelSpec("analytic").for_task(blind), 0, (0,)
        ).shards,
    ).validate()
    ours, theirs = score_plan(model, knowing).compute_ms, score_plan(model, unknowing).compute_ms
    assert ours.max() < 0.98 * theirs.max()
    assert len(knowing.device_shards(0)) <= len(unknowing.device_shards(0))  # no more of the rest beside the hot block
