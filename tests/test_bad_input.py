"""Bad input and faults, class by class: each is one ``error:`` line (exit 2, no traceback) or is accepted for a
stated reason; nothing already written is lost or modified. In-process where a subprocess start is not the point."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.choice import CostModelSpec
from searchers import make_searcher
from tests.conftest import REPO, make_table, make_task, run_cli

SHIPPED = REPO / "neuroshard_jax" / "data" / "models" / "xeon-union"


def _one_line(message: str, *fragments: str) -> None:
    assert "\n" not in message.strip() and "Traceback" not in message, message
    for f in fragments:
        assert f in message, message


def _exit_2(capsys, call, *fragments: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        call()
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: "), err
    _one_line(err, *fragments)


# --- 1. a valid task with a huge memory cap -------------------------------------------------------------------


@pytest.mark.parametrize("searcher", ["beam", "grid", "rl"])
def test_a_cap_of_terabytes_is_planned(searcher):
    """Caps of 2 TiB and more (host memory, offloaded tables) overflowed the i32 memory units; the units now
    grow with the task, so the plan is the one a 1 TiB cap gives (memory never binds in either)."""
    from neuroshard_jax.search.pipeline import search_plan

    tables = [make_table(i, rows=1000 * (i + 1), dim=16 * (1 + i % 2), pooling=2.0 + i) for i in range(8)]
    plans = []
    for cap in (1024.0, 4096.0, 10.0**6):
        task = make_task(tables, num_devices=3, mem_cap_gb=cap, batch_size=4096 if searcher == "rl" else 512)
        model = "neural" if searcher == "rl" else "analytic"
        plans.append(search_plan(task, make_searcher(searcher), CostModelSpec(model).for_task(task), 0).validate())
    assert plans[0].shards == plans[1].shards == plans[2].shards


def test_memory_units_stay_within_int32_and_round_safely():
    from searchers.grid import MAX_UNITS, cap_units, mem_units, unit_bytes

    task = make_task([make_table(0, rows=10**9, dim=128)], num_devices=2, mem_cap_gb=2.0**20)  # 1 PiB per device
    unit = unit_bytes(task)
    assert unit > 1024 and cap_units(task.largest_cap_bytes, unit) < MAX_UNITS
    assert mem_units(task.table_mem_bytes(0), unit) * unit >= task.table_mem_bytes(0)  # a shard rounds up
    assert cap_units(task.largest_cap_bytes, unit) * unit <= task.largest_cap_bytes  # the cap rounds down
    assert unit_bytes(make_task([make_table(0)], mem_cap_gb=4.0)) == 16  # the finest unit that keeps 4 GiB in range
    assert unit_bytes(make_task([make_table(0, rows=100)], mem_cap_gb=0.25)) == 1


def test_thousands_of_tiny_tables_take_their_bytes_not_a_unit_each():
    """3,000 tables of 48 bytes (with their step buffers, ~250 B each) on 4 devices of 1 MiB: 0.73 MiB of tables
    per device fit beside each device's batch slice; counted in 1 KiB units (2.9 MiB) they were refused."""
    import warnings

    import neuroshard_jax as nsj

    tables = [{"rows": 3, "dim": 4, "pooling_factor": 1.0} for _ in range(3000)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # estimated statistics: no data for these tables
        for searcher in ("beam", "grid"):
            settings = dict(num_devices=4, mem_cap_gb=2**-10, batch_size=8, cost_model="analytic")
            plan = nsj.plan(tables, searcher=searcher, **settings)
            assert max(m.total for m in plan.memory()) <= plan.task.room_bytes().max()


# --- 2. overrides: every one type-checked before any work (the rest are in test_cli) ---------------------------


@pytest.mark.fast
@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["task.path=some_task.json", "seed=abc"], "seed: got 'abc', expected an integer"),
        (["task.num_devices=2.5"], "task.num_devices: got 2.5, expected an integer"),
        (["task.num_tables=-3"], "task.num_tables"),
        (["task.batch_size=abc"], "task.batch_size: got 'abc', expected an integer"),
        # bounded as in a task file (2**40 asked numpy for 8 TiB)
        (["task.batch_size=1099511627776"], "task.batch_size: got 1099511627776, expected an integer >= 1 and <="),
        (["task.num_devices=100000"], "task.num_devices: got 100000, expected an integer >= 1 and <= 4096"),
        (["searcher=grid", "searcher.alphas=[0.5]"], "searcher.alphas"),
        (["calibrate=measured", "calibrate.samples=0"], "calibrate.samples: got 0"),
        (["cost_model.calibration=-1"], "cost_model.calibration: got -1"),
    ],
)
def test_overrides_are_checked_before_any_work(capsys, argv, fragment):
    from neuroshard_jax.core.cli import check_command_line
    from neuroshard_jax.search.job import main_config

    _exit_2(capsys, lambda: check_command_line("config", argv, main_config), fragment)


