"""The sealed benchmark's tasks: deterministic, 4 and 8 devices, measurable here, public datasets' published shapes,
and drawn by code and seeds of its own (none of the training sampler's, the pool's or the foreign benchmark's)."""

from __future__ import annotations

import ast

import numpy as np
import pytest

from tools import foreign_benchmark as fb
from tools import sealed_benchmark as sb

from .conftest import REPO

# modules that draw tables or index streams for training and for the foreign benchmark
DRAWING = (
    "neuroshard_jax/workloads/samplers.py",
    "neuroshard_jax/workloads/pool.py",
    "neuroshard_jax/workloads/statistics.py",
    "neuroshard_jax/workloads/builders.py",
    "neuroshard_jax/workloads/gpu_tasks.py",
    "neuroshard_jax/workloads/streams.py",
    "tools/foreign_benchmark.py",
)
SEALED_SOURCE = REPO / "tools" / "sealed_benchmark.py"


@pytest.fixture(scope="module")
def tasks():
    return sb.generate_tasks()


def test_generation_is_deterministic_and_spans_4_and_8_devices(tasks):
    again = sb.generate_tasks()
    assert [(i, f, t.to_json()) for i, f, t in tasks] == [(i, f, t.to_json()) for i, f, t in again]
    assert len(tasks) >= 20 and len({i for i, _, _ in tasks}) == len(tasks)
    sizes = [t.num_devices for _, _, t in tasks]
    assert sizes.count(4) == sizes.count(8) == sb.TASKS_PER_SIZE
    # every family at both sizes, ids as the stages expect (d<devices>-<index>)
    assert {(f, t.num_devices) for _, f, t in tasks} == {(f, n) for f in sb.FAMILIES for n in (4, 8)}
    assert all(i.startswith(f"d{t.num_devices}-") for i, _, t in tasks)


def test_every_task_is_measurable_here_and_roomy_for_torchrec(tasks):
    for task_id, _, task in tasks:
        assert 12 <= task.num_tables <= 120, task_id
        assert task.batch_size == sb.BATCH_SIZE
        cap = task.devices[0].mem_cap_gb
        assert all(d.mem_cap_gb == cap for d in task.devices)
        assert cap <= sb.MAX_DEVICE_GIB, task_id
        gib = [t.rows * t.dim * 4 / 2**30 for t in task.tables]
        # the roomy rule: every table fits a device with room, and the devices hold 2.5x the tables
        assert cap >= 1.5 * max(gib) - 0.01 and cap * task.num_devices >= 2.5 * sum(gib) - 0.05, task_id
        assert all(t.rows <= sb.ROW_CAP and 4 <= t.dim <= 128 for t in task.tables)
        assert all(abs(sum(t.bins) - 1) < 1e-3 for t in task.tables)


def test_public_families_have_the_published_cardinalities_and_feature_counts(tasks):
    assert len(sb.CRITEO_KAGGLE) == len(sb.CRITEO_TERABYTE) == 26 and len(sb.AVAZU) == 22
    # checksums of the transcribed figures: Kaggle's rows in all, MLPerf DLRM-DCNv2's lookups per sample
    assert sum(f.rows for f in sb.CRITEO_KAGGLE) == 33_762_577
    assert sum(f.pooling for f in sb.CRITEO_TERABYTE) == 214
    public = [(i, f, t) for i, f, t in tasks if f in sb.PUBLIC]
    assert {f for _, f, _ in public} == set(sb.PUBLIC)
    for task_id, family, task in public:
        fields = sb.PUBLIC[family]
        assert [t.name for t in task.tables] == [f"{family}.{f.name}" for f in fields], task_id
        # hashed into at most one row cap over the task (the fit), else the published cardinality
        cap = max(t.rows for t in task.tables)
        assert [t.rows for t in task.tables] == [min(f.rows, cap) for f in fields], task_id
        for table, field in zip(task.tables, fields):
            if family == "alibaba_display_ad" and field.name.startswith("hist_"):
                assert 20 <= table.pooling_factor <= 50  # behaviour sequences, at most 50
            else:
                assert table.pooling_factor == pytest.approx(field.pooling), (task_id, field.name)


def test_access_law_counts_every_lookup_and_spans_uniform_to_steep():
    rng = np.random.default_rng(0)
    for rows, lookups, skew in ((1000, 400_000, 0.0), (10**7, 4096, 1.0), (10**6, 40_000, 1.3), (5, 4096, 0.8)):
        counts = sb.power_law_counts(rng, rows, lookups, skew, 0.0)
        assert counts.sum() == lookups and len(counts) <= rows and (counts > 0).all()
    uniform = sb.power_law_counts(rng, 1000, 400_000, 0.0, 0.0)
    assert len(uniform) == 1000 and uniform.max() < 1.25 * 400  # every row, about evenly
    steep = sb.power_law_counts(rng, 1000, 400_000, 1.5, 0.0)
    assert steep.max() > 0.3 * 400_000  # rank 1 takes ~38% (1 / zeta(1.5) over 1000 ranks)
    missing = sb.power_law_counts(rng, 10**7, 100_000, 1.0, 0.8)
    assert missing.max() >= 0.79 * 100_000  # the missing value's row


