"""``tools.autotune_benchmark``'s report: the chosen plan against TorchRec's two plans as autotune measured them (a
TW+CW plan that is TorchRec default's read as that one), TorchRec without a plan counted, a baseline faster beyond
the rounds' spread counted."""

from __future__ import annotations

import json

import pytest

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.records import AutotuneRecord, MeasuredCandidate
from tools import autotune_benchmark


def _row(task_id: str, candidates: list[MeasuredCandidate], chosen: str) -> dict:
    record = AutotuneRecord(
        mode="kernels",
        candidates=tuple(candidates),
        chosen=chosen,
        rounds=2,
        stopped="leader",
        devices=8,
        seconds=10.0,
        warmup=2,
        iters=5,
        device="cpu",
    )
    return {"id": task_id, "family": "f", "wall_s": 20.0, "tables": 10, "hardware": "x", "autotune": record.to_json()}


def _measured(name: str, ms: float, spread: float = 0.5) -> MeasuredCandidate:
    return MeasuredCandidate(name=name, measured_ms=ms, low_ms=ms - spread, high_ms=ms + spread, kept=True)


def test_the_report_reads_the_chosen_plan_against_torchrecs_as_measured(tmp_path):
    rows = [
        _row(  # TW+CW's plan was TorchRec default's: read as measured there
            "d4-00",
            [
                _measured("beam", 8.0),
                _measured("torchrec_default", 10.0),
                MeasuredCandidate(name="torchrec", kept=False, why="the same plan as torchrec_default"),
            ],
            "beam",
        ),
        _row(  # TorchRec default made no plan; TW+CW measured within the chosen plan's spread
            "d4-01",
            [
                _measured("beam", 9.0, spread=1.0),
                MeasuredCandidate(name="torchrec_default", kept=False, why="torchrec planner: no plan"),
                _measured("torchrec", 9.5, spread=1.0),
            ],
            "beam",
        ),
        _row(
            "d4-02", [_measured("beam", 10.0), _measured("torchrec_default", 20.0), _measured("torchrec", 5.0)], "beam"
        ),
    ]
    (tmp_path / "autotune-s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = autotune_benchmark.report(tmp_path, "s")["sizes"][4]
    assert result["tasks"] == 3 and result["chosen"] == {"beam": 3}
    assert result["baseline_without_plan"] == {"torchrec_default": 1, "torchrec": 0}
    assert result["geo_vs"]["torchrec_default"] == pytest.approx((0.8 * 0.5) ** 0.5, abs=1e-4)
    assert result["worst_vs"]["torchrec"] == pytest.approx(2.0)  # d4-02's TW+CW plan twice as fast ...
    assert result["baseline_faster_beyond_spread"] == 1  # ... beyond the spread (a record autotune never makes)
    assert json.loads((tmp_path / "autotune-report-s.json").read_text())["sizes"]["4"]["tasks"] == 3
    with pytest.raises(UserError, match="no rows, expected the run stage first"):
        autotune_benchmark.report(tmp_path, "none")
    with pytest.raises(UserError, match="--suite: got 'mine', expected foreign or sealed-N"):
        autotune_benchmark.suite_of("mine")
