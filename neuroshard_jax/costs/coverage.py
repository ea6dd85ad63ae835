"""What a cost model's labels cover, and where a task lies past them: the device counts its comm nets were trained
on (``comm_worlds``), and a one-line warning for a plan on far more devices (``far_devices_warning``)."""

from __future__ import annotations

import functools
from pathlib import Path

from neuroshard_jax.core.constants import SHIPPED_MLP_CHECKPOINT, SHIPPED_MODEL_NAME
from neuroshard_jax.core.files import read_json
from neuroshard_jax.core.paths import package_path, resolve_dataset
from neuroshard_jax.costs.analytic import AnalyticConfig
from neuroshard_jax.costs.registry import checkpoint_path
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
        label = str(options.get("checkpoint") or (SHIPPED_MODEL_NAME if name == "neural" else name))
        trained, path = f"cost model {label} was trained on", Path(checkpoint_path(label))
        if not (path / "meta.json").is_file():
            return None
    worlds, dataset = comm_worlds(str(path.resolve()))
    if num_devices <= FAR_PAST_TRAINED * max(worlds):
        return None
    source = f"comm dataset {dataset}" if dataset else "not recorded: the comm sampler's default assumed"
    return (
        f"task.num_devices {num_devices} is far past the device counts {trained} "
        f"(all-to-alls of {', '.join(map(str, worlds))} devices, {source}): its comm costs, and so the plan's, are "
        "extrapolated, not learned"
    )
