"""Tiered memory on a GPU (``core.tiers``): host rows with a cache of them on the device (FBGEMM's managed caching,
TorchRec's ``fused_uvm_caching``): the cache's bytes, the misses a histogram implies, the planner's choice where a
GPU's memory is short, its price in the search, the export, and a miss price fitted on labels."""

import dataclasses
import json

import numpy as np
import pytest

import neuroshard_jax as nsj
from neuroshard_jax.core import tiers
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.memory import CACHE_SLOT_BYTES, cache_slots
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.plan_file import format_plan
from neuroshard_jax.core.table import Table
from neuroshard_jax.core.task import Task, on_device
from neuroshard_jax.costs.analytic import analytic_model
from neuroshard_jax.costs.scoring import score_plan, shards_alone
from neuroshard_jax.kernels.torchrec_export import ExportConfig, export_torchrec
from neuroshard_jax.search.sharding_planner import PlannerOptions
from searchers.torchrec import plan_from_torchrec

UNIFORM = (1.0,) + (0.0,) * 16


def skewed_bins(hot_share: float) -> tuple[float, ...]:
    """A histogram whose ``hot_share`` of a batch's distinct rows are read ~1,000 times (bin 10), the rest once."""
    bins = np.zeros(17)
    bins[0], bins[10] = 1.0 - hot_share, hot_share
    return tuple(bins)


def gpu_task(cap_gb: float, num_devices: int = 2, optimizer: str = "exact_row_wise_adagrad") -> Task:
    """Two big tables (one flat, one with a few hot rows) and four small ones, at a batch of 4,096."""
    big = [
        Table(0, 2_000_000, 64, 4.0, UNIFORM, name="flat"),
        Table(1, 2_000_000, 64, 20.0, skewed_bins(0.02), name="skewed"),
    ]
    small = [Table(2 + i, 20_000, 32, 2.0, UNIFORM, name=f"small{i}") for i in range(4)]
    task = Task.uniform(num_devices, cap_gb, 4096, (*big, *small))
    return dataclasses.replace(task, training=dataclasses.replace(task.training, optimizer=optimizer))


@pytest.mark.fast
def test_a_cached_table_holds_its_cache_on_the_device_and_its_rows_and_state_on_the_host():
    task = gpu_task(8.0)
    whole = task.rows_memory(0, 2_000_000, 64)
    cached = dataclasses.replace(task, tables=(dataclasses.replace(task.tables[0], cache_load_factor=0.2),))
    parts = cached.rows_memory(0, 2_000_000, 64)
    slots = cache_slots(2_000_000, 0.2)
    assert slots % 32 == 0 and 400_000 <= slots < 400_032  # whole sets of 32
    assert parts.weights == slots * 64 * 4 and parts.state == 0  # the state stays in host memory
    assert parts.buffers - whole.buffers == slots * CACHE_SLOT_BYTES + 2_000_000 * 4 + round(4.0 * 4096) * 24
    assert cached.host_mem_bytes() == whole.weights + whole.state == 2_000_000 * (64 + 1) * 4
    back = Task.from_json(json.loads(json.dumps(cached.to_json())))
    assert back.tables[0].cache_load_factor == 0.2 and back == cached
    for bad in (0, 1.0, 1.5, "x"):
        doc = cached.to_json()
        doc["tables"][0]["cache_load_factor"] = bad
        with pytest.raises(UserError, match=r"^task\.tables\['flat'\]\.cache_load_factor: got "):
            Task.from_json(doc)
    with pytest.raises(UserError, match=r"^task\.tables\['flat'\]\.cache_load_factor: got 0\.2 for device 'cpu'"):
        on_device(cached, "cpu")


