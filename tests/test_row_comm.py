"""The row-split comm model: labels with row groups from real gloo ranks, the fit, and plans scored with it."""

import dataclasses

import numpy as np
import pytest

from neuroshard_jax.core.assignment import comm_layout
from neuroshard_jax.core.devices import Device, Links
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import read_json, read_records, write_json
from neuroshard_jax.core.paths import package_path
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard, row_shards
from neuroshard_jax.core.table import Table
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.choice import CostModelSpec, make_cost_model
from neuroshard_jax.costs.cost_model import Scaled
from neuroshard_jax.costs.row_comm import (
    RowComm,
    disjoint,
    fit,
    for_kinds,
    load,
    rank_ms,
    shipped_names,
)
from neuroshard_jax.costs.scoring import (
    device_row_ms,
    fitted_ms,
    plan_arrays,
    plan_costs,
    score_plan,
    score_plans_devices,
)
from neuroshard_jax.learn.datasets import comm_arrays
from neuroshard_jax.learn.row_comm_fit import fit_row_comm
from neuroshard_jax.search.pipeline import search_plan
from searchers import make_searcher

ROWS = RowComm("test", (2, 4), ((1.0, 0.01), (2.0, 0.02)), ((0.5, 0.005), (1.5, 0.01)), 4096)


def test_the_fit_recovers_known_costs_and_extends_past_the_largest_group():
    rng = np.random.default_rng(0)
    records = []
    layouts = ([[0, 1, 2, 3]], [[0, 1], [2, 3]], [[1, 3]], [[0, 2], [1, 3]], [[0, 1, 2, 3], [0, 1]])
    for i in range(30):
        world = 4
        row_groups = [[int(rng.integers(8, 512)), ranks] for ranks in layouts[i % len(layouts)]]
        times = np.zeros((2, world))
        for w, ranks in row_groups:
            times[:, ranks] += np.asarray(ROWS.group_ms(len(ranks), w, 4096))[:, None]
        records.append(
            {"id": i, "ok": True, "world": world, "batch_size": 4096, "row_groups": row_groups}
            | {"fwd_rows_ms": times[0].tolist(), "bwd_rows_ms": times[1].tolist()}
        )
    fitted = fit(records, "test")  # the overlapping layout (a device in two groups) is left out
    assert fitted.sizes == (2, 4) and not disjoint(records[4]["row_groups"])
    np.testing.assert_allclose(np.asarray(fitted.fwd), np.asarray(ROWS.fwd), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(fitted.bwd), np.asarray(ROWS.bwd), rtol=1e-6)
    # a batch twice the labels' doubles the bytes; 3 devices lie between 2 and 4; 64 devices extend the last segment
    assert ROWS.group_ms(2, 100, 8192)[0] == pytest.approx(1.0 + 0.01 * 200)
    assert ROWS.group_ms(2, 100, 4096)[0] < ROWS.group_ms(3, 100, 4096)[0] < ROWS.group_ms(4, 100, 4096)[0]
    assert ROWS.group_ms(64, 100, 4096)[0] > ROWS.group_ms(8, 100, 4096)[0] > ROWS.group_ms(4, 100, 4096)[0]
    with pytest.raises(UserError, match="no comm record with row groups"):
        fit([{**records[0], "row_groups": []}], "test")
    with pytest.raises(UserError, match="row comm: 'nowhere' is neither a shipped fit"):
        load("nowhere")


def test_fits_are_read_back_checked_and_given_to_models_of_their_kind(tmp_path):
    path = tmp_path / "fit.json"
    write_json({"fit": {**ROWS.to_json(), "kind": "some cpu"}, "manifest": {}}, path)
    assert load(str(path)) == dataclasses.replace(ROWS, kind="some cpu")
    write_json({"fit": {**ROWS.to_json(), "sizes": [4, 2]}}, path)
    load.cache_clear()
    with pytest.raises(UserError, match="got group sizes \\[4, 2\\] .* expected ascending sizes >= 2"):
        load(str(path))
    path.write_text("{not json")
    load.cache_clear()
    with pytest.raises(UserError, match="row comm: .* expected a row comm fit"):
        load(str(path))
    assert for_kinds(["a kind no fit was measured on"]) is None
    for name in shipped_names():  # a shipped fit goes to the models trained on labels of its kind
        fit_ = load(name)
        assert for_kinds([fit_.kind]) == fit_ and fit_.sizes[0] >= 2
    assert make_cost_model("analytic", _task()).row_comm is None  # analytic: a block's width as all-to-all width


