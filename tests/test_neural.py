"""Neural cost models: real training on a tiny measured dataset, orbax checkpoints, the scoring API."""

import json
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hydra import compose, initialize_config_module

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.costs.checkpoints import load_checkpoint, save_checkpoint
from neuroshard_jax.costs.choice import CostModelSpec, NeuralConfig, make_cost_model
from neuroshard_jax.costs.cost_model import device_compute_ms, device_costs, plan_cost_ms
from neuroshard_jax.costs.neural import NetConfig, init_nets, neural_fns
from neuroshard_jax.costs.scoring import plan_arrays
from neuroshard_jax.learn.metrics import kendall_tau, mape, relative_errors
from neuroshard_jax.search.job import main_config
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.workloads.builders import load_task
from searchers import make_searcher

from .conftest import make_table, make_task


def _task(batch_size=256, num_devices=3, precision="fp32"):
    tables = [make_table(i, rows=1000 * (i + 1), dim=16, pooling=1.0 + i) for i in range(6)]
    return make_task(tables, num_devices=num_devices, batch_size=batch_size, precision=precision)


def test_training_learns_and_reports(tiny_checkpoint):
    _, ckpt, _, report = tiny_checkpoint
    compute = report["compute"]
    assert compute["samples"]["train"] == 32 and compute["samples"]["test"] == 4
    assert np.isfinite(compute["neural"]["mape"]) and np.isfinite(compute["analytic"]["mape"])
    assert "fwd_comm" in report and "bwd_comm" in report
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["batch_size"] == 256 and meta["datasets"]["compute"]["records"] == 40
    assert meta["feature_names"][0] == "rows"


def test_checkpoint_roundtrip_and_clear_errors(tiny_checkpoint, tmp_path):
    _, ckpt, net, _ = tiny_checkpoint
    config, _, params, _ = load_checkpoint(ckpt)
    assert config == net
    save_checkpoint(tmp_path / "again", config, params, {"note": "copy"})
    _, _, again, meta = load_checkpoint(tmp_path / "again")
    assert meta["note"] == "copy"
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: bool(jnp.array_equal(a, b)), params, again))
    with pytest.raises(UserError, match="does not match the checkpoint"):
        load_checkpoint(ckpt, NetConfig())
    other = tmp_path / "schema"
    shutil.copytree(ckpt, other)
    meta = json.loads((other / "meta.json").read_text())
    meta["feature_names"] = meta["feature_names"][:-1]
    (other / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="expected the schema"):
        load_checkpoint(other)
    with pytest.raises(UserError, match="no meta.json"):
        load_checkpoint(tmp_path)


def test_neural_model_scores_plans_jitted_without_retracing(tiny_checkpoint):
    _, ckpt, _, _ = tiny_checkpoint
    task = _task()
    model = make_cost_model("neural", task, {"checkpoint": str(ckpt)})
    one = Plan.from_assignment(task, [1] * 6, [[d % 3] for d in range(6)])
    two = Plan.from_assignment(task, [2, 1, 1, 1, 1, 1], [[0, 1], [1], [2], [2], [0], [1]])
    arrays = jax.tree.map(lambda *a: np.stack(a), plan_arrays(one, model, 8), plan_arrays(two, model, 8))
    score = jax.jit(chex.assert_max_traces(lambda p, a: plan_cost_ms(device_costs(model.fns, p, a)), n=1))
    first = np.asarray(score(model.params, arrays))
    second = np.asarray(score(model.params, jax.tree.map(lambda a: a[::-1].copy(), arrays)))  # no retrace
    np.testing.assert_allclose(first, second[::-1], rtol=1e-5)
    assert np.all(first > 0) and np.all(np.isfinite(first))
    grad = jax.grad(lambda f: plan_cost_ms(device_costs(model.fns, model.params, arrays._replace(feats=f))).sum())(
        arrays.feats
    )
    assert np.isfinite(np.asarray(grad)).all()


