"""What a cost model's labels cover, and where a task lies past them: the device counts its comm nets were trained
on (``comm_worlds``) and a one-line warning for a plan on far more devices (``far_devices_warning``); the range its
compute labels span (``LabelCoverage``, meta.json's ``coverage``) and a one-line warning for tables past it, a device
fusing more tables than any label did, or ensemble members that disagree (``out_of_depth_warning``)."""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path

from neuroshard_jax.core.config import bounded, check_bounds, typed
from neuroshard_jax.core.constants import SHIPPED_MLP_CHECKPOINT, SHIPPED_MODEL_NAME
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, read_json, read_records
from neuroshard_jax.core.manifests import load_manifest
from neuroshard_jax.core.paths import package_path, resolve_dataset
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.table import KERNEL_KINDS, kernel_kind
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.analytic import AnalyticConfig
from neuroshard_jax.costs.choice import adapt_here, checkpoint_path
from neuroshard_jax.kernels.processes import PoolTableRef, record_tables
from neuroshard_jax.workloads.pool import PoolSpec, load_pool
from neuroshard_jax.workloads.samplers import CommSamplerConfig

FAR_PAST_TRAINED = 4  # a plan on more devices than this x the largest all-to-all a model was trained on: "far past"


@functools.lru_cache(maxsize=16)
def comm_worlds(checkpoint: str) -> tuple[tuple[int, ...], str | None]:
    """The all-to-all sizes (device counts) a checkpoint's comm nets were trained on, and the comm dataset that
    says so (None: not found, the comm sampler's default sizes).

    A meta.json records its comm dataset by creation time and record count only (``datasets.comm``), so the
    dataset is the one whose manifest-comm.json has that creation time, among the folders the meta names and the
    shipped profiles; its ``settings.comm.world_sizes`` are the sizes."""
    meta = read_json(Path(checkpoint) / "meta.json", "cost_model.checkpoint", "a checkpoint's meta.json")
    datasets = meta.get("datasets") or {}
    created = (datasets.get("comm") or {}).get("created")
    compute = datasets.get("compute") if isinstance(datasets.get("compute"), list) else []
    named = [meta.get("dataset_dir"), *(d.get("dir") for d in compute if isinstance(d, dict))]
    profiles = package_path("data/profiles")
    folders = [resolve_dataset(d) for d in named if d] + (sorted(profiles.iterdir()) if profiles.is_dir() else [])
    for manifest in (f / "manifest-comm.json" for f in folders if created):
        if manifest.is_file():
            obj = read_json(manifest, "dataset", "the manifest of a comm dataset")
            worlds = ((obj.get("settings") or {}).get("comm") or {}).get("world_sizes")
            if obj.get("created") == created and worlds:
                return tuple(sorted(int(w) for w in worlds)), manifest.parent.name
    return tuple(CommSamplerConfig().world_sizes), None


def far_devices_warning(num_devices: int, name: str, options: dict | None) -> str | None:
    """One line if ``num_devices`` is far past (over ``FAR_PAST_TRAINED`` x) the largest all-to-all the comm of
    cost model ``name`` with ``options`` (a ``ModelChoice``'s or ``make_cost_model``'s) was trained on: its comm
    costs there are an extrapolation. None otherwise, and where no data bounds them (an analytic model with the
    user's own comm bandwidth or latency, a checkpoint that is not there)."""
    options = options or {}
    if name == "analytic":  # its comm defaults were fitted to the shipped CPU dataset, the format-3 model's
        fitted = AnalyticConfig()
        if any(options.get(k, getattr(fitted, k)) != getattr(fitted, k) for k in ("comm_bw_gbps", "comm_latency_ms")):
            return None
        trained, path = "the analytic model's comm defaults were fitted to", package_path(SHIPPED_MLP_CHECKPOINT)
    else:
        found = trained_checkpoint(name, options)
        if found is None:
            return None
        trained, path = f"cost model {found[0]} was trained on", found[1]
    worlds, dataset = comm_worlds(str(path.resolve()))
    if num_devices <= FAR_PAST_TRAINED * max(worlds):
        return None
    source = f"comm dataset {dataset}" if dataset else "not recorded: the comm sampler's default assumed"
    return (
        f"task.num_devices {num_devices} is far past the device counts {trained} "
        f"(all-to-alls of {', '.join(map(str, worlds))} devices, {source}): its comm costs, and so the plan's, are "
        "extrapolated, not learned"
    )


