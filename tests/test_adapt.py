"""``adapt``: a model of this machine from a small budget of real labels, fine-tuned, reported and registered."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging

import pytest

from neuroshard_jax.core.errors import UserError


def small_config(tmp_path, **changes):
    """Tiny spec shards at a batch size the shipped models know, a short plan phase and a short fine-tune."""
    from neuroshard_jax.kernels.executors import ExecutorConfig
    from neuroshard_jax.learn.adapt import AdaptConfig
    from neuroshard_jax.learn.plan_labels import PlanLabelConfig
    from neuroshard_jax.learn.trainer import TrainConfig
    from neuroshard_jax.workloads.samplers import CommSamplerConfig, SpecSamplerConfig

    specs = SpecSamplerConfig(max_tables=3, log10_rows=(2.0, 4.0), log10_pooling=(-0.5, 1.0), batch_sizes=(2048,))
    plans = PlanLabelConfig(
        searchers=("grid",), sources=("specs",), num_devices=(2,), min_tables=4, max_tables=5, candidates=2, variants=1
    )
    settings = dict(
        budget_min=1.0,
        start="xeon-union",
        name="adapted-test",
        out=str(tmp_path / "run"),
        plan_share=0.3,
        specs=specs,
        plans=plans,
        executor=ExecutorConfig(workers=1),
        pin=False,
        warmup=1,
        iters=2,
        finetune=TrainConfig(epochs=3, learning_rate=1e-3, progress=False),
        progress=False,
        input_labels=5,
        inputs=CommSamplerConfig(world_sizes=(2,), input_share=1.0),
    )
    return AdaptConfig(**{**settings, **changes})


def test_adapt_measures_fine_tunes_reports_and_registers_a_model_later_runs_choose(tmp_path, monkeypatch, caplog):
    from neuroshard_jax.core.files import read_records
    from neuroshard_jax.core.hardware import hardware, hardware_kind
    from neuroshard_jax.costs import registry
    from neuroshard_jax.learn.adapt import adapt, is_heldout

    monkeypatch.setenv("NEUROSHARD_CACHE_DIR", str(tmp_path / "cache"))  # this test's user, no other test's
    config = small_config(tmp_path)
    caplog.set_level(logging.INFO, logger="neuroshard_jax.learn.adapt")  # what it does and the held-out table
    report = adapt(dataclasses.replace(config, optimizer="EXACT_ROWWISE_ADAGRAD"))  # TorchRec's name is taken too
    config = dataclasses.replace(config, optimizer="exact_row_wise_adagrad")
    lines = caplog.messages
    labels = report["labels"]
    assert labels["train"] >= config.min_labels and labels["heldout"] >= 2 and labels["plan_devices"] > 0
    specs = read_records(tmp_path / "run" / "labels" / "specs" / "compute.jsonl")
    assert {r["id"] for r in specs if is_heldout(config, r["id"])}  # held out by id, apart from the training split
    held = [json.loads(x) for x in (tmp_path / "run" / "split" / "heldout" / "compute.jsonl").read_text().splitlines()]
    trained = (tmp_path / "run" / "split" / "train" / "compute.jsonl").read_text()
    assert held and all(f'"id": {r["id"]},' not in trained for r in held)
    rows = report["heldout"]
    assert set(rows) == {"xeon-union as it was", "xeon-union x one factor", "adapted-test"}
    for row in rows.values():
        assert 0 <= row["mape"] < 10 and -1 <= row["kendall_tau"] <= 1 and row["count"] == labels["heldout"]
    assert any(line.startswith("held out:") for line in lines) and any("adapted-test" in line for line in lines)
    # registered: chosen for this machine, named in the line as the user's, usable by name
    here = hardware_kind(hardware())
    meta = json.loads((tmp_path / "cache" / "models" / "adapted-test" / "meta.json").read_text())
    assert here in meta["hardware_kinds"] and meta["adapt"]["heldout"] == rows and meta["reanchored"]
    # its labels ran the optimizer asked for: every spec label and every plan's device, and the model says so
    for stage in ("specs", "plans"):
        manifest = json.loads((tmp_path / "run" / "labels" / stage / "manifest-compute.json").read_text())
        assert manifest["settings"]["optimizer"] == "exact_row_wise_adagrad", stage
    assert meta["optimizer"] == "exact_row_wise_adagrad"
    choice = registry.choose_cost_model("neural")
    assert choice.name == "adapted-test" and choice.matches and "(yours, made by adapt)" in choice.line()
    assert choice.line().endswith("with exact_row_wise_adagrad")
    from tests.conftest import make_table, make_task

    task = make_task([make_table(0), make_table(1)], batch_size=4096)
    assert registry.make_cost_model("adapted-test", task).name == "neural"
    # TorchRec's input distribution, measured on real gloo ranks and fitted: this user's fit, which models of this
    # kind price with before any shipped fit of it
    from neuroshard_jax.costs.input_dist import for_kinds, load

    fitted = report["input_dist"]
    mine = load(fitted["path"])
    assert fitted["sizes"] == [2] and mine.kind == here and for_kinds([here]) == mine
    assert registry.make_cost_model("adapted-test", task).input_dist == mine
    assert any(line.startswith("input distribution:") for line in lines)
    # resumable: a rerun spends no more measuring time than the budget's and keeps every label
    again = adapt(config)
    assert again["labels"] == labels
    assert len(read_records(tmp_path / "run" / "labels" / "specs" / "compute.jsonl")) == len(specs)


def test_the_measuring_order_is_fixed_by_the_seed_and_mixes_covering_and_uncertain_picks(tmp_path):
    from neuroshard_jax.costs.registry import checkpoint_path
    from neuroshard_jax.learn.adapt import UNCERTAIN_IDS, spec_order

    config = small_config(tmp_path)
    first = list(itertools.islice(spec_order(config, checkpoint_path("xeon-union"), set()), 12))
    assert first == list(itertools.islice(spec_order(config, checkpoint_path("xeon-union"), set()), 12))
    covering = [i for i in first if i < UNCERTAIN_IDS]
    assert covering == list(range(6)) and len(set(first)) == 12
    none = small_config(tmp_path, uncertain_share=0.0)
    assert list(itertools.islice(spec_order(none, checkpoint_path("xeon-union"), set()), 5)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"budget_min": 0}, "budget_min: got 0"),
        ({"uncertain_share": 1.0}, "uncertain_share: got 1.0"),
        ({"name": "xeon-union"}, "name: got 'xeon-union', which is a shipped model's"),
        ({"name": "../x"}, "name: got '../x', expected letters"),
        ({"device": "tpu"}, "device: got 'tpu'"),
        ({"optimizer": "adam"}, "optimizer: adam does not run on FBGEMM's CPU kernels, expected one of exact_sgd"),
        ({"protocol": "graphs"}, "protocol: got 'graphs', expected one of fixed, timed, queued, graph"),
        ({"protocol": "graph"}, "protocol: got 'graph' with device=cpu, expected device=cuda"),
    ],
)
def test_bad_settings_get_one_line(tmp_path, changes, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(".", r"\.")):
        small_config(tmp_path, **changes)


def test_a_start_or_comparison_that_is_no_ensemble_and_a_missing_gpu_are_refused_before_measuring(tmp_path):
    from neuroshard_jax.learn.adapt import adapt, check_device

    with pytest.raises(UserError, match="start: no model at"):
        adapt(small_config(tmp_path, start=str(tmp_path / "nothing")))
    with pytest.raises(UserError, match="start: 'cpu-b4096' is not a physics ensemble"):
        adapt(small_config(tmp_path, start="cpu-b4096"))
    with pytest.raises(UserError, match="compare: no model at"):
        adapt(small_config(tmp_path, compare=("no-such-model",)))
    assert not (tmp_path / "run").exists()  # nothing measured, nothing written
    with pytest.raises(UserError, match="device: got 'cuda', but nvidia-smi finds no GPU"):
        check_device("cuda", {"cpu": "AMD EPYC"})
    check_device("cuda", {"cpu": "AMD EPYC", "gpu": "NVIDIA H200"})