def test_neural_model_refuses_another_batch_size_or_precision(tiny_checkpoint):
    _, ckpt, _, _ = tiny_checkpoint
    with pytest.raises(UserError, match="trained at batch sizes \\[256\\]"):
        make_cost_model("neural", _task(batch_size=4096), {"checkpoint": str(ckpt)})
    with pytest.raises(UserError, match="trained at precision 'fp32'"):
        make_cost_model("neural", _task(precision="fp16"), {"checkpoint": str(ckpt)})
    with pytest.raises(UserError, match="no neural cost model"):
        make_cost_model("neural", _task(), {"checkpoint": "/nonexistent"})


def test_the_main_config_takes_a_neural_checkpoint(tiny_checkpoint, tmp_path):
    """``cost_model=neural cost_model.checkpoint=DIR`` with a task file, through the main job's config (in-process:
    the CLI itself is tested with the shipped model in test_cli)."""
    _, ckpt, _, _ = tiny_checkpoint
    (tmp_path / "task.json").write_text(json.dumps(_task().to_json()))
    overrides = ["cost_model=neural", f"cost_model.checkpoint={ckpt}", f"task.path={tmp_path / 'task.json'}"]
    with initialize_config_module(config_module="neuroshard_jax.conf", version_base="1.3"):
        config = main_config(compose(config_name="config", overrides=overrides))
    task = load_task(tmp_path / "task.json")
    options = config.planner
    searcher = make_searcher(options.searcher, options.searcher_options)
    plan = search_plan(task, searcher, CostModelSpec(options.cost_model, options.cost_model_options).for_task(task), 0)
    plan = plan.to_json()
    assert plan["cost_model"] == str(ckpt) and plan["task"] == task.to_json()  # the checkpoint that planned


def test_metrics_against_plain_python():
    pred, true = [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0]
    assert mape(pred, true) == pytest.approx((0 + 1 / 3 + 1 / 2 + 0) / 4)
    # 6 pairs, one discordant (2,3): tau = (5 - 1) / 6
    assert kendall_tau(pred, true) == pytest.approx(4 / 6)
    # MAPE, mean signed error and the worst ratio either way: 2/3 is 1.5x off, 3/2 1.5x
    assert relative_errors(pred, true) == pytest.approx(((1 / 3 + 1 / 2) / 4, (-1 / 3 + 1 / 2) / 4, 1.5))


@pytest.mark.fast
def test_untrained_nets_have_the_paper_shapes():
    nets, params = init_nets(NetConfig())
    shapes = jax.tree_util.tree_map(jnp.shape, params.compute)
    assert shapes["table_mlp"]["layers"][0]["kernel"].get_value() == (21, 128)
    assert shapes["head_mlp"]["layers"][0]["kernel"].get_value() == (33, 64)  # mean latent + log count
    assert shapes["head_mlp"]["layers"][1]["kernel"].get_value() == (64, 1)
    assert NeuralConfig().checkpoint is None


@pytest.mark.fast
def test_summing_before_the_last_layer_equals_summing_latents():
    nets, params = init_nets(NetConfig(), seed=3)
    fns = neural_fns(nets)
    rng = np.random.default_rng(0)
    feats = rng.lognormal(size=(5, 7, 21)).astype(np.float32)
    mask = rng.random((5, 7)) < 0.6
    fast = fns.embed_sum(params, feats, mask)
    slow = jnp.where(mask[..., None], fns.embed(params, feats), 0.0).sum(-2)
    np.testing.assert_allclose(np.asarray(fast), np.asarray(slow), rtol=1e-4, atol=1e-4)


@pytest.mark.fast
def test_chunked_scoring_equals_one_pass():
    from neuroshard_jax.costs import scoring

    nets, params = init_nets(NetConfig(), seed=1)
    fns = neural_fns(nets)
    rng = np.random.default_rng(2)
    feats = rng.lognormal(size=(3, 1000, 4, 21)).astype(np.float32)  # 3000 shards: chunks of 1024, padded
    mask = rng.random((3, 1000, 4)) < 0.7
    chunked = np.asarray(scoring.shard_costs(fns, params, feats, mask))
    one_pass = np.asarray(device_compute_ms(fns, params, feats, mask))
    assert chunked.shape == (3, 1000)
    np.testing.assert_allclose(chunked, one_pass, rtol=1e-4, atol=1e-5)