def trained_checkpoint(name: str, options: dict) -> tuple[str, Path] | None:
    """(the name a user knows it by, its folder) of the checkpoint behind cost model ``name`` with ``options``;
    None for the analytic model and where the checkpoint is not there."""
    if name == "analytic":
        return None
    label = str(options.get("checkpoint") or (SHIPPED_MODEL_NAME if name == "neural" else name))
    path = Path(checkpoint_path(label))
    return (label, path) if (path / "meta.json").is_file() else None


# a device whose members disagree so much that at least half its compute is the roofline's fallback (trust below
# this) is named in the warning; one just past ``trust_lo`` (the validation spread's 99th percentile) is only marked
# in the printed plan ("the model is unsure here")
UNSURE_TRUST = 0.5

RANGES = ("rows", "pooling_factor", "dim", "tables", "batch_size")  # LabelCoverage's (smallest, largest) fields


@dataclasses.dataclass(frozen=True)
class LabelCoverage:
    """The range a cost model's compute labels span, each field a (smallest, largest) pair over every label (one
    fused kernel's fwd+bwd time): per labelled table, the rows the kernel held of it (a row block's own), its pooling
    factor and the width it ran at (a column slice's own); per label, the tables fused in it and its batch size.

    The bounds are the labels' minimum and maximum, not percentiles: the labels come from samplers with hard edges
    (spec rows 1e2..1e7 and pooling 0.3..250, the pool's own tables), so their extremes are those edges, not
    outliers, and the model is fitted up to them; a percentile would call the pool's own largest tables unlabelled.
    That a few labels near an edge teach less than many is what the ensemble's spread says."""

    rows: tuple[int, int]
    pooling_factor: tuple[float, float]
    dim: tuple[int, int]
    tables: tuple[int, int]
    batch_size: tuple[int, int]
    labels: int = bounded(at_least=1)  # how many labels (successful records) span it
    # the kernel kinds its labels ran (``core.table.KERNEL_KINDS``; labels from before kinds: sum-pooled bags alone)
    kernels: tuple[str, ...] = ("sum",)

    def __post_init__(self):
        for field in RANGES:
            pair = getattr(self, field)
            if len(pair) != 2 or pair[0] > pair[1]:
                raise UserError(f"coverage.{field}: got {list(pair)}, expected [smallest, largest]")
        check_bounds(self, "coverage.")

    def joined(self, other: LabelCoverage) -> LabelCoverage:
        """The range of both (a fine-tuned model keeps what its prior learned, as it keeps its batch sizes)."""
        ranges = {
            f: (min(getattr(self, f)[0], getattr(other, f)[0]), max(getattr(self, f)[1], getattr(other, f)[1]))
            for f in RANGES
        }
        kernels = tuple(k for k in KERNEL_KINDS if k in self.kernels or k in other.kernels)
        return LabelCoverage(**ranges, labels=self.labels + other.labels, kernels=kernels)

    def to_json(self) -> JSONDoc:
        kinds = {"kernels": list(self.kernels)} if tuple(self.kernels) != ("sum",) else {}
        return {**{f: list(getattr(self, f)) for f in RANGES}, "labels": self.labels, **kinds}

    @classmethod
    def from_json(cls, obj, where: str = "coverage") -> LabelCoverage:
        """meta.json's ``coverage`` block, checked by its schema (``typed``)."""
        if not isinstance(obj, dict):
            raise UserError(f"{where}: got {obj!r:.60}, expected an object with {', '.join(RANGES)} and labels")
        return typed(cls, obj, where)


