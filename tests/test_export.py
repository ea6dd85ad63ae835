"""python -m neuroshard_jax.export: our plan as a TorchRec ShardingPlan, loaded into DistributedModelParallel."""

import dataclasses
import json

import pytest

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard, row_shards
from neuroshard_jax.costs.analytic import analytic_model
from neuroshard_jax.costs.scoring import with_costs
from neuroshard_jax.kernels.torchrec_export import ExportConfig, expected_local_shards, export_torchrec

from .conftest import make_table, make_task, run_cli


@pytest.fixture()
def split_plan(tmp_path):
    """Two devices; table 1 split in two, table 3 in four (two shards of it on each rank), table 4 row-wise (rows
    0-50 on rank 0, 51-100 on rank 1)."""
    tables = [make_table(10 + i, rows=50 + 30 * i, dim=d) for i, d in enumerate((16, 32, 8, 64))]
    task = make_task([*tables, make_table(14, rows=101, dim=8)], num_devices=2)
    shards = (
        Shard(0, 0, 16, 0),
        Shard(1, 0, 16, 1),
        Shard(1, 16, 16, 0),
        Shard(2, 0, 8, 1),
        *(Shard(3, 16 * k, 16, k % 2) for k in range(4)),
        *row_shards(4, 101, 8, [0, 1]),
    )
    plan = Plan(task, shards)
    scored = dataclasses.replace(with_costs(analytic_model(task), plan), searcher="test", seed=0, search_time_s=0.0)
    path = write_json(scored.to_json(), tmp_path / "plan.json")
    return plan, path


def test_exported_plan_names_and_places_every_shard(split_plan, tmp_path):
    plan, path = split_plan
    config = ExportConfig(device="cpu", table_names="emb_{id}")
    request, _ = export_torchrec(plan, tmp_path / "plan.pt", config)
    assert [t.name for t in request.tables] == ["emb_10", "emb_11", "emb_12", "emb_13", "emb_14"]
    assert expected_local_shards(request, 1) == [
        ["emb_11", 0, 16, 0, 80],
        ["emb_12", 0, 8, 0, 110],
        ["emb_13", 16, 16, 0, 140],
        ["emb_13", 48, 16, 0, 140],
        ["emb_14", 0, 8, 51, 50],
    ]


def test_row_blocks_export_only_as_torchrec_runs_them(split_plan, tmp_path):
    plan, _ = split_plan
    # blocks in the wrong rank order: TorchRec's row_wise puts block i on rank i, so this plan is refused, not bent
    swapped = tuple(dataclasses.replace(s, device=1 - s.device) if s.table == 4 else s for s in plan.shards)
    with pytest.raises(UserError, match=r"export: table emb_14: row blocks on ranks \[1, 0\]"):
        export_torchrec(
            Plan(plan.task, swapped), tmp_path / "bad.pt", ExportConfig(device="cpu", table_names="emb_{id}")
        )


def test_export_cli_checks_in_dmp_and_refuses_bad_options(split_plan):
    _, path = split_plan
    # check=true: DistributedModelParallel on 2 gloo processes; each rank's local shards must be the plan's and its
    # pooled outputs the sums of a known weight pattern through the all-to-alls (max abs error < 1e-4), else exit 2
    done = run_cli(  # on this CPU, as the README says, with no device named
        f"plan={path}",
        "check=true",
        "check_batch_size=6",
        "module_path=sparse_arch.ebc",
        module="neuroshard_jax.export",
    )
    assert done.returncode == 0, done.stderr
    assert path.with_suffix(".torchrec.pt").stat().st_size > 0
    assert "5 tables on 2 ranks" in done.stdout
    assert "rank 0: 5 shards" in done.stdout and "rank 1: 5 shards" in done.stdout
    assert "forward [6, 128]" in done.stdout  # this rank's bags, every table's columns (16 + 32 + 8 + 64 + 8)
    for args, message in (
        (["format=onnx"], "format: got 'onnx', expected one of torchrec"),
        (["check=true", "device=cuda"], "check: true runs DistributedModelParallel on this CPU, expected device=cpu"),
        (["table_names=same"], "table_names: got 'same', expected a pattern"),
        ([f"output={path}/x.pt"], f"output: {str(path / 'x.pt')!r} lies under {str(path)!r}, which is a file"),
        ([f"output={path.parent}"], "is a folder, expected a file's path"),
        ([f"output={path}"], "is the plan being exported, expected another file"),
        ([f"output={path}", "overwrite=true"], "is the plan being exported, expected another file"),
        ([], "plan.torchrec.pt' exists, expected a new file (overwrite=true replaces it)"),
    ):
        bad = run_cli(f"plan={path}", *args, module="neuroshard_jax.export")
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert bad.stderr.startswith("error: ") and message in bad.stderr
    missing = run_cli(module="neuroshard_jax.export")
    assert missing.returncode == 2 and "plan: missing" in missing.stderr
    assert path.read_text().startswith("{")  # the plan itself untouched
    again = run_cli(f"plan={path}", "overwrite=true", module="neuroshard_jax.export")
    assert again.returncode == 0, again.stderr


