import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuroshard_jax.core.constants import BYTES_PER_ELEMENT
from neuroshard_jax.core.devices import Device
from neuroshard_jax.core.errors import InfeasibleError, PlanError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.analytic import analytic_model
from searchers import make_searcher, searcher_names
from searchers.registry import register

from .conftest import make_table, make_task

# rl needs a policy at the task's batch size (test_rl.py); torchrec and torchrec_default run a subprocess planner
# (test_torchrec.py, test_data_parallel.py)
SEARCHERS = [s for s in searcher_names() if s not in ("rl", "torchrec", "torchrec_default")]


def assert_every_column_once_within_memory(plan: Plan):
    """Independent oracle: count column placements and device bytes from scratch."""
    task = plan.task
    covered = [np.zeros(t.dim, dtype=int) for t in task.tables]
    used = np.zeros(task.num_devices)
    for s in plan.shards:
        covered[s.table][s.col_offset : s.col_offset + s.dim] += 1
        used[s.device] += task.tables[s.table].rows * s.dim * BYTES_PER_ELEMENT[task.precision]
    assert all((c == 1).all() for c in covered)
    assert (used <= task.cap_bytes()).all()


tables_strategy = st.lists(
    st.tuples(st.integers(100, 200_000), st.sampled_from([4, 8, 16, 32, 64, 128]), st.floats(0.1, 50)),
    min_size=1,
    max_size=25,
)


# beam compiles its kernels anew for most drawn shapes: fewer examples and a short beam keep its share of the suite's
# time fair (validity does not depend on the beam's size; test_neuroshard_search checks the full search)
EXAMPLES = {"beam": 5}
OPTIONS = {"random": {"num_samples": 4}, "beam": {"k": 2, "n": 4, "max_length": 3}}


@pytest.mark.parametrize("name", SEARCHERS)
def test_every_searcher_returns_valid_plans(name):
    settings(max_examples=EXAMPLES.get(name, 15), deadline=None, suppress_health_check=[HealthCheck.too_slow])(
        given(
            tables=tables_strategy,
            num_devices=st.integers(1, 6),
            fill=st.floats(0.2, 1.0),
            seed=st.integers(0, 10),
            devices=st.lists(st.tuples(st.floats(1.0, 1.5), st.floats(0.25, 4.0)), min_size=6, max_size=6),
            heterogeneous=st.booleans(),
        )(check_valid_plans)
    )(name)


def check_valid_plans(name, tables, num_devices, fill, seed, devices, heterogeneous):
    """A random task (of heterogeneous devices: each cap a random 1-1.5x of the plain one, speeds 0.25-4): the
    searcher's plan tiles every column once within every device's memory, or it says why none fits."""
    task_tables = [make_table(i, rows=r, dim=d, pooling=p) for i, (r, d, p) in enumerate(tables)]
    total_bytes = sum(t.rows * t.dim * 4 for t in task_tables)
    mem_cap_gb = max(total_bytes / num_devices / fill, max(t.rows * t.dim * 4 for t in task_tables)) / 2**30
    task = make_task(task_tables, num_devices=num_devices, mem_cap_gb=mem_cap_gb)
    if heterogeneous:
        specs = [Device(mem_cap_gb * scale, speed) for scale, speed in devices[:num_devices]]
        task = Task(specs, task.batch_size, task.tables)
    searcher = make_searcher(name, OPTIONS.get(name))
    try:
        plan = searcher.search(task, analytic_model(task), seed)
    except InfeasibleError as err:
        assert "fits on no device" in str(err) or "no memory-feasible" in str(err)
        return
    assert_every_column_once_within_memory(plan)
    plan.validate()


