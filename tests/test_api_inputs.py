"""What ``neuroshard_jax.plan`` and the stats command take: numpy numbers and arrays, tables keyed by name, tables
without statistics; and the one-line message for what they refuse."""

import json
import re
import warnings

import numpy as np
import pytest

import neuroshard_jax as nsj
from neuroshard_jax.core.config import plain, typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.plan_file import format_plan
from neuroshard_jax.core.task import Task
from neuroshard_jax.workloads.builders import TaskConfig
from neuroshard_jax.workloads.statistics import DEFAULT_ZIPF, estimated_stats, zipf_ids

from .conftest import make_table, make_task, run_cli

BINS = [0.6, 0.3, 0.1] + [0.0] * 14


def _tables(**changes):
    """Two named tables as a user writes them; ``changes`` update the first."""
    return {
        "user_id": {"rows": 20_000, "dim": 16, "pooling_factor": 1.0, "bins": list(BINS), **changes},
        "item_id": {"rows": 5_000, "dim": 32, "pooling_factor": 4.0, "bins": list(BINS)},
    }


def _plan(tables, **kwargs):
    kwargs = {"num_devices": 2, "mem_cap_gb": 1.0, "cost_model": "analytic", "searcher": "size_greedy", **kwargs}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plan of complete tables warns of nothing
        return nsj.plan(tables, **kwargs)


def _refused(message, tables, **kwargs):
    with pytest.raises(UserError) as err:
        _plan(tables, **kwargs)
    assert str(err.value) == message


# --- numpy numbers and arrays ----------------------------------------------------------------------------------


@pytest.mark.fast
def test_numpy_numbers_and_arrays_plan_as_python_ones():
    python = _plan(_tables(), batch_size=512)
    numpy = _plan(
        _tables(rows=np.int64(20_000), dim=np.int32(16), pooling_factor=np.float32(1.0), bins=np.array(BINS)),
        num_devices=np.int64(2),
        mem_cap_gb=np.float64(1.0),
        batch_size=np.int64(512),
    )
    assert numpy.task == python.task and numpy.shards == python.shards
    assert type(numpy.task.tables[0].rows) is int and type(numpy.task.tables[0].bins[0]) is float
    on_devices = _plan(_tables(), devices=[{"mem_cap_gb": np.float32(1.0), "speed": np.float64(2.0)}] * 2)
    assert on_devices.task.speeds().tolist() == [2.0, 2.0]
    assert _plan(_tables(), searcher="beam", k=np.int64(2)).shards  # searcher options go through ``typed``


@pytest.mark.parametrize(
    "changes, kwargs, message",
    [
        (
            {"rows": np.bool_(True)},
            {},
            "plan.tables['user_id'].rows: got True, expected an integer >= 1 and <= 1099511627776",
        ),
        ({}, {"num_devices": np.bool_(True)}, "plan.num_devices: got True, expected an integer >= 1 and <= 4096"),
        (
            {"rows": np.float64(2e4)},
            {},
            "plan.tables['user_id'].rows: got 20000.0, expected an integer >= 1 and <= 1099511627776",
        ),
        (
            {"pooling_factor": np.float64("nan")},
            {},
            "plan.tables['user_id'].pooling_factor: got nan, expected a finite number >= 0 and <= 1000000",
        ),
        (
            {},
            {"mem_cap_gb": np.float32("inf")},
            "plan.mem_cap_gb: got inf, expected a finite number > 0 and <= 1048576",
        ),
        (
            {},
            {"seed": "a", "searcher": "random"},
            "seed: got 'a', expected an integer in 0..2**63-1 (the same seed gives the same plan)",
        ),
        ({}, {"seed": 2.5}, "seed: got 2.5, expected an integer in 0..2**63-1 (the same seed gives the same plan)"),
        ({}, {"seed": -1}, "seed: got -1, expected an integer in 0..2**63-1 (the same seed gives the same plan)"),
        (
            {},
            {"seed": 2**70},
            f"seed: got {2**70}, expected an integer in 0..2**63-1 (the same seed gives the same plan)",
        ),
        (
            {},
            {"num_devices": 3, "devices": [{"mem_cap_gb": 1.0}] * 2},
            "num_devices: got 3, but devices lists 2; expected one of them (or the same count)",
        ),
        (
            {"bins": np.array([0.5, 0.5])},
            {},
            "plan.tables['user_id'].bins: got [0.5, 0.5], expected 17 shares in [0, 1]",
        ),
    ],
)
def test_numpy_values_are_checked_as_python_ones(changes, kwargs, message):
    _refused(message, _tables(**changes), **kwargs)