@pytest.mark.fast
@pytest.mark.parametrize(
    "app, argv, fragment",
    [
        ("collect", ["num_samples=-1"], "num_samples: got -1, expected an integer >= 1"),
        ("collect", ["warmup=-2"], "warmup: got -2"),
        ("collect", ["comm.row_share=2"], "comm.row_share: got 2, expected a finite number >= 0 and <= 1"),
        ("collect", ["comm.world_sizes=[1,4]"], "comm.world_sizes[0]: got 1, expected an integer >= 2"),
        ("collect", ["specs.row_share=-1"], "specs.row_share: got -1, expected a finite number >= 0 and <= 1"),
        ("train", ["family=mlp", "init=xeon-union"], "init: got 'xeon-union', but only family=ensemble fine-tunes"),
        ("train", ["train.epochs=0"], "train.epochs: got 0, expected an integer >= 1"),
        ("train", ["train.split=[0.5,0.5,0.5]"], "train.split"),
        ("train", ["train.learning_rate=0"], "train.learning_rate: got 0, expected a finite number > 0"),
    ],
)
def test_app_settings_are_checked(capsys, app, argv, fragment):
    from neuroshard_jax.core.cli import check_command_line
    from neuroshard_jax.learn.cost_labels import config_from as collect_config
    from neuroshard_jax.train import app_config as train_config

    validate = {"collect": collect_config, "train": train_config}[app]
    _exit_2(capsys, lambda: check_command_line(app, argv, validate), fragment)


# --- 3. damaged or mismatched checkpoints ------------------------------------------------------------------


def _truncate_a_tensor_file(path):
    blobs = sorted((path / "state" / "ocdbt.process_0" / "d").iterdir(), key=lambda p: -p.stat().st_size)
    blobs[0].write_bytes(blobs[0].read_bytes()[:40])