def label_coverage(dataset_dirs: Sequence[str | Path]) -> LabelCoverage:
    """The range the compute labels (``compute.jsonl``'s successful records) of ``dataset_dirs`` span; a pool
    dataset's tables are read from its pool (generated once, then cached as every pool is). UserError where a
    folder holds no compute dataset or no successful record."""
    rows, pooling, dims, tables, batches, kernels = [], [], [], [], [], set()
    for folder in map(Path, dataset_dirs):
        settings = load_manifest(folder, "compute")["settings"]
        records = read_records(folder / "compute.jsonl")
        shard_sets = [record_tables(r) for r in records]
        uses_pool = any(isinstance(t, PoolTableRef) for shard in shard_sets for t in shard)
        pool = load_pool(PoolSpec.from_json(settings["pool"]), settings["batch_size"]) if uses_pool else None
        for record, shard in zip(records, shard_sets):
            tables.append(len(shard))
            batches.append(record.get("batch_size", settings["batch_size"]))
            kernels.add(kernel_kind(record.get("pooling", "sum"), bool(record.get("weighted", False))))
            for t in shard:
                pool_table = isinstance(t, PoolTableRef)
                whole = pool.rows[t.table_id] if pool_table else t.rows
                rows.append(whole if t.num_rows is None else t.num_rows)
                pooling.append(pool.pooling_factor[t.table_id] if pool_table else t.pooling_factor)
                dims.append(t.dim)
    if not tables:
        raise UserError(f"dataset: no successful records in {', '.join(str(d) for d in dataset_dirs)}")
    span = lambda values, cast: (cast(min(values)), cast(max(values)))  # noqa: E731
    return LabelCoverage(
        span(rows, int),
        span(pooling, float),
        span(dims, int),
        span(tables, int),
        span(batches, int),
        len(tables),
        tuple(k for k in KERNEL_KINDS if k in kernels),
    )


def coverage_block(dataset_dirs: Sequence[str | Path], init: str | Path | None = None) -> JSONDoc | None:
    """meta.json's ``coverage`` for a model trained on ``dataset_dirs``, fine-tuned from the checkpoint ``init``
    if given (its prior's coverage joined); None where the prior's is not known (then ``checkpoint_coverage``
    computes it when asked)."""
    coverage = label_coverage(dataset_dirs)
    if init is not None:
        before = checkpoint_coverage(str(Path(checkpoint_path(str(init))).resolve()))
        if before is None:
            return None
        coverage = coverage.joined(before)
    return coverage.to_json()


@functools.lru_cache(maxsize=16)
def checkpoint_coverage(checkpoint: str) -> LabelCoverage | None:
    """What the compute labels of the checkpoint in folder ``checkpoint`` cover: its meta.json's ``coverage``, else
    computed (once per process) from the compute datasets the meta names, joined with the coverage of the model it
    was fine-tuned from. None where one of those is not there (a clone without the shipped profiles) or cannot be
    read: nothing is known, so nothing is warned, and planning goes on."""
    meta = read_json(Path(checkpoint) / "meta.json", "cost_model.checkpoint", "a checkpoint's meta.json")
    if meta.get("coverage") is not None:
        return LabelCoverage.from_json(meta["coverage"], f"{checkpoint}/meta.json: coverage")
    compute = (meta.get("datasets") or {}).get("compute")
    named = [d.get("dir") for d in compute if isinstance(d, dict)] if isinstance(compute, list) else []
    folders = [resolve_dataset(d) for d in (named or [meta.get("dataset_dir")]) if d]  # format 3: one dataset_dir
    if not folders or not all((f / "compute.jsonl").is_file() for f in folders):
        return None
    try:
        coverage = label_coverage(folders)
    except UserError:  # a damaged dataset costs the warning, not the plan
        return None
    prior = meta.get("fine_tuned_from")
    if prior is None:
        return coverage
    prior_dir = resolve_dataset(prior)
    before = checkpoint_coverage(str(prior_dir.resolve())) if (prior_dir / "meta.json").is_file() else None
    return None if before is None else coverage.joined(before)


