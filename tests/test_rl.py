"""The DreamShard-style RL searcher: the estimated MDP, real policy training with hardware in the loop
(the evaluator measures plans, the cost model is refined), resume, and the rl searcher."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.costs.choice import make_cost_model
from neuroshard_jax.learn.policy_training import (
    PolicyTrainConfig,
    RefineConfig,
    TaskSetConfig,
    train_policy,
)
from neuroshard_jax.workloads.builders import TaskConfig, generate_task
from neuroshard_jax.workloads.pool import PoolSpec, load_pool
from searchers import make_searcher
from searchers.policy import PolicyConfig, batch_rollouts, decode, stack_tasks, task_arrays
from searchers.policy_store import load_policy, load_search_policy, resolve_policy

from .conftest import make_table, make_task

POOL = PoolSpec(num_tables=120)
TINY = PolicyConfig(table_hidden=(16,), latent=8, score_hidden=(16,))
TASKS = TaskSetConfig(
    num_train_tasks=12, min_tables=4, max_tables=8, num_devices=(2, 3), mem_cap_gb=0.05, batch_size=256, pool=POOL
)


def _train(out, checkpoint, rounds):
    config = PolicyTrainConfig(rounds=rounds, iterations_per_round=3, tasks_per_batch=4, episodes_per_task=4)
    refine = RefineConfig(plans_per_round=1, epochs=1)
    return train_policy(out, TINY, dataclass_replace(config, progress=False), TASKS, refine, str(checkpoint))


def dataclass_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


@pytest.fixture(scope="session")
def tiny_policy(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("policy") / "run"
    result = _train(out, tiny_checkpoint[1], rounds=1)
    return out, result


def _unseen_task(seed, num_devices=4, num_tables=10):
    pool = load_pool(POOL, 256)
    config = TaskConfig(num_tables=num_tables, num_devices=num_devices, mem_cap_gb=0.05, batch_size=256, pool=POOL)
    return generate_task(pool, dataclass_replace(config, split="test"), seed)


def test_training_measures_plans_refines_the_cost_model_and_resumes(tiny_policy, tiny_checkpoint):
    out, result = tiny_policy
    assert [h["round"] for h in result.history] == [1]
    assert all(h["measured_plans"] >= 1 and np.isfinite(h["mean_cost_ms"]) for h in result.history)
    labels = out / "labels"  # the plan-label dataset of collect kind=plans
    refine = [json.loads(line) for line in (labels / "plans.jsonl").read_text().splitlines()]
    assert all(r["plans"][0]["searcher"] == "rl" and max(r["plans"][0]["compute"]) > 0 for r in refine)
    devices = [json.loads(line) for line in (labels / "compute.jsonl").read_text().splitlines()]
    comm = [json.loads(line) for line in (labels / "comm.jsonl").read_text().splitlines()]
    assert devices and all(d["ok"] and d["total_ms"] > 0 for d in devices)
    assert len(comm) == len(refine) and all(len(c["fwd_ms"]) == c["world"] for c in comm)
    assert (out / "LATEST").read_text().strip() == "round-0001"
    # the same command with more rounds continues after round 1: nothing measured twice
    resumed = _train(out, tiny_checkpoint[1], rounds=2)
    assert [h["round"] for h in resumed.history] == [1, 2]
    ids = [json.loads(line)["id"] for line in (labels / "plans.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) and len(ids) > len(refine)
    assert sorted(p.name for p in out.glob("round-*")) == ["round-0002"]
    _, _, _, meta = load_policy(out)
    assert meta["rounds_done"] == 2 and meta["batch_size"] == 256


def test_resume_with_other_settings_is_refused(tiny_policy, tiny_checkpoint):
    out, _ = tiny_policy
    with pytest.raises(UserError, match="other settings"):
        train_policy(out, PolicyConfig(), PolicyTrainConfig(rounds=1), TASKS, RefineConfig(), str(tiny_checkpoint[1]))


@pytest.mark.parametrize("num_devices, num_tables", [(4, 10), (5, 14)])  # other N and T than in training
def test_rl_searcher_places_unseen_tasks(tiny_policy, tiny_checkpoint, num_devices, num_tables):
    out, _ = tiny_policy
    task = _unseen_task(3, num_devices, num_tables)
    model = make_cost_model("neural", task, {"checkpoint": str(tiny_checkpoint[1])})
    searcher = make_searcher("rl", {"policy": str(out), "samples": 8})
    plan = searcher.search(task, model, seed=5)
    plan.validate()
    assert plan == searcher.search(task, model, seed=5)  # same seed, same plan
    assert len(plan.shards) == task.num_tables  # table-wise
    greedy = make_searcher("rl", {"policy": str(out), "samples": 0}).search(task, model, seed=5)
    greedy.validate()


def test_no_legal_device_ends_the_episode_with_the_penalty(tiny_policy):
    out, _ = tiny_policy
    graph, params, _, _ = load_policy(out)
    _, _, model, _ = load_search_policy(resolve_policy(str(out)))
    tables = [make_table(i, rows=2000, dim=16) for i in range(4)]
    cramped = make_task(tables, num_devices=2, mem_cap_gb=2000 * 16 * 4 * 1.5 / 2**30, batch_size=256)
    arrays, _ = task_arrays(cramped, model)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)[None]
    out_ = batch_rollouts(graph, params, model.fns, model.params, stack_tasks([arrays]), keys, False)
    assert not np.asarray(out_.feasible).any()
    np.testing.assert_allclose(np.asarray(out_.cost_ms), float(arrays.penalty_ms))
    assert (np.asarray(out_.actions)[0, :, 3] == -1).all()  # nothing placed after the failure
    with pytest.raises(InfeasibleError, match="fits on no device"):
        make_searcher("rl", {"policy": str(out), "samples": 2}).search(cramped, model, 0)


def test_the_mask_is_in_the_loss(tiny_policy):
    """With one device every decision is forced: zero log-probability and zero entropy, so no gradient."""
    out, _ = tiny_policy
    graph, params, _, _ = load_policy(out)
    _, _, model, _ = load_search_policy(resolve_policy(str(out)))
    task = make_task([make_table(i, rows=100, dim=8) for i in range(3)], num_devices=1, batch_size=256)
    arrays = stack_tasks([task_arrays(task, model)[0]])
    keys = jax.random.split(jax.random.PRNGKey(1), 3)[None]

    def total_log_prob(net):
        return batch_rollouts(
            graph, params._replace(net=net), model.fns, model.params, arrays, keys, False
        ).log_prob.sum()

    grads = jax.grad(total_log_prob)(params.net)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree_util.tree_leaves(grads))


@pytest.mark.fast
def test_bad_policy_path_is_a_clear_error(tmp_path):
    task = _unseen_task(0)
    with pytest.raises(UserError, match="searcher.policy: no policy"):
        make_searcher("rl", {"policy": str(tmp_path / "none")}).search(task, make_cost_model("analytic", task), 0)
    with pytest.raises(UserError, match="searcher.samples: got -1"):
        make_searcher("rl", {"samples": -1})


def test_policy_of_another_batch_size_is_a_clear_error(tiny_policy):
    out, _ = tiny_policy
    task = make_task([make_table(i) for i in range(3)], num_devices=2, batch_size=512)
    with pytest.raises(UserError, match="task.batch_size: got 512, but the rl policy was trained at batch_size 256"):
        make_searcher("rl", {"policy": str(out)}).search(task, make_cost_model("analytic", task), 0)


def test_rl_decode_does_not_retrace_for_tasks_of_the_same_padded_shape(tiny_policy):
    out, _ = tiny_policy
    graph, params, model, _ = load_search_policy(resolve_policy(str(out)))
    keys = np.zeros((1, 1, 2), np.uint32)

    def run(task):
        arrays = stack_tasks([task_arrays(task, model, num_tables=16, num_devices=4)[0]])
        return decode(graph, params, model.fns, model.params, arrays, keys, True)

    run(_unseen_task(11, num_devices=4, num_tables=9))
    compiled = decode._cache_size()
    run(_unseen_task(12, num_devices=3, num_tables=14))  # other tables and devices, same padded shapes
    assert decode._cache_size() == compiled
