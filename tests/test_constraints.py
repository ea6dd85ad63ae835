"""Placement constraints (pin, exclude, no_split, max_shards, colocate): every searcher that takes them keeps them
on random constrained tasks that have a known feasible plan; conflicts are named; the others refuse in one line."""

import dataclasses

import numpy as np
import pytest

from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.core.constraints import violations
from neuroshard_jax.core.devices import Device
from neuroshard_jax.core.errors import InfeasibleError, PlanError, UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.sharding import Shard
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.choice import CostModelSpec, make_cost_model
from neuroshard_jax.costs.scoring import score_plan
from neuroshard_jax.search.pipeline import search_plan
from searchers import make_searcher

from .conftest import make_table, make_task

CONSTRAINED_SEARCHERS = (
    "beam",
    "grid",
    "rl",
    "random",
    "size_greedy",
    "lookup_greedy",
    "dim_greedy",
    "size_lookup_greedy",
)


def constrained_task(seed: int) -> Task:
    """Tables with random constraints that a known table-wise placement keeps (memory is no obstacle)."""
    rng = np.random.default_rng(seed)
    n, count = 3, 10  # one shape for all 20 tasks: the searchers compile once (the constraints and tables vary)
    known = rng.integers(0, n, count)  # the feasible placement the constraints are drawn from
    tables = []
    for t in range(count):
        table = make_table(
            t,
            rows=int(rng.integers(1_000, 60_000)),
            dim=int(rng.choice([16, 32, 64])),
            pooling=float(rng.uniform(1, 30)),
        )
        kind = rng.integers(0, 6)
        if kind == 0:
            table = table.constrained(pin=int(known[t]))
        elif kind == 1:
            table = table.constrained(exclude=tuple(d for d in range(n) if d != known[t])[:1])
        elif kind == 2:
            table = table.constrained(no_split=True)
        elif kind == 3:
            table = table.constrained(max_shards=2)
        elif kind == 4:
            table = table.constrained(colocate=f"g{known[t]}")  # tables known together share a group
        tables.append(table)
    task = make_task(tables, num_devices=n, batch_size=4096)  # the rl policy's batch
    total = sum(task.table_mem_bytes(i) for i in range(task.num_tables))
    return dataclasses.replace(task, devices=[Device(1.01 * total / GIB_BYTES)] * task.num_devices)


@pytest.mark.parametrize("searcher", CONSTRAINED_SEARCHERS)
def test_searchers_keep_every_constraint_on_20_tasks(searcher):
    for seed in range(20):
        task = constrained_task(seed)
        plan = search_plan(task, make_searcher(searcher), CostModelSpec("analytic").for_task(task), seed)
        assert violations(task.tables, plan.shards, task.table_names()) == [], (searcher, seed)
        task_json = Task.from_json(task.to_json())  # the constraints survive the task file
        assert task_json.tables == task.tables


def test_violations_and_conflicts_are_named():
    tables = [make_table(0, rows=1000, dim=32), make_table(1, rows=1000, dim=32)]
    task = make_task(
        [tables[0].constrained(pin=1, no_split=True), tables[1].constrained(colocate="a")],
        num_devices=2,
    )
    bad = Plan(task, (Shard(0, 0, 16, 0), Shard(0, 16, 16, 0), Shard(1, 0, 32, 0)))
    found = violations(task.tables, bad.shards, task.table_names())
    assert found == ["table 0: pinned to device 1, has shards on [0]", "table 0: no_split, cut into 2 shards"]
    with pytest.raises(PlanError, match="plan breaks 2 constraints: table 0: pinned to device 1"):
        bad.validate()
    heavy = make_table(2, rows=3_000_000, dim=64)  # 0.72 GiB each
    pinned = make_task([heavy.constrained(pin=0), dataclasses.replace(heavy, id=3).constrained(pin=0)], num_devices=2)
    with pytest.raises(InfeasibleError, match=r"tables pinned to device 0 \(2, 3\) need 1.43 GiB, its cap is 1 GiB"):
        search_plan(pinned, make_searcher("beam"), CostModelSpec("analytic").for_task(pinned), 0)
    apart = make_task(
        [tables[0].constrained(pin=0, colocate="g"), tables[1].constrained(pin=1, colocate="g")],
        num_devices=2,
    )
    with pytest.raises(InfeasibleError, match="colocate group 'g': its tables are pinned to devices \\[0, 1\\]"):
        search_plan(apart, make_searcher("grid"), CostModelSpec("analytic").for_task(apart), 0)
    with pytest.raises(UserError, match="searcher torchrec: does not take the constraint pin .* one of beam"):
        pinned_one = make_task([tables[0].constrained(pin=1)], num_devices=2)
        search_plan(pinned_one, make_searcher("torchrec"), CostModelSpec("analytic").for_task(pinned_one), 0)
    obj = make_task([tables[0]], num_devices=2).to_json()
    obj["tables"][0]["pin"] = 5
    with pytest.raises(UserError, match=r"task.tables\[0\].pin: got device 5, expected 0..1"):
        Task.from_json(obj)


