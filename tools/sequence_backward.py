"""Why a large sequence kernel reads two times: its CPU backward against the distinct rows a batch touches.

    python -m tools.sequence_backward --rounds 3 --out outputs/bench/sequence-backward.json

FBGEMM's CPU backward of an unpooled (``PoolingMode.NONE``) table-batched kernel gathers each id's gradient in hash
maps keyed by the id and the table (``split_embedding_nobag_backward_exact_cpu_kernel`` in
``embedding_backward_split_cpu_template.cpp``): a few heap blocks per distinct row, then one update per row. The
pooled kernels sort the ids (``csr2csc``) and update the same rows with FBGEMM's vector kernels. So the sequence
backward costs per distinct row, not per lookup, and that cost is pointer-chasing through the heap: it moves with the
state of the machine's memory. Each case below is one table of 1,000,000 rows, 12 ids a sample at batch 4096 (49k
lookups), every row it reads read about the same number of times: from once (49k distinct rows) to hundreds of times
(a few hundred); run as a sequence kernel and as a sum-pooled one (the control: the same ids), ``--rounds`` times by
one pinned worker, the cases interleaved. Printed and written: per case, the distinct rows, the forward / backward
medians of both kernels, the sequence backward per distinct row, and the spread of its timed iterations within a
request (max / min, median over the rounds) and across rounds (max / min of the rounds' medians)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
from pathlib import Path

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.features import NUM_BINS
from neuroshard_jax.core.hardware import hardware, hardware_kind
from neuroshard_jax.kernels.processes import ComputeWorker, SpecTableRef, compute_request
from neuroshard_jax.workloads.streams import TableSpec, accessed_rows

BATCH = 4096
ROWS = 1_000_000
IDS = 12.0  # ids a sample: 49,152 lookups a batch
READ_BINS = (0, 1, 3, 5, 7, 9)  # every row read once, twice, 5-8, 17-32, 65-128, 257-512 times
DIMS = (16, 64)  # the widest only where every row is read once


def one_bin(k: int) -> tuple[float, ...]:
    """An access histogram with every accessed row in read-count bin ``k``."""
    return tuple(1.0 if i == k else 0.0 for i in range(NUM_BINS))


def cases(rows: int, ids: float, batch: int) -> dict[str, tuple[SpecTableRef, int]]:
    """name -> (the sequence table, its distinct rows a batch): the read-count bins whose rows ``rows`` can hold."""
    out = {}
    for dim in DIMS:
        for k in READ_BINS if dim == DIMS[0] else READ_BINS[:1]:
            table = SpecTableRef(rows, ids, one_bin(k), dim, 7 + k, kernel="sequence")
            try:
                distinct = int(accessed_rows(TableSpec(rows, ids, table.bins, batch), int(ids * batch)).sum())
            except UserError:  # more distinct rows than the table has
                continue
            out[f"dim {dim}, rows read in bin {k}"] = (table, distinct)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--ids", type=float, default=IDS, help="ids a sample")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    for name in ("rounds", "rows", "ids", "batch"):
        if not getattr(args, name) >= 1:
            raise SystemExit(f"sequence_backward: --{name} {getattr(args, name)}: expected at least 1")
    todo = cases(args.rows, args.ids, args.batch)
    worker = ComputeWorker("cpu", core=max(os.sched_getaffinity(0)))
    runs: dict = {case: {"sequence": [], "sum": []} for case in todo}
    try:
        for r in range(args.rounds):
            for case, (table, _) in todo.items():
                for kernel in ("sequence", "sum"):
                    ref = dataclasses.replace(table, kernel=kernel)
                    answer = worker.request(
                        compute_request(f"{r}/{case}/{kernel}", [ref], None, args.batch), timeout_s=600
                    )
                    if not answer.ok:
                        raise SystemExit(f"sequence_backward: {case} ({kernel}) failed: {answer.error}")
                    spread = max(answer.bwd_runs_ms) / max(min(answer.bwd_runs_ms), 1e-9)
                    runs[case][kernel].append((answer.fwd_ms, answer.bwd_ms, spread, answer.cpu_share))
    finally:
        worker.close()
    out = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "machine": hardware_kind(hardware()),
        "batch_size": args.batch,
        "rows": args.rows,
        "ids_per_sample": args.ids,
        "rounds": args.rounds,
        "cases": {},
    }
    print(
        f"{out['machine']}, batch {args.batch}, {args.rows:,} rows, {args.ids:g} ids a sample, "
        f"{args.rounds} rounds (medians)"
    )
    print(
        "| case | distinct rows | seq fwd ms | seq bwd ms | us / distinct row | bwd spread in a request | "
        "bwd spread over rounds | sum fwd ms | sum bwd ms |"
    )
    print("| --- |" + " --- |" * 8)
    for case, (_, distinct) in todo.items():
        row: dict = {"distinct_rows": distinct}
        for kernel, values in runs[case].items():
            fwd, bwd, spread, share = zip(*values)
            row[kernel] = {"fwd_ms": fwd, "bwd_ms": bwd, "bwd_spread": spread, "cpu_share": share}
        seq = row["sequence"]
        bwd = statistics.median(seq["bwd_ms"])
        per_row = 1e3 * bwd / distinct
        within = statistics.median(seq["bwd_spread"])
        over = max(seq["bwd_ms"]) / min(seq["bwd_ms"])
        row.update(us_per_distinct_row=round(per_row, 3), spread_within=round(within, 3), spread_over=round(over, 3))
        out["cases"][case] = row
        print(
            f"| {case} | {distinct:,} | {statistics.median(seq['fwd_ms']):.2f} | {bwd:.2f} | {per_row:.2f} | "
            f"{within:.2f}x | {over:.2f}x | {statistics.median(row['sum']['fwd_ms']):.2f} | "
            f"{statistics.median(row['sum']['bwd_ms']):.2f} |"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
