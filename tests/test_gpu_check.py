"""The prepared GPU check runs dry on this CPU: every step, every file, the table (``tools/gpu_check.py``)."""

from __future__ import annotations

import json

from tests.conftest import run_cli


def test_the_gpu_check_runs_dry_and_writes_its_files_and_table(tmp_path):
    from tools.foreign_benchmark import TASKS_FILE, benchmark_tasks
    from tools.gpu_check import TORCHREC_PLANS, torchrec_plans

    pack = tmp_path / "pack"
    pack.mkdir()
    tasks = {task_id: task for task_id, _, task in benchmark_tasks(pack / TASKS_FILE)}
    torchrec_plans(tasks, pack / TORCHREC_PLANS, only=("d4-00",))  # what pack carries (no TorchRec there)
    out = tmp_path / "out"
    done = run_cli("run", str(out), "--dry", "--budget-s", "90", "--pack", str(pack), module="tools.gpu_check")
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "labels.tgz",
        "log.txt",
        "plans.json",
        "protocols.json",
        "search.json",
        "smoke.json",
    ]
    assert json.loads((out / "smoke.json").read_text())["answer"]["ok"]
    protocols = json.loads((out / "protocols.json").read_text())
    assert protocols["fixed"]["requests"] > 0 and protocols["timed"]["requests"] > 0
    assert protocols["timed"]["timed_iters_median"] >= 10  # iterations fill the time (at least iters)
    assert protocols["chosen"] in ("fixed", "timed")  # the quietest: the labels and plans steps take it
    plans = json.loads((out / "plans.json").read_text())["tasks"]
    assert set(plans["d4-00"]) == {"beam", "grid", "size_lookup_greedy", "torchrec"}
    assert all(row["slowest_ms"] > 0 for rows in plans.values() for row in rows.values())
    runs = json.loads((out / "search.json").read_text())["runs"]
    assert runs and all(r["ok"] and r["search_s"] is not None for r in runs)
    table = run_cli("table", str(out), module="tools.gpu_check")
    assert table.returncode == 0 and "| timed" in table.stdout and "| d4-00 |" in table.stdout
