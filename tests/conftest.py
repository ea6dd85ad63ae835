"""Tiny factories for tables, pools and tasks; a private feature cache for the whole session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("cache")
    os.environ["NEUROSHARD_CACHE_DIR"] = str(path)
    yield path


@pytest.fixture(scope="session")
def small_pool(_cache_dir):
    from neuroshard_jax.workloads.pool import PoolSpec, load_pool

    return load_pool(PoolSpec(num_tables=120), batch_size=512)


def make_table(table_id=0, rows=1000, dim=16, pooling=2.0):
    from neuroshard_jax.core.table import Table

    bins = np.zeros(17)
    bins[0] = 1.0
    return Table(table_id, rows, dim, pooling, tuple(bins))


def make_task(tables, num_devices=2, mem_cap_gb=1.0, batch_size=512, precision="fp32"):
    from neuroshard_jax.core.task import Task

    return Task.uniform(num_devices, mem_cap_gb, batch_size, tuple(tables), precision)


def run_cli(*args, cwd=None, module="neuroshard_jax", timeout=300):
    """Run an entry point as a user would; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A real (tiny) measured dataset and a neural cost model trained on it: (dataset dir, checkpoint dir)."""
    from neuroshard_jax.costs.neural import NetConfig
    from neuroshard_jax.learn.cost_labels import CollectConfig, collect
    from neuroshard_jax.learn.neural_fit import train_models
    from neuroshard_jax.learn.trainer import TrainConfig
    from neuroshard_jax.workloads.pool import PoolSpec
    from neuroshard_jax.workloads.samplers import CommSamplerConfig, ComputeSamplerConfig

    root = tmp_path_factory.mktemp("tiny")
    pool = PoolSpec(num_tables=120)
    common = dict(
        out_dir=str(root / "data"), pool=pool, batch_size=256, warmup=1, iters=3, progress=False, timeout_s=120
    )
    sampler = ComputeSamplerConfig(max_tables=4, mem_cap_gb=0.05)
    collect(CollectConfig(kind="compute", num_samples=40, sampler=sampler, **common))
    # half the samples with row groups, half with input distributions
    comm = CommSamplerConfig(world_sizes=(2, 3), row_share=0.5, input_share=0.5)
    collect(CollectConfig(kind="comm", num_samples=8, comm=comm, comm_chunk=4, **common))
    net = NetConfig(
        table_hidden=(16,), latent=8, head_hidden=(8,), comm_hidden=(8,), comm_latent=8, comm_head_hidden=(8,)
    )
    report = train_models(root / "data", net, TrainConfig(epochs=30, batch_size=16, progress=False), root / "ckpt")
    return root / "data", root / "ckpt", net, report


@pytest.fixture(scope="session")
def tiny_ensemble(tiny_checkpoint, tmp_path_factory):
    """A tiny physics ensemble trained on real measurements of both kinds: the tiny pool dataset (batch 256) and
    a tiny spec dataset (batches 128 and 256): (spec dataset dir, checkpoint dir, report)."""
    from neuroshard_jax.costs.ensemble import EnsembleConfig
    from neuroshard_jax.costs.neural import NetConfig
    from neuroshard_jax.learn.cost_labels import CollectConfig, collect
    from neuroshard_jax.learn.ensemble_fit import train_ensemble
    from neuroshard_jax.learn.trainer import TrainConfig
    from neuroshard_jax.workloads.samplers import SpecSamplerConfig

    root = tmp_path_factory.mktemp("tiny-ensemble")
    specs = SpecSamplerConfig(
        max_tables=3,
        log10_rows=(2.0, 4.0),
        log10_pooling=(-0.5, 1.0),
        dims=(8, 16),
        batch_sizes=(128, 256),
        mem_cap_gb=0.05,
        row_share=0.3,  # some samples hold a row block: measured on its own lookups
    )
    collect(
        CollectConfig(
            kind="compute",
            source="specs",
            num_samples=24,
            specs=specs,
            out_dir=str(root / "specs"),
            warmup=1,
            iters=3,
            progress=False,
            timeout_s=120,
        )
    )
    config = EnsembleConfig(
        members=3, hidden=(8,), comm=NetConfig(comm_hidden=(8,), comm_latent=8, comm_head_hidden=(8,))
    )
    train = TrainConfig(epochs=30, batch_size=16, progress=False)
    report = train_ensemble([tiny_checkpoint[0], root / "specs"], config, train, root / "ckpt", "tiny", "test")
    return root / "specs", root / "ckpt", report
