"""The model says when it is out of its depth (issue 51): a task past the range of a shipped model's labels warns in
one line naming what lies past and the remedy; the project's own pool task does not."""

import dataclasses
import json
import logging

import pytest

import neuroshard_jax as nsj
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.records import CalibrationProtocol, CalibrationRatios, CalibrationRecord
from neuroshard_jax.costs.choice import fitting_models
from neuroshard_jax.costs.coverage import (
    LabelCoverage,
    checkpoint_coverage,
    coverage_block,
    label_coverage,
    out_of_depth_warning,
    trained_checkpoint,
)
from neuroshard_jax.measure.breakdown import ExplainConfig, explain_file
from neuroshard_jax.search.sharding_planner import PlannerOptions
from neuroshard_jax.workloads.builders import TaskGroupConfig, make_task

from .conftest import make_table, run_cli
from .conftest import make_task as task_of

MODEL = "epyc-f26m2"  # named, not chosen: the test machine's kind varies
REMEDY = "calibrate=measured re-times this task's own tables"


def past_task(num_devices=2, mem_cap_gb=1.0):
    """Six tables at batch 4096, one of 3e7 rows (the labels stop at 1e7) and one of pooling 2000 (at about 300)."""
    tables = [make_table(i, rows=20_000 + i, dim=16, pooling=2.0) for i in range(4)]
    tables += [make_table(4, rows=30_000_000, dim=4, pooling=1.0), make_table(5, rows=5_000, dim=16, pooling=2000.0)]
    return task_of(tables, num_devices=num_devices, mem_cap_gb=mem_cap_gb, batch_size=4096)


@pytest.mark.fast
def test_the_pool_task_stays_inside_every_shipped_models_labels():
    task = make_task(TaskGroupConfig(), 0)  # the main job's default task: 50 of the project's pool tables
    models = fitting_models(task.batch_size, task.precisions)
    assert {MODEL, "xeon-union", "cpu-b4096"} <= set(models)
    planned = PlannerOptions("size_lookup_greedy", cost_model=MODEL).planner().run(task)
    assert out_of_depth_warning(task, planned.plan, MODEL, {}) is None  # its members agree on every device too
    for name in models:  # the same shards against each model's labels
        assert checkpoint_coverage(str(trained_checkpoint(name, {})[1].resolve())) is not None, name
        assert out_of_depth_warning(task, planned.plan, name, {}, trust=()) is None, name


@pytest.mark.fast
def test_a_task_past_the_labels_warns_naming_what_and_the_remedy():
    coverage = checkpoint_coverage(str(trained_checkpoint(MODEL, {})[1].resolve()))
    assert coverage.rows[1] < 3e7 and coverage.pooling_factor[1] < 2000 and coverage.tables[1] < 80
    task = past_task()
    line = out_of_depth_warning(task, None, MODEL, {})
    assert "\n" not in line
    assert line.startswith(f"cost model {MODEL} is out of its depth here: 2 of 6 tables lie past its labels (")
    assert "rows up to 3.0e7 > 1.0e7 labelled" in line
    assert f"pooling up to 2000 > {coverage.pooling_factor[1]:.4g} labelled" in line
    assert REMEDY in line and "python -m neuroshard_jax.adapt budget_min=10" in line
    assert out_of_depth_warning(task, None, "analytic", {}) is None  # a roofline has no labels to be past

    # 80 of the pool's own tables fused in one kernel: each table inside the labels, the kernel not
    crowded = make_task(TaskGroupConfig(num_tables=80, num_devices=1, mem_cap_gb=64.0), 0)
    plan = Plan.from_assignment(crowded, [1] * 80, [[0]] * 80)
    line = out_of_depth_warning(crowded, plan, MODEL, {})
    assert f"1 of 1 devices fuse more tables than any label did (up to 80 > {coverage.tables[1]})" in line
    assert "tables lie past" not in line

    # the user asked for calibrate=measured: the line says it is correcting, instead of recommending it
    ratios = CalibrationRatios(p10=1.1, p50=1.2, p90=1.4)
    record = CalibrationRecord(
        factor=1.2,
        ratios=ratios,
        devices=1,
        tables_per_device=80.0,
        measured_ms=(12.0,),
        predicted_ms=(10.0,),
        protocol=CalibrationProtocol(device="cpu", warmup=1, iters=3),
        seconds=4.0,
        far=False,
    )
    line = out_of_depth_warning(crowded, plan.with_record(CalibrationRecord, record), MODEL, {})
    assert "calibrate=measured is correcting for it (x1.20" in line and REMEDY not in line


