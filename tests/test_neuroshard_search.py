"""The vectorised NeuroShard searchers against the plain-Python oracle of the paper's algorithms."""

import dataclasses
import logging

import numpy as np
import pytest

from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.costs.analytic import analytic_model
from neuroshard_jax.costs.choice import make_cost_model
from neuroshard_jax.costs.cost_model import plan_cost_ms
from neuroshard_jax.costs.scoring import score_plan
from neuroshard_jax.workloads.builders import TaskConfig, generate_task
from neuroshard_jax.workloads.pool import PoolSpec
from searchers import make_searcher
from searchers.grid import MEM_UNIT_BYTES, cap_units, dim_bounds, grid_search, mem_units
from searchers.neuroshard import DEFAULT_ALPHAS, GridConfig, Scorer, SplitSpace

from .conftest import make_table, make_task
from .oracle import Oracle


def _tasks(pool, count, num_tables=12, mem_cap_gb=0.3, first_seed=0):
    for seed in range(first_seed, first_seed + count):
        for n in (3, 4):
            config = TaskConfig(
                num_tables=num_tables, num_devices=n, batch_size=512, mem_cap_gb=mem_cap_gb, pool=pool.spec
            )
            yield generate_task(pool, config, seed)


def _cost(model, plan):
    return float(plan_cost_ms(score_plan(model, plan)))


@pytest.mark.parametrize("model_name", ["analytic", "neural"])
def test_grid_and_beam_match_the_oracle(small_pool, tiny_checkpoint, model_name):
    # 2 tasks per model (3 and 4 devices; the seed differs between the models): 4 tasks against the oracle in all
    for task in _tasks(small_pool, 1, first_seed=0 if model_name == "analytic" else 1):
        if model_name == "neural":  # the tiny checkpoint is trained at batch 256
            task = make_task(task.tables, task.num_devices, task.largest_cap_gb, batch_size=256)
            model = make_cost_model("neural", task, {"checkpoint": str(tiny_checkpoint[1])})
        else:
            model = analytic_model(task)
        oracle = Oracle(task, model, DEFAULT_ALPHAS)
        cost, plan = oracle.grid_search()
        grid = make_searcher("grid").search(task, model, 0)
        assert grid.shards == plan.shards
        assert _cost(model, grid) == pytest.approx(cost, rel=1e-5)
        cost, plan = oracle.beam(k=3, n=10, max_length=3)
        beam = make_searcher("beam", {"max_length": 3}).search(task, model, 0)
        assert beam.shards == plan.shards
        assert _cost(model, beam) == pytest.approx(cost, rel=1e-5)
        assert _cost(model, beam) <= _cost(model, grid) + 1e-6  # the unsplit plan is a beam candidate


@pytest.mark.fast
def test_beam_splits_when_splitting_pays():
    # One wide, hot table and 2 devices: table-wise, one device gets all of it; halving it balances, for the price of
    # a second all-to-all (the column-wise tables'), which it pays many times over.
    tables = [make_table(0, rows=5000, dim=128, pooling=80.0), make_table(1, rows=100, dim=4, pooling=1.0)]
    task = make_task(tables, num_devices=2, mem_cap_gb=1.0, batch_size=4096)
    model = analytic_model(task)
    grid = make_searcher("grid").search(task, model, 0)
    beam = make_searcher("beam").search(task, model, 0)
    assert len(beam.shards) > len(grid.shards)
    assert _cost(model, beam) < 0.8 * _cost(model, grid)
    assert set(np.unique([s.device for s in beam.shards if s.table == 0])) == {0, 1}


