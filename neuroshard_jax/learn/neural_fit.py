"""The first model's family trained (``family=mlp``): the per-table MLP of ``costs.neural`` on one compute dataset,
and the fwd/bwd comm nets on its comm samples (which the ensemble reuses).

Targets are learned in log space (log ms), so the loss is a relative error: a 10% miss on a 2 ms
shard costs as much as on a 200 ms one. Splits are 80/10/10 by a seeded permutation; the weights with
the best validation loss are kept.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

from neuroshard_jax.core.files import JSONDoc, now_utc
from neuroshard_jax.core.manifests import load_manifest
from neuroshard_jax.costs.analytic import ANALYTIC_FNS, analytic_params
from neuroshard_jax.costs.checkpoints import load_checkpoint, save_checkpoint
from neuroshard_jax.costs.cost_model import device_compute_ms
from neuroshard_jax.costs.coverage import coverage_block
from neuroshard_jax.costs.neural import (
    FeatureStats,
    NeuralParams,
    comm_time,
    fit_stats,
    init_nets,
    neural_fns,
    normalize,
)
from neuroshard_jax.learn.datasets import comm_arrays, compute_arrays, split_indices
from neuroshard_jax.learn.metrics import metrics
from neuroshard_jax.learn.trainer import TrainConfig, fit


def compute_loss(stats: FeatureStats):
    def loss(model, feats, mask, target_ms):
        pred = model(normalize(feats, stats), mask)
        return jnp.mean((pred - jnp.log(target_ms)) ** 2)

    return loss


def comm_loss(use_delays: bool):
    def loss(model, dim_sums, delays_ms, mask, target_ms):
        pred = comm_time(model, dim_sums, delays_ms if use_delays else jnp.zeros_like(delays_ms), mask)
        err = (jnp.log(jnp.maximum(pred, 1e-3)) - jnp.log(jnp.maximum(target_ms, 1e-3))) ** 2
        return jnp.sum(jnp.where(mask, err, 0.0)) / jnp.maximum(mask.sum(), 1)

    return loss


def analytic_shard_ms(feats, mask, batch_size: int, precision: str = "fp32") -> np.ndarray:
    """The analytic model's compute ms of padded shards (for side-by-side metrics)."""
    params = analytic_params(batch_size, precision)
    return np.asarray(device_compute_ms(ANALYTIC_FNS, params, jnp.asarray(feats), jnp.asarray(mask)))


def shard_ms(nets, params: NeuralParams, feats, mask) -> np.ndarray:
    """The neural model's compute ms f64[S] of padded shards feats f32[S, T, F], mask bool[S, T]."""
    return np.asarray(device_compute_ms(neural_fns(nets), params, jnp.asarray(feats), jnp.asarray(mask)), float)


def predict_shard_ms(checkpoint: str | Path, feats, mask) -> np.ndarray:
    """``shard_ms`` with the nets of a saved checkpoint."""
    _, nets, params, _ = load_checkpoint(checkpoint)
    return shard_ms(nets, params, feats, mask)


def comm_ms(graph, state, dims, delays, mask) -> np.ndarray:
    """A comm net's ms f64[S, N] of padded samples."""
    net = nnx.merge(graph, state)
    return np.asarray(comm_time(net, jnp.asarray(dims), jnp.asarray(delays), jnp.asarray(mask)), float)