def test_row_groups_are_labelled_on_gloo_apart_from_the_all_to_all(tiny_checkpoint):
    """The tiny dataset's comm samples (real gloo ranks) carry row groups; the collectives are timed apart and the
    all-to-all nets train on the rest."""
    records = read_records(tiny_checkpoint[0] / "comm.jsonl")
    with_rows = [r for r in records if r.get("row_groups")]
    assert with_rows and len(with_rows) < len(records)
    for r in with_rows:
        inside = {rank for _, ranks in r["row_groups"] for rank in ranks}
        for rank in range(r["world"]):
            assert 0 <= r["fwd_rows_ms"][rank] < r["fwd_ms"][rank] and 0 <= r["bwd_rows_ms"][rank] < r["bwd_ms"][rank]
            if rank not in inside:  # no collective of its own: nothing to time
                assert r["fwd_rows_ms"][rank] < 0.05 and r["bwd_rows_ms"][rank] < 0.05
    # the all-to-all nets train on the all-to-all alone: the row groups' collectives (and the input distributions,
    # forward: test_input_dist.py) are taken out of the labels
    _, _, _, fwd_ms, bwd_ms, _ = comm_arrays(tiny_checkpoint[0])
    for i, r in enumerate(records):
        w = r["world"]
        for label, k in ((fwd_ms, "fwd"), (bwd_ms, "bwd")):
            apart = np.asarray(r.get(f"{k}_rows_ms", [0.0] * w)) + np.asarray(r.get(f"{k}_inputs_ms", [0.0] * w))
            np.testing.assert_allclose(label[i, :w], np.asarray(r[f"{k}_ms"]) - apart, rtol=1e-5, atol=1e-5)


@pytest.mark.fast
def test_the_shipped_fit_predicts_held_out_gloo_labels(tmp_path):
    """The shipped labels (150 samples, 2-8 gloo ranks): fitted on four fifths, the fifth held out is predicted within
    a median 25% per rank forward (this machine measured 18%); the shipped fit is the one ``train family=row_comm``
    makes of all the labels, its held-out figures the same."""
    records = [r for r in read_records(package_path("data/profiles/xeon-rowcomm/comm.jsonl")) if r.get("row_groups")]
    fitted = fit([r for r in records if r["id"] % 5 != 4], "four fifths")
    errors = [
        abs(p - m) / m
        for r in records
        if r["id"] % 5 == 4
        for p, m in zip(rank_ms(fitted, r)[0], r["fwd_rows_ms"])
        if p > 0
    ]
    assert len(errors) > 50 and np.median(errors) < 0.25
    _, figures, path = fit_row_comm("neuroshard_jax/data/profiles/xeon-rowcomm", "xeon-gloo", tmp_path, "test")
    shipped, again = load("xeon-gloo"), load(str(path))
    assert figures == read_json(package_path("data/row_comm/xeon-gloo.json"), "fit")["manifest"]["held_out"]
    assert shipped.sizes == again.sizes == tuple(range(2, 9)) and "family 6 model 167" in shipped.kind
    np.testing.assert_allclose(np.asarray(shipped.fwd), np.asarray(again.fwd), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(shipped.bwd), np.asarray(again.bwd), rtol=1e-6)


def _task():
    tables = [
        Table(0, 200_000, 4, 3.0, (0.2, 0.3, 0.5) + (0.0,) * 14, name="huge"),
        *(Table(1 + i, 3000 + 500 * i, 16, 2.0 + i, (1.0,) + (0.0,) * 16) for i in range(6)),
    ]
    # 3 MiB a device for tables: the huge table (3.2 MB, dim 4) fits only as row blocks; the rest, with the step's
    # buffers at batch 4096 (~0.6-0.8 MB a table), fit whole beside its blocks
    step = Task.uniform(4, 1.0, 4096, tuple(tables)).step_memory().total  # each device's slice of the batch
    return Task.uniform(4, (3 * 2**20 + step) / 2**30, 4096, tuple(tables))


