"""Plan-level labels (``collect kind=plans``) and the loop that fine-tunes on them: perturbations stay legal plans,
selection prefers the near-best the ensemble is unsure of, a real collection on the kernel worker is resumable
and exactly-once, and a fine-tune starts from the given checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.sharding import split_counts
from neuroshard_jax.costs.cost_model import DeviceCosts
from neuroshard_jax.learn.plan_labels import (
    PERTURBATIONS,
    PlanLabelConfig,
    assignment,
    perturb,
    plan_of,
    select_variants,
    variants_of,
)
from tests.conftest import make_table, make_task


def _task(num_devices=3):
    tables = [make_table(i, rows=500 + 100 * i, dim=16 if i % 2 else 32, pooling=1.0 + i) for i in range(7)]
    return make_task(tables, num_devices=num_devices, mem_cap_gb=1.0)


@pytest.mark.fast
def test_variants_are_distinct_legal_plans_of_every_kind():
    task = _task()
    parent = plan_of(task, [(i % 3,) if i != 2 else (0, 1) for i in range(7)]).validate()
    rng = np.random.default_rng(0)
    variants = variants_of(parent, 40, rng)
    assert len(variants) == 40
    seen = {assignment(parent)[1]}
    for _, plan in variants:
        plan.validate()  # every column tiled once, in equal 2^k slices, within memory
        counts, devices = assignment(plan)
        assert devices not in seen
        seen.add(devices)
        for t, count in enumerate(counts):
            assert count in split_counts(task.tables[t].dim)
    assert {kind for kind, _ in variants} == set(PERTURBATIONS)


def test_halve_and_merge_change_one_table_by_one_level():
    task = _task()
    devices = tuple((i % 3,) for i in range(7))
    rng = np.random.default_rng(1)
    halved = next(d for d in (perturb(task, devices, "halve", rng) for _ in range(20)) if d is not None)
    changed = [t for t in range(7) if halved[t] != devices[t]]
    assert len(changed) == 1 and len(halved[changed[0]]) == 2 and halved[changed[0]][0] == devices[changed[0]][0]
    merged = perturb(task, halved, "merge", rng)
    assert [len(d) for d in merged] == [1] * 7 and merged[changed[0]][0] in halved[changed[0]]
    assert perturb(task, devices, "merge", rng) is None  # nothing to merge in a table-wise plan


def test_selection_prefers_unsure_near_best_candidates():
    config = PlanLabelConfig(variants=2, near=0.1)
    # searched plan costs 10; candidates: 0, 2 and 3 near-best (<= 11), 1 and 4 far
    plan_ms = np.array([10.5, 20.0, 10.0, 10.9, 30.0])
    searched = np.full((1, 2), 10.0)
    total = np.concatenate([searched, np.stack([plan_ms, plan_ms], 1)])
    costs = DeviceCosts(total, np.zeros_like(total), np.zeros_like(total), total)
    spread = np.array([[0.0, 0.0], [0.1, 0.1], [0.9, 0.9], [0.3, 0.2], [0.5, 0.5], [0.95, 0.1]])
    assert select_variants(config, plan_ms, spread, costs, 1, np.random.default_rng(0)) == [2, 3]
    # too few near-best: the cheapest of the rest fill up
    config = PlanLabelConfig(variants=4, near=0.1)
    assert select_variants(config, plan_ms, spread, costs, 1, np.random.default_rng(0)) == [0, 1, 2, 3]
    random = PlanLabelConfig(variants=2, select="random")
    assert len(select_variants(random, plan_ms, spread, costs, 1, np.random.default_rng(0))) == 2


@pytest.mark.parametrize(
    "field, value",
    [
        ("select", "best"),
        ("sources", ("foreign",)),
        ("num_devices", (1,)),
        ("variants", -1),
        ("searchers", ()),
        ("references", -1),
        ("references", 3),  # without a reference dataset
        ("chunk", 0),
    ],
)
def test_bad_settings_are_one_line_errors(field, value):
    with pytest.raises(UserError, match=f"plans.{field}"):
        PlanLabelConfig(**{field: value})


def test_collect_plans_measures_searched_devices_once_and_fine_tunes(tiny_ensemble, tiny_checkpoint, tmp_path):
    """Real kernels: tasks of both sources planned by two searchers with the tiny ensemble, variants selected by
    its spread, every distinct device measured once (a rerun measures nothing), each plan's all-to-all measured;
    the report compares the round's predictions with its labels; a fine-tune from the checkpoint trains on them."""
    from neuroshard_jax.core.files import read_jsonl
    from neuroshard_jax.costs.checkpoints import read_meta
    from neuroshard_jax.costs.ensemble import EnsembleConfig
    from neuroshard_jax.learn.cost_labels import CollectConfig, collect
    from neuroshard_jax.learn.ensemble_fit import train_ensemble
    from neuroshard_jax.learn.plan_labels import plan_label_report
    from neuroshard_jax.learn.trainer import TrainConfig
    from neuroshard_jax.workloads.pool import PoolSpec
    from neuroshard_jax.workloads.samplers import SpecSamplerConfig

    spec_dir, ckpt, _ = tiny_ensemble
    specs = SpecSamplerConfig(
        max_tables=3, log10_rows=(2.0, 4.0), log10_pooling=(-0.5, 1.0), dims=(8, 16), batch_sizes=(128, 256)
    )
    plans = PlanLabelConfig(
        model=str(ckpt),
        searchers=("size_greedy", "lookup_greedy"),
        num_devices=(2,),
        min_tables=4,
        max_tables=6,
        pool_mem_cap_gb=0.05,
        max_device_gib=0.05,
        candidates=6,
        variants=2,
        references=2,  # the machine's speed measured with every 6 devices (drift.py), recorded with the labels
        reference=str(spec_dir),
        chunk=6,
    )
    config = CollectConfig(
        kind="plans",
        num_samples=2,
        out_dir=str(tmp_path / "labels"),
        pool=PoolSpec(num_tables=120),
        batch_size=256,
        specs=specs,
        plans=plans,
        warmup=1,
        iters=2,
        progress=False,
        timeout_s=120,
    )
    summary = collect(config)
    rows = read_jsonl(tmp_path / "labels" / "plans.jsonl")
    assert [(r["id"], r["source"]) for r in rows] == [("0/0", "pool"), ("0/1", "specs")]
    assert all(len(r["plans"]) == 4 for r in rows)  # two searched, two variants
    devices = read_jsonl(tmp_path / "labels" / "compute.jsonl")
    assert len({d["id"] for d in devices}) == len(devices) == summary["devices_measured"] > 0
    assert all(d["ok"] and d["total_ms"] > 0 and d["round"] == 0 and d["model"] == str(ckpt) for d in devices)
    assert all(0.2 < d["speed"] < 5 and d["reference"] == str(spec_dir) for d in devices)
    from neuroshard_jax.learn.datasets import compute_batches

    target = compute_batches(tmp_path / "labels")[3]  # training takes each label at the reference's speed
    assert target == pytest.approx([d["total_ms"] / d["speed"] for d in devices], rel=1e-5)
    assert len(read_jsonl(tmp_path / "labels" / "comm.jsonl")) == 8
    again = collect(config)
    assert again["devices_measured"] == 0 and again["comm_measured"] == 0
    report = plan_label_report(tmp_path / "labels")["0"]
    assert report["plans_measured"] == 8 and report["device_error"]["all"]["devices"] >= len(devices)
    assert set(report["device_error"]) >= {"all", "size_greedy", "lookup_greedy", "searched", "variants"}

    train = TrainConfig(epochs=2, batch_size=8, progress=False)
    ens = EnsembleConfig(members=3, hidden=(8,))
    out = tmp_path / "round-1"
    result = train_ensemble([spec_dir, tmp_path / "labels"], ens, train, out, "r1", "test", init=ckpt)
    meta = read_meta(out)
    assert meta["fine_tuned_from"] == str(ckpt) and "labels" in result["compute"]
    assert json.loads((tmp_path / "labels" / "manifest-compute.json").read_text())["rounds"]["0"]["tasks"] == 2


def test_loop_refuses_base_datasets_of_another_kind_of_hardware_before_measuring(tmp_path):
    """The loop's labels join its base datasets in training, which refuses another kind of hardware: the loop says
    so before its first measurement (a shipped dataset of this name but of another microarchitecture included)."""
    from neuroshard_jax.core.files import write_json
    from neuroshard_jax.core.hardware import hardware
    from neuroshard_jax.learn.feedback_loop import LoopConfig, check_base_hardware, run_loop

    base = tmp_path / "base"
    here = hardware()
    write_json(
        {"hardware": {**here, "cpu_id": "SomeVendor family 9 model 99"}, "settings": {"device": "cpu"}},
        base / "manifest-compute.json",
    )
    with pytest.raises(UserError, match=r"base_datasets: '.*base' was measured on .*family 9 model 99\], this machine"):
        run_loop(LoopConfig(out=str(tmp_path / "loop"), base_datasets=(str(base),)))
    assert not (tmp_path / "loop").exists()  # nothing measured, nothing written
    write_json({"hardware": here, "settings": {"device": "cpu"}}, base / "manifest-compute.json")
    check_base_hardware((str(base),), "cpu")  # this machine's own kind passes
