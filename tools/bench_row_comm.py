"""What a row-split table's comm costs, measured, against the all-to-all width the cost model prices it as.

    python -m tools.bench_row_comm [--worlds 2,4,8] [--widths 32,128,512] [--batch 4096] [--repeats 3]

The cost model has no labels for TorchRec's row-wise output dist (a reduce-scatter of partial pooled sums forward,
an all-gather backward): it counts a row block's width in its device's all-to-all width (``dim_sums``). This
measures both on real gloo ranks (the comm benchmark of ``worker.run_rank``): every rank with a base all-to-all
width of 64 plus one row-split table of width W over all ranks (a) as the reduce-scatter it is and (b) as W more
all-to-all width, and reports the ratio of their times, per world size and width (median of ``--repeats``
interleaved runs, the slowest rank). Run it with nothing else running. Writes outputs/bench/row_comm/row_comm.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.kernels.executors import ExecutorConfig, open_executor
from neuroshard_jax.kernels.messages import CommRequest

OUT = Path(__file__).resolve().parents[1] / "outputs" / "bench" / "row_comm"
BASE_WIDTH = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4,8")
    parser.add_argument("--widths", default="32,128,512")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with open_executor(ExecutorConfig(), "cpu", 600) as pool:
        for world in (int(w) for w in args.worlds.split(",")):
            requests = []
            for width in (int(w) for w in args.widths.split(",")):
                rs = {"dim_sums": [BASE_WIDTH] * world, "row_groups": [[width, list(range(world))]]}
                a2a = {"dim_sums": [BASE_WIDTH + width] * world}
                for name, layout in (("rs", rs), ("a2a", a2a)):
                    requests.append(CommRequest.of(layout, f"{name}-{width}", args.batch, [0.0] * world, 3, 10))
            runs: dict[str, list[tuple[float, float]]] = {}
            for _ in range(args.repeats):  # interleaved: every request once per repeat
                for key, ranks in pool.comm(requests, world, 600).items():
                    runs.setdefault(key, []).append((max(r.fwd_ms for r in ranks), max(r.bwd_ms for r in ranks)))
            for width in (int(w) for w in args.widths.split(",")):
                fwd = {k: statistics.median(f for f, _ in runs[f"{k}-{width}"]) for k in ("rs", "a2a")}
                bwd = {k: statistics.median(b for _, b in runs[f"{k}-{width}"]) for k in ("rs", "a2a")}
                row = {
                    "world": world,
                    "width": width,
                    "rs_fwd_ms": round(fwd["rs"], 3),
                    "a2a_fwd_ms": round(fwd["a2a"], 3),
                    "rs_bwd_ms": round(bwd["rs"], 3),
                    "a2a_bwd_ms": round(bwd["a2a"], 3),
                    "fwd_ratio": round(fwd["rs"] / fwd["a2a"], 3),
                    "bwd_ratio": round(bwd["rs"] / bwd["a2a"], 3),
                }
                print(row, flush=True)
                rows.append(row)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    write_json(
        {"machine": hardware(), "batch_size": args.batch, "base_width": BASE_WIDTH, "when": when, "rows": rows},
        OUT / "row_comm.json",
    )


if __name__ == "__main__":
    main()
