"""Policy checkpoints of the DreamShard-style RL searcher: save, find, load (orbax).

Layout of a policy directory (one finished round of ``python -m neuroshard_jax.train_policy``):
``policy/`` (orbax: net + feature statistics), ``optimizer/`` (the optimizer state, to resume training),
``cost_model/`` (the neural cost model checkpoint the policy was trained with) and ``meta.json``. A training
output directory holds rounds and a ``LATEST`` pointer; ``policy_dir`` resolves either.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from neuroshard_jax.core.constants import SHIPPED_POLICY
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import NUM_BASE_FEATURES
from neuroshard_jax.core.paths import package_path
from neuroshard_jax.costs.checkpoints import load_checkpoint, read_meta, restore_tree, save_tree
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.costs.neural import FeatureStats, neural_cost_model
from searchers.policy import Policy, PolicyConfig, PolicyParams

FORMAT_VERSION = 1


def save_policy(path: Path, config: PolicyConfig, params: PolicyParams, opt_state, meta: dict) -> None:
    """Write a policy checkpoint into the directory ``path`` (its ``policy/`` and ``optimizer/`` must not exist)."""
    net = {"net": nnx.to_pure_dict(params.net), "stats": params.stats._asdict()}
    digests = {"policy": save_tree(path / "policy", net)}
    if opt_state is not None:
        digests["optimizer"] = save_tree(path / "optimizer", {"leaves": jax.tree_util.tree_leaves(opt_state)})
    full = {"format": FORMAT_VERSION, "policy_config": dataclasses.asdict(config), **meta, "digests": digests}
    (path / "meta.json").write_text(json.dumps(full, indent=1) + "\n")


def policy_dir(path: str | Path) -> Path:
    """The newest finished round of a training output directory, or ``path`` itself."""
    path = Path(path).resolve()
    latest = path / "LATEST"
    return path / latest.read_text().strip() if latest.exists() else path


def load_policy(path: str | Path, tx: optax.GradientTransformation | None = None):
    """Restore (graph, params, optimizer state or None, meta) from a policy checkpoint directory."""
    path = policy_dir(path)
    meta = read_meta(path, "searcher.policy")
    if meta.get("format") != FORMAT_VERSION or "policy_config" not in meta:
        raise UserError(f"searcher.policy: {str(path)!r} is not a policy checkpoint (no policy_config in meta.json)")
    config = PolicyConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in meta["policy_config"].items()})
    graph, state = nnx.split(Policy(config, nnx.Rngs(0)))
    stats = FeatureStats(jnp.zeros(NUM_BASE_FEATURES), jnp.ones(NUM_BASE_FEATURES))
    digests = meta.get("digests") if isinstance(meta.get("digests"), dict) else {}
    net = {"net": nnx.to_pure_dict(state), "stats": stats._asdict()}
    tree = restore_tree(path / "policy", net, "searcher.policy", digests.get("policy"))
    nnx.replace_by_pure_dict(state, tree["net"])
    params = PolicyParams(state, FeatureStats(jnp.asarray(tree["stats"]["mean"]), jnp.asarray(tree["stats"]["std"])))
    opt_state = None
    if tx is not None:
        template = tx.init(state)
        optimizer = {"leaves": jax.tree_util.tree_leaves(template)}
        leaves = restore_tree(path / "optimizer", optimizer, "searcher.policy", digests.get("optimizer"))["leaves"]
        opt_state = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves)
    return graph, params, opt_state, meta


def resolve_policy(path: str | None) -> str:
    """The absolute directory of policy ``path`` (None: the policy shipped in the package)."""
    resolved = Path(path) if path else package_path(SHIPPED_POLICY)
    if not resolved.exists():
        raise UserError(
            f"searcher.policy: no policy at {str(resolved)!r}; expected a directory written by "
            "python -m neuroshard_jax.train_policy"
        )
    return str(resolved.resolve())


@functools.lru_cache(maxsize=4)
def load_search_policy(path: str) -> tuple[nnx.GraphDef, PolicyParams, CostModel, dict]:
    """(graph, params, the cost model it was trained with, meta) of the policy at ``path`` (cached)."""
    graph, params, _, meta = load_policy(path)
    _, nets, cost_params, _ = load_checkpoint(policy_dir(path) / "cost_model")
    return graph, params, neural_cost_model(nets, cost_params), meta
