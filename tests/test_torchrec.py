"""searcher=torchrec: TorchRec's real planner in the worker subprocess, converted to our plans."""

import subprocess
import sys

import pytest

from neuroshard_jax.core.constraints import violations
from neuroshard_jax.core.devices import Device
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.sharding import Shard
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.analytic import analytic_model
from searchers import make_searcher
from searchers.torchrec import plan_from_torchrec

from .conftest import make_table, make_task


def test_torchrec_planner_gives_a_valid_plan_of_ours():
    tables = [make_table(i, rows=10_000 * (i + 1), dim=(16, 64, 128)[i % 3], pooling=2.0 + i) for i in range(6)]
    task = make_task(tables, num_devices=2, mem_cap_gb=0.5, batch_size=512)
    plan = make_searcher("torchrec").search(task, analytic_model(task), 0)
    plan.validate()
    assert {s.device for s in plan.shards} <= {0, 1}
    # constraints TorchRec can express: no_split (its table_wise sharding type), max_shards (its min_partition)
    kept = [t.constrained(no_split=True) for t in tables[:-1]] + [tables[-1].constrained(max_shards=2)]
    # and devices of unequal memory (TorchRec's per-device hbm caps): the small device 1 takes only what fits
    constrained = Task([Device(0.5), Device(0.01)], task.batch_size, kept)
    plan = make_searcher("torchrec").search(constrained, analytic_model(constrained), 0).validate()
    assert violations(constrained.tables, plan.shards, constrained.table_names()) == []
    assert 0 < plan.mem_bytes()[1] <= constrained.cap_bytes()[1]
    assert len(plan.shards) <= len(tables) + 1


def test_unequal_torchrec_splits_are_refused_clearly():
    task = make_task([make_table(0, dim=64)])
    ok = plan_from_torchrec(task, [[{"col_offset": 32, "dim": 32, "rank": 1}, {"col_offset": 0, "dim": 32, "rank": 0}]])
    assert ok.shards == (Shard(0, 0, 32, 0), Shard(0, 32, 32, 1))
    with pytest.raises(UserError, match=r"widths \[16, 48\], expected 2\^k equal"):
        plan_from_torchrec(task, [[{"col_offset": 0, "dim": 16, "rank": 0}, {"col_offset": 16, "dim": 48, "rank": 1}]])


@pytest.mark.fast
def test_missing_torchrec_is_a_clear_message(tmp_path):
    code = (
        "import sys, json; sys.modules['torchrec'] = None; "
        "from neuroshard_jax.kernels.worker.torchrec_jobs import torchrec_plan; "
        "print(json.dumps(torchrec_plan({}).to_json()))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "torchrec is not installed" in done.stdout
    with pytest.raises(UserError, match="sharding_types: got"):
        make_searcher("torchrec", {"sharding_types": ["grid_shard"]})  # TorchRec's, not a plan of this project
