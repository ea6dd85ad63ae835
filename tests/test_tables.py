import subprocess
import sys

import numpy as np
import pytest

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.workloads.pool import (
    PoolSpec,
    SyntheticStreams,
    calibration_report,
    load_pool,
    synthetic_table_params,
)
from neuroshard_jax.workloads.statistics import file_stats


def test_calibrated_against_published_2021_statistics():
    """The default 856-table pool, streamed at batch 65536, matches the published pooled statistics (a third of
    the tables streamed here, 3x faster: python -m tools.calibrate_pool gives the whole pool's figures in
    docs/results/pool.md)."""
    report = calibration_report(PoolSpec(), every=3)
    assert report["unique_row_share_l1"] <= 0.15, report
    assert report["access_share_l1"] <= 0.15, report
    assert abs(report["mean_pooling_factor"] - 15.8) <= 2.0, report
    assert report["rows_min"] < 1e3 and report["rows_max"] > 3e6, report  # ~1e2 .. 1e7
    p50, p90, p99, pmax = report["pooling_p50_p90_p99_max"]
    assert p50 < 15.8 < p90 and pmax > 100, report  # heavy tail: most small, a few above 100


def test_streams_are_deterministic_and_well_formed(small_pool):
    for t in (0, 5, 77):
        indices, offsets = small_pool.index_stream(t)
        again, offsets_again = small_pool.index_stream(t)
        np.testing.assert_array_equal(indices, again)
        np.testing.assert_array_equal(offsets, offsets_again)
        assert offsets[0] == 0 and offsets[-1] == len(indices) and len(offsets) == small_pool.batch_size + 1
        assert np.all(np.diff(offsets) >= 0)
        assert indices.min(initial=0) >= 0 and indices.max(initial=0) < small_pool.rows[t]


def test_features_are_measured_from_the_streams(small_pool):
    indices, _ = small_pool.index_stream(3)
    assert small_pool.pooling_factor[3] == pytest.approx(len(indices) / small_pool.batch_size)
    used = small_pool.bins.sum(1) > 0
    np.testing.assert_allclose(small_pool.bins[used].sum(1), 1.0)


def test_pools_nest_and_depend_on_the_seed():
    small, large = synthetic_table_params(0, 10), synthetic_table_params(0, 40)
    np.testing.assert_array_equal(small.rows, large.rows[:10])
    other = synthetic_table_params(1, 10)
    assert not np.array_equal(small.rows, other.rows)


@pytest.mark.fast
def test_skew_makes_hot_rows():
    params = synthetic_table_params(0, 120)
    streams = SyntheticStreams(0, params)
    t = int(np.argmax(params.skew * (params.pooling > 5) * (params.rows > 1e4)))
    indices, _ = streams.stream(t, 4096)
    uniform = np.random.default_rng(0).integers(0, params.rows[t], size=len(indices))
    assert np.bincount(indices).max() > 5 * np.bincount(uniform).max()  # far hotter rows than uniform access


def test_pool_cache_gives_identical_features(small_pool):
    again = load_pool(small_pool.spec, small_pool.batch_size)
    np.testing.assert_array_equal(small_pool.bins, again.bins)
    np.testing.assert_array_equal(small_pool.pooling_factor, again.pooling_factor)


def test_unknown_table_id_is_a_clear_error(small_pool):
    with pytest.raises(UserError, match="table id: got 999"):
        small_pool.index_stream(999)


@pytest.mark.fast
def test_dlrm_file_loader(tmp_path):
    """A file in the public DLRM format (torch.save of indices, offsets, lengths) loads as a pool."""
    lengths = np.array([[2, 0, 1, 3], [1, 1, 1, 1]])  # T=2, B=4
    indices = np.array([0, 5, 5, 7, 7, 150, 1, 2, 3, 2])
    offsets = np.concatenate([[0], np.cumsum(lengths.ravel())])
    path = tmp_path / "tiny.pt"
    script = (
        "import sys, torch; torch.save((torch.tensor(eval(sys.argv[2])), torch.tensor(eval(sys.argv[3])), "
        "torch.tensor(eval(sys.argv[4]))), sys.argv[1])"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(path), str(indices.tolist()), str(offsets.tolist()), str(lengths.tolist())],
        check=True,
    )
    pool = load_pool(PoolSpec(source="dlrm", path=str(path)), batch_size=4)
    assert pool.rows.tolist() == [151, 100]  # max(100, largest index + 1)
    assert pool.pooling_factor.tolist() == [1.5, 1.0]
    got, offs = pool.index_stream(0)
    assert got.tolist() == [0, 5, 5, 7, 7, 150] and offs.tolist() == [0, 2, 2, 3, 6]
    # table 0: rows 0, 150 once, rows 5, 7 twice -> half the accessed rows in bin 0, half in bin 1
    np.testing.assert_allclose(pool.bins[0][:2], [0.5, 0.5])
    with pytest.raises(UserError, match="at most 4"):
        load_pool(PoolSpec(source="dlrm", path=str(path)), batch_size=8)
    # the statistics tool reads the same file: tables t0, t1 with the pool's features
    stats = file_stats(path, batch_size=4, progress=False)
    assert [t.name for t in stats] == ["t0", "t1"] and [t.rows for t in stats] == [151, 100]
    np.testing.assert_allclose([t.bins for t in stats], pool.bins)
    assert [t.pooling_factor for t in stats] == pool.pooling_factor.tolist()


@pytest.mark.fast
def test_bad_dlrm_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(UserError, match="cannot read"):
        load_pool(PoolSpec(source="dlrm", path=str(bad)), batch_size=4)
    with pytest.raises(UserError, match="does not exist"):
        load_pool(PoolSpec(source="dlrm", path=str(tmp_path / "missing.pt")), batch_size=4)


@pytest.mark.fast
def test_a_recalibrated_generator_never_reuses_cached_features(small_pool):
    """The cache key holds the generator's parameters: other settings, other streams, other features."""
    from neuroshard_jax.workloads.pool import SyntheticPoolConfig

    base = synthetic_table_params(0, 120)
    other = synthetic_table_params(0, 120, SyntheticPoolConfig(pooling_sigma=0.3))
    assert SyntheticStreams(0, base).fingerprint() != SyntheticStreams(0, other).fingerprint()
    assert SyntheticStreams(0, base).fingerprint() == SyntheticStreams(0, synthetic_table_params(0, 120)).fingerprint()
