"""The factor of one precision's kernels over another's on this machine kind, from the same spec samples collected
at both (``neuroshard_jax.costs.precision``): written into the shipped factors, keyed by the labels' hardware kind.

    python -m neuroshard_jax.collect kind=compute source=specs seed=91 num_samples=80 executor.workers=2 \\
        precision=fp32 out_dir=outputs/precision/fp32          # and precision=fp16 out_dir=outputs/precision/fp16
    python -m tools.precision_factor outputs/precision/fp32 outputs/precision/fp16 \\
        --out neuroshard_jax/data/precision/factors.json

Only samples timed quietly at both precisions count (a worker's CPU share of at least MIN_CPU_SHARE)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from neuroshard_jax.core.cli import fail
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import read_json, read_records
from neuroshard_jax.core.hardware import hardware_kind
from neuroshard_jax.costs.precision import KindFactors, PrecisionFactor, fit, kind_json
from neuroshard_jax.kernels.processes import quiet


def labels(folder: Path) -> tuple[dict, dict]:
    """(manifest, {id: total_ms} of its quiet ok labels) of a compute label folder."""
    manifest = read_json(folder / "manifest-compute.json", "label manifest", "python -m neuroshard_jax.collect")
    records = read_records(folder / "compute.jsonl")
    return manifest, {r["id"]: float(r["total_ms"]) for r in records if r.get("ok") and quiet(r)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="labels at the models' precision (fp32)")
    parser.add_argument("other", help="the same samples at another precision")
    parser.add_argument("--out", required=True, help="the factors file to add this kind's factor to")
    args = parser.parse_args(argv)
    try:
        print(add_factor(Path(args.base), Path(args.other), Path(args.out)))
    except UserError as err:
        fail(err)


def add_factor(base_dir: Path, other_dir: Path, out: Path) -> str:
    """Add the factor of ``other_dir``'s labels over ``base_dir``'s to the factors file ``out`` (made if absent),
    under their hardware kind, beside what it held; returns a line saying what it wrote."""
    (base_manifest, base), (other_manifest, other) = labels(base_dir), labels(other_dir)
    settings = [m["settings"] for m in (base_manifest, other_manifest)]
    same = {k: v for k, v in settings[0].items() if k != "precision"} == {
        k: v for k, v in settings[1].items() if k != "precision"
    }
    if not same or base_manifest["hardware"] != other_manifest["hardware"]:
        raise UserError("precision factor: the two folders differ in more than their precision, expected one run twice")
    kind = hardware_kind(base_manifest["hardware"], settings[0]["device"])
    trained, precision = settings[0]["precision"], settings[1]["precision"]
    factor = fit(base, other)
    doc = json.loads(out.read_text()) if out.exists() else {"kinds": {}}
    entry = doc["kinds"].get(kind)
    kept = {} if entry is None or entry["trained"] != trained else entry["factors"]
    factors = {p: PrecisionFactor(**f) for p, f in kept.items()}
    manifest = {
        "created": other_manifest["updated"],
        "git_commit": other_manifest["git_commit"],
        "versions": other_manifest["versions"],
        "hardware": other_manifest["hardware"],
        "how": f"python -m tools.precision_factor over spec labels of seed {settings[0]['seed']} at {trained} and "
        f"{precision} (python -m neuroshard_jax.collect kind=compute source=specs)",
    }
    factors[precision] = factor
    doc["kinds"][kind] = kind_json(KindFactors(kind, trained, factors, manifest))
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return (
        f"{kind}: {precision} over {trained} {factor.factor:.3f}x ({factor.pairs} pairs, p10-p90 {factor.p10:.3f}-"
        f"{factor.p90:.3f}) -> {out}"
    )


if __name__ == "__main__":
    main()
