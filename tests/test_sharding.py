"""Shard geometry (neuroshard_jax/core/sharding.py) against plain-Python oracles, and its users agreeing with it."""

import numpy as np
import pytest

from neuroshard_jax.core.constants import BYTES_PER_ELEMENT, DIM_ALIGNMENT
from neuroshard_jax.core.errors import PlanError
from neuroshard_jax.core.features import FEATURE_INDEX
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import (
    Shard,
    column_shards,
    is_legal_dim,
    max_halvings,
    mem_bytes,
    merge_colocated,
    narrowest_dim,
    shard_features,
    split_counts,
    tiling_error,
)

from .conftest import make_table, make_task


def legal_widths_oracle(dim):
    """Every width reachable by repeated halving that stays a positive multiple of DIM_ALIGNMENT."""
    widths, w = [], dim
    while w >= DIM_ALIGNMENT and w % DIM_ALIGNMENT == 0:
        widths.append(w)
        if w % 2:
            break
        w //= 2
    return widths


@pytest.mark.parametrize("dim", [4, 8, 12, 16, 20, 24, 28, 32, 48, 64, 96, 100, 128, 256])
def test_split_rule_matches_the_oracle(dim):
    widths = legal_widths_oracle(dim)
    assert max_halvings(dim) == len(widths) - 1
    assert narrowest_dim(dim) == widths[-1]
    assert split_counts(dim) == tuple(dim // w for w in widths)


def test_dim_24_halves_once_into_12():
    assert split_counts(24) == (1, 2) and narrowest_dim(24) == 12
    assert not is_legal_dim(6) and not is_legal_dim(0) and is_legal_dim(12)
    with pytest.raises(ValueError, match="expected one of"):
        column_shards(0, 24, [0, 1, 2, 3])


def test_memory_rule_and_device_memory():
    assert mem_bytes(1000, 16, "fp32") == 1000 * 16 * BYTES_PER_ELEMENT["fp32"]
    assert mem_bytes(1000, 16, "fp16") == 1000 * 16 * 2
    np.testing.assert_array_equal(mem_bytes(np.array([10, 20]), 8, "fp32"), [320, 640])
    shards = [*column_shards(0, 16, [0, 1]), Shard(1, 0, 8, 1)]
    task = make_task([make_table(0, rows=100, dim=16), make_table(1, rows=50, dim=8)], num_devices=3)
    plan = Plan.from_assignment(task, [2, 1], [[0, 1], [1]])
    weights = [parts.weights for parts in task.device_memory(shards)]
    assert weights == [100 * 8 * 4, (100 * 8 + 50 * 8) * 4, 0]  # SGD: no state; buffers beside (test_memory.py)
    np.testing.assert_array_equal(plan.mem_bytes(), task.device_mem_bytes(shards))


def test_shard_features_change_width_and_size_only():
    feats = make_task([make_table(0, rows=1000, dim=64, pooling=3.0)]).features()[0]
    half = shard_features(feats, 32)
    assert half[FEATURE_INDEX["dim"]] == 32 and half[FEATURE_INDEX["size"]] == 1000 * 32
    unchanged = [i for name, i in FEATURE_INDEX.items() if name not in ("dim", "size")]
    np.testing.assert_array_equal(half[unchanged], feats[unchanged])


def test_tiling():
    assert tiling_error(16, 100, column_shards(0, 16, [0, 1, 0, 1])) is None
    assert "no shard" in tiling_error(16, 100, [])
    assert "2^k" in tiling_error(24, 100, column_shards(0, 24, [0, 1])[:1] * 3)
    assert "do not tile" in tiling_error(16, 100, [Shard(0, 0, 8, 0), Shard(0, 4, 8, 1)])
    assert "row range alone" in tiling_error(16, 100, [Shard(0, 0, 16, 0, row_offset=0, num_rows=50)])
    task = make_task([make_table(0, rows=100, dim=24)])
    with pytest.raises(PlanError, match="2\\^k"):
        Plan(task, tuple(Shard(0, 6 * i, 6, 0) for i in range(4))).validate()


def test_colocated_sibling_slices_merge():
    """Halvings whose halves share a device are undone, level by level; a split across devices stays."""
    together = column_shards(0, 64, [1, 1, 1, 1])
    assert merge_colocated(together) == (Shard(0, 0, 64, 1),)
    pairs = column_shards(1, 64, [0, 0, 1, 1])
    assert merge_colocated(pairs) == (Shard(1, 0, 32, 0), Shard(1, 32, 32, 1))
    apart = column_shards(2, 64, [0, 1, 0, 1])  # slices 0 and 1 on different devices: nothing to merge
    assert merge_colocated(apart) == apart
    mixed = merge_colocated(together + apart + pairs)
    assert [s.table for s in mixed] == [0, 1, 1, 2, 2, 2, 2]
    assert merge_colocated(mixed) == mixed  # a fixed point