@pytest.mark.fast
def test_a_model_prices_row_groups_apart_from_the_all_to_all():
    plan = search_plan(_task(), make_searcher("size_lookup_greedy"), CostModelSpec("analytic").for_task(_task()), 0)
    layout = comm_layout(plan)
    assert layout.row_groups == [[4, [0, 1, 2, 3]]]
    model = make_cost_model("analytic", plan.task)
    none = dataclasses.replace(model, row_comm=RowComm("zero", (2,), ((0.0, 0.0),), ((0.0, 0.0),), 4096))
    priced = dataclasses.replace(model, row_comm=ROWS)
    dims = plan_arrays(plan, priced).devices.dim_sums
    assert dims.tolist() == layout.dim_sums and plan_arrays(plan).devices.dim_sums.tolist() == plan.dim_sums().tolist()
    fwd, bwd = device_row_ms(ROWS, plan)
    assert np.allclose(fwd, ROWS.group_ms(4, 4, 4096)[0]) and np.allclose(bwd, ROWS.group_ms(4, 4, 4096)[1])
    base, with_rows = score_plan(none, plan), score_plan(priced, plan)
    np.testing.assert_allclose(with_rows.bwd_comm_ms - base.bwd_comm_ms, bwd, rtol=1e-5)
    assert np.all(with_rows.fwd_comm_ms >= base.fwd_comm_ms + fwd.min() - 1e-4)
    batched, _ = score_plans_devices(priced, [plan, plan], uncertainty=False)
    np.testing.assert_allclose(batched.total_ms[1], with_rows.total_ms, rtol=1e-5)
    # the public jitted API, from one's own JAX code: the same plan cost with the row terms passed in
    arrays = plan_arrays(plan, priced)
    rows = tuple(r[0] for r in fitted_ms(priced, [plan]))
    np.testing.assert_allclose(arrays.devices.rows_ms, rows)
    cost = plan_costs(priced.fns, priced.params, arrays)
    assert float(cost) == pytest.approx(with_rows.total_ms.max(), rel=1e-5)
    unpriced = arrays._replace(devices=arrays.devices._replace(rows_ms=None))
    assert float(plan_costs(priced.fns, priced.params, unpriced)) < float(cost)


def test_a_group_across_hosts_is_scaled_to_the_links_and_one_within_a_host_is_not():
    links = Links(200.0, 25.0, devices_per_host=2)
    task = dataclasses.replace(_task(), links=links)
    huge = task.tables[0]
    across = Plan(task, (*row_shards(0, huge.rows, huge.dim, [0, 1, 2, 3]), *_whole_rest(task)))
    within = Plan(task, (*row_shards(0, huge.rows, huge.dim, [2, 3]), *_whole_rest(task)))
    fwd, _ = device_row_ms(ROWS, across)
    np.testing.assert_allclose(fwd, ROWS.group_ms(4, 4, 4096)[0] * task.comm_scale())
    fwd, bwd = device_row_ms(ROWS, within)
    assert fwd[:2].tolist() == [0.0, 0.0] and np.allclose(fwd[2:], ROWS.group_ms(2, 4, 4096)[0])
    # the model keeps the fit under the hosts' comm scale: the row term is added once, scaled per group
    model = dataclasses.replace(make_cost_model("analytic", task), row_comm=ROWS)
    scaled = model.with_scales(task.comm_scale())
    assert scaled.row_comm is ROWS and isinstance(scaled.params, Scaled)


def _whole_rest(task):
    return [Shard(t, 0, task.tables[t].dim, t % task.num_devices) for t in range(1, task.num_tables)]


@pytest.mark.fast
def test_column_wise_tables_run_an_all_to_all_of_their_own():
    """TorchRec runs one all-to-all per sharding type: a plan with a table cut in columns whose whole tables stay
    table-wise prices and measures the column-wise slices' all-to-all apart from the table-wise one; a plan without
    keeps its one all-to-all, and so does one whose whole tables join the column-wise group (the default)."""
    from neuroshard_jax.core.assignment import apart_arrays
    from neuroshard_jax.kernels.messages import CommRequest
    from neuroshard_jax.kernels.processes import run_comm
    from neuroshard_jax.kernels.worker.comm import all_to_alls

    task = dataclasses.replace(_task(), devices=[Device(1.0)] * 4)
    whole = tuple(Shard(t, 0, task.tables[t].dim, t % 4) for t in range(task.num_tables))
    cut = tuple(s for s in whole if s.table != 1) + (Shard(1, 0, 8, 0), Shard(1, 8, 8, 3))
    plain, split = Plan(task, whole).validate(), Plan(task, cut, merge_column_wise=False).validate()
    assert not comm_layout(plain).column_wise
    merged = comm_layout(Plan(task, cut).validate())
    assert merged.column_wise == merged.dim_sums and len(merged.inputs) == 1
    assert all_to_alls(merged.dim_sums, merged.column_wise) == [merged.dim_sums]
    layout = comm_layout(split)
    assert layout.column_wise == [8, 0, 0, 8] and layout.dim_sums == split.dim_sums().tolist()
    assert all_to_alls(layout.dim_sums, layout.column_wise) == [
        [d - c for d, c in zip(layout.dim_sums, [8, 0, 0, 8])],
        [8, 0, 0, 8],
    ]
    assert all_to_alls(comm_layout(plain).dim_sums) == [comm_layout(plain).dim_sums]
    # the model: the two all-to-alls' times add up (analytic comm: latency + bytes, so the split pays a latency more)
    model = make_cost_model("analytic", task)
    costs = score_plan(model, split)
    mask = np.ones(4, bool)
    parts = [np.asarray(p, np.float32) for p in all_to_alls(layout.dim_sums, layout.column_wise)]
    expected = sum(np.asarray(model.fns.bwd_comm(model.params, p, mask)) for p in parts)
    np.testing.assert_allclose(costs.bwd_comm_ms, expected, rtol=1e-5)
    assert np.all(apart_arrays(plain) == 0) and apart_arrays(split)[0].tolist() == [8, 0, 0, 8]
    # the comm benchmark on real gloo ranks runs both
    requests = [
        CommRequest.of({"dim_sums": [24, 8], **extra}, i, 256, [0.0, 0.0], 1, 2)
        for i, extra in enumerate(({}, {"column_wise": [8, 8]}))
    ]
    answers = run_comm(requests, 2, 120)
    assert all(r.fwd_ms > 0 and r.bwd_ms > 0 for i in (0, 1) for r in answers[i])


