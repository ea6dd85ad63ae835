r"""How well another kind's model, scaled by one factor as first contact scales it, reads a machine kind's labels: which
shipped model should plan on a kind that has none (``costs.choice.nearest_models``).

    python -m tools.kind_transfer --models xeon-union,epyc-f25m17 \
        --factor-from neuroshard_jax/data/profiles/epyc26-specs \
        --datasets neuroshard_jax/data/profiles/epyc-f26m2-plans8,neuroshard_jax/data/profiles/epyc-f26m2-corners

For each model: its factor is the median measured / predicted over the ``--factor-from`` labels shaped as first
contact's spec devices (``measure.first_contact``: 4-16 whole tables a device, predicted <= 40 ms), with the spread of
that median over draws of 12 of them (first contact measures 12); then every dataset's labels are read with the model
times that factor: MAPE, median signed error (predicted / measured - 1), and the MAPE a factor fitted on that dataset
itself would leave (the best any one factor does there). No measuring: the labels are the datasets' own, every one of
them of one machine kind (the datasets' manifests say which). Prints a table and, with ``--out``, writes it as JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.records import ratio_errors
from neuroshard_jax.costs.checkpoints import load_ensemble
from neuroshard_jax.costs.choice import checkpoint_path
from neuroshard_jax.learn.datasets import ensemble_arrays
from neuroshard_jax.learn.ensemble_fit import ensemble_ms
from neuroshard_jax.measure.first_contact import MAX_PREDICTED_MS, SAMPLES

MIN_TABLES, MAX_TABLES = 4, 16  # first contact's spec devices (``first_contact.contact_tasks``)
DRAWS = 200  # draws of SAMPLES labels for the spread of the factor


def errors(ratio: np.ndarray) -> dict:
    """MAPE and median signed error of predicted / measured ``ratio``, and the MAPE after this set's own factor."""
    return {
        "labels": int(len(ratio)),
        **ratio_errors(ratio, 1.0),
        "own_factor_mape": ratio_errors(ratio / np.median(ratio), 1.0)["mape"],
    }


def transfer(models: list[str], factor_from: str, datasets: list[str], seed: int = 0) -> dict:
    """Per model: the first-contact factor from ``factor_from``'s spec-shaped labels and each dataset's errors."""
    dirs = [Path(factor_from), *map(Path, datasets)]
    feats, mask, batch, target, source, _ = ensemble_arrays(dirs, 0.25, True)  # quiet labels, faulted ones dropped
    tables = mask.sum(1)
    out = {}
    for name in models:
        _, nets, params, _ = load_ensemble(checkpoint_path(name))
        predicted = ensemble_ms(nets, params, feats, mask, batch)[0]
        measured_over = target / predicted
        specs = np.flatnonzero(
            (source == 0) & (tables >= MIN_TABLES) & (tables <= MAX_TABLES) & (predicted <= MAX_PREDICTED_MS)
        )
        if len(specs) < SAMPLES:
            raise UserError(f"--factor-from: {len(specs)} labels shaped as first contact's, expected >= {SAMPLES}")
        factor = float(np.median(measured_over[specs]))
        rng = np.random.default_rng(seed)
        draws = [np.median(measured_over[rng.choice(specs, SAMPLES, replace=False)]) for _ in range(DRAWS)]
        out[name] = {
            "factor": round(factor, 4),
            "factor_p10_p90": [round(float(np.quantile(draws, q)), 4) for q in (0.1, 0.9)],
            "spec_labels": int(len(specs)),
            "datasets": {
                Path(d).name: errors(predicted[source == i] * factor / target[source == i])
                for i, d in enumerate(dirs)
                if i > 0
            },
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.kind_transfer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", required=True, help="models of other kinds, comma-separated")
    parser.add_argument("--factor-from", required=True, help="a spec label set of the machine kind judged")
    parser.add_argument("--datasets", required=True, help="label sets of the same kind to read, comma-separated")
    parser.add_argument("--out", default=None, help="a JSON file for the table")
    args = parser.parse_args(argv)
    try:
        result = transfer(args.models.split(","), args.factor_from, args.datasets.split(","))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("| model | factor (12-label p10-p90) | dataset | labels | MAPE | median signed | its own factor's MAPE |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, row in result.items():
        low, high = row["factor_p10_p90"]
        for dataset, e in row["datasets"].items():
            print(
                f"| {name} | x{row['factor']:.3f} ({low:.3f}-{high:.3f}) | {dataset} | {e['labels']} | "
                f"{e['mape']:.1%} | {e['bias']:+.1%} | {e['own_factor_mape']:.1%} |"
            )
    if args.out:
        write_json(result, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