@pytest.mark.fast
def test_the_cache_gives_back_the_generated_tasks(tmp_path, tasks):
    suite = fb.Suite("cached", lambda: tasks, sb.BASE_SEED, str(tmp_path))  # the stages' cache of a suite's tasks
    written = suite.tasks(tmp_path / "tasks.json")
    read = fb.Suite("cached", list, sb.BASE_SEED, str(tmp_path)).tasks(tmp_path / "tasks.json")
    assert [(i, f, t.to_json()) for i, f, t in read] == [(i, f, t.to_json()) for i, f, t in written]
    assert sb.SEALED.out == "outputs/bench/sealed" and sb.SEALED.base_seed == sb.BASE_SEED


@pytest.mark.fast
def test_a_fresh_sealed_set_draws_the_same_families_with_seeds_of_its_own():
    first = sb.sealed_task("avazu", 4, 0)
    fresh = sb.sealed_task("avazu", 4, 0, seal=1)
    assert first.to_json() == sb.sealed_task("avazu", 4, 0, seal=0).to_json()  # set 0 as it was drawn
    assert fresh.to_json() == sb.sealed_task("avazu", 4, 0, seal=1).to_json()  # deterministic
    assert fresh.to_json()["tables"] != first.to_json()["tables"]
    assert sb.sealed_suite(1).out == "outputs/bench/sealed-1" and sb.sealed_suite(0) is sb.SEALED
    assert sb.seal_of(["--seal", "1", "plan", "--tasks", "4"]) == (1, ["plan", "--tasks", "4"])
    assert sb.seal_of(["report"]) == (0, ["report"])


def _int_literals(path) -> set[int]:
    tree = ast.parse((REPO / path).read_text())
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and type(n.value) is int}


@pytest.mark.fast
def test_its_seeds_are_its_own():
    others = set().union(*(_int_literals(p) for p in DRAWING))
    assert sb.BASE_SEED not in others
    # the others' seed words (samplers 31337, 60013, 4099; tasks 104729, 7919; GPU tasks 54054) are not used here
    assert not {31337, 60013, 4099, 104729, 7919, 54054, fb.BASE_SEED} & _int_literals(SEALED_SOURCE)
    # and every generator it makes is seeded from its own base seed
    tree = ast.parse(SEALED_SOURCE.read_text())
    seeded = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "default_rng"]
    assert seeded and all(ast.unparse(n.args[0]).startswith("[BASE_SEED") for n in seeded)


@pytest.mark.fast
def test_it_imports_no_table_drawing_code():
    tree = ast.parse(SEALED_SOURCE.read_text())
    imported = {
        (node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    assert not any(module.startswith("neuroshard_jax.workloads") for module, _ in imported)
    # of the foreign benchmark, its stages only: not its generators, caps or fit
    assert {name for module, name in imported if module == "tools.foreign_benchmark"} <= {"Suite", "main"}
    plain = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not any(name.startswith(("neuroshard_jax", "tools", "searchers")) for name in plain)
    text = SEALED_SOURCE.read_text()
    for name in ("sample_spec_shard", "draw_table_spec", "SpecSamplerConfig", "zipf_ids", "synthetic_table_params"):
        assert name not in text


def test_the_sequence_tradeoff_prices_row_blocks_of_the_heaviest_devices_sequence_tables(tmp_path, capsys):
    """``tools.sequence_tradeoff``: a plan with a sequence table whole on its device, priced by the shipped kinds
    model beside the same plan with that table in 2 and 4 row blocks; every variant holds every row of every table,
    and a row-wise cut divides the distinct rows, so the slowest device's compute falls."""
    import json

    from neuroshard_jax.core.plan import Plan
    from neuroshard_jax.core.sharding import Shard
    from neuroshard_jax.core.table import Table
    from neuroshard_jax.core.task import Task
    from neuroshard_jax.costs.choice import build_cost_model, spec_of
    from tools import sequence_tradeoff as st

    bins = tuple([0.9, 0.1] + [0.0] * 15)
    tables = (
        Table(0, 900_000, 16, 12.0, bins, pooling="none", name="history"),
        Table(1, 5_000, 16, 1.0, bins, name="user"),
        Table(2, 20_000, 8, 4.0, bins, name="tags"),
    )
    task = Task.uniform(4, 1.0, 4096, tables)
    plan = Plan(task, (Shard(0, 0, 16, 0), Shard(1, 0, 16, 1), Shard(2, 0, 8, 2)))
    rows = tmp_path / "plans.jsonl"
    row = {"id": "t/portfolio", "task": "t", "searcher": "portfolio", "plan": plan.to_json()}
    rows.write_text(json.dumps(row) + "\n")
    out = tmp_path / "tradeoff.json"
    assert st.main(["--plans", str(rows), "--checkpoint", "epyc-f26m2-kinds", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())["tasks"]["t"]
    assert set(figures) == {"portfolio", "history in 2 row blocks", "history in 4 row blocks"}
    whole = figures["portfolio"]["compute_ms"]
    assert all(figures[f"history in {k} row blocks"]["compute_ms"] < whole for k in (2, 4))
    assert "history in 4 row blocks" in capsys.readouterr().out
    model = build_cost_model(spec_of("epyc-f26m2-kinds"), task)[0]
    for _, variant in st.row_variants(model, plan):
        held = sorted((s.row_offset, s.rows(900_000)) for s in variant.shards if s.table == 0)
        assert sum(n for _, n in held) == 900_000 and held[0][0] == 0
        assert {s.table for s in variant.shards} == {0, 1, 2}
    assert st.main(["--plans", str(rows), "--checkpoint", "epyc-f26m2-kinds", "--task", "nope"]) == 2
    assert "no plan of task 'nope'" in capsys.readouterr().err
