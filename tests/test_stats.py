"""Table statistics from the user's data (neuroshard_jax.stats): the profiler's definitions, exactly."""

import json

import numpy as np
import pytest

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.plan_file import format_plan
from neuroshard_jax.core.task import Task
from neuroshard_jax.workloads.statistics import (
    StatsAccumulator,
    estimated_stats,
    file_stats,
    read_stats_file,
    stats_file,
    zipf_ids,
)

from .conftest import run_cli


def test_one_batch_gives_the_profilers_features(small_pool):
    """The statistics of one batch are the pool's features of that table (same stream, same batch size)."""
    for table in (3, 17, 40):
        indices, offsets = small_pool.index_stream(table)
        acc = StatsAccumulator(small_pool.batch_size, rows={"t": int(small_pool.rows[table])})
        acc.add({"t": (indices, np.diff(offsets))})
        (stats,) = acc.result()
        assert stats.pooling_factor == pytest.approx(small_pool.pooling_factor[table])
        np.testing.assert_allclose(stats.bins, small_pool.bins[table], atol=1e-12)
        assert stats.batches == 1 and stats.rows == small_pool.rows[table]


def test_batches_are_regrouped_whatever_the_loaders_batches():
    """The same samples give the same statistics whether they come in chunks of 100 or 1000 samples; bins are
    the mean of the full batches' histograms; a trailing partial batch counts for the pooling factor only."""
    rng = np.random.default_rng(0)
    lengths = rng.poisson(6, size=2600)
    values = zipf_ids(rng, 5000, 1.2, int(lengths.sum()))
    starts = np.concatenate([[0], np.cumsum(lengths)])
    results = []
    for chunk in (100, 1000, 2600):
        acc = StatsAccumulator(512)
        for lo in range(0, 2600, chunk):
            hi = min(2600, lo + chunk)
            acc.add({"a": (values[starts[lo] : starts[hi]], lengths[lo:hi])})
        results.append(acc.result()[0])
    for r in results[1:]:
        assert r == results[0]
    expected = np.mean(
        [
            np.bincount(
                np.minimum(
                    np.ceil(
                        np.log2(np.unique(values[starts[b * 512] : starts[(b + 1) * 512]], return_counts=True)[1])
                    ).astype(int),
                    16,
                ),
                minlength=17,
            )
            / len(np.unique(values[starts[b * 512] : starts[(b + 1) * 512]]))
            for b in range(5)
        ],
        axis=0,
    )
    np.testing.assert_allclose(results[0].bins, expected / expected.sum(), atol=1e-12)
    assert results[0].batches == 5 and results[0].pooling_factor == pytest.approx(lengths.mean())
    assert results[0].rows == max(100, int(values.max()) + 1)


def test_features_of_one_table_are_pooled_per_sample():
    """Two features read by one table: one stream whose sample i holds both features' ids of sample i."""
    a = (np.array([1, 2, 2, 3]), np.array([2, 0, 2]))
    b = (np.array([2, 9]), np.array([1, 1, 0]))
    acc = StatsAccumulator(3, feature_tables={"fa": "T", "fb": "T"}, rows={"T": 10})
    acc.add({"fa": a, "fb": b})
    (stats,) = acc.result()
    assert stats.pooling_factor == pytest.approx(2.0)  # 6 lookups over 3 samples
    # counts: row 2 x3 (bin 2), rows 1, 3, 9 x1 (bin 0)
    assert stats.bins[0] == pytest.approx(0.75) and stats.bins[2] == pytest.approx(0.25)


def test_bad_data_is_named():
    acc = StatsAccumulator(100)
    with pytest.raises(UserError, match="feature 'x': lengths sum to 3 for 2 values"):
        acc.add({"x": (np.array([1, 2]), np.array([1, 2]))})
    acc.add({"x": (np.array([1]), np.array([1]))})
    with pytest.raises(UserError, match="table 'x': 1 samples, expected at least one batch of 100"):
        acc.result()
    with pytest.raises(UserError, match="index 7, expected indices below its 5 rows"):
        StatsAccumulator(1, rows={"y": 5}).add({"y": (np.array([7]), np.array([1]))})
    ignored = StatsAccumulator(1, feature_tables={"f": "T"})  # a feature no table reads is left out, as TorchRec does
    ignored.add({"z": (np.array([1]), np.array([1]))})
    assert ignored.result() == []