@pytest.mark.fast
@pytest.mark.parametrize("name", SEARCHERS)
def test_same_seed_same_plan(name, small_pool):
    from neuroshard_jax.workloads.builders import TaskConfig, generate_task

    task = generate_task(
        small_pool, TaskConfig(num_tables=30, mem_cap_gb=0.05, pool=small_pool.spec, batch_size=512), 1
    )
    model = analytic_model(task)
    assert make_searcher(name).search(task, model, 7) == make_searcher(name).search(task, model, 7)


def whole_bytes(table) -> int:
    """A table's memory while it trains (weights and the step's buffers at the tests' batch, exact SGD)."""
    return make_task([table]).table_mem_bytes(0)


def cap_gb(tables, num_devices: int, room: float) -> float:
    """The cap of devices that leave ``room`` bytes for ``tables`` beside what each holds for its slice of the
    batch (``Task.step_memory``)."""
    return (room + make_task(tables, num_devices=num_devices).step_memory().total + 1) / 2**30


def test_greedy_follows_the_key_and_memory():
    # By dim: table 0 (64) goes to device 0, which is then full, so the rest must go to device 1.
    tables = [
        make_table(0, rows=1000, dim=64),
        make_table(1, rows=10, dim=32),
        make_table(2, rows=10, dim=32),
        make_table(3, rows=10, dim=16),
    ]
    task = make_task(tables, num_devices=2, mem_cap_gb=cap_gb(tables, 2, whole_bytes(tables[0]) + 100))
    plan = make_searcher("dim_greedy").search(task, analytic_model(task), 0)
    devices = {s.table: s.device for s in plan.shards}
    assert devices == {0: 0, 1: 1, 2: 1, 3: 1}


def test_greedy_raises_instead_of_overfilling():
    tables = [make_table(i, rows=1000, dim=64) for i in range(3)]
    task = make_task(tables, num_devices=2, mem_cap_gb=cap_gb(tables, 2, whole_bytes(tables[0]) * 1.5))
    with pytest.raises(InfeasibleError, match="table 2 .* fits on no device"):
        make_searcher("size_greedy").search(task, analytic_model(task), 0)


@pytest.mark.fast
def test_random_respects_memory_and_splits_columns():
    tables = [make_table(i, rows=1000, dim=64) for i in range(4)]
    task = make_task(tables, num_devices=4, mem_cap_gb=cap_gb(tables, 4, whole_bytes(tables[0])))
    plan = make_searcher("random", {"num_samples": 16, "max_halvings": 2}).search(task, analytic_model(task), 0)
    assert_every_column_once_within_memory(plan)


def test_plan_validate_rejects_broken_plans():
    task = make_task([make_table(0, dim=16), make_table(1, dim=8)], num_devices=2)
    good = Plan.from_assignment(task, [2, 1], [[0, 1], [1]])
    good.validate()
    missing = Plan(task, good.shards[:2])
    with pytest.raises(PlanError, match="table 1 has no shard"):
        missing.validate()
    overlap = Plan(task, good.shards + (Shard(1, 0, 8, 0),))
    with pytest.raises(PlanError, match="do not tile"):
        overlap.validate()
    three = Plan(task, good.shards + (Shard(1, 0, 8, 0), Shard(1, 0, 8, 1)))
    with pytest.raises(PlanError, match="2\\^k column slices"):
        three.validate()
    bad_device = Plan(task, (dataclasses.replace(good.shards[0], device=5),) + good.shards[1:])
    with pytest.raises(PlanError, match="device 5"):
        bad_device.validate()
    odd = Plan(task, (Shard(0, 0, 8, 0), Shard(0, 4, 8, 1), Shard(1, 0, 8, 0)))
    with pytest.raises(PlanError, match="tile"):
        odd.validate()
    small = make_task([make_table(0, rows=1000, dim=16)], mem_cap_gb=1000 * 16 * 4 / 2 / 2**30)
    with pytest.raises(PlanError, match="device 0 holds"):
        Plan.from_assignment(small, [1], [[0]]).validate()


def test_duplicate_registration_raises():
    with pytest.raises(ValueError, match="registered twice"):
        register("random")(object)
