r"""One batch over and over, or a training step's batches one after another: the same kernels timed both ways.

    python -m tools.batches_effect --dataset neuroshard_jax/data/profiles/epyc26-specs [--records 200] \
        [--batches 16] [--rounds 2] [--out outputs/bench/batches-effect.json]
    python -m tools.batches_effect --dataset neuroshard_jax/data/profiles/epyc26-specs \
        --against neuroshard_jax/data/profiles/epyc-f26m2-fresh-specs [--out ...]

Every label before commit 28c6a8b (2026-11-30) timed a kernel on one batch, the same ids in the same bags at every
iteration. A training step reads a new batch each time: other bags in another order, other cold rows. This takes
``--records`` records of a compute dataset (evenly spread over it), and times each with its dataset's protocol twice
in one worker pass, once on one batch and once on ``--batches`` batches in turn (``streams.next_batches``), the two
in alternating order, ``--rounds`` passes; one pinned worker, the other core idle. It prints the ratio (batches /
one batch) over the records whose every reading was quiet, whole and by the kernel's shape: its tables' median
pooling factor, how many tables it fuses, and whether it holds column slices of one table (their ids are one
stream). The result is named by its date, commit and machine (``core.manifests.result_stamp``).

``--against``: no measuring; the labels of a dataset collected on several batches with the same samples (the same
sampler, seed and settings but ``batches``) read against the one-batch dataset's, record by record, by the same
slices: the two taken apart in time, so the machine's drift between them is in the ratio too."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import read_records, write_json
from neuroshard_jax.core.manifests import load_manifest, result_stamp
from neuroshard_jax.kernels.executors import ExecutorConfig, map_requests
from neuroshard_jax.kernels.processes import BATCHES, quiet
from neuroshard_jax.measure.drift import record_request


def shape(record: dict) -> dict[str, str]:
    """The slices a record's kernel falls in: ``pooling`` (its tables' median pooling factor), ``tables`` (how many
    it fuses), ``slices`` (column slices of one table among them, or not)."""
    tables = [t for t in record["tables"] if isinstance(t, dict)]
    pooling = float(np.median([t["pooling_factor"] for t in tables])) if tables else float("nan")
    seeds = [(t.get("seed"), t.get("row_offset")) for t in tables]
    count = len(record["tables"])
    return {
        "pooling": "<= 1" if pooling <= 1 else "1-10" if pooling <= 10 else "> 10",
        "tables": "1" if count == 1 else "2-8" if count <= 8 else "> 8",
        "slices": "column slices of a table" if len(set(seeds)) < len(seeds) else "distinct tables",
    }


def summary(ratios: np.ndarray) -> dict:
    return {
        "records": int(len(ratios)),
        "geomean": round(float(np.exp(np.mean(np.log(ratios)))), 4),
        "median": round(float(np.median(ratios)), 4),
        "p10": round(float(np.quantile(ratios, 0.1)), 4),
        "p90": round(float(np.quantile(ratios, 0.9)), 4),
    }


def measure(dataset: Path, records: int, batches: int, rounds: int) -> dict:
    settings = load_manifest(dataset, "compute")["settings"]
    if int(settings.get("batches", 1)) != 1:
        raise UserError(f"--dataset: {str(dataset)!r} was timed on {settings['batches']} batches, expected one of one")
    rows = [r for r in read_records(dataset / "compute.jsonl") if r.get("ok") and quiet(r)]
    if not rows:
        raise UserError(f"--dataset: {str(dataset)!r} holds no quiet label, expected a compute dataset")
    chosen = [rows[int(i)] for i in np.unique(np.linspace(0, len(rows) - 1, min(records, len(rows))).round())]
    times = {(j, k): [] for j in range(len(chosen)) for k in ("one", "many")}
    for round_ in range(rounds):
        requests = []
        for j, record in enumerate(chosen):
            one = record_request(record, settings, f"{j}/one")
            pair = [one, dataclasses.replace(one, id=f"{j}/many", batches=batches)]
            requests += pair if (j + round_) % 2 == 0 else pair[::-1]
        answers: dict = {}
        keep = answers.__setitem__
        device = settings.get("device", "cpu")
        map_requests(requests, lambda q, a: keep(q.id, a), ExecutorConfig(workers=1), device, 600, pin=device == "cpu")  # noqa: B023
        for key, answer in answers.items():
            j, k = key.split("/")
            times[(int(j), k)].append(answer.total_ms if answer.ok and answer.quiet else np.nan)
        print(f"round {round_ + 1} of {rounds}: {len(answers)} readings", flush=True)
    one = np.array([np.median(times[(j, "one")]) for j in range(len(chosen))])
    many = np.array([np.median(times[(j, "many")]) for j in range(len(chosen))])
    good = np.isfinite(one) & np.isfinite(many)
    if not good.any():
        raise UserError("no record read quiet both ways (something else ran on the cores); expected a quiet machine")
    ratio = many / one
    shapes = [shape(r) for r in chosen]
    out = slices(ratio, shapes, good)
    return {
        **result_stamp(),
        "dataset": dataset.name,
        "batches": batches,
        "rounds": rounds,
        "slices": out,
        "readings": [
            {"record": r["id"], "one_ms": round(float(a), 4), "batches_ms": round(float(b), 4), **s}
            for r, a, b, s, g in zip(chosen, one, many, shapes, good)
            if g
        ],
    }


def against(dataset: Path, other: Path) -> dict:
    """The quiet labels of ``other`` (several batches) over those of ``dataset`` (one), paired by sample."""
    settings = [load_manifest(d, "compute")["settings"] for d in (dataset, other)]
    same = [{k: v for k, v in s.items() if k not in ("batches", "malloc")} for s in settings]
    if same[0] != same[1]:
        raise UserError(f"--against: {str(other)!r} was collected with other settings than {str(dataset)!r}")
    if int(settings[0].get("batches", 1)) != 1 or int(settings[1].get("batches", 1)) == 1:
        raise UserError("--against: expected --dataset of one batch and --against of several")
    ones = {r["id"]: r for r in read_records(dataset / "compute.jsonl") if r.get("ok") and quiet(r)}
    pairs = [
        (ones[r["id"]], r)
        for r in read_records(other / "compute.jsonl")
        if r.get("ok") and quiet(r) and r["id"] in ones
    ]
    if not pairs:
        raise UserError(f"--against: no sample read quiet in both {str(dataset)!r} and {str(other)!r}")
    ratio = np.array([b["total_ms"] / a["total_ms"] for a, b in pairs])
    shapes = [shape(a) for a, _ in pairs]
    return {
        **result_stamp(),
        "dataset": dataset.name,
        "against": other.name,
        "batches": int(settings[1]["batches"]),
        "slices": slices(ratio, shapes, np.ones(len(ratio), bool)),
    }


def slices(ratio: np.ndarray, shapes: list[dict], good: np.ndarray) -> dict:
    """``summary`` of the good ratios, whole and by each slice of ``shape``."""
    out = {"all": summary(ratio[good])}
    for part in ("pooling", "tables", "slices"):
        for value in sorted({s[part] for s in shapes}):
            keep = good & np.array([s[part] == value for s in shapes])
            if keep.any():
                out[f"{part} {value}"] = summary(ratio[keep])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.batches_effect", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, help="a compute dataset timed on one batch")
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--batches", type=int, default=BATCHES)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--against", help="a dataset of the same samples on several batches: read, not measured")
    parser.add_argument("--out", default="outputs/bench/batches-effect.json")
    args = parser.parse_args(argv)
    try:
        for name in ("records", "batches", "rounds"):
            if getattr(args, name) < 1:
                raise UserError(f"--{name}: got {getattr(args, name)}, expected >= 1")
        if args.against:
            result = against(Path(args.dataset), Path(args.against))
        else:
            result = measure(Path(args.dataset), args.records, args.batches, args.rounds)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_json(result, Path(args.out))
    print(f"{result['date']} {result['commit']} {result['hardware']}: {result['batches']} batches / one batch")
    for name, cell in result["slices"].items():
        print(
            f"  {name:34s} {cell['records']:4d} records  geomean {cell['geomean']:.3f}  median {cell['median']:.3f}  "
            f"p10 {cell['p10']:.3f}  p90 {cell['p90']:.3f}"
        )
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