def _garble_a_tensor_file(path):
    blobs = sorted((path / "state" / "ocdbt.process_0" / "d").iterdir(), key=lambda p: -p.stat().st_size)
    data = bytearray(blobs[0].read_bytes())
    data[len(data) // 3 : len(data) // 3 + 64] = b"\xff" * 64
    blobs[0].write_bytes(bytes(data))


def _truncate_meta(path):
    text = (path / "meta.json").read_text()
    (path / "meta.json").write_text(text[: len(text) // 2])


def _truncate_metadata(path):
    target = path / "state" / "_METADATA"
    target.write_text(target.read_text()[:30])


def _other_net_config(path):
    meta = json.loads((path / "meta.json").read_text())
    meta["net_config"]["hidden"] = [32, 32]
    (path / "meta.json").write_text(json.dumps(meta))


def _no_net_config(path):
    meta = json.loads((path / "meta.json").read_text())
    del meta["net_config"]["members"]
    (path / "meta.json").write_text(json.dumps(meta))


def _no_comm_nets(path):
    meta = json.loads((path / "meta.json").read_text())
    del meta["datasets"]["comm"]
    (path / "meta.json").write_text(json.dumps(meta))


def _state_removed(path):
    shutil.rmtree(path / "state")


@pytest.mark.fast
@pytest.mark.parametrize(
    "damage, fragment",
    [
        (_truncate_a_tensor_file, "could not be restored (a tensor file could not be read: torn or garbled)"),
        (_garble_a_tensor_file, "could not be restored ("),  # a digest mismatch or a decode error: where it lands
        (_truncate_meta, "meta.json' could not be read"),
        (_truncate_metadata, "could not be restored (its _METADATA is not valid JSON (Unterminated string"),
        (_other_net_config, "could not be restored (an array saved ("),  # which array orbax names first varies
        (_no_net_config, "has no valid net_config"),
        (_no_comm_nets, "has no trained comm nets"),
        (_state_removed, "could not be restored (it or one of its files is missing)"),
    ],
)
def test_a_damaged_checkpoint_is_one_line(tmp_path, damage, fragment):
    from neuroshard_jax.costs.choice import make_cost_model

    path = tmp_path / "ckpt"
    shutil.copytree(SHIPPED, path)
    damage(path)
    task = make_task([make_table(0), make_table(1)], batch_size=4096)
    with pytest.raises(UserError) as err:
        make_cost_model("neural", task, {"checkpoint": str(path)})
    _one_line(str(err.value), "cost_model.checkpoint", "ckpt", fragment)
    assert not any(noise in str(err.value) for noise in ("<bound method", "TensorStore", "strict=False"))


def test_a_damaged_checkpoint_on_the_command_line(tmp_path):
    """End to end: exit 2, the one line, no traceback."""
    path = tmp_path / "ckpt"
    shutil.copytree(SHIPPED, path)
    _truncate_a_tensor_file(path)
    done = run_cli(f"cost_model.checkpoint={path}", "task.num_tables=8", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cost_model.checkpoint"), done.stderr


# --- 4. outputs that cannot be written ---------------------------------------------------------------------


def test_after_a_failed_restore_only_closed_loop_reports_are_dropped(monkeypatch):
    import sys
    import threading
    import types

    from neuroshard_jax.costs import checkpoints

    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: seen.append(value))
    monkeypatch.setattr(sys, "unraisablehook", lambda report: seen.append(report.exc_value))
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    checkpoints._drop_closed_loop_reports()
    closed, other = RuntimeError("Event loop is closed"), RuntimeError("a real fault")
    for exc in (closed, other):
        sys.excepthook(RuntimeError, exc, None)
        sys.unraisablehook(types.SimpleNamespace(exc_value=exc, object=None))
        threading.excepthook(types.SimpleNamespace(exc_value=exc))
    assert seen == [other] * 3
    # a coroutine of orbax's collected unawaited after a failed read reports its read's error: dropped; another's not
    space: dict = {}
    exec(compile("async def read(): pass", "/site-packages/orbax/checkpoint/reads.py", "exec"), space)
    exec(compile("async def mine(): pass", "/home/me/train.py", "exec"), space)
    orbax_read, mine = space["read"](), space["mine"]()
    read_error = ValueError("Encountered error while reading array index")
    sys.unraisablehook(types.SimpleNamespace(exc_value=read_error, object=orbax_read))
    sys.unraisablehook(types.SimpleNamespace(exc_value=read_error, object=mine))
    orbax_read.close()
    mine.close()
    assert seen == [other] * 3 + [read_error]


def test_an_output_folder_that_cannot_be_written_is_refused_before_work(tmp_path, capsys):
    from neuroshard_jax.core.cli import check_output_folder

    (tmp_path / "a_file").write_text("x")
    _exit_2(capsys, lambda: check_output_folder([f"hydra.run.dir={tmp_path / 'a_file' / 'run'}"]), "a_file", "folder")
    _exit_2(capsys, lambda: check_output_folder(["-m", f"hydra.sweep.dir={tmp_path / 'a_file'}"]), "hydra.sweep.dir")
    check_output_folder([f"hydra.run.dir={tmp_path / 'new' / 'deeper'}"])  # made later by Hydra: fine
    assert not (tmp_path / "new").exists()


def test_a_result_that_cannot_be_written_is_kept(tmp_path, capsys, monkeypatch):
    import tempfile

    from neuroshard_jax.__main__ import keep_result

    (tmp_path / "spare").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "spare"))
    (tmp_path / "a_file").write_text("x")
    result = {"searcher": "beam", "shards": [1, 2, 3]}
    _exit_2(capsys, lambda: keep_result(result, tmp_path / "a_file" / "plan.json"), "the result is in")
    assert (tmp_path / "a_file").read_text() == "x"
    [spare] = (tmp_path / "spare").glob("neuroshard-plan-*.json")
    assert json.loads(spare.read_text()) == result


# --- 5. readers of torn or corrupt files -------------------------------------------------------------------


def test_jsonl_readers_name_the_file_and_line_and_never_modify_a_read_dataset(tmp_path, caplog):
    from neuroshard_jax.core.files import JsonlLog, read_jsonl

    path = tmp_path / "compute.jsonl"
    good = b'{"id": 0, "ok": true}\n{"id": 1, "ok": true}\n'
    path.write_bytes(good + b'{"id": 2, "o')
    assert [r["id"] for r in read_jsonl(path)] == [0, 1]
    assert path.read_bytes() == good + b'{"id": 2, "o'  # a read-only use leaves the file as it is
    assert "torn last line" in caplog.text and caplog.records[-1].levelname == "WARNING"
    caplog.clear()
    JsonlLog(path)  # a writer cuts the torn line before appending, and says so
    assert path.read_bytes() == good and "dropped a torn last line" in caplog.text
    path.write_bytes(b'{"id": 0}\nnot json\n{"id": 2}\n')
    with pytest.raises(UserError, match="line 2 is not a JSON record"):
        read_jsonl(path)
    with pytest.raises(UserError, match="line 2 is not a JSON record"):
        list(JsonlLog(path).records())


@pytest.mark.parametrize(
    "content, fragment",
    [
        ('{"searcher": "beam", "task": {"num_dev', "line 1 is not valid JSON"),
        ("[1, 2]", "holds a JSON list"),
        ("", "line 1 is not valid JSON"),
    ],
)
def test_a_torn_plan_file_is_one_line(tmp_path, content, fragment):
    from neuroshard_jax.core.plan_file import load_plan

    (tmp_path / "plan.json").write_text(content)
    with pytest.raises(UserError) as err:
        load_plan(tmp_path / "plan.json")
    _one_line(str(err.value), "plan.json", fragment)


@pytest.mark.fast
def test_compare_reports_a_torn_plan_and_counts_a_bare_infeasible_record(tmp_path):
    from neuroshard_jax.measure.searcher_comparison import CompareConfig, compare_sweep
    from neuroshard_jax.search.pipeline import search_plan

    task = make_task([make_table(i, rows=1000 + i) for i in range(4)], num_devices=2)
    for name, searcher in (("0", "random"), ("1", "size_greedy")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "plan.json").write_text(
            json.dumps(
                search_plan(task, make_searcher(searcher), CostModelSpec("analytic").for_task(task), 0).to_json()
            )
        )
    (tmp_path / "2" / ".hydra").mkdir(parents=True)
    (tmp_path / "2" / ".hydra" / "overrides.yaml").write_text("- searcher=beam\n")
    (tmp_path / "2" / "plan.json").write_text(json.dumps({"infeasible": "no split fits"}))
    assert "beam" in compare_sweep(CompareConfig(sweep=str(tmp_path), out=str(tmp_path / "report")))
    summary = json.loads((tmp_path / "report" / "compare.json").read_text())
    rows = [r for table in summary.values() for r in table.get("rows", [])] if isinstance(summary, dict) else []
    assert any(r["label"] == "beam" and r["infeasible"] == 1 for r in rows), summary
    (tmp_path / "1" / "plan.json").write_text('{"searcher": "size_greedy", "task": {')
    with pytest.raises(UserError) as err:
        compare_sweep(CompareConfig(sweep=str(tmp_path)))
    _one_line(str(err.value), "plan:", "1/plan.json", "not valid JSON")


# --- 6. bad input that used to be accepted silently ----------------------------------------------------------


def _task_json(**changes):
    obj = make_task([make_table(0), make_table(1)]).to_json()
    for key, value in changes.items():
        if key.startswith("table_"):
            obj["tables"][0][key.removeprefix("table_")] = value
        else:
            obj[key] = value
    return obj


@pytest.mark.fast
@pytest.mark.parametrize(
    "obj, fragment",
    [
        (_task_json(num_device=3), "task.num_device: unknown key, did you mean 'num_devices'?"),
        (_task_json(table_pooling_factr=3.0), "tables[0].pooling_factr: unknown key, did you mean 'pooling_factor'?"),
        (_task_json(table_pooling="max"), "tables[0].pooling: got 'max', expected one of sum, mean, none"),
        (_task_json(table_pooling="none", table_weighted=True), "tables[0].pooling: 'none' (sequence) with weighted"),
        (_task_json(table_bins=[1.0] * 5 + [0.0] * 12), "tables[0].bins: the shares sum to 5"),
        (_task_json(table_bins=[0.0] * 17), "tables[0].bins: the shares sum to 0, expected 1"),
        (_task_json(table_bins=[0.0] * 17, table_pooling_factor=0.0, num_devices="2"), "task.num_devices: got '2'"),
        # the search's arrays grow with the devices: refused before anything is allocated (100,000 grew past 12 GB)
        (_task_json(num_devices=100_000), "task.num_devices: got 100000, expected an integer >= 1 and <= 4096"),
        (_task_json(devices=[{"mem_cap_gb": 1.0}] * 5000), "task.devices: got 5000 devices, expected at most 4096"),
        (_task_json(table_id=1), "tables[1].id: got 1, expected ids unique within a task"),
        # what sizes arrays and byte counts: bounded before anything is sampled (these ended in OverflowError)
        (_task_json(table_rows=10**30), "tables[0].rows: got 1" + "0" * 30 + ", expected an int"),
        (_task_json(table_pooling_factor=1e300), "tables[0].pooling_factor: got 1e+300, expected a finite number >= 0"),
        (_task_json(table_dim=2**40), "tables[0].dim: got 1099511627776, expected an integer >= 1 and <= 65536"),
        (_task_json(batch_size=2**62), "task.batch_size: got 4611686018427387904, expected an int"),
    ],
)
def test_a_bad_task_file_is_one_line(obj, fragment):
    with pytest.raises(UserError) as err:
        Task.from_json(obj)
    _one_line(str(err.value), fragment)


def test_accepted_task_files():
    """Shares summing to 1 within 0.01 (rounded by hand) are planned with; an unused table (pooling factor 0) may
    have no histogram; a whole plan.json is a task file; ``size`` is written for readers and ignored."""
    bins = [round(1 / 17, 3)] * 17  # 0.059 x 17 = 1.003
    Task.from_json(_task_json(table_bins=bins))
    Task.from_json(_task_json(table_bins=[0.0] * 17, table_pooling_factor=0.0))
    assert Task.from_json(_task_json(table_size=123)).tables[0].rows == 1000
    unnumbered = _task_json()
    for table in unnumbered["tables"]:
        del table["id"]  # a table's id is its place in the list where the file gives none
    assert [t.id for t in Task.from_json(unnumbered).tables] == [0, 1]
    unnumbered["tables"][0]["id"] = 1  # ids on some tables only: the one without is named, not blamed for an id
    with pytest.raises(UserError, match=r"tables\[1\]: has no id, and its place \(1\) is another table's id"):
        Task.from_json(unnumbered)


# --- 7. one device sends nothing --------------------------------------------------------------------------


@pytest.mark.fast
def test_a_single_device_has_no_all_to_all():
    from neuroshard_jax.costs.choice import make_cost_model
    from neuroshard_jax.costs.scoring import score_plan
    from neuroshard_jax.search.pipeline import search_plan

    task = make_task([make_table(i, rows=2000, dim=32, pooling=4.0) for i in range(3)], num_devices=1, batch_size=4096)
    model = make_cost_model("neural", task)
    costs = score_plan(
        model, search_plan(task, make_searcher("size_greedy"), CostModelSpec("neural").for_task(task), 0)
    )
    assert costs.compute_ms[0] > 0 and costs.fwd_comm_ms[0] == 0 and costs.bwd_comm_ms[0] == 0
    two = make_task(task.tables, num_devices=2, batch_size=4096)
    assert np.all(
        score_plan(
            model, search_plan(two, make_searcher("size_greedy"), CostModelSpec("neural").for_task(two), 0)
        ).bwd_comm_ms
        > 0
    )


def test_a_task_path_that_is_no_regular_file_is_one_line_and_never_blocks(tmp_path):
    """A FIFO would block the read forever and /dev/zero never ends: both, and a folder, are refused before reading."""
    import os

    from neuroshard_jax.workloads.builders import load_task

    fifo = tmp_path / "task.fifo"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero", tmp_path):
        with pytest.raises(UserError, match=r"^task\.path: '.*' is not a regular file, expected a task JSON file$"):
            load_task(path)


def test_json_nested_past_the_readers_depth_and_a_meta_that_is_a_fifo_are_one_line(tmp_path):
    """Python's JSON reader recurses once a level (a task file of 100,000 nested lists ended in RecursionError); a
    checkpoint's meta.json that is a FIFO would block its read."""
    import os

    from neuroshard_jax.costs.checkpoints import read_meta
    from neuroshard_jax.workloads.builders import load_task

    deep = tmp_path / "deep.json"
    deep.write_text('{"tables": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(UserError, match=r"^task\.path: '.*deep.json' is nested too deep to read, expected a task"):
        load_task(deep)
    model = tmp_path / "model"
    model.mkdir()
    os.mkfifo(model / "meta.json")
    with pytest.raises(UserError, match=r"meta.json' is not a regular file, expected a JSON object$"):
        read_meta(model)


@pytest.mark.fast
def test_a_pool_batch_whose_busiest_stream_would_not_fit_this_machine_is_refused_before_it_is_drawn():
    from neuroshard_jax.core.hardware import available_bytes
    from neuroshard_jax.core.table import PoolSpec
    from neuroshard_jax.workloads.pool import STREAM_BYTES, load_pool, pool_streams

    spec = PoolSpec()
    _, streams = pool_streams(spec)
    batch = int(available_bytes() / (float(streams.params.pooling.max()) * STREAM_BYTES)) + 1
    with pytest.raises(UserError, match=rf"task.batch_size: got {batch}, at which the pool's busiest table draws"):
        load_pool(spec, batch)


def test_an_empty_cache_variable_is_the_default_folder_not_the_current_one(monkeypatch):
    from pathlib import Path

    from neuroshard_jax.core.paths import cache_dir

    monkeypatch.setenv("NEUROSHARD_CACHE_DIR", "")
    assert cache_dir() == Path.home() / ".cache" / "neuroshard_jax"


@pytest.mark.fast
def test_a_torn_or_malformed_model_of_the_user_is_skipped_with_a_warning(tmp_path, monkeypatch, caplog):
    """A user model nobody names must not block the default run: a torn meta.json, or hardware_kinds that are no
    list, are left out of the choice with one warning line each."""
    import logging

    from neuroshard_jax.costs.choice import checkpoint_path, choose_cost_model, shipped_names

    monkeypatch.setenv("NEUROSHARD_CACHE_DIR", str(tmp_path))
    torn = tmp_path / "models" / "torn"
    torn.mkdir(parents=True)
    (torn / "meta.json").write_text('{"format": 4, "hardw')
    odd = tmp_path / "models" / "odd"
    shutil.copytree(checkpoint_path(shipped_names()[0]), odd)
    meta = json.loads((odd / "meta.json").read_text())
    (odd / "meta.json").write_text(json.dumps({**meta, "hardware_kinds": 5}))
    caplog.set_level(logging.WARNING, logger="neuroshard_jax.costs.choice")
    choice = choose_cost_model("neural")
    assert choice.name not in ("torn", "odd")
    for name, why in (("torn", "could not be read"), ("odd", "hardware_kinds: got 5, expected a list of kinds")):
        assert any(m.startswith(f"skipping your model {name} (") and why in m for m in caplog.messages), caplog.messages


@pytest.mark.fast
def test_a_chosen_user_model_whose_state_is_damaged_is_skipped_for_the_next_choice(tmp_path, monkeypatch, caplog):
    """A user model of this machine's kind with a good meta.json but a garbled state: the planner, which chose it
    (nobody named it), warns once and plans with the next choice; named, it is an error naming it."""
    import logging

    import neuroshard_jax as nsj
    from neuroshard_jax.core.hardware import hardware, hardware_kind
    from neuroshard_jax.costs.choice import checkpoint_path, shipped_names

    monkeypatch.setenv("NEUROSHARD_CACHE_DIR", str(tmp_path))
    mine = tmp_path / "models" / "mine"
    shutil.copytree(checkpoint_path(shipped_names()[0]), mine)
    meta = json.loads((mine / "meta.json").read_text())
    kind = hardware_kind(hardware())
    (mine / "meta.json").write_text(json.dumps({**meta, "hardware_kinds": [kind], "trained": "2099-01-01"}))
    (mine / "state" / "_METADATA").write_text("garbage")
    caplog.set_level(logging.WARNING, logger="neuroshard_jax.costs.choice")
    tables = [{"rows": 1000, "dim": 16, "pooling_factor": 2.0, "bins": [1.0] + [0.0] * 16} for _ in range(4)]
    plan = nsj.plan(tables, num_devices=2, mem_cap_gb=1.0, batch_size=4096, searcher="size_greedy")
    assert plan.validate()
    skipped = [m for m in caplog.messages if m.startswith(f"skipping your model mine ({mine}): its state/ could")]
    assert len(skipped) == 1, caplog.messages
    with pytest.raises(UserError, match="its state/ could not be restored"):
        nsj.plan(tables, num_devices=2, mem_cap_gb=1.0, batch_size=4096, searcher="size_greedy", cost_model="mine")


@pytest.mark.fast
def test_a_damaged_pool_cache_is_rebuilt_and_an_unwritable_cache_only_warns(tmp_path, monkeypatch, caplog):
    """A truncated cache file (a write cut short, a full disk) is rebuilt with one warning line, not a traceback on
    every run; a cache folder that cannot be written (here: under a file) costs the cache, not the run."""
    import logging

    from neuroshard_jax.core.table import PoolSpec
    from neuroshard_jax.workloads.pool import load_pool

    monkeypatch.setenv("NEUROSHARD_CACHE_DIR", str(tmp_path / "cache"))
    caplog.set_level(logging.WARNING, logger="neuroshard_jax.workloads.pool")
    spec = PoolSpec(num_tables=12)
    first = load_pool(spec, 128)
    (cache,) = (tmp_path / "cache" / "pools").glob("*.npz")
    cache.write_bytes(cache.read_bytes()[:100])
    again = load_pool(spec, 128)
    np.testing.assert_array_equal(again.bins, first.bins)
    assert any(m.startswith(f"cache file {cache} is damaged (") for m in caplog.messages), caplog.messages
    assert load_pool(spec, 128).bins.shape == first.bins.shape and len(caplog.messages) == 1  # rebuilt whole
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("NEUROSHARD_CACHE_DIR", str(tmp_path / "file" / "cache"))
    np.testing.assert_array_equal(load_pool(spec, 128).bins, first.bins)
    assert "set NEUROSHARD_CACHE_DIR to a folder you can write" in caplog.messages[-1]


def test_a_cache_that_cannot_be_made_keeps_no_compiled_kernels_and_says_so_in_one_line(tmp_path, monkeypatch, caplog):
    """A read-only home (here: the cache under a file): the search compiles as without a cache, with one warning
    that names the folder and NEUROSHARD_CACHE_DIR, not one JAX warning per compiled kernel."""
    import logging

    import jax

    from neuroshard_jax.search.pipeline import keep_compiled_kernels

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("NEUROSHARD_CACHE_DIR", str(tmp_path / "file" / "cache"))
    caplog.set_level(logging.WARNING, logger="neuroshard_jax.search.pipeline")
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        keep_compiled_kernels()
        keep_compiled_kernels()  # called again (every plan calls it): nothing more said
        assert jax.config.jax_compilation_cache_dir is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    folder = str(tmp_path / "file" / "cache")  # the cache itself: one cause for every folder in it
    assert caplog.messages == [
        f"cached files (compiled kernels, models, fits) are not kept or read: {folder!r} cannot be made (Not a "
        "directory); set "
        "NEUROSHARD_CACHE_DIR to a folder you can write"
    ]


@pytest.mark.fast
def test_a_restored_models_kept_weights_are_used_again_and_a_damaged_copy_is_read_afresh(tmp_path, monkeypatch):
    """A restored checkpoint's weights are kept in the cache (no orbax on the next start); a kept file that is
    damaged, or a state folder changed since, is read from the checkpoint again, never trusted."""
    import jax

    from neuroshard_jax.costs.checkpoints import load_ensemble, tree_digest

    monkeypatch.setenv("NEUROSHARD_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "ckpt"
    shutil.copytree(SHIPPED, path)
    first = load_ensemble(path)[2]
    kept = list((tmp_path / "cache" / "restored").glob("*.npz"))
    assert len(kept) == 1
    assert tree_digest(load_ensemble(path)[2]) == tree_digest(first)  # from the kept file
    kept[0].write_bytes(kept[0].read_bytes()[:100])  # a damaged kept file: read from the checkpoint again
    again = load_ensemble(path)[2]
    assert all(bool((a == b).all()) for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(first)))
    _garble_a_tensor_file(path)  # the state folder changed since: orbax reads it, and says it is damaged
    with pytest.raises(UserError, match="could not be restored"):
        load_ensemble(path)


@pytest.mark.parametrize(
    "variable, value, says",
    [
        ("JAX_ENABLE_X64", "1", "JAX_ENABLE_X64: got '1', expected it unset or 0: the cost models and their saved"),
        ("JAX_PLATFORMS", "cuda", "JAX_PLATFORMS: got 'cuda', but JAX cannot start it on this machine"),
        ("XLA_FLAGS", "--xla_no_such_flag=1", "XLA_FLAGS: got '--xla_no_such_flag=1': Unknown flag in XLA_FLAGS"),
    ],
)
def test_an_environment_that_changes_how_jax_computes_is_named_in_one_line(variable, value, says):
    """64-bit mode (the models' state would be blamed), a platform the machine lacks (XLA's bare AssertionError), a
    flag XLA does not know (XLA ends the process with its own fatal line): each one ``error:`` line naming the
    variable, exit 2, before the command's own work (here: its missing plan)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "JAX_PLATFORMS": "cpu", variable: value}
    command = [sys.executable, "-m", "neuroshard_jax.explain", "plan=nowhere.json"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    said = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and "Traceback" not in done.stderr and len(said) == 1, done.stderr
    assert said[0].startswith(f"error: {says}"), said


def test_a_cache_folder_others_may_write_in_is_neither_read_nor_kept(tmp_path, monkeypatch, caplog):
    """A shared cache (mode 0777, a team's scratch folder): a model planted in its models/ is not listed (so never
    chosen), compiled kernels are not kept there, and one warning names the folder; made private again, it is read.
    Where the test runs as root, a folder another user owns is refused the same way. A FIFO in place of a kept file
    is never opened (it would block the run)."""
    import logging
    import os

    from neuroshard_jax.core.paths import cache_folder
    from neuroshard_jax.costs.choice import user_names
    from neuroshard_jax.workloads.pool import cached_arrays

    cache = tmp_path / "shared"
    (cache / "models" / "planted").mkdir(parents=True)
    (cache / "models" / "planted" / "meta.json").write_text("{}")
    cache.chmod(0o777)
    (cache / "models").chmod(0o700)
    monkeypatch.setenv("NEUROSHARD_CACHE_DIR", str(cache))
    caplog.set_level(logging.WARNING)
    assert user_names() == [] and cache_folder("jax", "compiled search kernels") is None
    assert not (cache / "jax").exists() or not any((cache / "jax").iterdir())
    hint = "set NEUROSHARD_CACHE_DIR to a folder you can write"
    shared = f"{str(cache)!r} is writable by others (mode 0o777: chmod go-w it, or {hint})"
    # the cache itself refused: one warning for every use of it
    assert caplog.messages == [f"cached files (compiled kernels, models, fits) are not kept or read: {shared}"]
    cache.chmod(0o770 if cache.stat().st_gid == os.getgid() else 0o700)  # a group of one's own may write (umask 002)
    assert user_names() == ["planted"] and cache_folder("jax", "compiled search kernels") == cache / "jax"
    # a model folder that is a link (to a folder anyone may write) or that others may write is not listed
    elsewhere = tmp_path / "anyones"
    elsewhere.mkdir()
    (elsewhere / "meta.json").write_text("{}")
    elsewhere.chmod(0o777)
    (cache / "models" / "linked").symlink_to(elsewhere)
    assert user_names() == ["planted"]
    assert f"{str(cache / 'models' / 'linked')!r} is a symbolic link" in caplog.messages[-1]
    (cache / "models" / "planted").chmod(0o777)
    assert user_names() == []
    assert f"{str(cache / 'models' / 'planted')!r} is writable by others" in caplog.messages[-1]
    (cache / "models" / "planted").chmod(0o700)
    if hasattr(os, "getuid") and os.getuid() == 0:
        os.chown(cache / "models", 65534, 65534)
        assert user_names() == []
        assert f"{str(cache / 'models')!r} is owned by another user (uid 65534)" in caplog.messages[-1]
    os.mkfifo(cache / "pools.npz")
    assert cached_arrays(cache / "pools.npz", ("bins",)) is None
