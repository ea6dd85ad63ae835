"""The planner is built from parts: a Searcher (its capabilities declared by the interface), a CostModelSpec, the
measured stages; names turn into parts once, at the edge. Files are parsed by the one schema mechanism."""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import pytest

import neuroshard_jax as nsj
from neuroshard_jax.core.devices import Device
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.table import PoolSpec
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.choice import CostModelSpec
from neuroshard_jax.measure.calibration import CalibrateConfig
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.search.sharding_planner import Planner, PlannerOptions
from searchers import Searcher, make_searcher
from searchers.baselines import greedy_plan
from searchers.neuroshard import BeamSearch
from searchers.registry import register

from .conftest import make_table, make_task

pytestmark = pytest.mark.fast  # the before-commit tier (make test-fast)

TABLES = {
    f"t{i}": {"rows": 2000 * (i + 1), "dim": 16, "pooling_factor": 1.0 + i, "bins": [1.0] + [0.0] * 16}
    for i in range(5)
}


@dataclasses.dataclass(frozen=True)
class Pinning(Searcher):
    """A searcher of this test: table-wise by size, honouring pins only."""

    constraints: ClassVar[tuple[str, ...]] = ("pin",)
    name: ClassVar[str] = "pinning"

    def search(self, task, cost_model, seed):
        return greedy_plan(task, "size", self.name)


def test_a_searcher_of_ones_own_plans_through_the_pipeline_with_its_declared_capabilities():
    tables = [make_table(i, rows=1000 + 100 * i).constrained(pin=i % 2) for i in range(4)]
    task = make_task(tables)
    plan = Planner(Pinning(), CostModelSpec("analytic")).plan(task)
    assert plan.searcher == "pinning" and all(s.device == s.table % 2 for s in plan.shards)
    # a constraint it does not declare is refused, naming the searchers that take it
    colocated = make_task([t.constrained(pin=None, colocate="g") for t in tables])
    with pytest.raises(UserError, match=r"^searcher pinning: does not take the constraint colocate .* expected one of"):
        search_plan(colocated, Pinning(), CostModelSpec("analytic").for_task(colocated), 0)


def test_only_searchers_register_and_a_budget_is_shared_through_the_interface():
    with pytest.raises(TypeError, match="deriving from Searcher"):
        register("not-a-searcher")(type("Plain", (), {}))
    beam = make_searcher("beam", {"budget_s": 10.0})
    assert isinstance(beam, BeamSearch) and beam.with_budget(2.5).budget_s == 2.5
    grid = make_searcher("grid")
    assert grid.budget_s is None and grid.with_budget(1.0) is grid  # no budget: itself
    assert beam.share(4).max_work == beam.max_work / 4 and grid.share(4) is grid  # a work bound is shared too
    assert make_searcher("torchrec").own_row_splits and grid.replicates and not make_searcher("dim_greedy").replicates


