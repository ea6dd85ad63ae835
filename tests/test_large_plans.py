"""Plans on many devices: the printouts stay short, a plan far past the devices the cost model was trained on
says so, and explain stays linear in the devices (its split gains equal rescoring every variant whole)."""

import dataclasses
import json
import re

import numpy as np
import pytest

from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.plan_file import PRINTED_DEVICES, SLOWEST_PRINTED, format_plan, printed_devices
from neuroshard_jax.core.sharding import Shard, column_shards
from neuroshard_jax.costs.analytic import analytic_model
from neuroshard_jax.costs.coverage import far_devices_warning
from neuroshard_jax.costs.scoring import score_plans, with_costs
from neuroshard_jax.measure.breakdown import explanation, format_explanation, split_gains, table_compute_ms
from neuroshard_jax.measure.diff import format_diff, plan_diff

from .conftest import make_table, make_task, run_cli

# A tiny task at batch 512 on 2,000 devices: the analytic model, a table-wise greedy searcher (seconds).
MANY = [
    "searcher=dim_greedy",
    "cost_model=analytic",
    "task.num_tables=20",
    "task.pool.num_tables=120",
    "task.batch_size=512",
    "task.mem_cap_gb=0.2",
    "task.num_devices=2000",
]


def _more(text: str, rest: str) -> int:
    [count] = re.findall(rf"^\.\.\. (\d+) more devices {re.escape(rest)}", text, flags=re.MULTILINE)
    return int(count)


