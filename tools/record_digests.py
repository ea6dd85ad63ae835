"""Record the array digests (``checkpoints.tree_digest``) of checkpoints written before digests existed.

    python -m tools.record_digests neuroshard_jax/data/models/cpu-ensemble [...]

Each checkpoint is restored as it is, and the digest of what was restored is added to its meta.json
(``digests``), so that later loads detect a garbled tensor file. Run it only on checkpoints known to be good
(the shipped ones, as committed); a checkpoint that already has digests is left as it is.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from flax import nnx

from neuroshard_jax.costs.checkpoints import (
    ENSEMBLE_FORMAT,
    _ensemble_tree,
    load_checkpoint,
    load_ensemble,
    tree_digest,
)
from searchers.policy_store import load_policy


def digests_of(path: Path, meta: dict) -> dict:
    if "policy_config" in meta:
        _, params, _, _ = load_policy(path)
        # the optimizer state (resuming training only) is left unchecked in these older checkpoints
        return {"policy": tree_digest({"net": nnx.to_pure_dict(params.net), "stats": params.stats._asdict()})}
    if meta.get("format") == ENSEMBLE_FORMAT:
        _, _, params, _ = load_ensemble(path)
        return {"state": tree_digest(_ensemble_tree(params))}
    _, _, params, _ = load_checkpoint(path)
    tree = {
        "compute": nnx.to_pure_dict(params.compute),
        "fwd": nnx.to_pure_dict(params.fwd),
        "bwd": nnx.to_pure_dict(params.bwd),
        "stats": {"mean": params.stats.mean, "std": params.stats.std},
    }
    return {"state": tree_digest(tree)}


def main(paths: list[str]) -> None:
    for name in paths:
        path = Path(name)
        meta = json.loads((path / "meta.json").read_text())
        if "digests" in meta:
            print(f"{path}: has digests already")
            continue
        meta["digests"] = digests_of(path, meta)
        (path / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"{path}: {meta['digests']}")


if __name__ == "__main__":
    main(sys.argv[1:])