def test_rank_processes_this_machine_cannot_hold_are_refused_before_any_starts(monkeypatch):
    """A rank's torch and TorchRec (RANK_PROCESS_BYTES) and the modules are counted against the available memory."""
    from neuroshard_jax.core import hardware

    monkeypatch.setattr(hardware, "available_bytes", lambda: 8 * 2**30)
    hardware.check_rank_room(8, 2**30, "check")  # 8 x 0.35 GiB + 1 GiB fits 80% of 8 GiB
    with pytest.raises(UserError, match=r"check: 64 rank processes need about 22\.5 GiB \(64 x 0\.35 GiB for torch"):
        hardware.check_rank_room(64, 0, "check")


def test_default_export_places_shards_on_cuda(split_plan, tmp_path):
    plan, _ = split_plan
    _, text = export_torchrec(plan, tmp_path / "plan.pt", ExportConfig(module_path="sparse_arch.ebc"))
    assert "module: sparse_arch.ebc" in text and "rank:1/cuda:1" in text and "column_wise" in text
    assert "row_wise" in text
    assert "/cpu" not in text


def test_table_names_must_be_a_pattern():
    with pytest.raises(UserError, match="table_names"):
        ExportConfig(table_names="{nope}")
    assert json.loads(json.dumps(ExportConfig().__dict__))["device"] == "cuda"


def test_a_plan_of_every_kernel_kind_exports_a_collection_per_kind_and_trains_in_dmp(tmp_path):
    """Sum, mean, weighted and sequence tables (two dims of them), split in columns and rows: the export keys a
    collection per kernel kind under the module path (bags, weighted, an EmbeddingCollection per dim), and check=true
    runs it in DistributedModelParallel on 2 gloo ranks, every output as its kernel reduces the lookups (mean, weighted,
    a row per id) exact."""
    kinds = [("sum", False, 16), ("mean", False, 8), ("sum", True, 8), ("none", False, 16), ("none", False, 8)]
    tables = [
        dataclasses.replace(make_table(20 + i, rows=60 + 10 * i, dim=d), pooling=p, weighted=w)
        for i, (p, w, d) in enumerate(kinds)
    ]
    task = make_task(tables, num_devices=2)
    shards = (
        Shard(0, 0, 8, 0),
        Shard(0, 8, 8, 1),
        Shard(1, 0, 8, 1),
        Shard(2, 0, 8, 0),
        *row_shards(3, 90, 16, [0, 1]),
        Shard(4, 0, 8, 1),
    )
    plan = dataclasses.replace(with_costs(analytic_model(task), Plan(task, shards)), searcher="test", seed=0)
    path = write_json(plan.to_json(), tmp_path / "plan.json")
    done = run_cli(
        f"plan={path}", "check=true", "check_batch_size=4", "module_path=sparse", module="neuroshard_jax.export"
    )
    assert done.returncode == 0, done.stderr
    # each rank held the plan's shards and every output matched the weight pattern (else exit 2)
    assert done.stdout.count("backward ok") == 2 and "rank 1:" in done.stdout, done.stdout
    written = export_torchrec(plan, tmp_path / "again.pt", ExportConfig(device="cpu"))[1]
    for module in ("module: bags", "module: weighted", "module: sequence_d16", "module: sequence_d8"):
        assert module in written, written
