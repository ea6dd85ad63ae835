"""One kernel, two times: FBGEMM's CPU kernels timed under glibc's default allocator and with freed memory kept for
reuse (``kernels.processes.MALLOC_ENV``, what every worker runs with since 2026-11-30).

    python -m tools.malloc_probe --rounds 4 --out outputs/bench/malloc-probe.json

glibc hands a freed block above its mmap threshold (dynamic, at most 32 MB) back to the OS, and the next call's
output of that size is page-faulted afresh, unless a free block of the heap happens to fit, which depends on what the
process freed before. A sequence kernel writes a row per id (``ids x dim`` floats: 62 MB for 483k ids of dim 32), a
pooled kernel a row per bag and table (``batch x sum of dims``), so the same request reads one of two times by the
worker's history. Each case below is measured ``--rounds`` times by two pinned workers on the same core in turn, one
with each allocator setting, the cases interleaved; printed and written: per case, the output's MB and the forward /
backward medians and spread of each setting."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
from pathlib import Path

from neuroshard_jax.core.hardware import hardware, hardware_kind
from neuroshard_jax.kernels.processes import MALLOC_ENV, ComputeWorker, SpecTableRef, compute_request
from neuroshard_jax.learn.datasets import output_bytes

BATCH = 4096
HOT = (0.0,) * 14 + (0.4, 0.35, 0.25)  # every row read thousands of times a batch (a tiny table's histogram)
WARM = (0.0,) * 10 + (0.2, 0.6, 0.2, 0.0, 0.0, 0.0, 0.0)
SPREAD = (0.0, 0.1, 0.5, 0.3, 0.1) + (0.0,) * 12
# name -> (the kernel's tables, its kind): sequence kernels of 4-64 MB outputs, and a pooled one of 64 MB
CASES = {
    "sequence 17 rows, 30 ids, dim 32 (16 MB)": ([SpecTableRef(17, 30.0, HOT, 32, 1, kernel="sequence")], "sequence"),
    "sequence 17 rows, 118 ids, dim 32 (62 MB)": ([SpecTableRef(17, 117.9, HOT, 32, 1, kernel="sequence")], "sequence"),
    "sequence 17 rows, 30 ids, dim 128 (63 MB)": ([SpecTableRef(17, 30.0, HOT, 128, 1, kernel="sequence")], "sequence"),
    "sequence 1000 rows, 118 ids, dim 32 (62 MB)": (
        [SpecTableRef(1000, 117.9, WARM, 32, 2, kernel="sequence")],
        "sequence",
    ),
    "sum, 32 tables of dim 128 (64 MB)": ([SpecTableRef(10_000, 2.0, SPREAD, 128, s) for s in range(32)], "sum"),
}
SETTINGS = {"os": {k: None for k in MALLOC_ENV}, "reuse": {}}  # glibc's default (the variables unset), and reuse


def output_mb(tables: list[SpecTableRef], kind: str) -> float:
    """The kernel's output in MB (``learn.datasets.output_bytes`` of the label it would make: a row per id of a
    sequence kernel, a row per bag and table of a pooled one), its ids the tables' expected lookups."""
    label = {
        "tables": [{"dim": t.dim} for t in tables],
        "pooling": "none" if kind == "sequence" else "sum",
        "num_indices": sum(t.pooling_factor * BATCH for t in tables),
        "batch_size": BATCH,
    }
    return output_bytes(label) / 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    core = max(os.sched_getaffinity(0))
    workers = {name: ComputeWorker("cpu", extra_env=env, core=core) for name, env in SETTINGS.items()}
    runs: dict = {case: {name: [] for name in SETTINGS} for case in CASES}
    try:
        for r in range(args.rounds):
            for case, (tables, _) in CASES.items():
                for name, worker in workers.items():
                    request = compute_request(f"{r}/{case}/{name}", tables, None, BATCH)  # each table its kernel
                    answer = worker.request(request, timeout_s=300)
                    if not answer.ok:
                        raise SystemExit(f"malloc_probe: {case} ({name}) failed: {answer.error}")
                    runs[case][name].append((answer.fwd_ms, answer.bwd_ms, answer.cpu_share))
    finally:
        for worker in workers.values():
            worker.close()
    out = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "machine": hardware_kind(hardware()),
        "batch_size": BATCH,
        "rounds": args.rounds,
        "cases": {},
    }
    print(f"{out['machine']}, batch {BATCH}, {args.rounds} rounds; ms: median (min-max) of the rounds")
    print(f"| kernel | output MB | fwd, {' | fwd, '.join(SETTINGS)} | bwd, {' | bwd, '.join(SETTINGS)} |")
    print("| --- | --- |" + " --- |" * (2 * len(SETTINGS)))
    for case, (tables, kind) in CASES.items():
        row = {"output_mb": round(output_mb(tables, kind), 1)}
        cells = {"fwd": [], "bwd": []}
        for name in SETTINGS:
            fwd, bwd, share = zip(*runs[case][name])
            row[name] = {"fwd_ms": fwd, "bwd_ms": bwd, "cpu_share": share}
            for part, values in (("fwd", fwd), ("bwd", bwd)):
                cells[part].append(f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        out["cases"][case] = row
        print(f"| {case} | {row['output_mb']} | {' | '.join(cells['fwd'])} | {' | '.join(cells['bwd'])} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
