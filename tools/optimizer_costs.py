"""What the fused optimizer does to a kernel's time (issue 52): the same spec shards timed with each optimizer
FBGEMM's CPU kernels run, interleaved in one session, so the machine's drift cancels from the ratios.

    python -m tools.optimizer_costs --labels 60 --workers 2 --pin

Takes the first ``--labels`` records of a spec dataset (``--dataset``; its tables and batch sizes, not its labels),
times each with every ``--optimizers`` (in a shuffled order per record, ``--repeats`` rounds), and prints per
optimizer the median ratio of its fwd, bwd and total time to exact SGD's (with p10 and p90), by the shards' mean
width. Writes ``--out`` (JSON) with every timing.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np

from neuroshard_jax.core.files import read_records, write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.memory import kernel_optimizer
from neuroshard_jax.kernels.messages import ComputeAnswer, ComputeRequest
from neuroshard_jax.kernels.processes import KernelPool, compute_request

DATASET = "neuroshard_jax/data/profiles/epyc-f25m17-rowwise"
OUT = Path("outputs/bench/optimizer-costs/results.json")
PARTS = ("fwd_ms", "bwd_ms", "total_ms")


def measure(records: list[dict], optimizers: list[str], repeats: int, workers: int, pin: bool) -> list[dict]:
    """Every record timed with every optimizer, ``repeats`` rounds; rows {record, optimizer, repeat, fwd_ms,
    bwd_ms, total_ms}."""
    rows: list[dict] = []
    with KernelPool(workers, "cpu", 600, pin=pin) as pool:
        for repeat in range(repeats):
            requests = []
            for i, record in enumerate(records):
                order = np.random.default_rng([repeat, i]).permutation(len(optimizers))
                for k in map(int, order):
                    request = compute_request(
                        f"{repeat}/{i}/{optimizers[k]}",
                        record["tables"],
                        None,
                        record["batch_size"],
                        "cpu",
                        optimizers[k],
                    )
                    requests.append(request.tagged(record=i, repeat=repeat))

            def keep(request: ComputeRequest, answer: ComputeAnswer) -> None:
                if not answer.ok:
                    raise SystemExit(f"measurement failed: {answer.error}")
                rows.append(
                    {
                        "record": request.tag("record"),
                        "optimizer": request.optimizer,
                        "repeat": request.tag("repeat"),
                        **{part: getattr(answer, part) for part in PARTS},
                    }
                )

            pool.map(requests, keep)
            print(f"round {repeat}: {len(requests)} timings", flush=True)
    return rows


def ratios(rows: list[dict], optimizers: list[str], records: list[dict]) -> dict:
    """Per optimizer and part: the median over records of (its median time / exact SGD's), p10, p90; and the
    total's median ratio by the record's mean table width."""
    times: dict[tuple[int, str], dict[str, float]] = {}
    for key in {(r["record"], r["optimizer"]) for r in rows}:
        mine = [r for r in rows if (r["record"], r["optimizer"]) == key]
        times[key] = {part: statistics.median(r[part] for r in mine) for part in PARTS}
    base = optimizers[0]
    width = np.array([np.mean([t["dim"] for t in r["tables"]]) for r in records])
    out = {}
    for name in optimizers[1:]:
        per = {
            part: np.array([times[i, name][part] / times[i, base][part] for i in range(len(records))]) for part in PARTS
        }
        out[name] = {
            part: {q: float(np.percentile(v, p)) for q, p in (("median", 50), ("p10", 10), ("p90", 90))}
            for part, v in per.items()
        }
        out[name]["total_by_width"] = {
            f"{lo}-{hi}": float(np.median(per["total_ms"][(width > lo) & (width <= hi)]))
            for lo, hi in ((0, 8), (8, 32), (32, 128))
            if ((width > lo) & (width <= hi)).any()
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default=DATASET)
    parser.add_argument("--labels", type=int, default=60)
    parser.add_argument("--optimizers", default="exact_sgd,exact_row_wise_adagrad,exact_adagrad")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pin", action="store_true", help="each worker on a core of its own (as labels)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    optimizers = [kernel_optimizer(o, "cpu", "--optimizers").name for o in args.optimizers.split(",")]
    records = read_records(Path(args.dataset) / "compute.jsonl")[: args.labels]
    rows = measure(records, optimizers, args.repeats, args.workers, args.pin)
    summary = ratios(rows, optimizers, records)
    print(f"against {optimizers[0]}, {len(records)} shards of {args.dataset}:")
    for name, parts in summary.items():
        words = ", ".join(
            f"{part[:-3]} x{v['median']:.3f} (p10 {v['p10']:.2f}, p90 {v['p90']:.2f})"
            for part, v in parts.items()
            if part in PARTS
        )
        widths = ", ".join(f"width {k}: x{v:.3f}" for k, v in parts["total_by_width"].items())
        print(f"  {name}: {words}; total by width: {widths}")
    result = {"hardware": hardware(), "args": vars(args), "summary": summary, "rows": rows}
    write_json(result, Path(args.out))
    return result


if __name__ == "__main__":
    main()
