"""The TorchRec adapter: an EmbeddingBagCollection and batches in, a ShardingPlan out (torch in this process)."""

import dataclasses
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchrec = pytest.importorskip("torchrec")

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402
from torchrec.distributed.planner.types import CustomTopologyData, Topology  # noqa: E402

from neuroshard_jax.kernels.torchrec_format import plan_shards, to_torchrec  # noqa: E402
from neuroshard_jax.torchrec.planner import NeuroShardPlanner, batch_statistics  # noqa: E402
from neuroshard_jax.workloads.streams import zipf_ids  # noqa: E402

from .conftest import REPO  # noqa: E402


class TwoCollections(torch.nn.Module):
    """A model with two collections whose table names clash (t0), one table read by two features."""

    def __init__(self):
        super().__init__()
        meta = torch.device("meta")
        self.users = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(name="t0", embedding_dim=32, num_embeddings=5000, feature_names=["u0", "u1"]),
                EmbeddingBagConfig(name="t1", embedding_dim=64, num_embeddings=800, feature_names=["u2"]),
            ],
            device=meta,
        )
        self.items = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name="t0", embedding_dim=16, num_embeddings=20000, feature_names=["i0"])],
            device=meta,
        )


def _batches(keys, rows, pooling, batch, count, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        lengths = rng.poisson(np.array(pooling)[:, None], size=(len(keys), batch))
        values = [zipf_ids(rng, r, 1.1, int(n)) for r, n in zip(rows, lengths.sum(1))]
        yield KeyedJaggedTensor.from_lengths_sync(
            keys=keys, values=torch.from_numpy(np.concatenate(values)), lengths=torch.from_numpy(lengths.reshape(-1))
        )


@pytest.mark.fast
def test_a_module_gets_a_sharding_plan_equal_to_ours():
    model = TwoCollections()
    keys, rows, pooling = ["u0", "u1", "u2", "i0"], [5000, 5000, 800, 20000], [2.0, 1.0, 30.0, 4.0]
    # u* and i0 come from different loaders in real models; here one KJT carries all four features
    stats = batch_statistics(model, _batches(keys, rows, pooling, 1024, 4), batch_size=2048, progress=False)
    by_name = {s.name: s for s in stats}
    assert set(by_name) == {"users/t0", "t1", "items/t0"}  # a clashing name is qualified by its collection
    assert by_name["users/t0"].pooling_factor == pytest.approx(3.0, rel=0.05)  # two features pooled
    # the analytic model: this test is about the conversion (the README's example runs the default neural model)
    # devices of unequal memory (TorchRec's CustomTopologyData): the plan keeps each device's own cap
    caps = CustomTopologyData(data={"ddr_cap": [2 * 1024**3, 1024**3]}, world_size=2)
    planner = NeuroShardPlanner(
        Topology(world_size=2, compute_device="cpu", custom_topology_data=caps),
        batch_size=1024,
        stats=stats[:2],
        cost_model="analytic",
        verbose=False,
    )
    plan = planner.plan(model, None)
    ours = planner.last_plan
    assert ours.task.batch_size == 2048 and ours.costs.cost_model == "analytic"
    assert ours.stages == tuple(s.name for s in planner.planner.stages()) == ("search",)  # the planner's sequence
    assert ours.task.caps_gb() == [2.0, 1.0]
    assert [t.estimated for t in ours.task.tables] == [False, False, True]  # items/t0 had no statistics
    assert set(plan.plan) == {"users", "items"}
    written = plan_shards(plan)  # per TorchRec table name; both collections' t0 collide here, so compare per module
    assert len(written) == 2
    for path, names in (("users", {"t0": "users/t0", "t1": "t1"}), ("items", {"t0": "items/t0"})):
        for torchrec_name, our_name in names.items():
            index = [t.name for t in ours.task.tables].index(our_name)
            want = sorted((s.col_offset, s.dim, s.device) for s in ours.shards if s.table == index)
            sharding = plan.plan[path][torchrec_name]
            got = sorted(
                (int(s.shard_offsets[1]), int(s.shard_sizes[1]), int(str(s.placement).split("rank:")[1][0]))
                for s in sharding.sharding_spec.shards
            )
            assert got == want and sharding.sharding_type in ("table_wise", "column_wise")
    # our plan converts on its own too (to_torchrec: a meta collection of the task's tables)
    again = plan_shards(to_torchrec(ours, device="cpu"))
    assert set(again) == {"users/t0", "t1", "items/t0"}


@pytest.mark.fast
def test_a_batch_size_outside_the_model_falls_back_with_a_warning(caplog):
    caplog.set_level(logging.INFO, logger="neuroshard_jax.torchrec.planner")  # the plan, which warns, at INFO
    model = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="a", embedding_dim=16, num_embeddings=1000, feature_names=["a"])],
        device=torch.device("meta"),
    )
    planner = NeuroShardPlanner(world_size=2, mem_cap_gb=1.0, batch_size=32, pooling_factors={"a": 3.0})
    planner.plan(model)
    ours = [r for r in caplog.records if r.name == "neuroshard_jax.torchrec.planner"]
    [warning] = [r.getMessage() for r in ours if r.levelno == logging.WARNING]
    assert "task.batch_size: got 64" in warning and "planning with cost_model=analytic instead" in warning
    assert "warning: 1 of 1 tables have estimated access statistics" in caplog.text
    assert planner.last_plan.costs.cost_model == "analytic" and planner.last_plan.task.tables[0].pooling_factor == 3.0


