import dataclasses
import json

import numpy as np
import pytest

from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.task import check_feasible
from neuroshard_jax.workloads.builders import TaskConfig, generate_task, load_task, split_table_ids

from .conftest import make_table, make_task

pytestmark = pytest.mark.fast  # the before-commit tier (make test-fast)


@pytest.mark.parametrize("seed", range(5))
def test_neuroshard_style_tasks(small_pool, seed):
    config = TaskConfig(num_tables=None, num_devices=4, mem_cap_gb=0.05, pool=small_pool.spec, batch_size=512)
    task = generate_task(small_pool, config, seed)
    ids = [t.id for t in task.tables]
    assert 10 <= len(ids) <= 59 and len(set(ids)) == len(ids)  # drawn without replacement
    assert all(t.dim in (4, 8, 16, 32, 64, 128) for t in task.tables)
    sizes = [task.table_mem_bytes(i) for i in range(task.num_tables)]
    assert max(sizes) <= task.largest_cap_bytes and sum(sizes) <= 0.9 * 4 * task.largest_cap_bytes
    for t in task.tables:  # features come from the pool
        assert t.rows == small_pool.rows[t.id] and t.pooling_factor == small_pool.pooling_factor[t.id]


def test_same_seed_same_task(small_pool):
    config = TaskConfig(num_tables=20, pool=small_pool.spec, batch_size=512)
    assert generate_task(small_pool, config, 3) == generate_task(small_pool, config, 3)
    assert generate_task(small_pool, config, 3) != generate_task(small_pool, config, 4)


def test_dreamshard_splits_are_disjoint(small_pool):
    train, test = split_table_ids(small_pool, "train"), split_table_ids(small_pool, "test")
    assert not set(train) & set(test) and len(train) + len(test) == small_pool.num_tables
    config = TaskConfig(num_tables=30, split="test", pool=small_pool.spec, batch_size=512)
    assert {t.id for t in generate_task(small_pool, config, 0).tables} <= set(test.tolist())


def test_task_file_roundtrip(small_pool, tmp_path):
    task = generate_task(small_pool, TaskConfig(num_tables=12, pool=small_pool.spec, batch_size=512), 0)
    write_json(task.to_json(), tmp_path / "task.json")
    assert load_task(tmp_path / "task.json") == task


def _task_json():
    return make_task([make_table(0), make_table(1, rows=5000, dim=32)]).to_json()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda o: o.pop("num_devices"), "num_devices: missing"),
        (lambda o: o["tables"][1].pop("rows"), r"tables\[1\].rows: missing"),
        (lambda o: o["tables"][0].update(rows=-5), r"tables\[0\].rows: got -5, expected an integer >= 1"),
        (lambda o: o["tables"][0].update(dim=0), r"tables\[0\].dim: got 0, expected an integer >= 1"),
        (lambda o: o["tables"][0].update(pooling_factor=float("nan")), r"pooling_factor: got nan"),
        (lambda o: o["tables"][1].update(id=0), "ids unique"),
        (lambda o: o.update(mem_cap_gb=0), "mem_cap_gb: got 0"),
        (lambda o: o.update(precision="fp8"), "precision: got 'fp8'"),
        (lambda o: o["tables"][0].update(bins=[0.5]), "bins"),
        (lambda o: o.update(tables=[]), "non-empty list"),
    ],
)
def test_malformed_task_files(tmp_path, mutate, message):
    obj = _task_json()
    mutate(obj)
    path = tmp_path / "task.json"
    path.write_text(json.dumps(obj))  # json writes NaN as NaN, as a careless tool would
    with pytest.raises(UserError, match=message):
        load_task(path)


def test_unreadable_task_files(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_task(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="line 1 is not valid JSON"):
        load_task(tmp_path / "bad.json")


def test_infeasible_tasks():
    cap = 0.001  # GiB
    rows = int(cap * GIB_BYTES / 4 / 4) + 1  # a 4-wide shard is already over the cap
    with pytest.raises(InfeasibleError, match="no split fits"):
        check_feasible(make_task([make_table(0, rows=rows, dim=16)], mem_cap_gb=cap))
    step = make_task([make_table(0, rows=1, dim=16)]).table_mem_bytes(0) - 4 * 16  # the step's buffers (512 x 16)
    batch = make_task([make_table(i, rows=1, dim=16) for i in range(2)]).step_memory().total  # each device's slice
    fits_one = int((cap * GIB_BYTES - step - batch) / 4 / 16)  # weights and buffers fill a device
    many = [make_table(i, rows=fits_one, dim=16) for i in range(3)]
    with pytest.raises(InfeasibleError, match="in total"):
        check_feasible(make_task(many, num_devices=2, mem_cap_gb=cap))
    check_feasible(make_task(many[:2], num_devices=2, mem_cap_gb=cap))
    # dim 24 halves once, into 12-wide shards (not 4-wide): a table whose 12-wide half is over the cap fits no column
    # split, but its row blocks over 4 devices fit; over 1 device nothing does
    rows24 = int(cap * GIB_BYTES / 4 / 12) + 1
    check_feasible(make_task([make_table(0, rows=rows24, dim=24)], num_devices=4, mem_cap_gb=cap))
    with pytest.raises(InfeasibleError, match="no split fits"):
        check_feasible(make_task([make_table(0, rows=rows24, dim=24)], num_devices=1, mem_cap_gb=cap))


def test_precision_changes_memory():
    t32 = make_task([make_table(0, rows=1000, dim=16)])
    t16 = dataclasses.replace(t32, precision="fp16")
    w32, w16 = (t.rows_memory(0, 1000, 16) for t in (t32, t16))
    assert w32.weights == 2 * w16.weights == 64000 and w32.buffers == w16.buffers  # fp32 outputs either way
    assert t32.table_mem_bytes(0) - t16.table_mem_bytes(0) == 32000
    assert np.isclose(t32.largest_cap_bytes, GIB_BYTES)


def test_a_table_of_any_width_is_planned_whole_and_only_multiples_of_four_are_cut():
    """TorchRec and FBGEMM's CPU kernels take any width: a 6-wide table is planned (never cut in columns: a slice is
    a multiple of 4), a 24-wide one may be cut in two (of 12)."""
    from neuroshard_jax.core.plan import Plan
    from neuroshard_jax.core.sharding import Shard, split_counts

    task = make_task([make_table(0, rows=500, dim=6), make_table(1, rows=800, dim=24)], num_devices=2)
    assert split_counts(6) == (1,) and split_counts(24) == (1, 2)
    Plan(task, (Shard(0, 0, 6, 0), Shard(1, 0, 12, 0), Shard(1, 12, 12, 1))).validate()
    with pytest.raises(Exception, match="2\\^k column slices"):
        Plan(task, (Shard(0, 0, 3, 0), Shard(0, 3, 3, 1), Shard(1, 0, 24, 1))).validate()
