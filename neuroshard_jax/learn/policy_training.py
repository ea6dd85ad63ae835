"""``python -m neuroshard_jax.train_policy [out=DIR train.rounds=8 refine.plans_per_round=2]``: train the
DreamShard-style placement policy (conf/train_policy.yaml).

Rounds of: REINFORCE updates on batches of training tasks in the estimated MDP (``rl.py``), then
hardware in the loop: the policy's greedy plans of a few training tasks are measured by the evaluator,
their devices become compute and comm samples, and the cost model is fine-tuned on the shipped
dataset plus all measured plans so far. After every round the policy, its optimizer state, the refined
cost model and the history are checkpointed (written to a temporary directory, then swapped in), so a
stopped run continues from its last finished round with the same command.

Layout of ``out``: ``labels/`` (the measured plans as plan labels, ``plan_labels.py``), ``round-NNNN/`` (one
finished round: ``policy/``, orbax net + feature statistics; ``optimizer/``, the optimizer state; ``cost_model/``,
a neural cost model checkpoint; ``meta.json``) and ``LATEST`` (the name of the newest round, replaced atomically
once that round is complete; older rounds are then removed). A policy path may be ``out`` or a round directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from omegaconf import DictConfig

from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import typed
from neuroshard_jax.core.constants import SHIPPED_MLP_CHECKPOINT
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, JsonlLog, read_jsonl, read_records
from neuroshard_jax.core.folders import one_writer
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.paths import package_path, resolve_dataset
from neuroshard_jax.core.progress import progress_bar
from neuroshard_jax.costs.checkpoints import load_checkpoint, save_checkpoint
from neuroshard_jax.costs.cost_model import bucket
from neuroshard_jax.costs.neural import fit_stats, neural_cost_model
from neuroshard_jax.costs.scoring import score_plan
from neuroshard_jax.kernels.executors import ExecutorConfig, connected
from neuroshard_jax.learn.neural_fit import fit_nets
from neuroshard_jax.learn.plan_labels import label_rows, plan_entry
from neuroshard_jax.learn.trainer import TrainConfig
from neuroshard_jax.measure.evaluator import EvaluateConfig
from neuroshard_jax.workloads.builders import TaskConfig, generate_task
from neuroshard_jax.workloads.pool import PoolSpec, load_pool
from searchers.policy import (
    Policy,
    PolicyConfig,
    PolicyParams,
    TaskArrays,
    decode,
    plan_from_actions,
    reinforce_loss,
    stack_tasks,
    task_arrays,
)
from searchers.policy_store import load_policy, policy_dir, save_policy


@dataclasses.dataclass(frozen=True)
class PolicyTrainConfig:
    rounds: int = 8
    iterations_per_round: int = 40
    tasks_per_batch: int = 8
    episodes_per_task: int = 16
    learning_rate: float = 1e-3
    entropy_weight: float = 0.01
    infeasible_penalty: float = 2.0  # an infeasible episode costs this x the sum of its tables' predicted costs
    seed: int = 0
    progress: bool = True


@dataclasses.dataclass(frozen=True)
class TaskSetConfig:
    """Training tasks: ``num_train_tasks`` draws from the ``split`` half of the pool."""

    num_train_tasks: int = 256
    min_tables: int = 20
    max_tables: int = 40
    num_devices: tuple[int, ...] = (2, 4)
    mem_cap_gb: float = 4.0
    batch_size: int = 4096
    split: str = "train"
    pool: PoolSpec = PoolSpec()


@dataclasses.dataclass(frozen=True)
class RefineConfig:
    plans_per_round: int = 2  # plans measured by the evaluator per round (0: no hardware in the loop)
    epochs: int = 2
    learning_rate: float = 3e-4
    executor: ExecutorConfig = ExecutorConfig()  # the app's executor (conf/executor/): where the plans are measured


def training_tasks(config: TaskSetConfig):
    pool = load_pool(config.pool, config.batch_size)
    tasks = []
    for i in range(config.num_train_tasks):
        n = config.num_devices[i % len(config.num_devices)]
        task_config = TaskConfig(
            num_tables=None,
            min_tables=config.min_tables,
            max_tables=config.max_tables,
            num_devices=n,
            mem_cap_gb=config.mem_cap_gb,
            batch_size=config.batch_size,
            split=config.split,
            pool=config.pool,
        )
        tasks.append(generate_task(pool, task_config, seed=1_000_000 + i))
    return tasks


def _comparable(settings: JSONDoc) -> JSONDoc:
    """Settings a resumed run must share (more rounds, or another progress display, are fine)."""
    out = json.loads(json.dumps(settings))
    for key in ("rounds", "progress"):
        (out.get("train") or {}).pop(key, None)
    (out.get("refine") or {}).pop("executor", None)  # where plans are measured may change between runs
    (out.get("refine") or {}).pop("workers", None)  # (runs before the executor group recorded refine.workers)
    return out


def measure_greedy_plans(graph, params, model, tasks, seeds, config: RefineConfig, labels: Path, round_: int):
    """Hardware in the loop: the policy's greedy plans of ``tasks[seeds]`` become plan labels in ``labels``
    (``plan_labels``: plans.jsonl, one row per plan; every distinct device in compute.jsonl, the all-to-all in
    comm.jsonl), measured as ``collect kind=plans`` measures searched plans."""
    log = JsonlLog(labels / "plans.jsonl")
    done = {r["id"]: r for r in log.records()}  # read once: a resumed round keeps its measured plans
    rows = []
    for k, i in enumerate(seeds):
        row_id = f"{round_}/{k}"
        if row_id in done:
            rows.append(done[row_id])
            continue
        arrays, order = task_arrays(tasks[i], model)
        out = decode(
            graph, params, model.fns, model.params, stack_tasks([arrays]), jnp.zeros((1, 1, 2), jnp.uint32), True
        )
        if not bool(out.feasible[0, 0]):
            continue
        plan = plan_from_actions(tasks[i], order, np.asarray(out.actions[0, 0]))
        entry = plan_entry("rl-greedy", "rl", "searched", plan, score_plan(model, plan))
        row = {
            "id": row_id,
            "round": round_,
            "index": int(i),
            "source": "pool",
            "model": "rl-refined",
            "task": tasks[i].to_json(),
            "plans": [entry],
        }
        log.write_record(row)
        rows.append(row)
    label_rows(rows, labels, EvaluateConfig(executor=config.executor), "rl-refined", True, progress=False)


def refine_cost_model(nets, cost_params, dataset_dir: Path, refine: RefineConfig, labels: Path):
    """Fine-tune the cost model on the shipped dataset plus every plan label so far (``labels``); returns the
    new params and a report for the round's history."""
    paths = (labels / "compute.jsonl", labels / "comm.jsonl")
    extra_compute, extra_comm = (read_records(p) if p.exists() else [] for p in paths)
    refine_config = TrainConfig(epochs=refine.epochs, learning_rate=refine.learning_rate, progress=False)
    cost_params, report, _ = fit_nets(nets, cost_params, dataset_dir, refine_config, extra_compute, extra_comm)
    plans = len(read_jsonl(labels / "plans.jsonl"))
    return cost_params, {"measured_plans": plans, "compute_test_mape": report["compute"]["neural"]["mape"]}


