"""The train command's config (``conf/train.yaml``): which family, on which datasets, written where
(``python -m neuroshard_jax.train`` maps it to ``neural_fit``, ``ensemble_fit``, ``row_comm_fit`` or
``analytic_fit``)."""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig

from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.costs.ensemble import EnsembleConfig
from neuroshard_jax.costs.neural import NetConfig
from neuroshard_jax.learn.trainer import TrainConfig

FAMILIES = ("ensemble", "mlp", "row_comm", "input_dist", "analytic")


@dataclasses.dataclass(frozen=True)
class TrainAppConfig:
    """conf/train.yaml."""

    family: str = "ensemble"  # ensemble: physics roofline x bounded correction, K members | mlp: the first model
    datasets: tuple[str, ...] = (  # collect out_dirs (compute.jsonl; comm.jsonl from the first that has one)
        "neuroshard_jax/data/profiles/cpu-b4096",
        "neuroshard_jax/data/profiles/xeon-specs",
        "neuroshard_jax/data/profiles/xeon-plans",
        "neuroshard_jax/data/profiles/xeon-rowblocks",
        "neuroshard_jax/data/profiles/xeon-cold",
        "neuroshard_jax/data/profiles/xeon-tiny",
    )
    # the orbax checkpoint directory (replaced); family=row_comm or input_dist: the fit's folder, this user's fits
    # (paths.user_fits_dir) when left at this default
    out: str = "checkpoints/xeon-union"
    name: str = "xeon-union"
    # family=mlp, the paper's sizes: table MLP 21 -> 128 -> 32, head (32 + log count) -> 64 -> 1
    net: NetConfig = NetConfig()
    ensemble: EnsembleConfig = EnsembleConfig()
    train: TrainConfig = TrainConfig()
    allow_mixed_hardware: bool = False  # datasets measured on different processors (refused by default)
    init: str | None = None  # ensemble: fine-tune this checkpoint (a shipped name or a directory)
    reanchor: bool = False  # with init: first move its members onto the roofline fitted to these datasets
    steps: int = 3000  # family=analytic: optimizer steps of the constants' fit

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise UserError(f"family: got {self.family!r}, expected one of {', '.join(FAMILIES)}")
        if not self.datasets:
            raise UserError("datasets: got [], expected at least one dataset directory")
        if self.init and self.family != "ensemble":
            raise UserError(f"init: got {self.init!r}, but only family=ensemble fine-tunes; expected null")
        if self.reanchor and not self.init:
            raise UserError("reanchor: got true without init, expected init=MODEL (a model to fine-tune)")


def app_config(cfg: DictConfig) -> TrainAppConfig:
    return typed(TrainAppConfig, resolved(cfg))