def out_of_depth_warning(
    task: Task,
    plan: Plan | None,
    name: str,
    options: dict | None,
    *,
    trust: Sequence[float] | None = None,
    device: str = "cpu",
) -> str | None:
    """One line where cost model ``name`` with ``options`` (a ``ModelChoice``'s or a ``CostModelSpec``'s) predicts
    ``task`` past what it learned: tables past its labels' range (``checkpoint_coverage``: with ``plan``, the rows
    and width each planned shard holds; without, the tables whole), devices of ``plan`` fusing more tables than any
    label did, or devices where its ensemble's members disagree (``trust``: each device's; below UNSURE_TRUST where
    the spread passes halfway from ``trust_lo`` to ``trust_hi``; None: ``plan.costs.trust``). The line names the
    remedy, or where ``plan`` was calibrated on this task's own tables (``calibrate=measured``), says that the
    calibration is correcting for it; ``device``: the plan's (cpu | cuda), for the ``adapt`` command. None where
    nothing lies past, and for a model whose labels are not known (the analytic model, a checkpoint whose datasets
    are not there)."""
    found = trained_checkpoint(name, options or {})
    coverage = checkpoint_coverage(str(found[1].resolve())) if found else None
    findings = past_labels(task, plan, coverage) if coverage is not None else []
    if trust is None and plan is not None and plan.costs is not None:
        trust = plan.costs.trust
    unsure = sum(t < UNSURE_TRUST for t in trust or ())
    if unsure:
        findings.append(f"its ensemble's members disagree on {unsure} of {task.num_devices} devices")
    if not findings:
        return None
    record = plan.calibration if plan is not None else None
    if record is not None and not record.given:
        remedy = (
            f"calibrate=measured is correcting for it (x{record.factor:.2f}, one factor from this task's own "
            "tables for every device)"
        )
    else:
        remedy = (
            f"calibrate=measured re-times this task's own tables (nsj.plan: calibrate=True), or {adapt_here(device)} "
            "makes a model of this machine"
        )
    label = found[0] if found else name
    return (
        f"cost model {label} is out of its depth here: {'; '.join(findings)}: its costs there are extrapolated; "
        + remedy
    )


def past_labels(task: Task, plan: Plan | None, coverage: LabelCoverage) -> list[str]:
    """What of ``task`` (as ``plan`` places it, if given) lies past ``coverage``: at most two phrases, on the tables
    past it (rows held, pooling factor, width: only above the largest labelled; a table smaller than every label is
    cheap, its error cannot decide the slowest device) and on the devices fusing more tables than any label did."""
    tables = task.tables
    if plan is None:
        held = [(i, t.rows, t.dim) for i, t in enumerate(tables)]
    else:  # a data-parallel table is whole in every device's kernel
        held = [(s.table, s.rows(tables[s.table].rows), s.dim) for s in plan.shards]
        held += [(i, tables[i].rows, tables[i].dim) for i in plan.data_parallel]
    unlabelled = collections.Counter(t.kernel for t in tables if t.kernel not in coverage.kernels)
    largest = {"rows": coverage.rows[1], "pooling": coverage.pooling_factor[1], "dim": coverage.dim[1]}
    over, past = {}, set()
    for i, rows, dim in held:
        for key, value in (("rows", rows), ("pooling", tables[i].pooling_factor), ("dim", dim)):
            if value > largest[key]:
                over[key] = max(over.get(key, value), value)
                past.add(i)
    out = []
    if unlabelled:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(unlabelled.items()))
        known = "sum-pooled bags" if tuple(coverage.kernels) == ("sum",) else ", ".join(coverage.kernels)
        out.append(
            f"{sum(unlabelled.values())} of {task.num_tables} tables run kernels its labels never held ({kinds}; "
            f"it learned {known})"
        )
    if past:
        what = ", ".join(
            f"{key} up to {_number(over[key])} > {_number(limit)} labelled"
            for key, limit in largest.items()
            if key in over
        )
        out.append(f"{len(past)} of {task.num_tables} tables lie past its labels ({what})")
    if plan is not None:
        counts = collections.Counter(s.device for s in plan.shards)
        fused = [counts[d] + len(plan.data_parallel) for d in range(task.num_devices)]
        crowded = [n for n in fused if n > coverage.tables[1]]
        if crowded:
            out.append(
                f"{len(crowded)} of {task.num_devices} devices fuse more tables than any label did "
                f"(up to {max(crowded)} > {coverage.tables[1]})"
            )
    return out


def _number(x: float) -> str:
    """A bound as a user reads it: 5.0e8, 2000, 0.32."""
    return f"{x:.1e}".replace("e+0", "e").replace("e+", "e") if abs(x) >= 1e5 else f"{x:.4g}"