def test_the_main_job_prints_the_warning_beside_the_plan(tmp_path):
    (tmp_path / "task.json").write_text(json.dumps(past_task().to_json()))
    done = run_cli(
        "searcher=size_lookup_greedy",
        f"cost_model.name={MODEL}",
        f"task.path={tmp_path / 'task.json'}",
        f"hydra.run.dir={tmp_path / 'out'}",
    )
    assert done.returncode == 0, done.stderr
    assert "predicted cost" in done.stdout
    [line] = [x for x in done.stderr.splitlines() if "out of its depth" in x]
    assert line.startswith(f"warning: cost model {MODEL} is out of its depth here: 2 of 6 tables lie past")
    assert REMEDY in line


@pytest.mark.fast
@pytest.mark.filterwarnings("ignore:cost model. ")  # the model of another kind than a test machine
def test_the_python_api_logs_it_and_explain_prints_it(tmp_path, caplog):
    tables = {
        t.name or f"t{t.id}": {"rows": t.rows, "dim": t.dim, "pooling_factor": t.pooling_factor, "bins": list(t.bins)}
        for t in past_task().tables
    }
    with caplog.at_level(logging.WARNING, logger="neuroshard_jax"):
        plan = nsj.plan(tables, num_devices=2, mem_cap_gb=1.0, searcher="size_lookup_greedy", cost_model=MODEL)
    [record] = [r for r in caplog.records if "out of its depth" in r.getMessage()]
    assert record.name == "neuroshard_jax.api" and "2 of 6 tables lie past its labels" in record.getMessage()
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
    text = explain_file(ExplainConfig(plan=str(tmp_path / "plan.json"), model=MODEL, chart=False))
    assert text.startswith(f"warning: cost model {MODEL} is out of its depth here: 2 of 6 tables lie past")


@pytest.mark.fast
def test_a_checkpoint_without_its_datasets_warns_of_nothing(tmp_path):
    shipped = trained_checkpoint(MODEL, {})[1]
    meta = json.loads((shipped / "meta.json").read_text())
    meta["datasets"]["compute"][0]["dir"] = str(tmp_path / "absent")  # a clone without the profiles
    meta.pop("coverage", None)  # and of a checkpoint written before meta.json carried its coverage
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "meta.json").write_text(json.dumps(meta))
    assert checkpoint_coverage(str(clone.resolve())) is None
    assert out_of_depth_warning(past_task(), None, "neural", {"checkpoint": str(clone)}) is None

    # a coverage block in meta.json (what training writes) is read as written, without the datasets
    labels = shipped.parents[1] / "profiles" / "epyc26-specs"
    coverage = label_coverage([labels])
    assert LabelCoverage.from_json(coverage.to_json()) == coverage
    prior = checkpoint_coverage(str(trained_checkpoint("xeon-union", {})[1].resolve()))
    assert coverage_block([labels], "xeon-union") == coverage.joined(prior).to_json()  # fine-tuned: both ranges
    meta["coverage"] = dataclasses.replace(coverage, pooling_factor=(0.3, 5000.0)).to_json()
    (clone / "meta.json").write_text(json.dumps(meta))
    checkpoint_coverage.cache_clear()
    line = out_of_depth_warning(past_task(), None, "neural", {"checkpoint": str(clone)})
    assert "1 of 6 tables lie past its labels (rows up to 3.0e7 > 1.0e7 labelled)" in line
    with pytest.raises(nsj.UserError, match=r"^coverage.rows: got \[10, 1\], expected \[smallest, largest\]$"):
        LabelCoverage.from_json({**coverage.to_json(), "rows": [10, 1]})