def test_the_planner_takes_parts_and_names_turn_into_parts_once():
    with pytest.raises(UserError, match=r"^planner.searcher: got 'beam', expected a Searcher"):
        Planner(searcher="beam")
    with pytest.raises(UserError, match=r"^planner.cost_model: got 'analytic', expected a CostModelSpec"):
        Planner(make_searcher("grid"), "analytic")
    with pytest.raises(UserError, match=r"^cost_model: got 'nope', expected one of"):
        CostModelSpec("nope")
    with pytest.raises(UserError, match=r"^searcher.width: unknown key"):
        PlannerOptions("beam", searcher_options={"width": 3}).planner()
    planner = Planner(make_searcher("size_lookup_greedy"), CostModelSpec("analytic"), seed=3)
    by_parts = nsj.plan(TABLES, num_devices=2, mem_cap_gb=1.0, planner=planner)
    by_names = nsj.plan(
        TABLES, num_devices=2, mem_cap_gb=1.0, searcher="size_lookup_greedy", cost_model="analytic", seed=3
    )
    assert (by_parts.shards, by_parts.costs) == (by_names.shards, by_names.costs)  # the same seed, the same plan
    with pytest.raises(UserError, match=r"^planner: given with searcher=\.\.\."):
        nsj.plan(TABLES, num_devices=2, planner=planner, searcher="grid")
    with pytest.raises(UserError, match=r"^planner: given with k=\.\.\."):
        nsj.plan(TABLES, num_devices=2, planner=planner, k=5)
    for keyword in ({"seed": 7}, {"searcher": "beam"}, {"row_split": "fit"}):  # explicit, even if default
        with pytest.raises(UserError, match=rf"^planner: given with {next(iter(keyword))}=\.\.\.; expected"):
            nsj.plan(TABLES, num_devices=2, planner=planner, **keyword)
    with pytest.raises(UserError, match=r"^planner: got 'beam', expected a Planner"):
        nsj.plan(TABLES, num_devices=2, planner="beam")
    with pytest.raises(UserError, match=r"^planner.run: got dict, expected a Task"):
        planner.run({"tables": TABLES})
    with pytest.raises(UserError, match=r"^serach: unknown option, did you mean 'searcher'\?"):
        nsj.plan(TABLES, num_devices=2, serach="grid")


def test_a_planner_option_is_one_field_and_every_entry_point_takes_it(monkeypatch):
    """An option added to ``PlannerOptions`` (a subclass with one more field, put in its place) is at once a keyword
    of ``nsj.plan`` and of the TorchRec adapter and a key of the main job's command line, type-checked alike."""
    from hydra import compose, initialize_config_module

    from neuroshard_jax import conf
    from neuroshard_jax.search import sharding_planner
    from neuroshard_jax.search.job import main_config
    from neuroshard_jax.torchrec.planner import NeuroShardPlanner

    seen = []

    @dataclasses.dataclass(frozen=True)
    class WithProbe(PlannerOptions):
        probe: int = 0

        def planner(self):
            seen.append(self.probe)
            return super().planner()

    monkeypatch.setattr(sharding_planner, "PlannerOptions", WithProbe)
    monkeypatch.setattr(conf, "PlannerOptions", WithProbe)
    try:
        conf.register()
        with initialize_config_module(config_module="neuroshard_jax.conf", version_base="1.3"):
            config = main_config(compose(config_name="config", overrides=["probe=3", "cost_model=analytic"]))
        assert config.planner.probe == 3 and seen == [3]
        nsj.plan(TABLES, num_devices=2, mem_cap_gb=1.0, searcher="size_greedy", cost_model="analytic", probe=4)
        NeuroShardPlanner(world_size=2, mem_cap_gb=1.0, cost_model="analytic", probe=5)
        assert seen == [3, 4, 5]
        with pytest.raises(UserError, match=r"^probe: got 'x', expected an integer"):
            nsj.plan(TABLES, num_devices=2, probe="x")
        with pytest.raises(UserError, match=r"^planner: given with probe=\.\.\."):
            NeuroShardPlanner(world_size=2, planner=Planner(make_searcher("grid")), probe=1)
    finally:
        monkeypatch.undo()
        conf.register()


def test_a_task_has_one_representation_and_writes_as_before():
    tables = (make_table(0), make_table(1))
    uniform = Task.uniform(3, 2.0, 512, tables)
    assert uniform == Task((Device(2.0),) * 3, 512, tables) and uniform.is_uniform and uniform.num_devices == 3
    obj = uniform.to_json()
    assert obj["num_devices"] == 3 and obj["mem_cap_gb"] == 2.0 and "devices" not in obj
    assert Task.from_json(obj) == uniform
    mixed = Task((Device(1.0), Device(4.0, 2.0)), 512, tables)
    assert not mixed.is_uniform and mixed.largest_cap_gb == 4.0 and mixed.caps_gb() == [1.0, 4.0]
    assert Task.from_json(mixed.to_json()) == mixed and mixed.to_json()["devices"][1] == {
        "mem_cap_gb": 4.0,
        "speed": 2.0,
    }