def _example_lines(tmp_path, script: str, *args: str) -> list[str]:
    """Run examples/``script`` with ``args`` in ``tmp_path``: its exit status 0 and one "median step" line per planner,
    ours then TorchRec's (returned)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if "median step" in line]
    assert [line.split(":")[0].strip() for line in lines] == ["neuroshard", "torchrec"], done.stdout
    return lines


def test_the_dlrm_example_trains_with_both_planners(tmp_path):
    """examples/torchrec_dlrm.py, small: statistics, our plan and TorchRec's, DistributedModelParallel on 2 gloo
    processes each, a few SGD steps; one line per planner."""
    lines = _example_lines(
        tmp_path,
        "torchrec_dlrm.py",
        "--tables",
        "3",
        "--rows",
        "1000",
        "--batch-size",
        "32",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--stats-batches",
        "2",
        "--hot-pooling",  # the smallest table looked up 200 times a sample: a candidate to be data-parallel
        "200",
    )
    assert all("quartiles" in line and "tables: " in line for line in lines), lines


def test_readme_torchrec_example_runs(capsys, caplog):
    caplog.set_level(logging.NOTSET, logger="neuroshard_jax")  # its level as it was, after the example sets it
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## From a TorchRec model") :]
    start = section.index("```python\n") + len("```python\n")
    code = section[start : section.index("```\n", start)]
    exec(compile(code, "README.md (From a TorchRec model)", "exec"), {})
    out = capsys.readouterr()
    assert "column_wise" in out.out or "table_wise" in out.out
    assert "predicted cost" in caplog.text and "estimated" not in caplog.text


@pytest.mark.fast
def test_statistics_by_feature_name_are_used_and_unknown_names_refused():
    """A statistics file of the stats CLI names features: a single-feature table takes its feature's entry."""
    from neuroshard_jax.core.errors import UserError
    from neuroshard_jax.workloads.statistics import estimated_stats

    model = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="a", embedding_dim=16, num_embeddings=1000, feature_names=["a_id"])],
        device=torch.device("meta"),
    )
    measured = dataclasses.replace(estimated_stats("a_id", 1000, 5.0, 64), estimated=False, samples=64, batches=1)
    planner = NeuroShardPlanner(world_size=2, mem_cap_gb=1.0, batch_size=32, stats=[measured], verbose=False)
    planner.plan(model)
    table = planner.last_plan.task.tables[0]
    assert not table.estimated and table.pooling_factor == 5.0 and table.bins == measured.bins
    stray = dataclasses.replace(measured, name="b_id")
    with pytest.raises(UserError, match="stats: b_id name no table of the module, expected a table name"):
        NeuroShardPlanner(world_size=2, mem_cap_gb=1.0, batch_size=32, stats=[stray], verbose=False).plan(model)
    # a pooling factor under a name the module does not have (a typo) is refused, not planned with the default
    typo = NeuroShardPlanner(world_size=2, mem_cap_gb=1.0, batch_size=32, pooling_factors={"zzz": 3.0}, verbose=False)
    with pytest.raises(UserError, match=r"^pooling_factors: 'zzz' name no table or feature of the module, expected"):
        typo.plan(model)
    NeuroShardPlanner(world_size=2, mem_cap_gb=1.0, batch_size=32, pooling_factors={"a_id": 3.0}, verbose=False).plan(
        model
    )
    for bad in (0, -1, 2.0, True):
        with pytest.raises(UserError, match=r"^world_size: got .*, expected an integer >= 1"):
            NeuroShardPlanner(world_size=bad, verbose=False)
    from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig

    empty = TopologyFactory.create_topology(TrainerConfig(world_size=0), kernel_config=KernelConfig("cpu"))
    with pytest.raises(UserError, match=r"^topology: world_size 0 with 0 devices, expected at least one rank$"):
        NeuroShardPlanner(empty, verbose=False)


