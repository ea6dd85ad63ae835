"""Compare the synthetic table pool with the published DLRM 2021 statistics.

    python -m tools.calibrate_pool [--seed 0] [--num-tables 856]

Generates every table's index stream at the published batch size (65536) and prints the L1
distances of the pooled unique-row and access shares per bin, the mean pooling factor, and the
spread of row counts and pooling factors. Takes about a minute on one CPU core.
"""

import argparse
import json
import time

from neuroshard_jax.workloads.pool import PoolSpec, calibration_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-tables", type=int, default=856)
    args = parser.parse_args()
    start = time.perf_counter()
    report = calibration_report(PoolSpec(seed=args.seed, num_tables=args.num_tables))
    report["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