def test_plan_and_pool_files_refuse_unknown_keys_and_wrong_types_like_configs():
    task = make_task([make_table(0), make_table(1)])
    plan = search_plan(task, make_searcher("dim_greedy"), CostModelSpec("analytic").for_task(task), 0)
    obj = json.loads(json.dumps(plan.to_json()))
    assert Plan.from_json(obj) == plan
    cases = [
        (lambda o: o["shards"][0].update(dimm=16), r"^plan.shards\[0\].dimm: unknown key, did you mean 'dim'\?"),
        (lambda o: o["shards"][0].update(dim="16"), r"^plan.shards\[0\].dim: got '16', expected an integer >= 1$"),
        (
            lambda o: o["shards"][0].update(row_offset=-1),
            r"^plan.shards\[0\].row_offset: got -1, expected an integer >= 0",
        ),
        (lambda o: o.update(cost_msec=1.0), r"^plan.cost_msec: unknown key, did you mean 'cost_ms'\?"),
        (lambda o: o["task"].update(pool={"source": "synthetic", "seeds": 1}), r"^plan.task.pool.seeds: unknown key"),
        (
            lambda o: o["task"].update(batch_size=None),
            r"^plan.task.batch_size: got None, expected an integer >= 1 and <= 16777216$",
        ),
    ]
    for change, message in cases:
        bad = json.loads(json.dumps(obj))
        change(bad)
        with pytest.raises(UserError, match=message):
            Plan.from_json(bad)
    assert PoolSpec.from_json({"source": "synthetic", "seed": 2}) == PoolSpec(seed=2)


def test_a_planner_chosen_for_this_machine_takes_the_model_of_its_kind_trained_at_the_tasks_batch(monkeypatch):
    from neuroshard_jax.costs import choice

    monkeypatch.setattr(choice, "hardware", lambda: {"cpu": "Intel(R) Xeon(R) Processor", "gpu": "NVIDIA H200"})
    planner = PlannerOptions(
        "size_greedy", device="cuda"
    ).planner()  # an H200 has two models: fixed labels 2k-8k, queued 16k-64k
    for batch, name in ((4096, "h200-union"), (32768, "h200-queued")):
        planned = planner.run(make_task([make_table(i) for i in range(3)], batch_size=batch))
        assert planned.choice.name == name and planned.choice.matches and planned.plan.costs.cost_ms > 0


def test_options_none_a_misspelt_searcher_and_a_given_calibration_read_as_before():
    """``None`` options are no options; a searcher's name is checked before its options; a calibration factor the
    user gives is recorded as given (not as the float32 the scoring multiplies by); the TorchRec adapter plans any
    batch with a planner given to it too."""
    from neuroshard_jax.torchrec.planner import NeuroShardPlanner

    plan = nsj.plan(
        TABLES,
        num_devices=2,
        mem_cap_gb=1.0,
        searcher="size_greedy",
        cost_model="analytic",
        searcher_options=None,
        cost_model_options={"calibration": 1.1},
    )
    assert plan.calibration.factor == 1.1 and plan.calibration.given
    with pytest.raises(UserError, match=r"^searcher: got 'bem', expected one of"):
        nsj.plan(TABLES, num_devices=2, searcher="bem", k=5)
    # a user's own planner plans as built (no fallback slipped in); one for another device than the topology's is
    # refused (world_size alone: TorchRec's GPU trainer topology)
    own = Planner(make_searcher("grid"), device="cuda")
    adapter = NeuroShardPlanner(world_size=2, mem_cap_gb=1.0, planner=own)
    assert adapter.planner is own and not adapter.planner.fallback
    with pytest.raises(UserError, match=r"^planner: plans for device 'cpu', the topology's compute device is 'cuda'"):
        NeuroShardPlanner(world_size=2, mem_cap_gb=1.0, planner=Planner(make_searcher("grid")))