def test_a_run_on_2000_devices_prints_a_summary_warns_and_explains(tmp_path):
    done = run_cli(*MANY, "explain=true", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert len(plan["devices"]) == 2000  # the file holds every device
    out = done.stdout.splitlines()
    assert len(out) < 60  # two short tables, not 4,000 lines
    assert _more(done.stdout, "in plan.json") >= 2000 - SLOWEST_PRINTED - 1
    totals = [d["cost_ms"]["total"] for d in plan["devices"]]
    slowest = int(np.argmax(totals))
    assert f"slowest {max(totals):.3f} (device {slowest})" in done.stdout
    # the warning, once, on stderr: the device count and the sizes the model's comm was fitted on
    [warning] = [line for line in done.stderr.splitlines() if line.startswith("warning: task.num_devices")]
    assert "2000 is far past" in warning and "all-to-alls of 2, 4, 8 devices" in warning
    # explain=true: summarised the same way, the slowest device marked, the chart drawn as areas
    assert _more(done.stdout, "not shown") >= 2000 - SLOWEST_PRINTED - 1
    assert any(line.endswith("<- slowest") for line in out) and any(line.endswith("<- fastest") for line in out)
    assert (tmp_path / "plan.png").stat().st_size > 10_000

    again = run_cli(f"plan={tmp_path / 'plan.json'}", "model=analytic", "chart=false", module="neuroshard_jax.explain")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("warning: task.num_devices 2000 is far past")
    assert len(again.stdout.splitlines()) < 30 and "imbalance: max/mean" in again.stdout


@pytest.fixture(scope="module")
def split_plan():
    """40 devices (past PRINTED_DEVICES): two split tables, a data-parallel one, most devices empty."""
    tables = [make_table(i, rows=3000 * (i + 1), dim=32, pooling=1.0 + 2 * i) for i in range(6)]
    task = make_task(tables, num_devices=40, mem_cap_gb=0.05, batch_size=512)
    shards = (
        *column_shards(0, 32, [0, 1, 2, 3]),
        Shard(1, 0, 32, 4),
        *column_shards(2, 32, [5, 6, 7, 8, 9, 10, 11, 12]),
        Shard(3, 0, 32, 1),
        Shard(4, 0, 32, 13),
    )
    plan = Plan(task, shards, data_parallel=(5,)).validate()
    return plan, analytic_model(task)


def _rescored_gains(model, plan):
    """The oracle: every variant (a split table whole on one of its devices, if it fits) scored in full."""
    out = {}
    for table in {s.table for s in plan.shards}:
        slices = [s for s in plan.shards if s.table == table]
        if len(slices) == 1:
            continue
        devices = sorted({s.device for s in slices})
        others = tuple(s for s in plan.shards if s.table != table)
        variants = {
            d: dataclasses.replace(plan, shards=(*others, Shard(table, 0, plan.task.tables[table].dim, d)))
            for d in devices
        }
        fitting = [d for d, v in variants.items() if v.mem_bytes()[d] <= plan.task.cap_bytes()[d]]
        scores = score_plans(model, [plan, *(variants[d] for d in fitting)])
        out[table] = {d: score - scores[0] for d, score in zip(fitting, scores[1:])}
    return out


@pytest.mark.fast
def test_split_gains_equal_rescoring_every_variant(split_plan):
    plan, model = split_plan
    gains = split_gains(model, plan)
    expected = _rescored_gains(model, plan)
    assert set(gains) == set(expected) == {0, 2}
    for table, costs in expected.items():
        best = min(costs, key=costs.get)
        assert gains[table].whole_on == best
        assert gains[table].gain_ms == pytest.approx(costs[best], rel=1e-4, abs=1e-4)


def test_table_shares_at_many_devices_add_up_to_each_devices_compute(split_plan):
    plan, model = split_plan
    compute = np.arange(1.0, 41.0)  # any per-device compute: the shares are scaled to it
    shares = table_compute_ms(model, plan, compute)
    held = np.zeros(40, bool)
    held[[s.device for s in plan.shards]] = True
    held |= bool(plan.data_parallel)  # a data-parallel table is on every device
    np.testing.assert_allclose(shares.sum(axis=1), np.where(held, compute, 0.0))
    assert (shares[:, 5] > 0).all() and shares[30, 5] == pytest.approx(compute[30])  # device 30: the replica only


def test_explanation_and_diff_of_many_devices_are_summarised(split_plan):
    plan, model = split_plan
    text = format_explanation(explanation(plan, model))
    rows = [line for line in text.splitlines() if re.match(r"^\s+\d+\s+\d+\s", line)]
    assert len(rows) == SLOWEST_PRINTED + 1 and _more(text, "not shown") == 40 - len(rows)
    assert "2: 8 slices on devices [5, 6, 7, 8, 9, 10, 11, 12]" in text
    base = dataclasses.replace(plan, shards=(*[s for s in plan.shards if s.table != 1], Shard(1, 0, 32, 20)))
    diff = format_diff(plan_diff(plan, base.validate(), model))
    assert "1: moved, devices [20] -> [4]" in diff
    assert _more(diff, "not shown") == 40 - SLOWEST_PRINTED


def test_format_plan_lists_the_slowest_and_names_a_few_unsure_devices(split_plan):
    plan, model = split_plan
    obj = {**with_costs(model, plan).to_json(), "searcher": "beam", "seed": 0, "search_time_s": 0.1}
    for d in obj["devices"]:
        d.update(model_spread=0.2, model_trust=0.5)  # every device unsure: a few named, the rest counted
    text = format_plan(obj, "big.json")
    totals = [d["cost_ms"]["total"] for d in obj["devices"]]
    assert len(printed_devices(totals)) <= SLOWEST_PRINTED + 1 < PRINTED_DEVICES < 40
    assert _more(text, "in big.json") == 40 - len(printed_devices(totals))
    assert len(re.findall(r"^device \d+: the model is unsure", text, flags=re.MULTILINE)) == SLOWEST_PRINTED
    assert f"the model is unsure on {40 - SLOWEST_PRINTED} more devices (model_trust in big.json)" in text
    small = {**obj, "devices": obj["devices"][:4], "task": {**obj["task"], "num_devices": 4}}
    assert "more devices" not in format_plan(small)  # up to PRINTED_DEVICES: every device, as before


def test_the_warning_reads_the_sizes_a_model_was_trained_on(tmp_path):
    limit = 4 * 8  # FAR_PAST_TRAINED x the largest all-to-all of the shipped comm datasets
    assert far_devices_warning(limit, "neural", {}) is None
    shipped = far_devices_warning(limit + 1, "neural", {})
    assert f"task.num_devices {limit + 1} is far past" in shipped and "comm dataset cpu-b4096" in shipped
    assert "2, 4, 8 devices" in far_devices_warning(10**5, "analytic", {})
    assert far_devices_warning(10**5, "analytic", {"comm_bw_gbps": 50.0}) is None  # the user's own numbers
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "meta.json").write_text(json.dumps({"datasets": {"comm": {"created": "nowhere", "records": 3}}}))
    assert "not recorded: the comm sampler's default" in far_devices_warning(10**5, "neural", {"checkpoint": str(mine)})