def test_a_cut_puts_the_whole_tables_in_the_column_wise_group_unless_told_not_to():
    """Where beam cuts a table over devices, the whole tables that may be column-wise join its group (one shard
    each): one all-to-all and one input distribution, priced, measured and exported alike; a table whose sharding
    types exclude column_wise stays table-wise; ``merge_column_wise=false`` keeps every whole table table-wise and
    the plan says so in plan.json; TorchRec's plans keep the types its planner chose."""
    from neuroshard_jax.core.assignment import apart_arrays, comm_layout
    from neuroshard_jax.core.constraints import TableConstraints
    from neuroshard_jax.core.plan_file import format_plan
    from neuroshard_jax.costs.scoring import with_costs
    from searchers.torchrec import plan_from_torchrec

    only_tw = TableConstraints(sharding_types=("table_wise",))
    tables = [
        make_table(0, rows=5000, dim=128, pooling=80.0),
        make_table(1, rows=100, dim=4, pooling=1.0),
        make_table(2, rows=300, dim=8, pooling=2.0),
        dataclasses.replace(make_table(3, rows=200, dim=8, pooling=2.0), constraints=only_tw),
    ]
    task = make_task(tables, num_devices=2, mem_cap_gb=1.0, batch_size=4096)
    model = analytic_model(task)
    merged = make_searcher("beam").search(task, model, 0)
    apart = make_searcher("beam", {"merge_column_wise": False}).search(task, model, 0)
    assert merged.merge_column_wise and not apart.merge_column_wise
    assert merged.column_wise_tables() == {0, 1, 2} and apart.column_wise_tables() == {0}
    layout = comm_layout(merged)
    on_3 = next(s.device for s in merged.shards if s.table == 3)
    assert layout.column_wise == [w - 8 * (d == on_3) for d, w in enumerate(layout.dim_sums)]
    assert len(layout.inputs) == 2 and len(comm_layout(apart).inputs) == 2  # table 3's own table-wise distribution
    assert apart_arrays(merged)[0].sum() == merged.dim_sums().sum() - 8
    shards = merged.torchrec_shards()
    assert shards[1] == [{"col_offset": 0, "dim": 4, "rank": shards[1][0]["rank"], "column_wise": 1}]
    assert "column_wise" not in shards[3][0] and all("column_wise" not in s for s in apart.torchrec_shards()[1])
    # with every whole table free to join, the same shards run one all-to-all in place of two: a latency less
    free = dataclasses.replace(task, tables=(*task.tables[:3], make_table(3, rows=200, dim=8, pooling=2.0)))
    one, two = Plan(free, merged.shards), Plan(free, merged.shards, merge_column_wise=False)
    assert len(comm_layout(one).inputs) == 1 and _cost(model, one) < _cost(model, two) - 1.0
    for plan in (merged, apart):
        back = Plan.from_json(plan.to_json())
        assert (
            back.merge_column_wise == plan.merge_column_wise and back.column_wise_tables() == plan.column_wise_tables()
        )
    assert "merge_column_wise" not in merged.to_json() and apart.to_json()["merge_column_wise"] is False
    assert merged.to_json()["column_wise"] == [0, 1, 2] and apart.to_json()["column_wise"] == [0]
    printed = [
        format_plan(dataclasses.replace(with_costs(model, p), searcher="beam", seed=0, search_time_s=0.1).to_json())
        for p in (merged, apart)
    ]
    assert "1 table cut over devices, 2 tables whole with them" in printed[0]
    assert "the whole tables table-wise" in printed[1]
    torchrec = plan_from_torchrec(
        task, [[{k: v for k, v in s.items() if k != "column_wise"} for s in t] for t in shards]
    )
    assert not torchrec.merge_column_wise and torchrec.column_wise_tables() == {0}
    old = {k: v for k, v in torchrec.to_json().items() if k != "merge_column_wise"}
    assert not Plan.from_json({**old, "searcher": "torchrec"}).merge_column_wise  # a file from before the rule


def test_tight_memory_uses_the_fallback_or_reports_infeasible(small_pool):
    task = next(_tasks(small_pool, 1, num_tables=10))
    total = sum(task.table_mem_bytes(i) for i in range(task.num_tables))
    biggest = max(task.table_mem_bytes(i) for i in range(task.num_tables))
    roomy = make_task(task.tables, 3, max(total / 3 * 1.05, biggest * 1.01) / 2**30, batch_size=512)
    plan = make_searcher("grid").search(roomy, analytic_model(roomy), 0)
    assert (plan.mem_bytes() <= roomy.largest_cap_bytes).all()
    cramped = make_task(task.tables, 3, total / 3 * 0.9 / 2**30, batch_size=512)
    for name in ("grid", "beam"):
        with pytest.raises(InfeasibleError, match=f"{name}: no memory-feasible plan"):
            make_searcher(name).search(cramped, analytic_model(cramped), 0)