def test_plain_makes_numpy_python_in_nested_objects():
    value = plain({"a": np.int64(3), "b": [np.float32(0.5), (np.bool_(True),)], "c": np.arange(3), np.str_("d"): 1})
    assert value == {"a": 3, "b": [0.5, (True,)], "c": [0, 1, 2], "d": 1}
    assert [type(x) for x in (value["a"], value["b"][0], value["b"][1][0], value["c"][0])] == [int, float, bool, int]
    assert typed(TaskConfig, {"num_devices": np.int64(3), "dims": np.array([16, 32])}, "task").dims == (16, 32)
    with pytest.raises(UserError, match=r"^task.num_devices: got True, expected an integer >= 1 and <= 4096$"):
        typed(TaskConfig, {"num_devices": np.bool_(True)}, "task")


# --- tables keyed by name, and named in errors ----------------------------------------------------------------


def test_tables_keyed_by_name_take_the_key_as_name():
    plan = _plan(_tables())
    assert plan.task.table_names() == ["user_id", "item_id"] and [t.id for t in plan.task.tables] == [0, 1]
    assert set(plan.placement()) == {"user_id", "item_id"}
    as_list = _plan([{"name": name, **spec} for name, spec in _tables().items()])
    assert as_list.task == plan.task
    named = _plan({name: {"name": name, **spec} for name, spec in _tables().items()})  # the key repeated: fine
    assert named.task == plan.task


@pytest.mark.parametrize(
    "tables, message",
    [
        (_tables(rows=-1), "plan.tables['user_id'].rows: got -1, expected an integer >= 1"),
        (
            [{"name": "user_id", **_tables(dim=0)["user_id"]}],
            "plan.tables['user_id'].dim: got 0, expected an integer >= 1",
        ),
        ([{**_tables()["user_id"], "rows": -1}], "plan.tables[0].rows: got -1, expected an integer >= 1"),
        (
            _tables(pooling_factr=1.0),
            "plan.tables['user_id'].pooling_factr: unknown key, did you mean 'pooling_factor'?",
        ),
        (_tables(pooling="max"), "plan.tables['user_id'].pooling: got 'max', expected one of sum, mean, none"),
        (_tables(pin=5), "plan.tables['user_id'].pin: got device 5, expected 0..1"),
        (_tables(name="other"), "plan.tables['user_id'].name: got 'other', expected its key 'user_id' or no name"),
        (
            {"user_id": 5},
            "plan.tables['user_id']: got 5, expected a table object like {'rows': 1000, 'dim': 64, "
            "'pooling_factor': 1.0}",
        ),
        (
            [{"name": "a", **_tables()["user_id"]}] * 2,
            "plan.tables[1].name: got 'a', expected names unique within a task",
        ),
        ({}, "plan.tables: got {}, expected at least one table"),
        ([], "plan.tables: got [], expected a non-empty list of tables"),
        (5, "plan.tables: got int, expected a mapping of name -> table object or a list of them"),
    ],
)
def test_errors_name_a_table_by_its_name(tables, message):
    with pytest.raises(UserError) as err:
        _plan(tables)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_task_file_names_its_named_tables():
    obj = make_task([make_table(0), make_table(1)]).to_json()
    obj["tables"][1].update(name="item_id", rows=0)
    with pytest.raises(
        UserError, match=r"^task.tables\['item_id'\].rows: got 0, expected an integer >= 1 and <= 1099511627776$"
    ):
        Task.from_json(obj)


# --- tables without statistics --------------------------------------------------------------------------------


@pytest.mark.fast
def test_tables_without_bins_are_estimated_as_the_torchrec_adapter_does():
    tables = _tables()
    del tables["item_id"]["bins"]
    with pytest.warns(UserWarning) as caught:
        plan = nsj.plan(tables, num_devices=2, mem_cap_gb=1.0, cost_model="analytic", batch_size=512, seed=3)
    expected = (
        "1 of 2 tables have estimated access statistics (item_id): no data was given for them; the costs assume a "
        "Zipf law (python -m neuroshard_jax.stats measures them)"
    )
    assert [str(w.message) for w in caught] == [expected]
    user, item = plan.task.tables
    assert not user.estimated and user.bins == tuple(BINS)
    assert item.estimated and item.bins == estimated_stats("item_id", 5_000, 4.0, 512, DEFAULT_ZIPF, 3).bins
    assert f"warning: {expected}" in format_plan(plan.to_json())
    with pytest.warns(UserWarning, match="estimated access statistics"):
        uniform = nsj.plan(tables, num_devices=2, mem_cap_gb=1.0, cost_model="analytic", zipf=0.0)
    assert uniform.task.tables[1].bins == estimated_stats("item_id", 5_000, 4.0, 4096, 0.0, 0).bins


