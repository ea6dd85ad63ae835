"""How well a cost model predicts row blocks, measured: a spec dataset with row blocks against the model.

    python -m neuroshard_jax.collect kind=compute source=specs specs.row_share=0.5 specs.max_tables=4 \
        num_samples=160 out_dir=neuroshard_jax/data/profiles/xeon-rowblocks      # labels (resumable)
    python tools/bench_row_blocks.py neuroshard_jax/data/profiles/xeon-rowblocks [--checkpoint xeon-union]

A row block does the lookups that land in its rows; the model scores it as a table of its rows doing that share of
the pooling factor with the table's histogram (``sharding.shard_features``). The labels measure the block on the
table's stream restricted to its rows (the worker). This splits the dataset's samples into those holding a row
block and those without, and reports the model's MAPE and mean signed error on each (the samples without blocks
are the control: the same generator, the same session). Writes bench/row_blocks/NAME.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.checkpoints import load_ensemble
from neuroshard_jax.datasets import hardware, read_records, write_json
from neuroshard_jax.errors import UserError
from neuroshard_jax.models import checkpoint_path
from neuroshard_jax.training import MIN_CPU_SHARE, compute_batches, ensemble_ms

OUT = Path(__file__).resolve().parent.parent / "bench" / "row_blocks"


def figures(pred: np.ndarray, true: np.ndarray) -> dict:
    rel = (pred - true) / true
    return {
        "samples": int(len(true)),
        "mape": round(float(np.mean(np.abs(rel))), 4) if len(true) else None,
        "signed": round(float(np.mean(rel)), 4) if len(true) else None,
        "off_2x": int(np.sum((pred / true > 2) | (pred / true < 0.5))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("--checkpoint", default="xeon-union")
    args = parser.parse_args()
    try:
        folder = Path(args.dataset)
        _, nets, params, _ = load_ensemble(checkpoint_path(args.checkpoint))
        feats, mask, batch, target, _ = compute_batches(folder)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    records = read_records(folder / "compute.jsonl")
    quiet = np.array([r.get("cpu_share", 1.0) >= MIN_CPU_SHARE for r in records])
    blocks = np.array([any("num_rows" in t for t in r["tables"]) for r in records])
    pred, _ = ensemble_ms(nets, params, feats, mask, batch)
    result = {
        "dataset": folder.as_posix(),
        "checkpoint": args.checkpoint,
        "machine": hardware(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "quiet_samples": int(quiet.sum()),
        "with_row_blocks": figures(pred[quiet & blocks], target[quiet & blocks]),
        "without_row_blocks": figures(pred[quiet & ~blocks], target[quiet & ~blocks]),
    }
    print(
        f"{args.checkpoint} on {folder.name} ({result['quiet_samples']} quiet samples): with row blocks "
        f"{result['with_row_blocks']}, without {result['without_row_blocks']}"
    )
    write_json(result, OUT / f"{folder.name}--{args.checkpoint}.json")


if __name__ == "__main__":
    main()