def test_integer_rules():
    assert mem_units(1) == 1 and mem_units(MEM_UNIT_BYTES) == 1 and mem_units(MEM_UNIT_BYTES + 1) == 2
    assert cap_units(2 * MEM_UNIT_BYTES - 1) == 1
    assert list(dim_bounds([1.0, 1.05, 1.5], 400, 4, True)) == [100, 105, 150, np.iinfo(np.int32).max]
    assert list(dim_bounds([1.1], 30, 4, False)) == [8]  # floor(8.25)


@pytest.mark.parametrize(
    "name, options, fragment",
    [
        ("grid", {"alphas": []}, "searcher.alphas: got []"),
        ("grid", {"alphas": [0.9, 1.2]}, "searcher.alphas[0]: got 0.9, expected a finite number >= 1"),
        ("beam", {"k": 0}, "searcher.k: got 0"),
        ("beam", {"max_length": -1}, "searcher.max_length: got -1"),
        ("beam", {"width": 3}, "searcher.width: unknown key"),
        ("beam", {"budget_s": 0}, "searcher.budget_s: got 0"),
        ("beam", {"max_work": 0}, "searcher.max_work: got 0"),
        ("beam", {"max_work": True}, "searcher.max_work: got True"),
    ],
)
def test_bad_options_are_clear_errors(name, options, fragment):
    with pytest.raises(UserError, match=fragment.replace("[", "\\[").replace("]", "\\]")):
        make_searcher(name, options)


@pytest.mark.fast
def test_beam_scales_to_a_large_pool_quickly(_cache_dir):
    """856 tables on 64 devices (the benchmark case, shortened): a valid plan, no table left out."""
    from neuroshard_jax.workloads.pool import load_pool

    pool = load_pool(PoolSpec(), 512)
    config = TaskConfig(num_tables=856, num_devices=64, batch_size=512, mem_cap_gb=4.0, pool=pool.spec)
    task = generate_task(pool, config, 0)
    plan = make_searcher("beam", {"max_length": 1, "alphas": [1.0, 1.2]}).search(task, analytic_model(task), 0)
    assert {s.table for s in plan.shards} == set(range(856))
    assert (plan.mem_bytes() <= task.largest_cap_bytes).all()


@pytest.mark.fast
def test_grid_and_a_beam_level_do_not_retrace_within_a_bucket(small_pool):
    """Candidate batches and shard lists are padded to power-of-two buckets: a second task, or a second beam
    level, of the same buckets reuses the compiled grid search."""
    tasks = [
        generate_task(small_pool, TaskConfig(num_tables=n, num_devices=4, pool=small_pool.spec, batch_size=512), s)
        for n, s in ((10, 0), (12, 1))
    ]
    model = analytic_model(tasks[0])
    scorers = [Scorer(SplitSpace(t, model), model, GridConfig()) for t in tasks]
    scorers[0].score([(0,) * 10])
    compiled = grid_search._cache_size()
    scorers[1].score([(0,) * 12])  # the grid search of another task (16 shard slots either way)
    assert grid_search._cache_size() == compiled
    scorers[1].score([tuple(int(i == t) for i in range(12)) for t in range(3)])  # a beam level: 3 candidates
    compiled = grid_search._cache_size()
    scorers[1].score([tuple(int(i in (t, t + 1)) for i in range(12)) for t in range(4)])  # the next level: 4
    assert grid_search._cache_size() == compiled  # both levels in the 4-candidate, 16-slot bucket


