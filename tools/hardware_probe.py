"""Is this machine the kind of hardware a dataset was measured on? Re-measure some of its records here and compare.

    python -m tools.hardware_probe DATASET_DIR [--samples 24] [--workers 2] [--seed 0] [--out FILE] [--record]

Cost labels belong to one kind of hardware, and a CPU's name does not tell kinds apart: this project's machines
all print "AMD EPYC", and a Zen 4 one measured the AMD pool shards (``epyc-b4096``) at 0.57x their labels.
This draws ``--samples`` quiet records of the dataset (``ok``, ``cpu_share`` >= 0.9 where recorded; seeded), measures
them here with the dataset's own protocol (its manifest's pool, batch size, optimizer, precision, warm-ups,
iterations and pinning), and reports the ratio here / there of each record's fwd+bwd time: median, p10, p90.
A median within ``SAME`` of 1 says this machine measures like the dataset's (the repeat noise of one label is
2-15%); anything else says its labels would not mix with this machine's. Run it with nothing else running.
Writes the figures, both machines' hardware records and the verdict to ``--out``
(default ``outputs/bench/hardware/<dataset name>--<this CPU's id>.json``). ``--record`` also appends the verdict to the
dataset's manifest (``probes``): where it says "same", training, the loop and resumed collections then take the
dataset as of this machine's kind too (``datasets.manifest_kinds``), with the measured ratio kept as evidence.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import hardware, hardware_kind, read_json, resolve_dataset, write_json
from neuroshard_jax.kernels.executors import ExecutorConfig, map_requests
from neuroshard_jax.measure.drift import references

SAME = 0.12  # |log ratio| of the median within this: the same kind (noise between sessions 2-15% per label)


def record_verdict(manifest_path: Path, result: dict) -> None:
    """Append a probe's verdict to a dataset's manifest (``probes``: one entry per kind probed, the newest kept)."""
    manifest = read_json(manifest_path, "dataset", "a manifest written by neuroshard_jax.collect")
    kind = result["here"]["kind"]
    entry = {"kind": kind, "same_kind": result["same_kind"], "cpu_id": result["here"].get("cpu_id")}
    entry.update({k: result[k] for k in ("ratio_here_over_there", "quiet", "how", "when")})
    manifest["probes"] = [p for p in manifest.get("probes", ()) if p.get("kind") != kind] + [entry]
    write_json(manifest, manifest_path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="a dataset directory (compute.jsonl + manifest-compute.json)")
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--record", action="store_true", help="append the verdict to the dataset's manifest")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.workers < 1:
        raise SystemExit(f"error: --samples {args.samples} / --workers {args.workers}: expected integers >= 1")
    dataset = resolve_dataset(args.dataset)
    if not (dataset / "manifest-compute.json").exists():
        raise SystemExit(f"error: dataset: {args.dataset!r} has no manifest-compute.json, expected a compute dataset")
    refs = references(dataset, args.samples, args.seed)
    requests, manifest = list(refs.requests), refs.manifest
    settings = manifest["settings"]
    answers: dict[str, dict] = {}
    map_requests(
        requests,
        lambda request, answer: answers.__setitem__(request["id"], answer),
        ExecutorConfig(workers=args.workers),
        settings.get("device", "cpu"),
        600,
        pin=bool(settings.get("pin", False)),
    )
    quiet = refs.ratios(answers)
    if not quiet:
        raise SystemExit("error: no quiet measurement here (every answer failed or ran beside other work)")
    ratios = np.array(sorted(quiet.values()))
    median = float(np.median(ratios))
    here, there = hardware(), manifest.get("hardware")
    device = settings.get("device", "cpu")
    same = abs(np.log(median)) <= SAME
    result = {
        "dataset": args.dataset,
        "samples": len(requests),
        "quiet": len(ratios),
        "ratio_here_over_there": {
            "median": round(median, 3),
            "p10": round(float(np.quantile(ratios, 0.1)), 3),
            "p90": round(float(np.quantile(ratios, 0.9)), 3),
        },
        "same_kind": bool(same),
        "here": {"kind": hardware_kind(here, device), **here},
        "there": {"kind": hardware_kind(there, device), **(there or {})},
        "how": f"python -m tools.hardware_probe {args.dataset} --samples {args.samples} --workers {args.workers} "
        f"--seed {args.seed}",
        "when": datetime.date.today().isoformat(),
    }
    here_slug = re.sub(r"[^a-z0-9]+", "-", here.get("cpu_id", "unknown").lower()).strip("-")
    out = Path(args.out) if args.out else Path("outputs/bench/hardware") / f"{dataset.name}--{here_slug}.json"
    write_json(result, out)
    if args.record:
        record_verdict(dataset / "manifest-compute.json", result)
    verdict = "measures like" if same else "does NOT measure like"
    stats = result["ratio_here_over_there"]
    print(
        f"this machine ({result['here']['kind']}) {verdict} {args.dataset} ({result['there']['kind']}): "
        f"here/there median {stats['median']} (p10 {stats['p10']}, p90 {stats['p90']}) over {len(ratios)} records; "
        f"{out}"
    )


if __name__ == "__main__":
    try:
        main()
    except UserError as err:
        sys.exit(f"error: {err}")
    except KeyboardInterrupt:
        sys.exit(130)
