"""experiment=compare: a smoke-size suite sweep of the real CLI, measured by the real evaluator, compared."""

import json

from neuroshard_jax.measure.searcher_comparison import CompareConfig, compare_sweep

from .conftest import run_cli

SMALL = [
    "cost_model=analytic",
    "suite.tasks=2",
    "suite.devices=[2,3]",
    "suite.first_seed=5",
    "task.min_tables=4",
    "task.max_tables=8",
    "task.pool.num_tables=120",
    "task.batch_size=512",
    "evaluator.warmup=1",
    "evaluator.iters=2",
    "evaluator.comm_warmup=1",
    "evaluator.comm_iters=2",
]


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def compare(sweep):
    return compare_sweep(CompareConfig(sweep=str(sweep)))


def test_suite_sweep_measures_resumes_and_compares(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "experiment=compare", "searcher=grid,size_lookup_greedy", "evaluate=true", *SMALL]
    done = run_cli(*args, f"hydra.sweep.dir={sweep}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(": 4 tasks, 0 infeasible, 4 measured; results in") == 2
    results = lines(sweep / "0" / "results.jsonl")
    assert [r["id"] for r in results] == ["2/5", "2/6", "3/5", "3/6"]
    measured = {r["id"]: r for r in lines(sweep / "0" / "measured.jsonl")}
    assert set(measured) == {r["id"] for r in results}
    assert all(m["measured_ms"] > 0 and len(m["devices"]) == int(m["id"][0]) for m in measured.values())
    # Both searchers saw the same tasks (same table counts per task).
    assert [r["tables"] for r in results] == [r["tables"] for r in lines(sweep / "1" / "results.jsonl")]

    before = (sweep / "0" / "measured.jsonl").read_bytes()
    # Stopped while measuring: the rest is measured on resume (from the sweep's plan measurements: same values),
    # the rest of the sweep (run 1, finished) resumes to nothing.
    before_1 = (sweep / "1" / "measured.jsonl").read_bytes()
    (sweep / "0" / "measured.jsonl").write_bytes(b"".join(before.splitlines(keepends=True)[:2]))
    resumed = run_cli(*args, f"hydra.sweep.dir={sweep}")
    assert resumed.returncode == 0, resumed.stderr
    assert (sweep / "0" / "measured.jsonl").read_bytes() == before
    assert (sweep / "1" / "measured.jsonl").read_bytes() == before_1

    other = run_cli(*args, "task.max_tables=9", f"hydra.sweep.dir={sweep}")  # other tasks under the same run
    assert other.returncode == 2 and "holds a suite run with other overrides, task" in other.stderr

    table = compare(sweep)
    assert "### 2 devices" in table and "### 3 devices" in table and "### all tasks" in table
    assert "4 tasks, 4 solved by every run, 4 of them measured for every run. Ranked by measured cost" in table
    assert "| `grid` | 4 | 0 |" in table and "| `size_lookup_greedy` | 4 | 0 |" in table
    assert (sweep / "cost_by_searcher.png").stat().st_size > 1000 and (sweep / "search_time.png").exists()


def test_ablation_labels_and_later_measurement(tmp_path):
    sweep = tmp_path / "sweep"
    # max_length=0: both beam widths return the grid plan, so the two runs' plans are identical.
    done = run_cli(
        "-m", "experiment=compare", "searcher=beam", "searcher.k=1,2", "searcher.max_length=0", *SMALL,
        "suite.devices=[2]", f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not (sweep / "0" / "measured.jsonl").exists()
    assert "predicted cost" in compare(sweep) and "`beam searcher.k=1`" in compare(sweep)
    measure = run_cli(f"sweep={sweep}", "warmup=1", "iters=2", "comm_iters=2", module="neuroshard_jax.evaluate")
    assert measure.returncode == 0, measure.stderr
    assert "4 / 4 plans measured (2 new in this batch)" in measure.stderr
    first, second = (lines(sweep / run / "measured.jsonl") for run in ("0", "1"))
    assert [m["measured_ms"] for m in first] == [m["measured_ms"] for m in second]  # measured once, not twice
    assert len(lines(sweep / "plan_measurements.jsonl")) == 2
    table = compare(sweep)
    assert "Ranked by measured cost over the 2 tasks" in table and "`beam searcher.k=2`" in table


def test_suite_refuses_bad_settings(tmp_path):
    bad = run_cli("-m", "experiment=compare", "searcher=grid", *SMALL, "suite.tasks=0", f"hydra.sweep.dir={tmp_path}")
    assert bad.returncode == 2 and "suite.tasks: got 0, expected an integer >= 1" in bad.stderr
    single = run_cli("searcher=grid", "evaluate=true", "cost_model=analytic")
    assert single.returncode == 2 and "evaluate: true needs a suite" in single.stderr
    missing = run_cli(f"sweep={tmp_path}", module="neuroshard_jax.evaluate")
    assert missing.returncode == 2 and "holds no suite run" in missing.stderr