def test_estimates_follow_the_assumed_law_and_warn_in_the_plan():
    uniform = estimated_stats("u", 1_000_000, 4.0, 4096, zipf=0.0)
    skewed = estimated_stats("s", 1_000_000, 4.0, 4096, zipf=1.3)
    assert uniform.estimated and uniform.samples == 0
    assert uniform.bins[0] > 0.95  # 16k lookups over 1M rows: almost every touched row once
    assert skewed.bins[0] < 0.9 and max(np.nonzero(skewed.bins)[0]) >= 8  # hot rows reach high bins
    assert estimated_stats("u", 1_000_000, 4.0, 4096, zipf=0.0) == uniform  # deterministic
    table = {
        "id": 0,
        "name": "u",
        "rows": 1_000_000,
        "dim": 16,
        "pooling_factor": 4.0,
        "bins": list(uniform.bins),
        "estimated": True,
    }
    task = Task.from_json({"num_devices": 1, "mem_cap_gb": 1.0, "batch_size": 4096, "tables": [table]})
    assert task.tables[0].estimated and task.to_json()["tables"][0]["estimated"] is True
    plan_json = {
        "searcher": "x",
        "cost_model": "y",
        "seed": 0,
        "task": task.to_json(),
        "cost_ms": 1.0,
        "search_time_s": 0.0,
        "devices": [
            {
                "device": 0,
                "num_shards": 1,
                "dim_sum": 16,
                "mem_gb": 0.1,
                "cost_ms": {"compute": 1.0, "fwd_comm": 0.0, "bwd_comm": 0.0, "total": 1.0},
            }
        ],
    }
    assert "warning: 1 of 1 tables have estimated access statistics (u)" in format_plan(plan_json)


def test_task_tables_take_bin_k_keys():
    bins = {f"bin_{k}": (1.0 if k == 0 else 0.0) for k in range(17)}
    obj = {
        "num_devices": 1,
        "mem_cap_gb": 1.0,
        "batch_size": 64,
        "tables": [{"id": 0, "rows": 10, "dim": 8, "pooling_factor": 1.0, **bins}],
    }
    assert Task.from_json(obj).tables[0].bins[0] == 1.0
    del obj["tables"][0]["bin_16"]
    with pytest.raises(UserError, match=r"task.tables\[0\].bin_16: missing, expected all of bin_0 .. bin_16"):
        Task.from_json(obj)


def test_stats_command_on_an_npz(tmp_path):
    """python -m neuroshard_jax.stats on a file of indices and offsets per feature, as a user runs it."""
    rng = np.random.default_rng(1)
    arrays = {}
    for name, pooling in (("user", 1.0), ("item", 12.0)):
        lengths = rng.poisson(pooling, size=1000)
        arrays[f"{name}/indices"] = zipf_ids(rng, 3000, 1.1, int(lengths.sum()))
        arrays[f"{name}/offsets"] = np.concatenate([[0], np.cumsum(lengths)])
    arrays["item/rows"] = np.array(4000)
    np.savez(tmp_path / "data.npz", **arrays)
    done = run_cli(
        f"data={tmp_path / 'data.npz'}",
        f"out={tmp_path / 'tables.json'}",
        "batch_size=256",
        "progress=false",
        module="neuroshard_jax.stats",
    )
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "tables.json").read_text())
    by_name = {t["name"]: t for t in out["tables"]}
    assert out["batch_size"] == 256 and by_name["item"]["rows"] == 4000 and by_name["item"]["batches"] == 3
    direct = {t.name: t for t in file_stats(tmp_path / "data.npz", 256, progress=False)}
    assert by_name["user"]["bins"] == list(direct["user"].bins)
    assert by_name["item"]["pooling_factor"] == pytest.approx(direct["item"].pooling_factor)
    short = {**arrays, "user/lengths": np.diff(arrays["user/offsets"]) + (np.arange(1000) == 0)}  # one index over
    del short["user/offsets"]
    np.savez(tmp_path / "short.npz", **short)
    with pytest.raises(UserError, match="user/lengths of .* sum to .* expected non-negative lengths summing to"):
        file_stats(tmp_path / "short.npz", 256, progress=False)
    bad = run_cli(f"data={tmp_path / 'missing.npz'}", module="neuroshard_jax.stats")
    assert bad.returncode == 2 and bad.stderr.startswith("error: data:") and "Traceback" not in bad.stderr


