"""What a budget of labels buys on a new machine: held-out MAPE against the number of labels adapted on.

    python -m tools.bench_adapt --dataset neuroshard_jax/data/profiles/epyc26-specs [--sizes 50,100,200,400,800,1600]
        [--heldout 400] [--init xeon-union] [--out outputs/bench/adapt]

The dataset's last ``--heldout`` samples (by id, quiet ones: ``cpu_share`` >= MIN_CPU_SHARE) are held out; for each
size N the first N samples make a dataset of their own, on which the shipped model ``--init`` is fine-tuned (60
epochs at 1e-3, what the loop and ``adapt`` do), fine-tuned after moving onto the roofline fitted to the N samples
(``reanchor=true``, ``adapt``'s default), and a model is trained from scratch (the train command's defaults). Every
model, ``--init`` as shipped (zero labels) and ``--init`` scaled by one factor (the median measured / predicted over
the N samples, what ``calibrate=measured`` does) are scored on the held-out samples: MAPE and Kendall tau.
Training runs the real command (``python -m neuroshard_jax.train``) in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from neuroshard_jax.core.constants import MIN_CPU_SHARE
from neuroshard_jax.core.files import read_records, write_json
from neuroshard_jax.core.hardware import hardware
from neuroshard_jax.core.paths import resolve_dataset
from neuroshard_jax.costs.choice import checkpoint_path
from neuroshard_jax.learn.fine_tune import heldout_scores, median_factor, subset


def train(datasets: Path, out: Path, init: str | None, reanchor: bool = False) -> float:
    args = [sys.executable, "-m", "neuroshard_jax.train", f"datasets=[{datasets}]", f"out={out}", f"name={out.name}"]
    args += [f"init={init}", "train.epochs=60", "train.learning_rate=0.001"] if init else []
    args += ["reanchor=true"] if reanchor else []
    start = time.perf_counter()
    done = subprocess.run([*args, "train.progress=false"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: training failed: {done.stderr.strip().splitlines()[-1:]}")
    return round(time.perf_counter() - start, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--sizes", default="50,100,200,400,800,1600")
    parser.add_argument("--heldout", type=int, default=400)
    parser.add_argument("--init", default="xeon-union")
    parser.add_argument("--out", default="outputs/bench/adapt")
    args = parser.parse_args()
    source = resolve_dataset(args.dataset)
    work = Path(args.out) / source.name
    records = sorted(read_records(source / "compute.jsonl"), key=lambda r: r["id"])
    held = {r["id"] for r in records[-args.heldout :] if r.get("ok") and r.get("cpu_share", 1.0) >= MIN_CPU_SHARE}
    heldout = subset(source, lambda r: r["id"] in held, work / "heldout")
    init = checkpoint_path(args.init)
    rows = [{"labels": 0, "shipped": heldout_scores(init, heldout).to_json()}]
    print(json.dumps(rows[-1]), flush=True)
    for n in (int(s) for s in args.sizes.split(",")):
        ids = {r["id"] for r in records[: len(records) - args.heldout][:n]}
        labelled = subset(source, lambda r, ids=ids: r["id"] in ids, work / f"n{n}")
        row = {"labels": len(ids)}
        row["calibrated"] = heldout_scores(init, heldout, median_factor(init, labelled)).to_json()
        for how, base, reanchor in (
            ("finetuned", args.init, False),
            ("reanchored", args.init, True),
            ("scratch", None, False),
        ):
            ckpt = work / f"{how}-n{n}"
            seconds = train(labelled, ckpt, base, reanchor)
            row[how] = {**heldout_scores(str(ckpt), heldout).to_json(), "train_s": seconds}
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "dataset": str(args.dataset),
        "init": args.init,
        "machine": hardware(),
        "rows": rows,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    write_json(result, work / "adapt.json")
    print(f"written to {work / 'adapt.json'}")


if __name__ == "__main__":
    main()
