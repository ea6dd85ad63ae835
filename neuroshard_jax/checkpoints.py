"""Orbax checkpoints of the neural cost models: params + net config + feature statistics + provenance.

Layout of a checkpoint directory:
  state/         orbax StandardCheckpointer: {"compute", "fwd", "bwd"} nnx states and the feature stats
  meta.json      net config, feature names (the schema), batch size, dataset manifest ids, metrics
Restoring into nets of another config, or a checkpoint of another feature schema, is a clear error.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx

from neuroshard_jax.errors import UserError
from neuroshard_jax.features import FEATURE_NAMES
from neuroshard_jax.neural import FeatureStats, NetConfig, NeuralNets, NeuralParams, init_nets

FORMAT_VERSION = 3  # 2: compute head on mean latent + log count; 3: comm nets learn the transfer, not the wait


def save_tree(path: Path, tree) -> None:
    """Save a pytree of arrays with orbax (``path`` must not exist)."""
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(Path(path).resolve(), tree)


def restore_tree(path: Path, template):
    """Restore a pytree saved by ``save_tree`` into the structure, shapes and dtypes of ``template``."""
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(Path(path).resolve(), abstract)


def save_checkpoint(path: str | Path, config: NetConfig, params: NeuralParams, meta: dict) -> Path:
    """Write a checkpoint (replacing one at ``path``)."""
    path = Path(path).resolve()
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    tree = {
        "compute": nnx.to_pure_dict(params.compute),
        "fwd": nnx.to_pure_dict(params.fwd),
        "bwd": nnx.to_pure_dict(params.bwd),
        "stats": {"mean": params.stats.mean, "std": params.stats.std},
    }
    save_tree(path / "state", tree)
    full_meta = {
        "format": FORMAT_VERSION,
        "net_config": dataclasses.asdict(config),
        "feature_names": list(FEATURE_NAMES),
        **meta,
    }
    (path / "meta.json").write_text(json.dumps(full_meta, indent=1) + "\n")
    return path


def read_meta(path: str | Path) -> dict:
    meta_path = Path(path) / "meta.json"
    if not meta_path.exists():
        raise UserError(
            f"cost_model.checkpoint: {str(path)!r} has no meta.json, expected a neural cost model checkpoint"
        )
    return json.loads(meta_path.read_text())


def load_checkpoint(
    path: str | Path, config: NetConfig | None = None
) -> tuple[NetConfig, NeuralNets, NeuralParams, dict]:
    """Restore a checkpoint. ``config``, if given, must equal the saved net config."""
    path = Path(path).resolve()
    meta = read_meta(path)
    if meta.get("format") != FORMAT_VERSION:
        raise UserError(
            f"cost_model.checkpoint: {str(path)!r} has checkpoint format {meta.get('format')}, expected "
            f"{FORMAT_VERSION}; retrain it with python -m neuroshard_jax.train"
        )
    if meta.get("feature_names") != list(FEATURE_NAMES):
        raise UserError(
            f"cost_model.checkpoint: {str(path)!r} scores features {meta.get('feature_names')}, expected the schema "
            f"{list(FEATURE_NAMES)}"
        )
    saved = NetConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in meta["net_config"].items()})
    if config is not None and config != saved:
        raise UserError(
            f"cost_model: net config {dataclasses.asdict(config)} does not match the checkpoint's "
            f"{dataclasses.asdict(saved)}"
        )
    nets, template = init_nets(saved)
    target = {
        "compute": nnx.to_pure_dict(template.compute),
        "fwd": nnx.to_pure_dict(template.fwd),
        "bwd": nnx.to_pure_dict(template.bwd),
        "stats": {"mean": template.stats.mean, "std": template.stats.std},
    }
    tree = restore_tree(path / "state", target)
    states = []
    for name, state in (("compute", template.compute), ("fwd", template.fwd), ("bwd", template.bwd)):
        nnx.replace_by_pure_dict(state, tree[name])
        states.append(state)
    stats = FeatureStats(jnp.asarray(tree["stats"]["mean"]), jnp.asarray(tree["stats"]["std"]))
    return saved, nets, NeuralParams(*states, stats), meta
