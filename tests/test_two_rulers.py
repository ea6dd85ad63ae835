"""Two rulers (issue 65): the ``zipf`` pool keeps streams of a law of its own; a device of a task drawn from it is
read on the real kernels by both rulers (its tables' histograms, its own streams replayed); ``tools.two_rulers``'
report sums the readings up."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.table import PoolSpec
from neuroshard_jax.kernels.executors import ExecutorConfig, open_executor
from neuroshard_jax.measure.calibration import whole
from neuroshard_jax.measure.evaluator import EvaluateConfig, device_request, device_tables, measure_tables
from neuroshard_jax.workloads.builders import TaskConfig, generate_task
from neuroshard_jax.workloads.pool import load_pool, pool_streams
from neuroshard_jax.workloads.zipf_pool import ZipfStreams, zipf_table_params
from tools import two_rulers

pytestmark = pytest.mark.fast  # the before-commit tier (make test-fast)


def test_the_zipf_pool_keeps_streams_of_its_own_law(_cache_dir):
    small, large = zipf_table_params(3, 10), zipf_table_params(3, 200)
    np.testing.assert_array_equal(small.rows, large.rows[:10])  # pools nest
    assert not np.array_equal(small.rows, zipf_table_params(4, 10).rows)
    assert large.rows.min() >= 100 and large.rows.max() <= 10**7 and (large.rows > 10**6).sum() > 10
    assert (large.exponent == 0).any() and large.exponent.max() <= 1.6
    streams = ZipfStreams(3, large)
    for t in (0, 7, 150):
        indices, offsets = streams.stream(t, 512)
        again, offsets_again = streams.stream(t, 512)
        np.testing.assert_array_equal(indices, again)
        np.testing.assert_array_equal(offsets, offsets_again)
        assert offsets[0] == 0 and offsets[-1] == len(indices) and len(offsets) == 513
        assert indices.min(initial=0) >= 0 and indices.max(initial=0) < large.rows[t]
    # a steep law makes a hot row; a uniform table has none (rows well above its lookups)
    big = (large.rows > 10**5) & (large.pooling > 5)
    steep = int(np.argmax(np.where(big, large.exponent, 0)))
    flat = int(np.argmax(big & (large.exponent == 0)))
    top = [np.bincount(streams.stream(t, 4096)[0]).max() / len(streams.stream(t, 4096)[0]) for t in (steep, flat)]
    assert top[0] > 0.01 > top[1], (top, large.exponent[steep], large.exponent[flat])
    spec = PoolSpec(source="zipf", seed=3, num_tables=200)
    assert spec.pool_id == "zipf-v1-s3-n200" and PoolSpec.from_json(spec.to_json()) == spec
    rows, source = pool_streams(spec)
    np.testing.assert_array_equal(rows, large.rows)
    pool = load_pool(spec, 512)  # features measured from the streams
    indices, _ = source.stream(7, 512)
    assert pool.pooling_factor[7] == pytest.approx(len(indices) / 512)
    with pytest.raises(UserError, match=r"pool.source: got 'zipfian', expected one of synthetic, zipf, dlrm"):
        PoolSpec(source="zipfian")
    with pytest.raises(UserError, match="pool.num_tables: got 0, expected a positive integer"):
        PoolSpec(source="zipf", num_tables=0)


def test_both_rulers_read_a_zipf_tasks_devices_on_the_real_kernels(_cache_dir):
    """A task drawn from the zipf pool: its devices as the histogram ruler sends them (spec tables, no pool) and as
    the stream ruler does (the pool's table ids: the worker replays the streams), measured interleaved on one real
    worker; both read every device, and within 2x of each other (the study's figures: tools/two_rulers.py)."""
    pool = load_pool(PoolSpec(source="zipf", seed=11, num_tables=120), 512)
    config = TaskConfig(num_tables=6, num_devices=2, mem_cap_gb=0.02, batch_size=512, pool=pool.spec)
    task = generate_task(pool, config, seed=0)
    devices = [whole(task, [0, 1, 2]), whole(task, [3, 4, 5])]
    evaluator = EvaluateConfig(warmup=2, iters=5)
    jobs = {}
    for d, shards in enumerate(devices):
        for ruler in two_rulers.RULERS:
            seen = two_rulers.ruler_task(task, ruler)
            jobs[f"{d}/{ruler}"] = (seen, device_tables(seen, shards))
    spec_request = device_request(None, *jobs["0/histogram"], evaluator).to_json()
    stream_request = device_request(None, *jobs["0/stream"], evaluator).to_json()
    assert spec_request["pool"] is None and all(isinstance(t, dict) and "bins" in t for t in spec_request["tables"])
    assert stream_request["pool"] == pool.spec.to_json() and all(isinstance(t, list) for t in stream_request["tables"])
    with open_executor(ExecutorConfig(), "cpu", 120) as worker:
        answers = measure_tables(jobs, evaluator, worker, repeats=2)
    for d in range(2):
        h, s = (np.median([a.total_ms for a in answers[f"{d}/{r}"]]) for r in two_rulers.RULERS)
        assert h > 0 and s > 0 and 0.5 < s / h < 2.0, (d, h, s)


def test_the_report_sums_the_rulers_up_by_kind_and_shape(tmp_path, capsys):
    """Readings written as the measure stage writes them: the ratios, their spread and the model's error per kind,
    the tables by shape; a reading taken on a busy machine in every repeat is left out."""
    pool = load_pool(PoolSpec(source="zipf", seed=11, num_tables=120), 512)
    task = generate_task(pool, TaskConfig(num_tables=4, num_devices=2, mem_cap_gb=0.02, pool=pool.spec), seed=1)
    task = dataclasses.replace(task, batch_size=two_rulers.BATCH_SIZE)

    def row(kind, table, hist, stream, predicted, busy=0, source=None):
        shards = [[table, 0, task.tables[table].dim, 0, None]]
        readings = {"histogram": hist, "stream": stream, "histogram_busy": busy, "stream_busy": 0}
        return {"kind": kind, "source": source or str(table), "predicted": predicted, "shards": shards, **readings}

    items = [
        row("table", 0, [1.0, 1.0, 1.2], [1.1, 1.1, 1.1], 0.9),
        row("table", 1, [2.0, 2.0, 2.0], [1.8, 1.8, 1.9], 2.2),
        row("table", 2, [4.0, 4.0, 4.0], [40.0, 40.0, 40.0], 4.0, busy=3),  # busy in every repeat: left out
        row("device", 3, [5.0, 5.0, 50.0], [5.0, 5.0, 5.0], 4.0, source="portfolio/1"),
        row("group", 3, [2.0, 2.0, 2.0], [2.0, 2.0, 2.0], 1.0, source="0"),
    ]
    retimed = [{"drift": "a", "label_ms": 2.0, "total_ms": 2.2, "cpu_share": 1.0}]
    record = {"id": "zipf-d4-0", "task": task.to_json(), "model": "m", "hardware": {"cpu_id": "x"}, "plans": {}}
    items[3]["histogram_share"] = [1.0, 0.95, 0.4]  # its third reading was taken on a busy machine: left out
    (tmp_path / "readings.jsonl").write_text(json.dumps(record | {"items": items, "retimed": retimed}) + "\n")
    result = two_rulers.report(type("Args", (), {"out": str(tmp_path)}))
    tables = result["kinds"]["zipf/table"]
    assert tables["n"] == 2 and tables["median_ratio"] == pytest.approx((1.1 + 0.9) / 2)
    assert tables["median_off"] == pytest.approx(0.1) and tables["model_vs_histogram"]["mape"] == pytest.approx(0.1)
    assert result["kinds"]["all/device"]["median_off"] == 0 and result["kinds"]["all/device"]["n"] == 1
    assert result["drift"]["speed_median"] == pytest.approx(1.1)
    # the plan's device read 5 ms in every quiet round: as trained 4 ms (-20%), calibrated on the group (x2) 8 ms,
    # on the plan's own device (x1.25) 5 ms
    calibration = result["calibration"]
    assert calibration["all/trained"] == {"devices": 1, "mape": 0.2, "bias": -0.2, "worst": 1.25}
    assert calibration["zipf/tables"]["mape"] == pytest.approx(0.6) and calibration["zipf/plan"]["mape"] == 0
    assert sum(v["n"] for k, v in result["shapes"].items() if k.startswith("zipf/rows")) == 2
    assert json.loads((tmp_path / "rulers.json").read_text()) == result
    assert "zipf/table" in capsys.readouterr().out
    once, hot = [1.0] + [0.0] * 16, [0.0, 0.0, 1.0] + [0.0] * 14  # every row read once; every row 3-4 times
    assert two_rulers._reuse(dataclasses.replace(task.tables[0], bins=tuple(once))) == 1.0
    assert two_rulers._reuse(dataclasses.replace(task.tables[0], bins=tuple(hot))) == 3.5
    with pytest.raises(UserError, match="no readings, expected a measure stage first"):
        two_rulers.report(type("Args", (), {"out": str(tmp_path / "none")}))