def heterogeneous_task(speeds=(1.0, 1.0, 0.5)) -> Task:
    """3 devices: device 0 too small for the two large tables (only devices 1 and 2 hold them), device 2 slow."""
    large = [make_table(t, rows=2_000_000, dim=64, pooling=8.0) for t in range(2)]  # 0.48 GiB each
    small = [make_table(t, rows=20_000 * t, dim=32, pooling=float(t)) for t in range(2, 10)]
    base = make_task(large + small, batch_size=4096)
    devices = [Device(0.3, speeds[0]), Device(1.0, speeds[1]), Device(1.0, speeds[2])]
    return Task(devices, base.batch_size, base.tables)


@pytest.mark.fast
@pytest.mark.parametrize("searcher", CONSTRAINED_SEARCHERS)
def test_heterogeneous_devices_every_searcher_keeps_each_cap_and_scales_by_speed(searcher):
    task = heterogeneous_task()
    analytic_model = make_cost_model("analytic", task)
    plan = search_plan(task, make_searcher(searcher), CostModelSpec("analytic").for_task(task), 0)  # validated
    assert (plan.mem_bytes() <= task.cap_bytes()).all()
    assert all(s.device != 0 for s in plan.shards if s.table < 2 and s.dim == 64)  # a large table whole: not on 0
    same = Task.uniform(
        task.num_devices, task.devices[0].mem_cap_gb, task.batch_size, task.tables
    )  # identical devices of speed 1
    raw = score_plan(analytic_model, dataclasses.replace(plan, task=same)).compute_ms
    np.testing.assert_allclose(plan.costs.compute_ms, raw / task.speeds(), rtol=1e-5)


@pytest.mark.fast
def test_faster_devices_get_more_work_and_the_schema_checks_devices():
    task = Task([Device(1.0, 0.5), Device(1.0, 3.0)], 4096, heterogeneous_task().tables[2:])
    for searcher in ("grid", "size_lookup_greedy"):  # the slow device first: empty devices are not all alike
        plan = search_plan(task, make_searcher(searcher), CostModelSpec("analytic").for_task(task), 0)
        raw = plan.costs.compute_ms * task.speeds()
        assert raw[1] > 1.5 * raw[0], (searcher, raw)  # the 6x faster device carries more of the work
    obj = task.to_json()
    assert obj["num_devices"] == 2 and obj["devices"][1] == {"mem_cap_gb": 1.0, "speed": 3.0}
    assert Task.from_json({**obj, "devices": list(task.devices)}) == task  # Device objects are taken too
    assert Task.from_json(obj) == task and Task.from_json({k: v for k, v in obj.items() if k != "num_devices"}) == task
    assert Task([Device(2.0)] * 3, 512, task.tables).is_uniform  # identical devices: a plain task
    for change, message in (
        ({"devices": [{"mem_cap_gb": 1.0, "speed": 0}]}, r"task.devices\[0\].speed: got 0, expected a finite number"),
        ({"devices": [{"mem_cap": 1.0}]}, r"task.devices\[0\].mem_cap: unknown key"),
        ({"num_devices": 3}, r"task.num_devices: got 3, expected 2 \(the devices given\)"),
        ({"mem_cap_gb": 4.0}, r"task.mem_cap_gb: got 4.0, expected 1.0 \(the largest of the devices' caps\)"),
        ({"devices": []}, r"task.devices: got \[\], expected a non-empty list"),
    ):
        with pytest.raises(UserError, match=message):
            Task.from_json({**obj, **change})
    with pytest.raises(UserError, match="searcher=torchrec: TorchRec's planner takes no per-device compute speed"):
        search_plan(task, make_searcher("torchrec"), CostModelSpec("analytic").for_task(task), 0)
    small = Task([Device(0.001), Device(1.0)], 4096, task.tables)
    with pytest.raises(
        InfeasibleError, match=r"tables need .* GiB in total \(.*\), expected at most .* GiB \(2 devices of"
    ):
        tight = dataclasses.replace(small, tables=heterogeneous_task().tables)
        search_plan(tight, make_searcher("beam"), CostModelSpec("analytic").for_task(tight), 0)
