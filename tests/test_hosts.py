"""Devices in several hosts: the task format, the comm scaled to the links, and row blocks kept within one host
(TorchRec's table_row_wise)."""

import dataclasses

import numpy as np
import pytest

from neuroshard_jax.core.devices import Device, Links
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.table import Table
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.choice import CostModelSpec, make_cost_model
from neuroshard_jax.costs.cost_model import Scaled
from neuroshard_jax.costs.scoring import score_plan
from neuroshard_jax.kernels.torchrec_format import to_torchrec
from neuroshard_jax.measure.breakdown import explanation, format_explanation
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.search.ways import row_blocks_of
from searchers import make_searcher

LINKS = {"intra_host_gbps": 200.0, "inter_host_gbps": 25.0}


def _tables(n=8):
    return [Table(i, 4000 + 700 * i, 16 * (1 + i % 3), 2.0 + i, (1.0,) + (0.0,) * 16) for i in range(n)]


def test_links_scale_each_device_by_its_off_host_peers():
    # 4 devices in hosts of 2: each has 2 of 3 peers off its host: (1/3) + (2/3) * 200/25 = 17/3
    assert np.allclose(Links(200, 25).comm_scale([0, 0, 1, 1]), 17 / 3)
    # a lone device in its host sends everything over the network; the others a third of it
    assert np.allclose(Links(200, 25).comm_scale([0, 0, 0, 1]), [2 / 3 + 8 / 3] * 3 + [8.0])
    assert np.allclose(Links(200, 25).comm_scale([0, 0]), 1.0) and Links(1, 1).comm_scale([0]).shape == (1,)
    tables = Task.uniform(1, 1.0, 256, tuple(_tables(2))).to_json()["tables"]
    links = {**LINKS, "devices_per_host": 8}
    task = Task.from_json({"num_devices": 16, "mem_cap_gb": 1, "batch_size": 256, "links": links, "tables": tables})
    assert task.hosts() == [0] * 8 + [1] * 8 and task.local_size() == 8 and task.multi_host
    assert Task.from_json(task.to_json()) == task


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"devices": [{"mem_cap_gb": 1, "host": 0}, {"mem_cap_gb": 1, "host": 1}]},
            r"task.links: missing, but the devices sit in 2 hosts; expected",
        ),
        ({"links": {**LINKS, "devices_per_host": 0}}, r"task.links.devices_per_host: got 0, expected an integer >= 1"),
        ({"links": {"intra_host_gbps": 200}}, r"task.links.inter_host_gbps: missing, expected a value"),
        ({"links": {**LINKS, "devices_per_host": 2, "gbps": 1}}, r"task.links.gbps: unknown key"),
        ({"links": LINKS}, r"task.links: the devices sit in one host; expected a host per device"),
        (
            {"num_devices": 3, "links": {**LINKS, "devices_per_host": 2}},
            r"task.links.devices_per_host: got 2, but 3 devices do not fill whole hosts of it; expected a divisor of 3",
        ),
        ({"mem_cap_gb": 1e10}, r"task\.mem_cap_gb: got 10000000000\.0, expected a finite number > 0 and <= 1048576"),
        ({"devices": [{"mem_cap_gb": 1, "host": -1}] * 2}, r"task.devices\[0\].host: got -1, expected an integer"),
    ],
)
def test_bad_hosts_and_links_are_named(change, message):
    obj = {
        "num_devices": 2,
        "mem_cap_gb": 1,
        "batch_size": 256,
        "tables": [{"id": 0, "rows": 100, "dim": 8, "pooling_factor": 1.0, "bins": [1.0] + [0.0] * 16}],
    }
    if "devices" in change:
        obj.pop("num_devices"), obj.pop("mem_cap_gb")
    with pytest.raises(UserError, match=message):
        Task.from_json({**obj, **change})


