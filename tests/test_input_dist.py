"""TorchRec's input distribution (the ids' all-to-alls before the lookups): labelled on real gloo ranks, fitted, and
priced by the models, the host-side scoring and the batched grid search alike."""

import dataclasses

import jax
import numpy as np
import pytest

from neuroshard_jax.core.assignment import comm_layout, input_features
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import read_records, write_json
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard, row_shards
from neuroshard_jax.core.table import Table
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.analytic import analytic_model
from neuroshard_jax.costs.cost_model import plan_cost_ms
from neuroshard_jax.costs.input_dist import InputDist, design, fit, for_kinds, load, received
from neuroshard_jax.costs.scoring import input_taken, input_terms, score_plan, score_plans
from neuroshard_jax.learn.datasets import comm_arrays
from neuroshard_jax.learn.row_comm_fit import fit_row_comm
from searchers import make_searcher
from searchers.grid import _column_group, _input_taken
from searchers.neuroshard import SplitSpace

from .oracle import Oracle

FIT = InputDist("test", (2, 4), ((1.0, 0.002, 0.01), (2.0, 0.004, 0.03)), 4096)


def _hand_ms(terms, taken):
    """Each device's input ms, written out: per distribution that moves anything, a + b received + c total / N."""
    n = taken.shape[1]
    out = np.zeros(n)
    for row in taken:
        if row.sum() > 0:
            out += terms[0] + terms[1] * row + terms[2] * row.sum() / n
    return out


def _features(rng):
    return list(rng.uniform(1, 300, size=int(rng.integers(0, 4))))


@pytest.mark.fast
def test_the_fit_recovers_known_terms_and_scales_with_the_batch():
    rng = np.random.default_rng(0)
    records = []
    for i in range(24):
        world = (2, 4)[i % 2]
        inputs = [[_features(rng) for _ in range(world)] for _ in range(1 + i % 3)]
        taken = received(inputs)
        record = {"id": i, "ok": True, "world": world, "batch_size": 4096, "inputs": inputs}
        records.append(record | {"fwd_inputs_ms": _hand_ms(FIT.terms(world, 4096), taken).tolist()})
        x, y = design(records[-1])  # the design matrix is the formula's
        np.testing.assert_allclose(x @ FIT.terms(world, 4096), y, rtol=1e-9)
    fitted = fit(records, "test")
    assert fitted.sizes == (2, 4)
    np.testing.assert_allclose(np.asarray(fitted.coefs), np.asarray(FIT.coefs), rtol=1e-5, atol=1e-9)
    # twice the batch: twice the ids, the same latency; 3 devices lie between 2 and 4, 16 extend the last segment
    np.testing.assert_allclose(FIT.terms(2, 8192), [1.0, 0.004, 0.02])
    assert FIT.terms(2, 4096)[0] < FIT.terms(3, 4096)[0] < FIT.terms(4, 4096)[0] < FIT.terms(16, 4096)[0]
    with pytest.raises(UserError, match="no comm record with input distributions"):
        fit([{**records[0], "inputs": []}], "test")
    with pytest.raises(UserError, match="records of batch sizes \\[256, 4096\\]"):
        fit([records[0], {**records[1], "batch_size": 256}], "test")


@pytest.mark.fast
def test_fits_are_read_back_checked_and_given_to_models_of_their_kind(tmp_path):
    path = tmp_path / "fit.json"
    write_json({"fit": {**FIT.to_json(), "kind": "some cpu"}, "manifest": {}}, path)
    assert load(str(path)) == dataclasses.replace(FIT, kind="some cpu")
    write_json({"fit": {**FIT.to_json(), "coefs": [[1.0, 2.0], [1.0, 2.0, 3.0]]}}, path)
    load.cache_clear()
    with pytest.raises(UserError, match="expected ascending counts >= 2, one \\(a, b, c\\) triple per count"):
        load(str(path))
    with pytest.raises(UserError, match="input dist: 'nowhere' is neither a shipped fit"):
        load("nowhere")
    assert for_kinds(["a kind no fit was measured on"]) is None


