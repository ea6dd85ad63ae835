"""``tools.batches_effect``: a dataset's kernels timed on one batch over and over and on a training step's batches in
turn, on the real worker, and the ratio by the kernel's shape."""

from __future__ import annotations

import json

import pytest

from neuroshard_jax.core.files import write_json


def _dataset(tmp_path, batches=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = {"rows": 20_000, "pooling_factor": 1.0, "bins": [1.0] + [0.0] * 16, "dim": 8, "seed": 1}
    records = [
        {"id": 0, "tables": [spec], "batch_size": 512, "ok": True, "total_ms": 0.1, "cpu_share": 1.0},
        {"id": 1, "tables": [spec, {**spec, "dim": 4}], "batch_size": 512, "ok": True, "total_ms": 0.2},
    ]
    (tmp_path / "compute.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    settings = {"kind": "compute", "device": "cpu", "batch_size": 512, "warmup": 1, "iters": 3, "source": "specs"}
    settings.update({"batches": batches} if batches else {})
    write_json({"settings": settings}, tmp_path / "manifest-compute.json")
    return tmp_path


def test_a_kernels_shape_and_the_ratio_both_ways_on_the_real_worker(tmp_path):
    from tools.batches_effect import main, shape

    data = _dataset(tmp_path / "d")
    assert shape({"tables": [{"pooling_factor": 0.5, "seed": 1}] * 2}) == {
        "pooling": "<= 1",
        "tables": "2-8",
        "slices": "column slices of a table",
    }
    out = tmp_path / "out.json"
    code = main(["--dataset", str(data), "--records", "2", "--batches", "4", "--rounds", "1", "--out", str(out)])
    if code == 0:  # both records read quiet both ways: the ratios and their slices
        result = json.loads(out.read_text())
        assert result["batches"] == 4 and result["slices"]["all"]["records"] >= 1 and result["hardware"]
        assert all(r["one_ms"] > 0 and r["batches_ms"] > 0 for r in result["readings"])
    else:  # a busy machine: refused in one line, nothing written
        assert code == 2 and not out.exists()


@pytest.mark.fast
def test_bad_arguments_and_a_dataset_of_many_batches_are_refused_in_one_line(tmp_path, capsys):
    from tools.batches_effect import main

    assert main(["--dataset", str(tmp_path), "--records", "0"]) == 2
    assert "--records: got 0, expected >= 1" in capsys.readouterr().err
    data = _dataset(tmp_path / "m", batches=16)
    assert main(["--dataset", str(data)]) == 2
    assert "was timed on 16 batches, expected one of one" in capsys.readouterr().err


@pytest.mark.fast
def test_two_datasets_of_the_same_samples_are_read_against_each_other_by_sample(tmp_path):
    from tools.batches_effect import main

    one = _dataset(tmp_path / "one")
    many = _dataset(tmp_path / "many", batches=16)
    lines = [json.loads(x) for x in (many / "compute.jsonl").read_text().splitlines()]
    (many / "compute.jsonl").write_text("".join(json.dumps({**r, "total_ms": 2 * r["total_ms"]}) + "\n" for r in lines))
    out = tmp_path / "against.json"
    assert main(["--dataset", str(one), "--against", str(many), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["slices"]["all"] == {"records": 2, "geomean": 2.0, "median": 2.0, "p10": 2.0, "p90": 2.0}
    assert result["slices"]["tables 1"]["records"] == 1 and result["batches"] == 16
    assert main(["--dataset", str(many), "--against", str(one), "--out", str(out)]) == 2  # the wrong way round
