"""Does a cost model's device cost grow as the hardware's does? (issue 51: "cost monotone in lookups, width and
tables"). Over random devices of spec-sampler tables (the training sampler's range, its own seed), the model's
device compute is compared before and after one change a kernel can only pay more for:

- **a table added** to the device;
- **one table's pooling factor doubled** (twice the lookups, the same access law);
- **one table twice as wide** (reported apart for 4 -> 8 wide: FBGEMM's CPU kernels cost the same at 4 and 8,
  half a vector either way; the labels say +1%, so a model may read it either side of flat).

    python -m tools.monotone_probe --checkpoint epyc-f25m17 [--devices 2000]

It prints, per change, the share of devices whose predicted cost fell and the largest fall (relative). By
construction every shard's corrected cost is positive (a table added adds a positive term) and its roofline grows
with lookups and width; what can still fall is the per-shard correction (bounded, exp(+-C)) and the device head's
factor (exp(+-0.7)): this measures how often and by how much they undo the growth.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from neuroshard_jax.costs.choice import CostModelSpec
from neuroshard_jax.measure.calibration import predicted_compute_ms
from neuroshard_jax.workloads.builders import task_from_tables
from neuroshard_jax.workloads.samplers import SpecSamplerConfig, draw_table_spec

SEED = 515_029  # the probe's own
WIDTHS = (4, 8, 16, 32, 64)  # doubled up to 128


@dataclasses.dataclass(frozen=True)
class MonotoneReport:
    """Per change: devices probed, the share whose cost fell by more than ``tolerance``, the largest fall."""

    change: str
    devices: int
    fell: float
    worst_fall: float


def probe_tables(num_tables: int, seed: int = SEED, batch_size: int = 4096) -> list[dict]:
    """``num_tables`` spec-sampler tables (whole range, a third from the heavy corner) with widths 4..64."""
    rng = np.random.default_rng([seed, 1])
    heavy = np.random.default_rng([seed, 2])
    config = SpecSamplerConfig()
    tables = []
    for i in range(num_tables):
        spec = draw_table_spec(rng, config, batch_size, (heavy, "heavy") if heavy.random() < 1 / 3 else None)
        tables.append({"name": f"t{i}", **spec, "rows": min(spec["rows"], 2_000_000), "dim": int(rng.choice(WIDTHS))})
    return tables


def monotone_report(
    spec: CostModelSpec, devices: int = 2000, seed: int = SEED, tolerance: float = 1e-4
) -> list[MonotoneReport]:
    """The three changes over ``devices`` random devices of 1..32 tables each, priced by ``spec``'s model."""
    rng = np.random.default_rng([seed, 3])
    base = probe_tables(64, seed)
    doubled_pooling = [{**t, "name": t["name"] + "p", "pooling_factor": 2 * t["pooling_factor"]} for t in base]
    doubled_width = [{**t, "name": t["name"] + "w", "dim": 2 * t["dim"]} for t in base]
    task = task_from_tables(base + doubled_pooling + doubled_width, num_devices=1, mem_cap_gb=1e3)
    model = spec.for_task(task)
    n = len(base)
    groups, added, pooled, widened, narrow = [], [], [], [], []
    for _ in range(devices):
        group = [int(t) for t in rng.choice(n, int(rng.integers(1, 33)), replace=False)]
        others = [t for t in range(n) if t not in group]
        pick = int(rng.integers(len(group)))
        groups.append(group)
        added.append(group + [int(rng.choice(others))])
        pooled.append(group[:pick] + [group[pick] + n] + group[pick + 1 :])
        widened.append(group[:pick] + [group[pick] + 2 * n] + group[pick + 1 :])
        narrow.append(base[group[pick]]["dim"] == 4)
    before = predicted_compute_ms(model, task, groups)
    narrow = np.array(narrow)
    reports = []
    for change, after_groups, part in (
        ("table added", added, np.ones(devices, bool)),
        ("pooling doubled", pooled, np.ones(devices, bool)),
        ("width doubled", widened, ~narrow),
        ("width 4 -> 8", widened, narrow),
    ):
        after = predicted_compute_ms(model, task, after_groups)
        fall = (1.0 - after / before)[part]
        reports.append(
            MonotoneReport(change, len(fall), float(np.mean(fall > tolerance)), float(max(0.0, fall.max(initial=0.0))))
        )
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=None, help="a neural checkpoint directory or shipped name")
    parser.add_argument("--devices", type=int, default=2000)
    args = parser.parse_args(argv)
    spec = CostModelSpec("neural", {"checkpoint": args.checkpoint} if args.checkpoint else {})
    print(f"{'change':<16} {'devices':>8} {'cost fell':>10} {'worst fall':>11}")
    for r in monotone_report(spec, args.devices):
        print(f"{r.change:<16} {r.devices:>8} {100 * r.fell:>9.1f}% {100 * r.worst_fall:>10.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
