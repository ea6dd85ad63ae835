r"""One device of a benchmark plan, re-timed in fresh workers over minutes, beside the same tables in a sum-pooled
kernel (the control: the same rows, ids and stream). A kernel whose time moves with the machine's state while its
control holds shows up here; the label protocol (``EvaluateConfig``'s warmup and iters), one worker pinned to the
last core, a fresh worker each round.

    python -m tools.kernel_drift --plans outputs/bench/seq-f26m2/plans.jsonl --task d8-00 --searcher torchrec \
        --device 1 --minutes 10 --every 60 --out outputs/bench/kernel-drift.json

Written for the sequence benchmark's d8-00 (2026-11-30): its table-wise plan's one sequence device read 12.1 ms in
the benchmark's run and 18-35 ms in the hour after, while the plan's pooled devices re-read within 0.99-1.17x.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import now_utc, read_records
from neuroshard_jax.core.hardware import hardware, hardware_kind
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.kernels.processes import ComputeWorker
from neuroshard_jax.measure.evaluator import EvaluateConfig, device_request, plan_kernels


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", required=True, help="a benchmark's plans.jsonl")
    parser.add_argument("--task", required=True)
    parser.add_argument("--searcher", required=True)
    parser.add_argument("--device", type=int, required=True)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--every", type=float, default=60.0, help="seconds from one round's start to the next's")
    parser.add_argument("--repeats", type=int, default=3, help="readings of each kernel a round")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        rows = read_records(Path(args.plans))
    except UserError as err:
        raise SystemExit(f"kernel_drift: --plans: {err}") from None
    found = [r for r in rows if r.get("task") == args.task and r.get("searcher") == args.searcher]
    if not found:
        raise SystemExit(f"kernel_drift: no plan of task {args.task!r} by {args.searcher!r} in {args.plans}")
    plan = Plan.from_json(found[-1]["plan"])
    kernels = plan_kernels(plan)
    if not 0 <= args.device < len(kernels) or not kernels[args.device]:
        raise SystemExit(f"kernel_drift: --device {args.device}: expected a device of the plan that holds tables")
    _, at, tables = kernels[args.device][0]
    pooled = [dataclasses.replace(t, kernel="sum") for t in tables]
    config = EvaluateConfig()
    core = max(os.sched_getaffinity(0))
    rounds = []
    end = time.monotonic() + 60 * args.minutes
    while time.monotonic() < end:
        started = time.monotonic()
        worker = ComputeWorker("cpu", core=core)
        try:
            reading = {"t": now_utc()}
            for name, kernel in (("device", tables), ("pooled", pooled)):
                answers = [
                    worker.request(device_request(f"{len(rounds)}/{name}/{r}", at, kernel, config), timeout_s=300)
                    for r in range(args.repeats)
                ]
                bad = [a.error for a in answers if not a.ok]
                if bad:
                    raise SystemExit(f"kernel_drift: {name} failed: {bad[0]}")
                reading[name] = [[round(a.fwd_ms, 3), round(a.bwd_ms, 3)] for a in answers]
        finally:
            worker.close()
        rounds.append(reading)
        device = statistics.median(sum(x) for x in reading["device"])
        control = statistics.median(sum(x) for x in reading["pooled"])
        print(f"{reading['t']}: device {device:.2f} ms, its tables sum-pooled {control:.2f} ms", flush=True)
        time.sleep(max(0.0, min(args.every - (time.monotonic() - started), end - time.monotonic())))
    out = {
        "machine": hardware_kind(hardware()),
        "plans": args.plans,
        "task": args.task,
        "searcher": args.searcher,
        "device": args.device,
        "protocol": {"warmup": config.warmup, "iters": config.iters, "core": core, "fresh_worker_each_round": True},
        "rounds": rounds,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