@pytest.mark.parametrize(
    "changes, kwargs, message",
    [
        ({"rows": 0}, {}, "plan.tables['user_id'].rows: got 0, expected an integer >= 1 and <= 1099511627776"),
        (
            {"pooling_factor": None},
            {},
            "plan.tables['user_id'].pooling_factor: got None, expected a finite number >= 0 and <= 1000000",
        ),
        ({}, {"zipf": -1.0}, "zipf: got -1.0, expected a finite exponent >= 0"),
        ({}, {"zipf": "steep"}, "zipf: got 'steep', expected a finite exponent >= 0"),
    ],
)
def test_a_table_to_estimate_is_checked_first(changes, kwargs, message):
    tables = _tables(**changes)
    del tables["user_id"]["bins"]
    with pytest.raises(UserError) as err, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nsj.plan(tables, num_devices=2, mem_cap_gb=1.0, cost_model="analytic", **kwargs)
    assert str(err.value) == message


# --- the stats command -----------------------------------------------------------------------------------------


def test_stats_command_says_which_features_have_no_samples(tmp_path):
    rng = np.random.default_rng(0)
    lengths = rng.poisson(2.0, size=600)
    arrays = {
        "user/indices": zipf_ids(rng, 1000, 1.1, int(lengths.sum())),
        "user/lengths": lengths,
        "empty_a/indices": np.zeros(0, dtype=np.int64),
        "empty_a/offsets": np.zeros(1, dtype=np.int64),
        "empty_b/indices": np.zeros(0, dtype=np.int64),
        "empty_b/lengths": np.zeros(0, dtype=np.int64),
    }
    np.savez(tmp_path / "data.npz", **arrays)
    args = (f"out={tmp_path / 'tables.json'}", "batch_size=256", "progress=false")
    done = run_cli(f"data={tmp_path / 'data.npz'}", *args, module="neuroshard_jax.stats")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"warning: data: features of {str(tmp_path / 'data.npz')!r} with 0 samples are left out of the statistics: "
        "empty_a, empty_b"
    ]
    assert [t["name"] for t in json.loads((tmp_path / "tables.json").read_text())["tables"]] == ["user"]
    np.savez(tmp_path / "none.npz", **{k: v for k, v in arrays.items() if k.startswith("empty")})
    bad = run_cli(f"data={tmp_path / 'none.npz'}", *args, module="neuroshard_jax.stats")
    assert bad.returncode == 2 and bad.stderr.splitlines() == [
        f"error: data: every feature of {str(tmp_path / 'none.npz')!r} has 0 samples, expected at least one batch of "
        "samples"
    ]


@pytest.mark.fast
def test_the_printed_plan_names_each_devices_tables_summarised_past_a_width():
    tables = {
        f"feature_with_a_long_name_{i}": {"rows": 1000, "dim": 8, "pooling_factor": 1.0, "bins": BINS}
        for i in range(12)
    }
    plan = _plan(tables)
    text = format_plan({**plan.to_json(), "searcher": "size_greedy", "seed": 0, "search_time_s": 0.1})
    header, *rows = text.splitlines()[1:4]
    assert header.endswith("  tables")
    for row in rows:
        assert "feature_with_a_long_name_" in row and re.search(r"\+\d+ more$", row), row
    small = _plan(_tables())
    text = format_plan({**small.to_json(), "searcher": "size_greedy", "seed": 0, "search_time_s": 0.1})
    assert "user_id" in text and "item_id" in text


@pytest.mark.fast
def test_load_cost_model_without_a_name_is_the_model_the_planner_chooses_here():
    import jax

    from neuroshard_jax.costs.choice import choose_cost_model

    chosen = choose_cost_model("neural", {}, "cpu", make_task([make_table(0)], batch_size=4096)).name
    mine, theirs = nsj.load_cost_model(), nsj.load_cost_model(chosen)
    leaves = zip(jax.tree_util.tree_leaves(mine.params), jax.tree_util.tree_leaves(theirs.params))
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in leaves)


@pytest.mark.fast
def test_a_platform_the_machine_lacks_is_one_line_through_the_library_too(monkeypatch):
    """``JAX_PLATFORMS=cuda`` on a machine without a GPU: ``nsj.plan`` raises one UserError naming the variable (it
    raised JAX's bare AssertionError), as the commands say it."""
    bins = [1.0] + [0.0] * 16
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    with pytest.raises(UserError, match=r"^JAX_PLATFORMS: got 'cuda', but JAX cannot start it on this machine"):
        nsj.plan([{"rows": 100, "dim": 8, "pooling_factor": 1.0, "bins": bins}], num_devices=2, mem_cap_gb=1.0)