@pytest.mark.fast
def test_the_model_scales_transfers_but_not_the_wait_for_a_late_peer():
    flat = Task.uniform(4, 1.0, 512, tuple(_tables()))
    hosts = Task([Device(1.0, host=d // 2) for d in range(4)], 512, _tables(), links=Links(200, 25))
    plan = search_plan(flat, make_searcher("size_greedy"), CostModelSpec("analytic").for_task(flat), 0)
    spread = Plan(hosts, plan.shards)
    one, two = (make_cost_model("analytic", t) for t in (flat, hosts))
    assert isinstance(two.params, Scaled) and one is not two and two.expected.params.comm_scale[0] > 5
    a, b = score_plan(one, plan), score_plan(two, spread)
    assert np.allclose(a.compute_ms, b.compute_ms) and np.allclose(b.bwd_comm_ms, a.bwd_comm_ms * 17 / 3, rtol=1e-5)
    wait = a.compute_ms + a.bwd_comm_ms
    late = np.argmax(wait)  # the latest device waits for nobody: its fwd comm is all transfer
    assert np.isclose(b.fwd_comm_ms[late], a.fwd_comm_ms[late] * 17 / 3, rtol=1e-4)
    early = np.argmin(b.compute_ms + b.bwd_comm_ms)
    assert b.fwd_comm_ms[early] < a.fwd_comm_ms[early] * 17 / 3  # its wait is not scaled


def test_row_blocks_stay_in_the_least_full_host_and_export_as_table_row_wise():
    tables = [Table(0, 200_000, 4, 3.0, (0.5, 0.5) + (0.0,) * 15, name="big"), *_tables(6)[1:]]
    task = Task.uniform(
        8, 2 / 1024, 512, tuple(tables), links=Links(200, 25, devices_per_host=4)
    )  # 3.2 MB: no device holds it
    assert task.host_groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    blocks = row_blocks_of(task, [0], within_host=True)
    assert [s.device for s in blocks] == [0, 1, 2, 3] and sum(s.num_rows for s in blocks) == 200_000
    assert [s.device for s in row_blocks_of(task, [0])] == list(range(8))
    plan = search_plan(task, make_searcher("beam"), CostModelSpec("analytic").for_task(task), 0).validate()
    devices = sorted(s.device for s in plan.shards_of(0))
    assert devices in ([0, 1, 2, 3], [4, 5, 6, 7], list(range(8)))
    within = dataclasses.replace(plan, shards=tuple(s for s in plan.shards if s.table) + blocks)
    types = {name: p.sharding_type for name, p in to_torchrec(within, device="cpu").plan[""].items()}
    assert types["big"] == "table_row_wise"
    one_host = Task.uniform(8, 2 / 1024, 512, tuple(tables))
    assert one_host.host_groups() is None and one_host.local_size() is None


def test_torchrec_planner_sees_the_hosts_and_explain_says_how_comm_is_scaled():
    tables = [Table(0, 200_000, 4, 3.0, (0.5, 0.5) + (0.0,) * 15, name="big"), *_tables(6)[1:]]
    task = Task.uniform(
        4, 3 / 1024, 512, tuple(tables), links=Links(200, 25, devices_per_host=2)
    )  # 3 MiB: big fits no device
    options = {"sharding_types": ["table_wise", "table_row_wise"], "reservation": "percent"}
    plan = search_plan(task, make_searcher("torchrec", options), CostModelSpec("analytic").for_task(task), 0).validate()
    big = sorted(s.device for s in plan.shards_of(0))
    assert big in ([0, 1], [2, 3]), big  # TorchRec's table_row_wise: the blocks within one host of 2
    text = format_explanation(explanation(plan, make_cost_model("analytic", task)))
    assert "2 hosts (200 GB/s within, 25 GB/s between): comm predicted on one host and scaled x5.67..5.67" in text
    skewed = Task([Device(1.0, host=h) for h in (0, 0, 0, 1)], 512, _tables(), links=Links(200, 25))
    with pytest.raises(UserError, match=r"searcher=torchrec: TorchRec's topology has hosts of equal size"):
        search_plan(skewed, make_searcher("torchrec"), CostModelSpec("analytic").for_task(skewed), 0)