def test_input_distributions_are_labelled_on_gloo_apart_from_the_all_to_all(tiny_checkpoint):
    """The tiny dataset's comm samples (real gloo ranks, TorchRec's KJTAllToAll) carry input distributions, timed
    apart; the all-to-all nets train on the rest; the fit takes them."""
    records = read_records(tiny_checkpoint[0] / "comm.jsonl")
    with_inputs = [r for r in records if r.get("inputs")]
    assert with_inputs and len(with_inputs) < len(records)
    for r in with_inputs:
        assert all(0 < i < f for i, f in zip(r["fwd_inputs_ms"], r["fwd_ms"]))
    _, _, _, fwd_ms, _, _ = comm_arrays(tiny_checkpoint[0])
    for i, r in enumerate(records):
        w = r["world"]
        apart = np.asarray(r.get("fwd_rows_ms", [0.0] * w)) + np.asarray(r.get("fwd_inputs_ms", [0.0] * w))
        np.testing.assert_allclose(fwd_ms[i, :w], np.asarray(r["fwd_ms"]) - apart, rtol=1e-5, atol=1e-5)
    fitted = fit(with_inputs, "tiny")
    assert set(fitted.sizes) <= {2, 3} and all(min(c) >= 0 for c in fitted.coefs)


@pytest.mark.fast
def test_more_ids_take_longer_to_distribute():
    from neuroshard_jax.kernels.messages import CommRequest
    from neuroshard_jax.kernels.processes import run_comm

    requests = [
        CommRequest.of({"dim_sums": [8, 8], "inputs": [[[p], [p, 2.0]]]}, i, 2048, [0.0, 0.0], 1, 3)
        for i, p in enumerate((2.0, 1000.0))
    ]
    answers = run_comm(requests, 2, 120)
    few, many = ([r.fwd_inputs_ms for r in answers[i]] for i in (0, 1))
    assert all(0 < f < m for f, m in zip(few, many))  # 4 thousand ids against 2 million: no noise hides that


def _task(num_devices=4):
    tables = [
        Table(0, 200_000, 8, 30.0, (0.2, 0.3, 0.5) + (0.0,) * 14, name="rows"),
        *(Table(1 + i, 3000 + 500 * i, 16, 2.0 + 10 * i, (1.0,) + (0.0,) * 16) for i in range(6)),
    ]
    return Task.uniform(num_devices, 1.0, 4096, tuple(tables))


def _plan(task):
    """Table 0 cut in rows over devices 2, 3; table 1 cut in columns over 0 and 3; table 2's two slices on device 1
    (one table-wise shard); table 6 data-parallel; the rest whole. Pooling factors: 30, then 2, 12, ..., 52."""
    rest = tuple(Shard(t, 0, 16, t % 4) for t in (3, 4, 5))
    cut = (Shard(1, 0, 8, 0), Shard(1, 8, 8, 3), Shard(2, 0, 8, 1), Shard(2, 8, 8, 1))
    return Plan(task, (*row_shards(0, task.tables[0].rows, 8, [2, 3]), *cut, *rest), data_parallel=(6,)).validate()


@pytest.mark.fast
def test_a_plan_s_input_distributions_follow_its_sharding_types():
    task = _task()
    apart = dataclasses.replace(_plan(task), merge_column_wise=False)
    features = input_features(apart)
    assert features == {
        "table_wise": [[32.0], [12.0, 42.0], [], [22.0]],  # tables 4; 2 (one shard of two slices) and 5; 3
        "column_wise": [[2.0], [], [], [2.0]],  # table 1's ids go whole to both its devices
        "row_wise": [[], [], [15.0], [15.0]],  # table 0's ids split by its blocks' rows
    }  # table 6, data-parallel: its ids stay where they were read
    assert comm_layout(apart).inputs == list(features.values())
    np.testing.assert_allclose(input_taken(apart), received(list(features.values())))
    # as plans are made: the whole tables join table 1 in the column-wise group, one distribution in place of two
    merged = input_features(_plan(task))
    assert merged == {"column_wise": [[2.0, 32.0], [12.0, 42.0], [], [2.0, 22.0]], "row_wise": features["row_wise"]}
    taken = input_taken(_plan(task))
    assert not taken[0].any() and taken[1].tolist() == [34.0, 54.0, 0.0, 24.0]


@pytest.mark.fast
def test_a_model_prices_the_input_distributions_forward_only():
    task = _task()
    plan = _plan(task)
    model = analytic_model(task)
    priced = dataclasses.replace(model, input_dist=FIT)
    base, with_inputs = score_plan(model, plan), score_plan(priced, plan)
    expected = _hand_ms(FIT.terms(4, 4096), input_taken(plan))
    np.testing.assert_allclose(with_inputs.bwd_comm_ms, base.bwd_comm_ms, rtol=1e-6)
    np.testing.assert_allclose(with_inputs.fwd_comm_ms - base.fwd_comm_ms, expected, rtol=1e-4)
    one = dataclasses.replace(task, devices=task.devices[:1])
    alone = Plan(one, tuple(Shard(t, 0, one.tables[t].dim, 0) for t in range(one.num_tables)))
    assert score_plan(priced, alone).fwd_comm_ms.tolist() == [0.0]  # one device moves nothing
    assert np.array_equal(input_terms(FIT, task), np.tile(FIT.terms(4, 4096)[:, None], (1, 4)).astype(np.float32))