@pytest.mark.fast
def test_the_adapter_holds_back_torchrecs_share_of_a_topologys_memory():
    """TorchRec's planner holds back 15% of each device's memory: so does the adapter, unless mem_cap_gb gives the
    memory for tables or mem_reserve says otherwise."""
    from neuroshard_jax.torchrec.planner import TORCHREC_RESERVE

    assert NeuroShardPlanner(world_size=2, verbose=False).reserve() == TORCHREC_RESERVE == 0.15
    assert NeuroShardPlanner(world_size=2, mem_cap_gb=1.0, verbose=False).reserve() == 0.0
    assert NeuroShardPlanner(world_size=2, mem_reserve=0.05, verbose=False).reserve() == 0.05
    model = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="a", embedding_dim=16, num_embeddings=1000, feature_names=["a_id"])],
        device=torch.device("meta"),
    )
    planner = NeuroShardPlanner(world_size=2, batch_size=32, cost_model="analytic", verbose=False)
    planner.plan(model)
    assert planner.last_plan.task.training.reserve == 0.15


def test_torchs_is_fx_tracing_notice_is_dropped_and_nothing_else(caplog):
    """TorchRec's KeyedJaggedTensor triggers torch's once-only is_fx_tracing deprecation notice in the user's
    program (the README's example printed it); the adapter drops that record alone."""
    import torch.fx._symbolic_trace as trace

    import neuroshard_jax.torchrec  # noqa: F401  (installs the filter)

    caplog.set_level(logging.WARNING)
    trace.is_fx_tracing_warning.__wrapped__()  # the notice as torch logs it, past its once-only cache
    trace.log.warning("another notice of that logger")
    assert caplog.messages == ["another notice of that logger"]


def test_every_module_kind_torchrec_shards_is_planned_as_its_planner_keys_it_and_trains_in_dmp(tmp_path):
    """Bags (sum and mean), sequence embeddings nested two levels down, a weighted bag collection and a
    feature-processed one: ours and TorchRec's ``EmbeddingShardingPlanner`` plan the same module paths and tables,
    each table priced in its own kernel (sequence tables' all-to-all a row per id) with the sharding types its
    sharder offers; then DistributedModelParallel runs two training steps with our plan on 2 gloo ranks, every
    collection sharded."""
    import json
    import math

    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
    from torchrec.distributed.sharding_plan import get_default_sharders

    from tests.torchrec_models import BAGS, MixedModel

    topology = TopologyFactory.create_topology(TrainerConfig(world_size=2), kernel_config=KernelConfig("cpu"))
    theirs = EmbeddingShardingPlanner(topology=topology).plan(MixedModel(), get_default_sharders())
    planner = NeuroShardPlanner(
        topology, mem_cap_gb=1.0, batch_size=64, cost_model="analytic", verbose=False, pooling_factors={"history": 12.0}
    )
    ours = planner.plan(MixedModel(), get_default_sharders())
    keyed = lambda plan: {path: sorted(tables) for path, tables in plan.plan.items()}  # noqa: E731
    assert (
        keyed(ours)
        == keyed(theirs)
        == {
            "bags": ["tags", "user"],
            "towers.seq": ["clicks", "history"],
            "scored": ["scored"],
            "weighted": ["pos"],
        }
    )
    tables = {t.name: t for t in planner.last_plan.task.tables}
    kinds = {name: t.kernel for name, t in tables.items()}
    assert kinds == {
        "user": "sum",
        "tags": "mean",
        "history": "sequence",
        "clicks": "sequence",
        "scored": "sum_weighted",
        "pos": "sum_weighted",
    }
    # one fp16 table among fp32 ones: its own bytes (and a kernel of its own where it shares a device)
    task = planner.last_plan.task
    assert task.precision == "fp32" and task.precisions == ("fp16", "fp32")
    assert {name: t.precision for name, t in tables.items() if t.precision} == {"user": "fp16"}
    user = list(tables).index("user")
    assert task.rows_memory(user, BAGS["user"], 32).weights == BAGS["user"] * 32 * 2
    assert "table_row_wise" not in tables["history"].constraints.sharding_types  # EmbeddingCollection's sharder
    assert tables["history"].width(16) == math.ceil(16 * 12.0)  # a row per id in the all-to-all

    script = REPO / "tests" / "torchrec_mixed_rank.py"
    init = f"file://{tmp_path / 'init'}"
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), "2", init, str(out)], cwd=REPO, env=env, stderr=subprocess.PIPE
        )
        for r, out in enumerate(outs)
    ]
    try:
        said = [rank.communicate(timeout=600)[1].decode()[-3000:] for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0], said
    rank0, rank1 = (json.loads(out.read_text()) for out in outs)
    assert rank0["plan"] == rank1["plan"] and set(rank0["plan"]) == set(keyed(theirs))
    assert all(math.isfinite(x) for x in rank0["losses"] + rank1["losses"])
    assert rank0["sharded"] == {
        "module.bags": "ShardedEmbeddingBagCollection",
        "module.towers.seq": "ShardedEmbeddingCollection",
        "module.scored": "ShardedEmbeddingBagCollection",
        "module.weighted": "ShardedFeatureProcessedEmbeddingBagCollection",
        "module.weighted._embedding_bag_collection": "ShardedEmbeddingBagCollection",
    }