def save_round(out: Path, number: int, policy: tuple, cost_model: tuple) -> None:
    """Write finished round ``number`` (policy: config, params, optimizer state, meta; cost_model: net config,
    params, meta) to ``out/round-NNNN``, point LATEST at it once complete, and remove older rounds."""
    name = f"round-{number:04d}"
    shutil.rmtree(out / name, ignore_errors=True)  # a round left half-written by a stop
    (out / name).mkdir()
    save_policy(out / name, *policy)
    save_checkpoint(out / name / "cost_model", *cost_model)
    pointer = out / "LATEST.tmp"
    pointer.write_text(name + "\n")
    pointer.replace(out / "LATEST")  # the round counts only once it is complete
    for old in out.glob("round-*"):
        if old.name != name:
            shutil.rmtree(old)


@dataclasses.dataclass(frozen=True)
class TrainedPolicy:
    """A policy run's end: the rounds done and every round's entry of meta.json's ``history``."""

    rounds_done: int
    history: list[JSONDoc]


def train_policy(
    out: str | Path,
    policy_config: PolicyConfig,
    config: PolicyTrainConfig,
    task_config: TaskSetConfig,
    refine: RefineConfig,
    cost_model_path: str | None = None,
) -> TrainedPolicy:
    """Train the policy in rounds into ``out`` (resumable; held for this run alone, ``one_writer``)."""
    measures = refine.plans_per_round > 0  # the executor reached before anything is written
    with connected(refine.executor) if measures else contextlib.nullcontext(), one_writer(out, "out") as out:
        return _train(out, policy_config, config, task_config, refine, cost_model_path)