def test_one_stage_sequence_built_once_and_run_in_its_order_by_every_entry_point():
    """``Planner.stages`` is the one place the sequence is built: measured stages where asked, in one order; the plan
    names the stages that ran; ``nsj.plan`` runs the planner's own sequence (the TorchRec adapter's ``plan`` and
    ``collective_plan`` are checked in test_torchrec_planner and test_portfolio)."""
    names = lambda planner: tuple(s.name for s in planner.stages())  # noqa: E731
    assert names(PlannerOptions().planner()) == ("first_contact", "search")  # the model chosen for this machine
    assert names(PlannerOptions(cost_model="analytic").planner()) == ("search",)  # a named model is used as given
    on_plan = CalibrateConfig(name="measured", on="plan")
    every = PlannerOptions(cost_model="analytic", calibrate=on_plan, autotune="kernels", polish=True).planner()
    assert names(every) == ("search", "calibrate_on_plan", "autotune", "polish", "check_on_plan")
    on_tables = PlannerOptions(calibrate=True, autotune="loop", polish=True).planner()
    assert names(on_tables) == ("calibrate", "search", "autotune", "polish")
    plan = nsj.plan(TABLES, num_devices=2, mem_cap_gb=1.0, searcher="grid", cost_model="analytic")
    assert plan.stages == ("search",) and Plan.from_json(plan.to_json()).stages == ("search",)
    old = plan.to_json()
    del old["stages"]
    assert Plan.from_json(old) == plan and Plan.from_json(old).stages == ()  # a plan.json from before stages loads


def test_a_device_never_holds_sequence_slices_of_two_widths():
    """TorchRec runs an EmbeddingCollection's column slices on a rank in one FBGEMM unpooled kernel, which takes one
    width (DistributedModelParallel failed on a plan with slices 16 and 32 wide of 64-wide sequence tables on one
    rank): such a plan is refused by ``validate``; the search's plans are evened (the wider table cut to the narrower
    width where they meet, on the same devices: the same weights, a copy of the ids a slice); bags and whole tables
    are left alone."""
    from neuroshard_jax.core.errors import PlanError
    from neuroshard_jax.core.sharding import Shard, even_sequence_slices, mixed_sequence_slices

    history, actions, bag = (
        dataclasses.replace(make_table(i, rows=1000, dim=64, pooling=20.0), pooling=kind)
        for i, kind in enumerate(("none", "none", "sum"))
    )
    task = make_task([history, actions, bag], num_devices=4)
    shards = (
        *(Shard(0, 16 * k, 16, k) for k in range(4)),
        Shard(1, 0, 32, 2),
        Shard(1, 32, 32, 3),
        Shard(2, 0, 32, 2),  # a bag's slices may differ: pooled kernels take mixed widths
        Shard(2, 32, 32, 1),
    )
    assert mixed_sequence_slices(task.tables, shards) == ((2, 64, (16, 32)), (3, 64, (16, 32)))
    with pytest.raises(PlanError, match=r"^plan: device 2 holds column slices \[16, 32\] wide of sequence tables 64"):
        Plan(task, shards).validate()
    even = even_sequence_slices(task.tables, shards)
    assert [s for s in even if s.table == 1] == [
        Shard(1, 0, 16, 2),
        Shard(1, 16, 16, 2),
        Shard(1, 32, 16, 3),
        Shard(1, 48, 16, 3),
    ]
    assert [s for s in even if s.table != 1] == [s for s in shards if s.table != 1]
    plan = Plan(task, even).validate()
    before = Plan(task, shards).memory()  # the same weights; each slice holds its own copy of the ids
    assert [m.weights for m in plan.memory()] == [m.weights for m in before]
    assert all(m.buffers >= b.buffers for m, b in zip(plan.memory(), before))
    beam = Planner(cost_model=CostModelSpec("analytic"), searcher=make_searcher("beam")).run(task).plan
    assert not mixed_sequence_slices(task.tables, beam.shards)
