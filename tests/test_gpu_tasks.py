"""The GPU-sized task family (``workloads/gpu_tasks.py``): a pure function of (seed, index), within its ranges,
its tables' features those of the streams the worker replays."""

from __future__ import annotations

import numpy as np
import pytest

from neuroshard_jax.core.features import bin_shares
from neuroshard_jax.core.sharding import mem_bytes
from neuroshard_jax.workloads.gpu_tasks import GpuTaskConfig, gpu_task, table_params, table_stream
from neuroshard_jax.workloads.pool import stream_histogram

pytestmark = pytest.mark.fast  # the before-commit tier (make test-fast)

SMALL = GpuTaskConfig(tables=(20, 30), batch_sizes=(16384, 32768, 65536), log10_rows_max=5.0, mean_pooling=2.0)


def test_a_gpu_task_is_a_pure_function_of_seed_and_index():
    a, b = gpu_task(SMALL, 7, 3), gpu_task(SMALL, 7, 3)
    assert a == b and a.tables == b.tables
    assert gpu_task(SMALL, 7, 4).tables != a.tables and gpu_task(SMALL, 8, 3).tables != a.tables


def test_gpu_tasks_stay_within_their_ranges():
    for index in range(4):
        task = gpu_task(SMALL, 0, index)
        assert task.num_devices == SMALL.device_counts[index % 2]
        assert 20 <= task.num_tables <= 30
        assert task.batch_size in (16384, 32768, 65536)  # per-device batches of 16k-64k samples
        assert {t.dim for t in task.tables} <= set(SMALL.dims)
        assert all(100 <= t.rows <= 10**5 + 1 for t in task.tables)
        total = sum(mem_bytes(t.rows, t.dim, task.precision) for t in task.tables)
        assert total <= sum(task.caps_gb()) * 2**30 * SMALL.fill + 1  # the memory fill, at most
        assert [t.id for t in task.tables] == list(range(task.num_tables))  # ids: the stream pool's table ids


def test_the_default_family_is_gpu_sized():
    light = GpuTaskConfig(tables=(400, 400), batch_sizes=(16384,), mean_pooling=0.5)  # its memory, fewer lookups
    task = gpu_task(light, 54, 0)  # the check's first: 8 devices, 50 tables a device
    assert task.num_devices == 8 and task.num_tables == 400 and task.batch_size >= 16384
    assert min(task.caps_gb()) >= 10  # GiB a device: a sizeable share of a GPU's


def test_a_tables_features_are_those_of_its_stream():
    task = gpu_task(SMALL, 1, 0)
    params, stream_seed = table_params(SMALL, 1, 0, task.num_tables)
    for t in (0, 5):
        indices, offsets = table_stream(params, stream_seed, t, task.batch_size)
        table = task.tables[t]
        assert len(offsets) == task.batch_size + 1 and indices.max() == table.rows - 1  # rows: largest index + 1
        assert abs(len(indices) / task.batch_size - table.pooling_factor) < 1e-3
        np.testing.assert_allclose(bin_shares(stream_histogram(indices, table.rows)[0]), table.bins, atol=1e-5)
