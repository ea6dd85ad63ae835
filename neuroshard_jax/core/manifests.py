"""A dataset's manifest (``manifest-KIND.json`` beside its records): the settings it was collected with, the hardware
it was measured on and the kinds a probe found alike, how its labels were timed, the code's commit."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, now_utc, read_json, write_text
from neuroshard_jax.core.hardware import hardware, hardware_kind

PROTOCOL_KEYS = ("device", "optimizer", "precision", "protocol", "warmup", "iters", "pin", "malloc", "batches")
LATER_PROTOCOL_KEYS = ("malloc", "batches")  # recorded since 2026-11-30: the models of labels before it record none
TIMED_KEYS = ("warmup_ms", "measure_ms", "max_iters")  # the ``timed`` and ``graph`` protocols' own
# what a protocol key absent from a dataset's settings means (the labels taken before it was recorded)
ABSENT = {"pin": False, "precision": "fp32", "protocol": "fixed", "malloc": "os", "batches": 1}


def label_protocol(settings: JSONDoc) -> JSONDoc:
    """How a dataset's labels were timed, from its manifest's settings: the device, the step measured (optimizer,
    precision), the protocol (``fixed``: warm-up and timed iterations, the label their median; ``timed``: warm-up
    and timed iterations by kernel time; ``graph``: ``timed`` over CUDA-graph replays), and whether each worker had
    a core of its own (``pin``; absent: not pinned), and whether the host allocator kept freed memory for reuse
    (``malloc``: ``reuse``; absent: ``os``, glibc's default, where outputs above 32 MB were page-faulted afresh or not
    by what the worker freed before), and how many batches the iterations took in turn (``batches``; absent: 1, the
    same batch every time). Plan labels record no precision: theirs is collect's fp32."""
    found = {k: settings.get(k, ABSENT.get(k)) for k in PROTOCOL_KEYS}
    return {**found, **{k: settings[k] for k in TIMED_KEYS if found["protocol"] != "fixed"}}


def manifest_kinds(manifest: JSONDoc) -> list[str]:
    """The kinds of hardware a dataset's labels hold for: the kind it was measured on, then every kind a
    ``python -m neuroshard_jax.probe record=true`` run found to measure like it (``probes`` in the manifest, each
    with its measured ratio): one CPU name spans several kinds, and one kind may be recorded under two names (a dataset
    from before ``cpu_id`` was recorded)."""
    device = manifest.get("settings", {}).get("device")
    probed = [p["kind"] for p in manifest.get("probes", ()) if p.get("same_kind") and p.get("kind")]
    return list(dict.fromkeys([hardware_kind(manifest.get("hardware"), device), *probed]))


def common_kinds(manifests: list[JSONDoc]) -> list[str]:
    """The kinds of hardware every dataset's labels hold for (``manifest_kinds``), in the first one's order."""
    kinds = manifest_kinds(manifests[0])
    return [k for k in kinds if all(k in manifest_kinds(m) for m in manifests[1:])]


def git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
        return done.stdout.strip() or None
    except OSError:
        return None


def result_stamp() -> JSONDoc:
    """What names a measured result (STYLE 21): today's date, the code's short commit and this machine's kind."""
    return {
        "date": datetime.date.today().isoformat(),
        "commit": (git_commit() or "unknown")[:7],
        "hardware": hardware_kind(hardware()),
    }


def write_manifest(path: Path, settings: JSONDoc, extra: JSONDoc) -> JSONDoc:
    """Create the manifest, or check that a resumed run uses the same settings; then update it."""
    path = Path(path)
    settings = json.loads(json.dumps(settings))  # tuples -> lists, as they read back
    if path.exists():
        manifest = read_json(path, "dataset", "a manifest written by neuroshard_jax.collect")
        device = settings.get("device", "cpu")
        was, now = hardware_kind(manifest.get("hardware"), device), hardware_kind(extra.get("hardware"), device)
        both = "hardware" in extra and "hardware" in manifest
        if both and now not in manifest_kinds(manifest):
            raise UserError(
                f"hardware: this machine is {now!r}, but the dataset in {str(path.parent)!r} was measured on {was!r}; "
                "expected the same kind of hardware (labels differ 1.2-2.8x between them), another out_dir, or "
                "a python -m neuroshard_jax.probe record=true verdict that this machine measures like it"
            )
        if both and now != was:
            # a probed kind resumes the dataset: its own hardware stays, the resuming machine is noted beside it
            resumed = [h for h in manifest.get("resumed_on", []) if h != extra["hardware"]]
            extra = {**extra, "resumed_on": [*resumed, extra["hardware"]]}
            extra.pop("hardware")
        # the protocol's keys count when absent too: a dataset keeps one protocol (absent: fixed, unpinned)
        keys = [
            *settings,
            *(k for k in (*PROTOCOL_KEYS, *TIMED_KEYS) if k in manifest["settings"]),
        ]
        for key in dict.fromkeys(keys):
            value = settings.get(key)
            if manifest["settings"].get(key) != value:
                was = manifest["settings"].get(key)
                shown, same = repr(was), ""
                if was is None and key in ABSENT:  # a label of before the key: its meaning, and the option to ask it
                    shown = f"{ABSENT[key]!r} (not recorded)"
                    same = f" ({key}={ABSENT[key]})" if key != "malloc" else ""
                raise UserError(
                    f"{key}: got {value!r}, but the dataset in {str(path.parent)!r} was collected with {shown}; "
                    f"expected the same settings{same} or another out_dir"
                )
    else:
        manifest = {"settings": settings, "created": now_utc()}
    manifest.update(extra)
    manifest["updated"] = now_utc()
    write_text(path, json.dumps(manifest, indent=1) + "\n")
    return manifest


def load_manifest(dataset_dir: Path, kind: str) -> JSONDoc:
    path = Path(dataset_dir) / f"manifest-{kind}.json"
    return read_json(path, "dataset", f"the manifest of a {kind} dataset collected by neuroshard_jax.collect")