@pytest.mark.fast
def test_misses_follow_the_histogram_a_flat_table_hits_its_load_factor_a_skewed_one_keeps_its_hot_rows():
    flat = Table(0, 1_000_000, 64, 2.0, UNIFORM)
    missed, distinct = tiers.missed_rows(flat, 4096, 0.2)
    assert distinct == pytest.approx(8192) and missed / distinct == pytest.approx(0.8, abs=1e-3)
    skewed = Table(1, 1_000_000, 64, 50.0, skewed_bins(0.05))
    missed, distinct = tiers.missed_rows(skewed, 4096, 0.05)
    per_bin = tiers.distinct_rows(skewed, 4096)
    cold, hot, slots = per_bin[0], per_bin[10], cache_slots(1_000_000, 0.05)
    held = tiers.set_held(hot, slots // 32, 32)
    assert held == pytest.approx(hot, rel=1e-3)  # a few hot rows over many sets: all but a fraction of one held
    assert missed == pytest.approx(hot - held + cold * (1 - (slots - held) / (1e6 - hot)))
    assert missed < cold  # the hot rows held, a share of the cold ones
    # hot rows crowding the sets: 3,200 over 100 sets of 32 hold 93% (Poisson overflow), 1e6 fill every slot
    assert tiers.set_held(3200, 100, 32) == pytest.approx(2975, abs=1) and tiers.set_held(1e6, 100, 32) == 3200
    assert tiers.missed_rows(skewed, 4096, 0.5)[0] < tiers.missed_rows(skewed, 4096, 0.05)[0]
    task = Task.uniform(1, 8.0, 4096, (flat,))
    traffic, rows = tiers.miss_traffic(task, 0, 0.2)
    assert traffic == pytest.approx(2 * rows * 64 * 4)  # exact SGD: no state to move
    assert tiers.miss_ms(task, 0, 0.2) == pytest.approx(traffic / (32 * 2**30 / 1e3))


@pytest.mark.fast
def test_a_price_fitted_on_labels_recovers_the_link_and_is_judged_held_out():
    truth = tiers.TierPrice(20.0, 0.5, "truth")
    readings = []
    for table, (traffic, missed) in enumerate(((3e8, 2e5), (1e8, 9e4), (6e8, 5e5))):
        for k, lf in enumerate((0.5, 0.2, 0.05)):
            scale = 1 + k
            ms = float(truth.ms(traffic * scale, missed * scale))
            readings.append(
                {"table": table, "load_factor": lf, "extra_ms": ms, "bytes": traffic * scale, "missed": missed * scale}
            )
    fitted = tiers.fit_price(readings, "test labels")
    assert fitted.link_gibps == pytest.approx(20.0, rel=1e-6) and fitted.miss_us == pytest.approx(0.5, rel=1e-6)
    assert tiers.held_out(readings, "test labels")["mape"] < 1e-6
    with pytest.raises(UserError, match="expected at least 2"):
        tiers.fit_price(readings[:1], "x")


def test_where_a_gpus_memory_is_short_the_planner_caches_tables_prices_their_misses_and_exports_them(tmp_path):
    """A GPU task whose tables are 1.6x its devices' memory: ``tiering=off`` refuses it; ``auto`` (the default)
    caches tables until they take at most 85% of it, plans every table (whole rows for the cached ones), every device
    within its cap; the model prices a cached table alone as its kernel plus its misses; the same seed gives the same
    plan; plan.json keeps the load factors and the printout names them; the export writes TorchRec's
    ``fused_uvm_caching`` with ``CacheParams(load_factor)`` (read back by the worker) and refuses device=cpu."""
    task = on_device(gpu_task(0.33), "cuda")
    need = sum(task.table_mem_bytes(i) for i in range(task.num_tables))
    assert need > 1.5 * task.cap_bytes().sum()
    options = dict(searcher="beam", device="cuda", cost_model="analytic", seed=1)
    with pytest.raises(InfeasibleError, match="task infeasible"):
        PlannerOptions(**options, tiering="off").planner().run(task)
    run = PlannerOptions(**options).planner().run(task)
    plan = run.plan
    cached = tiers.cached_tables(plan.task)
    assert plan.stages[0] == "tiering" and cached and set(cached) <= {0, 1}
    plan.validate()
    assert (plan.mem_bytes() <= plan.task.cap_bytes()).all()
    assert sum(plan.task.table_mem_bytes(i) for i in range(task.num_tables)) <= 0.85 * task.cap_bytes().sum()
    assert all(s.whole_rows(plan.task.tables[s.table].rows) for s in plan.shards if s.table in cached)
    # priced: the model's price of a cached table alone is its kernel's and its misses'
    base = analytic_model(plan.task)
    feats = plan.task.features()[cached].astype(np.float32)
    _, alone = shards_alone(base, feats)
    _, priced = shards_alone(run.cost_model, feats)
    misses = [tiers.miss_ms(plan.task, i, plan.task.tables[i].cache_load_factor) for i in cached]
    assert priced == pytest.approx(alone + np.array(misses), rel=0.02)
    from neuroshard_jax.core.errors import PlanError
    from neuroshard_jax.measure.breakdown import explanation

    said = explanation(plan, base)  # explain prices the plan's own tiered memory, whatever model it is given
    priced_devices = score_plan(run.cost_model, plan).compute_ms
    assert [d.compute_ms for d in said.devices] == pytest.approx(list(priced_devices), rel=1e-5)
    with pytest.raises(PlanError, match=r"is data-parallel and in tiered memory"):
        Plan(plan.task, tuple(s for s in plan.shards if s.table != cached[0]), data_parallel=(cached[0],)).validate()
    again = PlannerOptions(**options).planner().run(task).plan
    assert again == plan and again.task == plan.task
    doc = json.loads(json.dumps(plan.to_json()))
    assert Plan.from_json(doc).task == plan.task and doc["host_mem_gb"] > 0
    assert "tiered memory (TorchRec's fused_uvm_caching" in format_plan(doc)
    request, printed = export_torchrec(plan, tmp_path / "plan.pt", ExportConfig(device="cuda"))
    assert "fused_uvm_caching" in printed
    shards = dict(zip([t.name for t in request.tables], request.shards))
    assert {s["cache_load_factor"] for i in cached for s in shards[f"t{i}"]} <= set(tiers.LOAD_FACTORS)
    with pytest.raises(UserError, match=r"^export: table t\d is in tiered memory .* expected device=cuda"):
        export_torchrec(plan, tmp_path / "cpu.pt", ExportConfig(device="cpu"))
    # TorchRec's own plan with a table in tiered memory reads back so, and is priced with its own tiering
    torchrec_shards = [[{"col_offset": 0, "dim": t.dim, "rank": i % 2}] for i, t in enumerate(task.tables)]
    torchrec_shards[0][0]["cache_load_factor"] = 0.2
    theirs = plan_from_torchrec(plan.task, torchrec_shards, tiered=True)
    assert tiers.cached_tables(theirs.task) == [0] and theirs.task.tables[0].cache_load_factor == 0.2
    own = score_plan(run.cost_model, theirs).compute_ms
    untiered = analytic_model(task).with_tiers(dataclasses.replace(theirs.task, tables=task.tables), tiers.PRIOR)
    bare = score_plan(untiered, dataclasses.replace(theirs, task=task)).compute_ms
    assert own[0] == pytest.approx(bare[0] + tiers.miss_ms(theirs.task, 0, 0.2), rel=0.05) and own[1] == bare[1]
    # a cached table in TorchRec's row blocks (row_wise over both devices): each block's own misses priced
    from neuroshard_jax.core.sharding import Shard, row_shards

    rest = [Shard(i, 0, t.dim, i % 2) for i, t in enumerate(task.tables) if i != 0]
    blocks = Plan(theirs.task, (*row_shards(0, task.tables[0].rows, 64, [0, 1]), *rest), merge_column_wise=False)
    bare_blocks = dataclasses.replace(blocks, task=task)
    got = score_plan(run.cost_model, blocks).compute_ms - score_plan(untiered, bare_blocks).compute_ms
    one = tiers.missed_rows(task.tables[0], task.batch_size, 0.2, 1_000_000)[0] * 2 * 64 * 4 / (32 * 2**30 / 1e3)
    one += tiers.missed_rows(task.tables[0], task.batch_size, 0.2, 1_000_000)[1] * 2 * 4 / (32 * 2**30 / 1e3)
    assert got == pytest.approx([one, one], rel=0.02)  # row-wise Adagrad: each block's rows and their state
    # TorchRec's planner, offered fused_uvm_caching here, chooses its own tables (at its load factor, 0.2)
    torchrec = PlannerOptions(**{**options, "searcher": "torchrec"}).planner().run(task).plan
    assert tiers.cached_tables(torchrec.task) and {t.cache_load_factor for t in torchrec.task.tables} <= {None, 0.2}


@pytest.mark.fast
def test_a_table_the_user_caches_is_kept_and_one_only_row_wise_is_refused():
    task = gpu_task(64.0)
    mine = dataclasses.replace(task.tables[0], cache_load_factor=0.1)
    given = dataclasses.replace(task, tables=(mine, *task.tables[1:]))
    assert tiers.tiered(given) is given  # it fits: nothing more cached, the user's kept
    row_only = mine.constrained(sharding_types=("row_wise",))
    with pytest.raises(UserError, match=r"^task\.tables\['flat'\]\.cache_load_factor: given with sharding_types"):
        tiers.tiered(dataclasses.replace(task, tables=(row_only, *task.tables[1:])))
    with pytest.raises(UserError, match=r"^tiering: got 'on', expected one of auto, off"):
        PlannerOptions(tiering="on")
    with pytest.raises(UserError, match=r"cache_load_factor: got 0\.1 for device 'cpu'"):
        nsj.plan(
            {"t": {"rows": 100, "dim": 16, "pooling_factor": 1.0, "bins": list(UNIFORM), "cache_load_factor": 0.1}},
            1,
            1.0,
            "size_greedy",
            "analytic",
        )


@pytest.mark.fast
def test_the_miss_model_agrees_with_a_simulated_lru_cache_on_a_training_steps_batches():
    """``tools.cache_misses``: FBGEMM's set-associative LRU cache simulated on the batches a training step reads of a
    skewed table (hot rows kept, the rows read once or twice moved each batch); filled, its missed rows a batch are
    the model's within 5% at each load factor, and fewer the larger the cache."""
    from neuroshard_jax.core.features import access_histogram, bin_shares
    from tools.cache_misses import LruCache, simulate

    rng = np.random.default_rng(0)
    rows, batch = 200_000, 2048
    hot = rng.choice(rows, 300, replace=False)
    ids = np.concatenate([np.repeat(hot, 6), rng.choice(np.setdiff1d(np.arange(rows), hot), 12_000, replace=False)])
    ids = rng.permutation(ids)
    offsets = np.linspace(0, len(ids), batch + 1).astype(np.int64)
    table = Table(0, rows, 32, len(ids) / batch, tuple(bin_shares(access_histogram(ids, rows)[0])))
    seen = []
    for lf in (0.5, 0.2, 0.05):
        simulated, filled = simulate(ids, offsets, rows, lf, 4)
        model, distinct = tiers.missed_rows(table, batch, lf)
        assert distinct == pytest.approx(12_300, rel=0.02) and filled >= 2  # a bin read at its mid count
        assert model == pytest.approx(simulated, rel=0.05), lf
        seen.append(simulated)
    assert seen == sorted(seen)
    cache = LruCache(1000, 0.1)  # 4 sets of 32: a batch larger than the cache leaves the rest uncached
    assert cache.batch(np.arange(500)) == 500 and cache.batch(np.arange(500)) == 500 - 128


def test_where_the_search_packs_no_plan_a_gpu_run_caches_more_tables_and_plans():
    """Three tables of 0.6 of a device, each kept whole (``no_split``), on two devices: they fit in total (so nothing
    is cached at first) but no placement packs them; the run tries again with more of them in tiered memory and
    plans; ``tiering=off`` keeps the search's refusal."""
    rows = int(0.6 * 2**30 / (64 * 4))
    tables = [Table(i, rows, 64, 2.0, UNIFORM, name=f"t{i}").constrained(no_split=True) for i in range(3)]
    task = Task.uniform(2, 1.0, 512, tables)
    options = dict(searcher="size_greedy", device="cuda", cost_model="analytic")
    with pytest.raises(InfeasibleError):
        PlannerOptions(**options, tiering="off").planner().run(task)
    plan = PlannerOptions(**options).planner().run(task).plan
    assert tiers.cached_tables(plan.task) and plan.stages[0] == "tiering"
    plan.validate()