def _train(
    out: Path,
    policy_config: PolicyConfig,
    config: PolicyTrainConfig,
    task_config: TaskSetConfig,
    refine: RefineConfig,
    cost_model_path: str | None,
) -> TrainedPolicy:
    settings = {
        "policy_config": dataclasses.asdict(policy_config),
        "train": dataclasses.asdict(config),
        "tasks": dataclasses.asdict(task_config),
        "refine": dataclasses.asdict(refine),
    }
    tx = optax.adam(config.learning_rate)
    if (out / "LATEST").exists():  # resume after the last finished round
        graph, params, opt_state, meta = load_policy(out, tx)
        if _comparable(settings) != _comparable({k: meta.get(k) for k in settings}):
            raise UserError(
                f"train_policy: {str(out)!r} holds a run with other settings; expected the same settings or a new out"
            )
        net_config, nets, cost_params, cost_meta = load_checkpoint(policy_dir(out) / "cost_model")
        history, start_round = meta["history"], meta["rounds_done"]
    else:
        source = cost_model_path or str(package_path(SHIPPED_MLP_CHECKPOINT))
        net_config, nets, cost_params, cost_meta = load_checkpoint(source)
        graph, state = nnx.split(Policy(policy_config, nnx.Rngs(config.seed)))
        params, opt_state, history, start_round = PolicyParams(state, None), tx.init(state), [], 0
    if cost_meta["batch_size"] != task_config.batch_size:
        raise UserError(
            f"tasks.batch_size: got {task_config.batch_size}, but the cost model was trained at batch "
            f"{cost_meta['batch_size']}; expected the same"
        )
    model = neural_cost_model(nets, cost_params)
    tasks = training_tasks(task_config)
    width, n_max = bucket(max(t.num_tables for t in tasks)), max(task_config.num_devices)

    def build_arrays():
        return stack_tasks([task_arrays(t, model, width, n_max, config.infeasible_penalty)[0] for t in tasks])

    arrays = build_arrays()
    if params.stats is None:
        params = params._replace(stats=fit_stats(arrays.feats, arrays.valid))

    fns = model.fns

    @jax.jit
    def update(params, opt_state, cost_params, batch, keys):
        (loss, rollout), grads = jax.value_and_grad(
            lambda net: reinforce_loss(
                graph, params._replace(net=net), fns, cost_params, batch, keys, config.entropy_weight
            ),
            has_aux=True,
        )(params.net)
        updates, opt_state = tx.update(grads, opt_state, params.net)
        return params._replace(net=optax.apply_updates(params.net, updates)), opt_state, loss, rollout

    labels = out / "labels"
    labels.mkdir(parents=True, exist_ok=True)
    dataset_dir = resolve_dataset(cost_meta["dataset_dir"])
    base = jax.random.PRNGKey(config.seed)
    for round_ in range(start_round, config.rounds):
        started = time.perf_counter()
        stats = []
        bar = progress_bar(
            range(config.iterations_per_round), enabled=config.progress, desc=f"round {round_ + 1}/{config.rounds}"
        )
        for it in bar:
            rng = np.random.default_rng([config.seed, round_, it])
            idx = rng.choice(len(tasks), size=min(config.tasks_per_batch, len(tasks)), replace=False)
            batch = TaskArrays(*(a[idx] for a in arrays))
            keys = jax.random.split(
                jax.random.fold_in(jax.random.fold_in(base, round_), it), (len(idx), config.episodes_per_task)
            )
            params, opt_state, loss, rollout = update(params, opt_state, model.params, batch, keys)
            feasible = np.asarray(rollout.feasible)
            stats.append(
                {
                    "loss": float(loss),
                    "cost_ms": float(np.asarray(rollout.cost_ms)[feasible].mean()) if feasible.any() else None,
                    "feasible": float(feasible.mean()),
                    "entropy": float(rollout.entropy.mean()),
                }
            )
            bar.set_postfix(cost=f"{stats[-1]['cost_ms'] or float('nan'):.2f}", feasible=f"{stats[-1]['feasible']:.2f}")
        entry = {
            "round": round_ + 1,
            "policy_s": round(time.perf_counter() - started, 2),
            "last": stats[-1],
            "mean_cost_ms": float(np.mean([s["cost_ms"] for s in stats if s["cost_ms"] is not None])),
        }
        if refine.plans_per_round > 0:
            started = time.perf_counter()
            rng = np.random.default_rng([config.seed, round_, 7])
            seeds = rng.choice(len(tasks), size=min(refine.plans_per_round, len(tasks)), replace=False)
            measure_greedy_plans(graph, params, model, tasks, seeds, refine, labels, round_)
            cost_params, report = refine_cost_model(nets, cost_params, dataset_dir, refine, labels)
            model = neural_cost_model(nets, cost_params)
            arrays = build_arrays()  # cost-model latents and penalties change with the cost model
            entry.update(refine_s=round(time.perf_counter() - started, 2), **report)
        history.append(entry)
        meta = {
            **settings,
            "rounds_done": round_ + 1,
            "history": history,
            "feature_names": cost_meta["feature_names"],
            "batch_size": task_config.batch_size,
            "precision": cost_meta.get("precision", "fp32"),
            "cost_model_source": cost_meta.get("how"),
            "hardware": hardware(),
            "how": "python -m neuroshard_jax.train_policy (conf/train_policy.yaml)",
            "trained": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        cost_meta_out = {k: v for k, v in cost_meta.items() if k not in ("format", "net_config", "feature_names")}
        refined = len(read_jsonl(labels / "plans.jsonl")) if refine.plans_per_round else 0
        cost_meta_out["refined_on_measured_plans"] = refined
        save_round(out, round_ + 1, (policy_config, params, opt_state, meta), (net_config, cost_params, cost_meta_out))
    return TrainedPolicy(config.rounds, history)


@dataclasses.dataclass(frozen=True)
class TrainPolicyAppConfig:
    """conf/train_policy.yaml. ``cost_model``: the neural checkpoint to start from (None: the shipped one)."""

    out: str = "checkpoints/policy"
    cost_model: str | None = None  # the neural cost model checkpoint to start from (null: the shipped one)
    policy: PolicyConfig = PolicyConfig()
    train: PolicyTrainConfig = PolicyTrainConfig()
    tasks: TaskSetConfig = TaskSetConfig()  # training tasks: the train half of the pool
    refine: RefineConfig = RefineConfig()  # hardware in the loop, per round
    executor: ExecutorConfig = ExecutorConfig()  # where refinement measures its plans (conf/executor/)


def app_config(cfg: DictConfig) -> TrainPolicyAppConfig:
    config = typed(TrainPolicyAppConfig, resolved(cfg))
    return dataclasses.replace(config, refine=dataclasses.replace(config.refine, executor=config.executor))