def fit_nets(
    nets,
    params: NeuralParams,
    dataset_dir: Path,
    config: TrainConfig,
    extra_compute: list[dict] = (),
    extra_comm: list[dict] = (),
) -> tuple[NeuralParams, JSONDoc, JSONDoc]:
    """Fit the compute net (and the comm nets if the dataset has comm samples) from ``params`` with its
    feature statistics; extra records (measured plans) join the training split. Returns the best-validation
    params, the test-split report and the dataset provenance."""
    feats, mask, target, manifest = compute_arrays(dataset_dir, extra_compute)
    base = len(target) - len(extra_compute)
    train, val, test = split_indices(base, config.split, config.seed)
    train = np.concatenate([train, np.arange(base, len(target))])
    stats = params.stats
    compute_state, history = fit(
        nets.compute, params.compute, compute_loss(stats), (feats, mask, target), train, val, config, "compute"
    )
    pred = shard_ms(nets, params._replace(compute=compute_state), feats[test], mask[test])
    settings = manifest["settings"]
    analytic = analytic_shard_ms(feats[test], mask[test], settings["batch_size"], settings.get("precision", "fp32"))
    report = {
        "compute": {
            "neural": metrics(pred, target[test]),
            "analytic": metrics(analytic, target[test]),
            "samples": {"train": len(train), "val": len(val), "test": len(test)},
            "epochs": len(history),
            "best_val_loss": min(h["val_loss"] for h in history),
        }
    }
    datasets = {"compute": {"pool_id": settings["pool_id"], "created": manifest["created"], "records": base}}
    fitted = params._replace(compute=compute_state)
    if (dataset_dir / "manifest-comm.json").exists():
        fwd, bwd, comm_report, datasets["comm"] = fit_comm(
            nets.fwd, params.fwd, nets.bwd, params.bwd, dataset_dir, config, extra_comm
        )
        report.update(comm_report)
        fitted = fitted._replace(fwd=fwd, bwd=bwd)
    return fitted, report, datasets


def fit_comm(fwd_graph, fwd_state, bwd_graph, bwd_state, dataset_dir: Path, config: TrainConfig, extra_comm=()):
    """Fit the fwd and bwd comm nets on a dataset's comm samples (then ``extra_comm``); returns the fitted
    states, the test-split report and the dataset provenance."""
    dims, delays, cmask, fwd_ms, bwd_ms, comm_manifest = comm_arrays(dataset_dir, extra_comm)
    cbase = len(dims) - len(extra_comm)
    ctrain, cval, ctest = split_indices(cbase, config.split, config.seed)
    ctrain = np.concatenate([ctrain, np.arange(cbase, len(dims))])
    states, report = {}, {}
    for name, graph, state, use_delays, truth in (
        ("fwd_comm", fwd_graph, fwd_state, True, fwd_ms),
        ("bwd_comm", bwd_graph, bwd_state, False, bwd_ms),
    ):
        arrays = (dims, delays, cmask, truth)
        states[name], _ = fit(graph, state, comm_loss(use_delays), arrays, ctrain, cval, config, name)
        d = delays[ctest] if use_delays else np.zeros_like(delays[ctest])
        out_ms = comm_ms(graph, states[name], dims[ctest], d, cmask[ctest])
        report[name] = metrics(out_ms[cmask[ctest]], truth[ctest][cmask[ctest]])
    provenance = {"created": comm_manifest["created"], "records": cbase}
    return states["fwd_comm"], states["bwd_comm"], report, provenance


def checkpoint_meta(dataset_dir: Path, config: TrainConfig, report: JSONDoc, datasets: JSONDoc, how: str) -> JSONDoc:
    """Provenance written beside the weights (checkpoint meta.json)."""
    manifest = load_manifest(dataset_dir, "compute")
    settings = manifest["settings"]
    return {
        "batch_size": settings["batch_size"],
        "precision": settings.get("precision", "fp32"),
        "optimizer": settings.get("optimizer"),
        "device": settings.get("device"),
        "dataset_dir": str(dataset_dir),
        "datasets": datasets,
        "coverage": coverage_block([dataset_dir]),  # the range its labels span: a task past it is warned
        "hardware": manifest.get("hardware"),
        "train_config": dataclasses.asdict(config),
        "metrics": report,
        "how": how,
        "trained": now_utc(),
    }


def train_models(dataset_dir: str | Path, net_config, config: TrainConfig, out: str | Path) -> JSONDoc:
    """Train the compute net (and the comm nets if the dataset has comm samples); save a checkpoint."""
    dataset_dir = Path(dataset_dir)
    feats, mask, target, _ = compute_arrays(dataset_dir)
    train, _, _ = split_indices(len(target), config.split, config.seed)
    nets, params = init_nets(net_config, config.seed)
    params = params._replace(stats=fit_stats(feats[train], mask[train]))
    trained, report, datasets = fit_nets(nets, params, dataset_dir, config)
    how = f"python -m neuroshard_jax.train dataset={dataset_dir}"
    save_checkpoint(out, net_config, trained, checkpoint_meta(dataset_dir, config, report, datasets, how))
    return report