@pytest.mark.fast
def test_row_blocks_get_the_statistics_of_their_own_lookups(tmp_path):
    """Oracle: ids sorted by frequency (the hottest first), cut by hand into TorchRec's row layout."""
    rng = np.random.default_rng(3)
    rows, batch = 1000, 128
    lengths = rng.poisson(6.0, size=4 * batch + 7)  # 4 full batches and a partial one
    values = np.minimum(rng.zipf(1.3, int(lengths.sum())) - 1, rows - 1)
    acc = StatsAccumulator(batch, rows={"t": rows}, row_blocks=(2, 4))
    acc.add({"t": (values, lengths)})
    [table] = acc.result()
    assert [b.count for b in table.row_blocks] == [2, 4]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for stats in table.row_blocks:
        size = -(-rows // stats.count)
        lookups, shares = np.zeros(stats.count), np.zeros((stats.count, 17))
        for b in range(4):
            ids, counts = np.unique(values[starts[b * batch] : starts[(b + 1) * batch]], return_counts=True)
            for k in range(stats.count):
                mine = counts[ids // size == k]
                lookups[k] += mine.sum()
                if len(mine):
                    shares[k] += np.bincount(np.ceil(np.log2(mine)).astype(int), minlength=17) / len(mine)
        np.testing.assert_allclose(stats.pooling_factors, table.pooling_factor * lookups / lookups.sum())
        for k in range(stats.count):
            want = shares[k] / shares[k].sum() if shares[k].sum() else shares[k]
            np.testing.assert_allclose(stats.bins[k], want, atol=1e-12)
    assert table.row_blocks[0].pooling_factors[0] > 5 * table.row_blocks[0].pooling_factors[1]  # the hot rows: block 0
    # a table whose rows are not given (the DLRM rule) has no block statistics; to_json carries them into a task
    assert _unsized_blocks(values, lengths, batch) == ()
    task = Task.from_json(
        {"num_devices": 2, "mem_cap_gb": 1, "batch_size": batch, "tables": [{**table.to_json(), "id": 0, "dim": 16}]}
    )
    assert task.tables[0].row_blocks == table.row_blocks
    assert task.tables[0].block_stats(0, 500) == (table.row_blocks[0].pooling_factors[0], table.row_blocks[0].bins[0])
    assert task.tables[0].block_stats(0, 400) is None  # no count cuts that block
    path = tmp_path / "tables.json"  # the statistics file keeps them; a bad entry is named
    path.write_text(json.dumps(stats_file([table], batch, "drawn")))
    assert read_stats_file(path)[0].row_blocks == table.row_blocks
    bad = stats_file([table], batch, "drawn")
    bad["tables"][0]["row_blocks"][0]["count"] = 3
    path.write_text(json.dumps(bad))
    with pytest.raises(UserError, match=r"table 0.row_blocks\[0\].pooling_factors: got .* a list of 3"):
        read_stats_file(path)


def _unsized_blocks(values, lengths, batch):
    acc = StatsAccumulator(batch)
    acc.add({"t": (values, lengths)})
    return acc.result()[0].row_blocks


@pytest.mark.parametrize(
    "row_blocks, fragment",
    [
        ({"count": 2}, r"row_blocks: got .*expected a list"),
        ([{"count": 1, "pooling_factors": [1.0], "bins": [[1.0] + [0.0] * 16]}], r"row_blocks\[0\].count: got 1"),
        ([{"count": 2, "pooling_factors": [1.0], "bins": []}], r"row_blocks\[0\].pooling_factors: .*a list of 2"),
        ([{"count": 2, "pooling_factors": [0.5, 0.2], "bins": [[1.0] + [0.0] * 16] * 2}], "sum to 0.7, expected"),
        ([{"count": 2, "pooling_factors": [0.5, 0.5], "bins": [[1.0] + [0.0] * 16, [0.5] * 17]}], r"bins\[1\]: the"),
        ([{"count": 2, "pooling_factors": [0.5, -0.5], "bins": [[1.0] + [0.0] * 16] * 2}], r"factors\[1\]: got -0.5"),
        ([{"count": 20, "pooling_factors": [0.05] * 20, "bins": [[1.0] + [0.0] * 16] * 20}], "at most the table's 10"),
        ([{"count": 2, "pooling_factors": [0.5, 0.5], "bins": [[1.0] + [0.0] * 16] * 2, "rows": 3}], "rows"),
    ],
)
def test_bad_row_block_statistics_are_named(row_blocks, fragment):
    table = {"id": 0, "rows": 10, "dim": 8, "pooling_factor": 1.0, "bins": [1.0] + [0.0] * 16, "row_blocks": row_blocks}
    with pytest.raises(UserError, match=fragment):
        Task.from_json({"num_devices": 1, "mem_cap_gb": 1.0, "batch_size": 64, "tables": [table]})
