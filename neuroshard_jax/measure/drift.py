"""The machine's speed while it measures: quiet records of a dataset re-measured among new measurements.

A machine of one kind does not keep one speed: on this project's 2-core Xeon the same devices measured 6.5%
slower in one 9-minute window than 18 minutes later (docs/results/plan-accuracy.md), more than the noise of a
median of 5 repeats. ``References`` are records of a dataset of the same kind whose times are known; measured in
the same batch as new devices, the median of (now / recorded) over them is the machine's speed relative to that
dataset's session. ``python -m neuroshard_jax.probe`` uses them to tell kinds of hardware apart; plan labels
(``plans.references``) record the speed of each batch with its labels (``speed``), and training divides a label by
its speed, so labels of a slow hour and of a fast one join on one scale; ``tools/bench_plan_accuracy.py`` reads a
model against the machine's state of each task's moment.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, read_records
from neuroshard_jax.core.manifests import load_manifest
from neuroshard_jax.core.paths import resolve_dataset
from neuroshard_jax.kernels.messages import ComputeAnswer, ComputeRequest
from neuroshard_jax.kernels.processes import Timing, compute_request, quiet
from neuroshard_jax.workloads.pool import PoolSpec


@dataclasses.dataclass(frozen=True)
class References:
    """Worker requests re-measuring records of ``dataset`` with its own protocol, and each one's recorded ms."""

    dataset: str
    requests: tuple[ComputeRequest, ...]
    recorded: dict[str, float]  # request id -> the record's fwd+bwd ms in its dataset
    manifest: dict

    def ratios(self, answers: dict[str, ComputeAnswer]) -> dict[str, float]:
        """Request id -> measured now / recorded, of the quiet answers (``ok``, the worker's CPU share held)."""
        return {k: a.total_ms / self.recorded[k] for k, a in answers.items() if k in self.recorded and a.ok and a.quiet}

    def speed(self, answers: dict[str, ComputeAnswer]) -> float | None:
        """The machine's speed now relative to the dataset's session (the median ratio); None if none was quiet."""
        ratios = self.ratios(answers)
        return float(statistics.median(ratios.values())) if ratios else None


def record_request(record: dict, settings: JSONDoc, request_id: str) -> ComputeRequest:
    """A worker request re-measuring a collected ``record`` with its dataset's protocol (``settings``: its manifest's
    pool, batch size, device, optimizer, precision, warm-ups, iterations) and its own kernel kind."""
    specs = bool(record["tables"]) and isinstance(record["tables"][0], dict)
    pool = PoolSpec(**settings["pool"]) if settings.get("pool") and not specs else None
    return compute_request(
        request_id,
        record["tables"],
        pool,
        int(record.get("batch_size", settings["batch_size"])),
        settings.get("device", "cpu"),
        settings.get("optimizer", "exact_sgd"),
        settings.get("precision", "fp32"),
        int(settings.get("warmup", 5)),
        int(settings.get("iters", 10)),
        Timing.from_json(settings),
        record.get("pooling", "sum"),  # the record's kernel kind: re-timed as the kernel it timed
        bool(record.get("weighted", False)),
        int(settings.get("batches", 1)),  # the dataset's: absent, one batch every time
    )


def references(dataset: str | Path, samples: int, seed: int = 0) -> References:
    """``samples`` quiet records of ``dataset`` (``ok``, ``cpu_share`` >= MIN_CPU_SHARE where recorded; seeded) as
    requests with the dataset's protocol (its manifest's pool, batch size, optimizer, precision, warm-ups,
    iterations), ids ``probe-<record index>``."""
    path = resolve_dataset(dataset)
    manifest = load_manifest(path, "compute")
    settings = manifest["settings"]
    records = [r for r in read_records(path / "compute.jsonl") if r.get("total_ms") and quiet(r)]
    if not records:
        raise UserError(f"dataset: {str(dataset)!r} has no measured records, expected a collected dataset")
    chosen = sorted(int(i) for i in np.random.default_rng(seed).permutation(len(records))[:samples])
    requests = tuple(record_request(records[i], settings, f"probe-{i}") for i in chosen)
    recorded = {f"probe-{i}": float(records[i]["total_ms"]) for i in chosen}
    return References(str(dataset), requests, recorded, manifest)