@pytest.mark.fast
def test_a_tight_cap_that_the_cost_order_cannot_pack_is_packed_by_memory():
    """Two devices at 96% fill, the small tables the hottest: the cost-ordered greedy fills a device with them and
    finds no room for the last big table under any bound; the memory-ordered fallback packs it, as the oracle does."""
    # rows x 100 of the case found at 1e4-1e5 rows: the step's buffers (~0.1 MB a table) stay ~0.1% of a table
    rows = [100 * r for r in (52000, 51000, 49000, 30000, 15000, 10000)]
    pooling = [2.5, 6.2, 7.9, 13.4, 14.4, 18.9]
    tables = [make_table(i, rows=r, dim=16, pooling=p) for i, (r, p) in enumerate(zip(rows, pooling))]
    sizes = make_task(tables).table_mem_bytes  # weights and the step's buffers
    cap_gb = sum(sizes(i) for i in range(len(rows))) / 2 * 1.04 / 2**30
    task = make_task(tables, num_devices=2, mem_cap_gb=cap_gb)
    model = analytic_model(task)
    with pytest.raises(InfeasibleError):
        make_searcher("grid", {"memory_only_fallback": False}).search(task, model, 0)
    plan = make_searcher("grid", {}).search(task, model, 0).validate()
    cost, expected = Oracle(task, model, DEFAULT_ALPHAS).grid_search()
    assert expected is not None and plan.shards == expected.shards


def test_beam_within_a_budget_returns_its_best_plan_so_far(small_pool, caplog):
    """A budget that leaves no room after the root: the grid's plan, said in a log line; a roomy one: beam's own
    plan."""
    caplog.set_level(logging.INFO, logger="searchers")
    task = generate_task(small_pool, TaskConfig(num_tables=12, num_devices=4, pool=small_pool.spec, batch_size=512), 0)
    model = analytic_model(task)
    grid = make_searcher("grid", {}).search(task, model, 0)
    assert make_searcher("beam", {"budget_s": 1e-6}).search(task, model, 0) == grid
    assert "beam: budget_s=1e-06 reached after 0 of 10 levels" in caplog.text
    roomy = make_searcher("beam", {"budget_s": 1e6}).search(task, model, 0)
    assert roomy == make_searcher("beam", {}).search(task, model, 0)
    # a bound on the work, not the time: the same plan every time (the grid's where it leaves no level)
    assert make_searcher("beam", {"max_work": 1}).search(task, model, 0) == grid
    assert "beam: max_work=1 reached after 0 of 10 levels" in caplog.text
    assert roomy == make_searcher("beam", {"max_work": None}).search(task, model, 0)  # hundreds: never reached
    bounded = [make_searcher("beam", {"max_work": 2e5}).search(task, model, 0) for _ in range(2)]
    assert bounded[0] == bounded[1]


@pytest.mark.fast
def test_packing_by_memory_puts_each_shard_where_most_memory_is_left():
    """Caps 13 and 17 (units of 1e6 rows x dim 16: the step's buffers, ~0.1 MB a table, stay within the caps' 0.1%
    slack), tables of 10, 7, 7, 4 units: the cost order (the hottest, small, first) finds no plan; packing by least
    memory used would strand a 7; by most memory left: 7 + 4 | 10 + 7."""
    from neuroshard_jax.core.devices import Device
    from neuroshard_jax.core.sharding import mem_bytes
    from neuroshard_jax.core.task import Task

    unit = mem_bytes(10**6, 16, "fp32")
    tables = [
        make_table(i, rows=10**6 * n, dim=16, pooling=p) for i, (n, p) in enumerate([(10, 1), (7, 2), (7, 3), (4, 9)])
    ]
    devices = [Device(13 * unit / 2**30 * 1.001), Device(17 * unit / 2**30 * 1.001)]
    task = Task(devices, 512, tables)
    with pytest.raises(InfeasibleError):
        make_searcher("grid", {"memory_only_fallback": False}).search(task, analytic_model(task), 0)
    plan = make_searcher("grid", {}).search(task, analytic_model(task), 0).validate()
    units = [sorted(tables[s.table].rows // 10**6 for s in plan.device_shards(d)) for d in range(2)]
    assert units == [[4, 7], [7, 10]]  # the two 7s are alike but for their buffers: either may go with the 4
