"""How well a cost model predicts row blocks, measured: a spec dataset with row blocks against the model.

    python -m neuroshard_jax.collect kind=compute source=specs specs.row_share=0.5 specs.max_tables=4 \
        num_samples=160 out_dir=neuroshard_jax/data/profiles/xeon-rowblocks      # labels (resumable)
    python -m tools.bench_row_blocks neuroshard_jax/data/profiles/xeon-rowblocks [--checkpoint xeon-union]

A row block does the lookups that land in its rows. The labels measure the block on the table's stream restricted
to its rows (the worker), and training reads a block's features from those lookups (its pooling factor and its own
histogram: ``streams.block_statistics``). A search knows only the table's statistics and scores a block as a table
of its rows doing their share of the pooling factor with the table's histogram (``sharding.shard_features``). This
splits the dataset's samples into those holding a row block and those without, and reports the model's MAPE and
mean signed error on each, the blocks scored both ways (the samples without blocks are the control: the same
generator, the same session), and where the blocks' error lies (how their lookups fell against the uniform share).
Writes outputs/bench/row_blocks/NAME--CHECKPOINT.json.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from neuroshard_jax.core.cli import fail
from neuroshard_jax.core.constants import MIN_CPU_SHARE
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import read_records, write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.costs.checkpoints import load_ensemble
from neuroshard_jax.costs.choice import checkpoint_path
from neuroshard_jax.learn.datasets import compute_batches
from neuroshard_jax.learn.ensemble_fit import ensemble_ms
from neuroshard_jax.workloads.streams import block_statistics, request_spec

OUT = Path(__file__).resolve().parents[1] / "outputs" / "bench" / "row_blocks"


def figures(pred: np.ndarray, true: np.ndarray) -> dict:
    rel = (pred - true) / true
    return {
        "samples": int(len(true)),
        "mape": round(float(np.mean(np.abs(rel))), 4) if len(true) else None,
        "signed": round(float(np.mean(rel)), 4) if len(true) else None,
        "off_2x": int(np.sum((pred / true > 2) | (pred / true < 0.5))),
    }


def block_lookups(table: dict, batch_size: int) -> tuple[float, float]:
    """(lookups landing in the block / the share its rows would get, the block's pooling factor) of a spec row block,
    from the very stream the worker measured (``streams.block_statistics``): how its lookups fell, against the
    uniform share the search's features assume."""
    spec, seed = request_spec(table, batch_size)
    pooling, _ = block_statistics(spec, seed, int(table["row_offset"]), int(table["num_rows"]))
    expected = spec.pooling_factor * int(table["num_rows"]) / spec.rows
    return (pooling / expected if expected > 0 else 1.0), pooling


def where_blocks_err(records: list[dict], pred: np.ndarray, true: np.ndarray) -> dict:
    """The samples holding a row block, grouped by how their block's lookups fell (realized / uniform share of the
    costliest block of the sample: below 0.8, 0.8-1.25, above) and by the block's pooling factor (below 1, 1-10,
    above): which one the model's error follows."""
    share, pooling = [], []
    for record in records:
        stats = [block_lookups(t, int(record["batch_size"])) for t in record["tables"] if "num_rows" in t]
        share.append(max(s for s, _ in stats))
        pooling.append(min(p for _, p in stats))
    share, pooling = np.asarray(share), np.asarray(pooling)
    rel = np.log(pred / true)

    def by_range(values: np.ndarray, low: float, high: float) -> dict:
        masks = (values < low, (values >= low) & (values <= high), values > high)
        names = (f"below {low:g}", f"{low:g}-{high:g}", f"above {high:g}")
        return {name: figures(pred[m], true[m]) for name, m in zip(names, masks)}

    def log_corr(values: np.ndarray) -> float | None:
        return round(float(np.corrcoef(rel, np.log(np.maximum(values, 1e-3)))[0, 1]), 3) if len(rel) > 2 else None

    return {
        "lookup_share_realized_over_uniform": by_range(share, 0.8, 1.25),
        "block_pooling": by_range(pooling, 1, 10),
        "corr_log_error_log_share": log_corr(share),
        "corr_log_error_log_pooling": log_corr(pooling),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("--checkpoint", default="xeon-union")
    args = parser.parse_args()
    try:
        folder = Path(args.dataset)
        _, nets, params, _ = load_ensemble(checkpoint_path(args.checkpoint))
        # a block's features: its own lookups' statistics (as training reads the labels), or the table's scaled
        # to its rows (all a search knows of a block of a table it has statistics for)
        feats = {own: compute_batches(folder, block_stats=own) for own in (True, False)}
    except UserError as err:
        fail(err)
    records = read_records(folder / "compute.jsonl")
    quiet = np.array([r.get("cpu_share", 1.0) >= MIN_CPU_SHARE for r in records])
    blocks = np.array([any("num_rows" in t for t in r["tables"]) for r in records])
    target = feats[True][3]
    pred = {own: ensemble_ms(nets, params, f, m, b)[0] for own, (f, m, b, _, _) in feats.items()}
    result = {
        "dataset": folder.as_posix(),
        "checkpoint": args.checkpoint,
        "machine": hardware(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "quiet_samples": int(quiet.sum()),
        "with_row_blocks": figures(pred[True][quiet & blocks], target[quiet & blocks]),
        "with_row_blocks_table_statistics": figures(pred[False][quiet & blocks], target[quiet & blocks]),
        "without_row_blocks": figures(pred[True][quiet & ~blocks], target[quiet & ~blocks]),
    }
    block_records = [r for r, q, b in zip(records, quiet, blocks) if q and b]
    result["blocks_by"] = where_blocks_err(block_records, pred[True][quiet & blocks], target[quiet & blocks])
    result["blocks_by_table_statistics"] = where_blocks_err(
        block_records, pred[False][quiet & blocks], target[quiet & blocks]
    )
    print(
        f"{args.checkpoint} on {folder.name} ({result['quiet_samples']} quiet samples): with row blocks "
        f"{result['with_row_blocks']} (the table's statistics scaled: {result['with_row_blocks_table_statistics']}), "
        f"without {result['without_row_blocks']}"
    )
    write_json(result, OUT / f"{folder.name}--{Path(args.checkpoint).name}.json")  # a path or a shipped name


if __name__ == "__main__":
    main()
