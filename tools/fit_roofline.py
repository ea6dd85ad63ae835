"""How much each roofline term of the physics ensemble explains, on measured shards.

    python -m tools.fit_roofline [--datasets DIR ...]   (default: the shipped cpu-b4096 and cpu-specs datasets)

Fits the non-negative least-squares roofline of ``training.fit_roofline`` (relative error) per dataset, with all
its columns and without the lookups x shards interaction, and prints the MAPE of each fit: the evidence for the
interaction term.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from neuroshard_jax.learn.datasets import compute_batches
from neuroshard_jax.learn.ensemble_fit import roofline_design

COLUMNS = ("table", "lookup", "gather", "update", "output", "kernel", "lookups x shards")


def fit_mape(design: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
    coef, _ = nnls(design / target[:, None], np.ones(len(target)))
    return float(np.mean(np.abs(design @ coef - target) / target)), coef


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--datasets",
        nargs="+",
        default=["neuroshard_jax/data/profiles/cpu-b4096", "neuroshard_jax/data/profiles/cpu-specs"],
    )
    args = parser.parse_args()
    for path in args.datasets:
        feats, mask, batch, target, _ = compute_batches(Path(path))
        design = roofline_design(feats, mask, batch)
        full, coef = fit_mape(design, target)
        without, _ = fit_mape(design[:, :-1], target)
        print(
            f"{path}: {len(target)} shards; MAPE {100 * full:.1f}% with every term, "
            f"{100 * without:.1f}% without the interaction"
        )
        print("  coefficients (ms per 1e6 units): " + ", ".join(f"{n} {c:.3g}" for n, c in zip(COLUMNS, coef)))


if __name__ == "__main__":
    main()