@pytest.mark.fast
def test_the_grid_prices_each_placement_s_input_distributions_as_the_host_does():
    """Random placements of column splits (slices of one table spread, or sharing a device): what the jitted grid
    takes per device equals the host's count on the plan those placements make."""
    task = _task(3)
    space = SplitSpace(task, analytic_model(task))
    levels = [(0, 2, 1, 0, 1, 0, 0), (1, 1, 1, 1, 0, 0, 0)]
    batch = space.batch(levels)
    rng = np.random.default_rng(0)
    for c, level in enumerate(levels):
        count = sum(1 << k for k in level)
        for _ in range(10):
            devices = np.full(batch.valid.shape[1], -1, np.int32)
            devices[:count] = rng.integers(0, 3, size=count)
            spread = _column_group(devices, batch.column_table[c], batch.column_ok[c])
            taken = jax.jit(_input_taken, static_argnums=4)(devices, batch.ids[c], batch.column_table[c], spread, 3)
            plan = space.plan(level, devices)
            np.testing.assert_allclose(np.asarray(taken), input_taken(plan)[:2], rtol=1e-6)


@pytest.mark.fast
def test_grid_and_beam_match_the_oracle_with_the_input_distributions_priced(small_pool):
    from neuroshard_jax.workloads.builders import TaskConfig, generate_task

    config = TaskConfig(num_tables=12, num_devices=4, batch_size=512, mem_cap_gb=0.3, pool=small_pool.spec)
    task = generate_task(small_pool, config, 2)
    model = dataclasses.replace(analytic_model(task), input_dist=FIT)
    # the comm-aware placement of the cheapest candidates on (``comm_weights``, off by default), in both
    oracle = Oracle(task, model, (1.0, 1.1, 1.3), comm_weights=(1.0,))
    cost, plan = oracle.beam(k=3, n=10, max_length=3)
    options = {"max_length": 3, "alphas": [1.0, 1.1, 1.3], "comm_weights": [1.0]}
    beam = make_searcher("beam", options).search(task, model, 0)
    assert beam.shards == plan.shards
    assert float(plan_cost_ms(score_plan(model, beam))) == pytest.approx(cost, rel=1e-5)
    assert score_plans(model, [beam])[0] > score_plans(analytic_model(task), [beam])[0]


@pytest.mark.fast
def test_the_shipped_fit_is_the_one_its_labels_make(tmp_path):
    from neuroshard_jax.core.files import read_json
    from neuroshard_jax.core.paths import package_path
    from neuroshard_jax.costs.input_dist import SHIPPED
    from neuroshard_jax.costs.row_comm import shipped_names

    names = shipped_names(SHIPPED)
    assert names, "no input dist fit shipped"
    for name in names:
        shipped = load(name)
        manifest = read_json(package_path(f"{SHIPPED}/{name}.json"), "fit")["manifest"]
        again, figures, _ = fit_row_comm(manifest["dataset"]["dir"], name, tmp_path, "test", "input_dist")
        assert again.sizes == shipped.sizes and for_kinds([shipped.kind]) == shipped
        np.testing.assert_allclose(np.asarray(again.coefs), np.asarray(shipped.coefs), rtol=1e-6)
        assert figures == manifest["held_out"] and figures["fwd_mape"] < 0.5


def test_a_fit_of_this_machine_goes_to_the_user_s_fits_and_prices_its_kind(tiny_checkpoint, tmp_path, monkeypatch):
    """``train family=input_dist`` without ``out``: the fit lands in this user's fits, where models of its hardware
    kind find it before a shipped one."""
    from neuroshard_jax.costs.row_comm import of_kinds

    from .conftest import run_cli

    monkeypatch.setenv("NEUROSHARD_CACHE_DIR", str(tmp_path / "cache"))
    done = run_cli("family=input_dist", f"datasets=[{tiny_checkpoint[0]}]", "name=mine", module="neuroshard_jax.train")
    assert done.returncode == 0, done.stderr
    mine = load(str(tmp_path / "cache" / "input_dist" / "mine.json"))
    assert "price with it from now on" in done.stdout and mine.kind
    assert of_kinds("data/no-shipped-fits", "input_dist", load, [mine.kind]) == mine
    assert for_kinds([mine.kind]) == mine