def test_a_sequence_table_s_row_blocks_are_an_all_to_all_of_their_own():
    """A sequence table cut into row blocks reduces nothing: each block sends the rows its ids looked up (TorchRec's
    sequence row_wise), so the blocks are no row group but an all-to-all of their own whose widths add up to the
    table's whole width (ids x dim); the model prices it apart, the comm benchmark runs it on real gloo ranks, and
    the row-split stage tries every sequence table in blocks."""
    from neuroshard_jax.core.assignment import APART, apart_arrays, row_groups, sequence_row_dims
    from neuroshard_jax.kernels.messages import CommRequest
    from neuroshard_jax.kernels.processes import run_comm
    from neuroshard_jax.kernels.worker.comm import all_to_alls
    from neuroshard_jax.search.ways import row_split_choices

    tables = [
        dataclasses.replace(Table(0, 4000, 16, 8.0, (1.0,) + (0.0,) * 16), pooling="none"),
        *(Table(1 + i, 3000, 16, 2.0, (1.0,) + (0.0,) * 16) for i in range(3)),
    ]
    task = Task.uniform(4, 1.0, 4096, tuple(tables))
    blocks = row_shards(0, 4000, 16, range(4))
    plan = Plan(task, tuple(blocks) + tuple(Shard(t, 0, 16, t) for t in (1, 2, 3))).validate()
    whole = Plan(task, tuple(Shard(t, 0, 16, t) for t in range(4))).validate()
    assert row_groups(plan) == []  # no reduce-scatter of partial sums
    rows_dims = sequence_row_dims(plan)
    assert rows_dims == [32] * 4 and sum(rows_dims) == whole.dim_sums()[0] == 128  # 16 x 8 ids, spread over 4
    layout = comm_layout(plan)
    assert layout.row_wise == rows_dims and layout.dim_sums == [32, 48, 48, 48]
    assert not comm_layout(whole).row_wise and not layout.row_groups
    assert all_to_alls(layout.dim_sums, (), layout.row_wise) == [[0, 16, 16, 16], [32, 32, 32, 32]]
    apart = apart_arrays(plan, rows_apart=True)
    assert apart.shape == (APART, 4) and apart[3].tolist() == rows_dims and not apart[:3].any()
    # priced: the two all-to-alls' times add up (analytic comm)
    model = make_cost_model("analytic", task)
    costs = score_plan(model, plan)
    mask = np.ones(4, bool)
    parts = [np.asarray(p, np.float32) for p in all_to_alls(layout.dim_sums, (), layout.row_wise)]
    expected = sum(np.asarray(model.fns.bwd_comm(model.params, p, mask)) for p in parts)
    np.testing.assert_allclose(costs.bwd_comm_ms, expected, rtol=1e-5)
    # measured: the comm benchmark runs the row-wise all-to-all after the table-wise one
    request = CommRequest.of(layout.to_json(), "seq", 256, [0.0] * 4, 1, 2)
    assert CommRequest.from_json(request.to_json()).row_wise == tuple(rows_dims)
    answers = run_comm([request], 4, 120)
    assert all(r.fwd_ms > 0 and r.bwd_ms > 0 for r in answers["seq"])
    # searched: every sequence table in row blocks is one of the row-split stage's ways
    assert row_split_choices(task, "fit") == [(), (0,)]