def test_a_module_the_planner_cannot_plan_is_refused_by_name_never_skipped():
    """A collection TorchRec shards that this planner does not (the inference one here) is refused in one line
    naming its path and type; a model with no collection at all says so."""
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEmbeddingBagCollection

    from neuroshard_jax.core.errors import UserError

    quant = QuantEmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="q", embedding_dim=16, num_embeddings=100, feature_names=["q"])],
        is_weighted=False,
        device=torch.device("cpu"),
    )
    model = torch.nn.ModuleDict({"bags": TwoCollections().users, "served": quant})
    planner = NeuroShardPlanner(world_size=2, mem_cap_gb=1.0, cost_model="analytic", verbose=False)
    with pytest.raises(
        UserError, match=r"module: served is a torchrec\.quant\.embedding_modules\.EmbeddingBagCollection"
    ):
        planner.plan(model)
    with pytest.raises(UserError, match="module: no embedding collection in Linear"):
        planner.plan(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"pooling_factors": {"u0": "abc"}}, "pooling_factors['u0']: got 'abc', expected a number of lookups"),
        ({"pooling_factors": [1.0]}, "pooling_factors: got [1.0], expected a mapping"),
        ({"stats": ["a", "b"]}, "stats: got 'a' (str), expected TableStats of batch_statistics"),
        ({"batch_size": "512"}, "batch_size: got '512', expected an integer >= 1"),
        ({"compute_kernel": "bogus"}, "compute_kernel: got 'bogus', expected one of fused, dense"),
        ({"mem_cap_gb": -1}, "mem_cap_gb: got -1, expected a number > 0"),
        ({"mem_reserve": 1.5}, "mem_reserve: got 1.5, expected a share of memory in [0, 1)"),
        ({"zipf": float("nan")}, "zipf: got nan, expected a finite exponent >= 0"),
    ],
)
def test_bad_adapter_arguments_are_one_line_errors(kwargs, message):
    from neuroshard_jax.core.errors import UserError

    with pytest.raises(UserError, match=re.escape(message)):
        NeuroShardPlanner(**{"world_size": 2, "mem_cap_gb": 1.0, **kwargs})


def test_batch_statistics_refuses_unknown_features_and_non_integer_ids():
    from neuroshard_jax.core.errors import UserError

    model = TwoCollections()
    stray = KeyedJaggedTensor.from_lengths_sync(
        keys=["u0", "nope"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1, 0])
    )
    with pytest.raises(UserError, match="batches: feature 'nope' is read by no table of the module"):
        batch_statistics(model, [stray], batch_size=2, progress=False)
    floats = KeyedJaggedTensor.from_lengths_sync(
        keys=["u0"], values=torch.tensor([1.5, 2.0]), lengths=torch.tensor([1, 1])
    )
    with pytest.raises(UserError, match="batches: ids of dtype torch.float32, expected integer ids"):
        batch_statistics(model, [floats], batch_size=2, progress=False)


def test_the_sequence_example_trains_with_both_planners(tmp_path):
    """examples/torchrec_sequence.py, small: an attention over an EmbeddingCollection history beside pooled, mean and
    weighted bags, planned by ours and by TorchRec's planner and trained in DMP on 2 gloo processes; one line each."""
    lines = _example_lines(
        tmp_path,
        "torchrec_sequence.py",
        *("--items", "3000", "--users", "2000", "--categories", "300", "--history", "8", "--max-history", "16"),
        *("--batch-size", "32", "--steps", "2", "--warmup", "1", "--stats-batches", "2"),
    )
    assert all("nan" not in line for line in lines)
