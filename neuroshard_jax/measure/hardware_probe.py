"""Is this machine the kind of hardware a dataset was measured on? Re-measure some of its records here and compare.

    python -m neuroshard_jax.probe dataset=DATASET_DIR [samples=24 workers=2 seed=0 out=FILE record=true]

Cost labels belong to one kind of hardware, and a CPU's name does not tell kinds apart: this project's machines
all print "AMD EPYC", and a Zen 4 one measured the AMD pool shards (``epyc-b4096``) at 0.57x their labels.
This draws ``samples`` quiet records of the dataset (``ok``, ``cpu_share`` >= 0.9 where recorded; seeded), measures
them here with the dataset's own protocol (its manifest's pool, batch size, optimizer, precision, warm-ups,
iterations and pinning), and reports the ratio here / there of each record's fwd+bwd time: median, p10, p90.
A median within ``SAME`` of 1 says this machine measures like the dataset's (the repeat noise of one label is
2-15%); anything else says its labels would not mix with this machine's. Run it with nothing else running.
Writes the figures, both machines' hardware records and the verdict to ``out``
(default ``outputs/probe/<dataset name>--<this CPU's id>.json``). ``record=true`` also appends the verdict to the
dataset's manifest (``probes``): where it says "same", training, the loop and resumed collections then take the
dataset as of this machine's kind too (``datasets.manifest_kinds``), with the measured ratio kept as evidence.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path

import numpy as np

from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import bounded, check_bounds, typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import read_json, write_json
from neuroshard_jax.core.hardware import hardware, hardware_kind
from neuroshard_jax.core.paths import resolve_dataset
from neuroshard_jax.kernels.executors import ExecutorConfig, map_requests
from neuroshard_jax.kernels.messages import ComputeAnswer
from neuroshard_jax.measure.drift import references

SAME = 0.12  # |log ratio| of the median within this: the same kind (noise between runs 2-15% per label)


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    """conf/probe.yaml."""

    dataset: str | None = None  # a compute dataset's directory (compute.jsonl + manifest-compute.json)
    samples: int = bounded(at_least=1, default=24)  # quiet records of the dataset re-measured here
    workers: int = bounded(at_least=1, default=2)  # local kernel workers measuring them
    seed: int = 0  # which records are drawn
    out: str | None = None  # the result's JSON (null: outputs/probe/<dataset name>--<this CPU's id>.json)
    record: bool = False  # also append the verdict to the dataset's manifest (probes)

    def __post_init__(self):
        check_bounds(self)


def app_config(cfg) -> ProbeConfig:
    return typed(ProbeConfig, resolved(cfg))


def record_verdict(manifest_path: Path, result: dict) -> None:
    """Append a probe's verdict to a dataset's manifest (``probes``: one entry per kind probed, the newest kept)."""
    manifest = read_json(manifest_path, "dataset", "a manifest written by neuroshard_jax.collect")
    kind = result["here"]["kind"]
    entry = {"kind": kind, "same_kind": result["same_kind"], "cpu_id": result["here"].get("cpu_id")}
    entry.update({k: result[k] for k in ("ratio_here_over_there", "quiet", "how", "when")})
    manifest["probes"] = [p for p in manifest.get("probes", ()) if p.get("kind") != kind] + [entry]
    write_json(manifest, manifest_path)


def probe(config: ProbeConfig) -> tuple[dict, Path]:
    """Re-measure ``config.samples`` quiet records of the dataset here: the result (ratios here / there, both
    machines' kinds, the verdict) and where it was written."""
    if not config.dataset:
        raise UserError("dataset: missing, expected dataset=PATH of a compute dataset (compute.jsonl + manifest)")
    dataset = resolve_dataset(config.dataset)
    if not (dataset / "manifest-compute.json").exists():
        raise UserError(f"dataset: {config.dataset!r} has no manifest-compute.json, expected a compute dataset")
    refs = references(dataset, config.samples, config.seed)
    requests, manifest = list(refs.requests), refs.manifest
    settings = manifest["settings"]
    answers: dict[str, ComputeAnswer] = {}
    map_requests(
        requests,
        lambda request, answer: answers.__setitem__(request.id, answer),
        ExecutorConfig(workers=config.workers),
        settings.get("device", "cpu"),
        600,
        pin=bool(settings.get("pin", False)),
    )
    quiet = refs.ratios(answers)
    if not quiet:
        raise UserError("dataset: no quiet measurement here (every answer failed or ran beside other work)")
    ratios = np.array(sorted(quiet.values()))
    median = float(np.median(ratios))
    here, there = hardware(), manifest.get("hardware")
    device = settings.get("device", "cpu")
    same = abs(np.log(median)) <= SAME
    result = {
        "dataset": config.dataset,
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
        "how": f"python -m neuroshard_jax.probe dataset={config.dataset} samples={config.samples} "
        f"workers={config.workers} seed={config.seed}",
        "when": datetime.date.today().isoformat(),
    }
    here_slug = re.sub(r"[^a-z0-9]+", "-", here.get("cpu_id", "unknown").lower()).strip("-")
    out = Path(config.out) if config.out else Path("outputs/probe") / f"{dataset.name}--{here_slug}.json"
    write_json(result, out)
    if config.record:
        record_verdict(dataset / "manifest-compute.json", result)
    return result, out
