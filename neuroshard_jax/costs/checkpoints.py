"""Orbax checkpoints of the neural cost models: params + net config + feature statistics + provenance.

Layout of a checkpoint directory:
  state/         orbax StandardCheckpointer: the nnx states as pure dicts, the input statistics (and scalars)
  meta.json      format version, model family, net config, feature names (the schema), batch sizes, datasets,
                 the range their labels span (``coverage.LabelCoverage``; older checkpoints: computed when asked),
                 metrics
Two formats load: 3, the per-table MLP of ``neural.py`` (the first shipped model, kept for the ablation), and
4, the physics ensemble of ``ensemble.py``. Restoring into nets of another config, a checkpoint of another
feature schema or of an unknown format is a one-line error saying why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
import threading
from pathlib import Path
from typing import TypedDict

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from neuroshard_jax.core.errors import DamagedModel, UserError, first_line
from neuroshard_jax.core.features import BASE_FEATURE_NAMES, KIND_MODEL_FEATURE_NAMES
from neuroshard_jax.core.files import JSONDoc, read_json
from neuroshard_jax.core.folders import recover_dir, replace_dir
from neuroshard_jax.core.hardware import release
from neuroshard_jax.core.paths import cache_folder, resolve_dataset
from neuroshard_jax.costs.ensemble import (
    NUM_COEFS,
    EnsembleConfig,
    EnsembleNets,
    EnsembleParams,
    InputStats,
    abstract_ensemble,
    input_names,
)
from neuroshard_jax.costs.neural import FeatureStats, NetConfig, NeuralNets, NeuralParams, init_nets

FORMAT_VERSION = 3  # 2: compute head on mean latent + log count; 3: comm nets learn the transfer, not the wait
ENSEMBLE_FORMAT = 4  # the physics ensemble: roofline x bounded correction, K members, batch size an input
SCALARS = ("batch_size", "comm_batch_size", "trust_lo", "trust_hi", "risk")


def tree_digest(tree) -> str:
    """sha256 of a pytree's arrays (dtype, shape and bytes of every leaf, in tree order): recorded in meta.json
    at save time, checked at load time (orbax's compressed chunks carry no checksum: a garbled byte in a tensor
    file decodes silently into other weights)."""
    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def save_tree(path: Path, tree) -> str:
    """Save a pytree of arrays with orbax (``path`` must not exist); returns its ``tree_digest``."""
    import orbax.checkpoint as ocp  # imported where a checkpoint is written or first read: half a second

    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(Path(path).resolve(), tree)
    marker = Path(path) / "commit_success.txt"  # orbax names the absolute folder it wrote: a path of this machine
    if marker.is_file():
        marker.write_text("Checkpoint commit was successful\n")
    return tree_digest(tree)


def restore_tree(path: Path, template, key: str = "cost_model.checkpoint", digest: str | None = None):
    """Restore a pytree saved by ``save_tree`` into the structure, shapes and dtypes of ``template``; a missing,
    damaged or mismatched state (a truncated or garbled tensor file or _METADATA, other shapes, arrays whose
    ``tree_digest`` is not ``digest`` when one is given) is one UserError."""
    path = Path(path).resolve()
    kept = _kept_tree(path, template, digest)
    if kept is not None:
        return kept
    import orbax.checkpoint as ocp

    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
    _drop_closed_loop_reports()  # before: a failing restore's pending reads may report while it still unwinds
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            tree = checkpointer.restore(path, abstract)
    except Exception as err:  # orbax, tensorstore and JSON errors of every kind: the files are not what we wrote
        tree, reason = None, restore_failure(err)
    else:
        reason = None if digest is None or tree_digest(tree) == digest else "its arrays differ from those saved"
    if reason is not None:
        why = f"its {path.name}/ could not be restored ({reason})"
        raise DamagedModel(
            f"{key}: {str(path.parent)!r}: {why}; expected the folder written with its meta.json: retrain or copy "
            "the checkpoint again",
            why,
        )
    _keep_tree(path, tree, digest)
    return tree


def _kept_path(path: Path, digest: str) -> Path:
    """Where a restored state's arrays are kept: by their digest and the state folder's files as they are (names,
    sizes, modification times), so a folder changed since, damaged or not, is read by orbax again."""
    files = sorted(p for p in path.rglob("*") if p.is_file())
    stamp = hashlib.sha256(
        repr([(str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]).encode()
    )
    folder = cache_folder("restored", "restored model arrays", quiet=True)  # a speed-up: without it, orbax reads
    if folder is None:  # not this user's alone: nothing read from it or kept in it
        raise OSError("the cache folder is not private")
    return folder / f"{digest[:32]}-{stamp.hexdigest()[:16]}.npz"


def _kept_tree(path: Path, template, digest: str | None):
    """The arrays of a checkpoint restored before (``_keep_tree``), by their digest, in ``template``'s structure: no
    orbax to import or run. None where there is none, or it is not what was saved (then restored afresh)."""
    if digest is None or not path.is_dir():
        return None
    try:
        kept_path = _kept_path(path, digest)
    except OSError:
        return None
    if not kept_path.is_file():
        return None
    leaves, structure = jax.tree_util.tree_flatten(template)
    try:
        with np.load(kept_path, allow_pickle=False) as kept:
            arrays = [kept[str(i)] for i in range(len(leaves))]
    except Exception:  # noqa: BLE001 - a damaged file of ours (a bad zip, a short read, ...): the checkpoint is read
        return None
    if any(a.shape != tuple(t.shape) or a.dtype != t.dtype for a, t in zip(arrays, leaves)):
        return None
    tree = jax.tree_util.tree_unflatten(structure, [jax.device_put(a) for a in arrays])  # no per-shape compile
    return tree if tree_digest(tree) == digest else None


def _keep_tree(state: Path, tree, digest: str | None) -> None:
    """Keep a restored checkpoint's arrays as one .npz in the cache (``_kept_path``: the next process reads them in
    milliseconds); a cache that cannot be written keeps nothing, silently (the checkpoint is read as before)."""
    if digest is None:
        return
    try:
        path = _kept_path(state, digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(f".{os.getpid()}.part")
        with open(part, "wb") as f:
            np.savez(f, **{str(i): np.asarray(a) for i, a in enumerate(jax.tree_util.tree_leaves(tree))})
        os.replace(part, path)
    except OSError:
        return


def _drop_closed_loop_reports() -> None:
    """After a failed restore, tensorstore's reads still pending complete on orbax's closed event loop and report
    ``RuntimeError: Event loop is closed`` from their threads, at any moment: before the caller's one-line error
    was printed (one test run of many), even before the restore call had returned (another); and orbax's read
    coroutines left unawaited report the read's error as they are collected ("Exception ignored in: <coroutine
    object _read_array_index_and_device_put>", 60 lines each, after the one-line warning of a damaged model). Those
    reports, and only those, are dropped from the first restore on; every other report goes to the hook that was
    there."""

    def closed_loop(exc) -> bool:
        return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"

    if getattr(sys.excepthook, "drops_closed_loop", False):
        return
    excepthook, unraisablehook, thread_hook = sys.excepthook, sys.unraisablehook, threading.excepthook

    def on_exception(kind, value, tb):
        if not closed_loop(value):
            excepthook(kind, value, tb)

    on_exception.drops_closed_loop = True
    sys.excepthook = on_exception
    sys.unraisablehook = lambda report: closed_loop(report.exc_value) or _orbax_read(report) or unraisablehook(report)
    threading.excepthook = lambda args: closed_loop(args.exc_value) or thread_hook(args)


def _orbax_read(report) -> bool:
    """An unraisable report of one of orbax's coroutines, collected unawaited after a failed read."""
    code = getattr(report.object, "cr_code", None)
    return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


def _first_line(err: Exception) -> str:
    return first_line(err)[:200].rstrip(".")


SHAPES = re.compile(r"Requested shape: (\([\d, ]*\)) is not compatible with the stored shape: (\([\d, ]*\))")


def restore_failure(err: Exception) -> str:
    """Why orbax could not restore a state, in a few words: TensorStore's and orbax's own messages run on into
    object reprs and advice about their options (the first sentence of the first line, else these)."""
    text = first_line(err)
    if shapes := SHAPES.search(text):
        return f"an array saved {shapes.group(2)} where its meta.json's net_config makes {shapes.group(1)}"
    if isinstance(err, json.JSONDecodeError):
        return f"its _METADATA is not valid JSON ({err.msg}, character {err.pos})"
    if isinstance(err, FileNotFoundError) or text.endswith("not found") or "NOT_FOUND" in text:
        return "it or one of its files is missing"
    if "PERMISSION_DENIED" in text or isinstance(err, PermissionError):
        return "a file of it may not be read (permission denied)"
    if "TensorStore" in text or "reading array" in text:
        return "a tensor file could not be read: torn or garbled"
    return text.split(". ")[0][:160].rstrip(".")


def save_checkpoint(path: str | Path, config: NetConfig, params: NeuralParams, meta: dict) -> Path:
    """Write a checkpoint (replacing one at ``path``)."""
    tree = {
        "compute": nnx.to_pure_dict(params.compute),
        "fwd": nnx.to_pure_dict(params.fwd),
        "bwd": nnx.to_pure_dict(params.bwd),
        "stats": {"mean": params.stats.mean, "std": params.stats.std},
    }
    head = {
        "format": FORMAT_VERSION,
        "net_config": dataclasses.asdict(config),
        "feature_names": list(BASE_FEATURE_NAMES),
    }
    return _save(path, tree, {**head, **meta})


def _save(path: str | Path, tree: dict, meta: dict) -> Path:
    """A checkpoint folder (``state/`` by orbax, ``meta.json`` with the state's digest) made beside ``path`` and
    swapped in whole (``replace_dir``): a stop at any moment leaves the old model or the new one loadable."""

    def write(folder: Path) -> None:
        digest = save_tree(folder / "state", tree)
        (folder / "meta.json").write_text(json.dumps({**meta, "digests": {"state": digest}}, indent=1) + "\n")

    return replace_dir(Path(path).resolve(), write)


def read_meta(path: str | Path, key: str = "cost_model.checkpoint") -> JSONDoc:
    """The meta.json of a checkpoint as a dict (a missing or unreadable one is a UserError naming ``key``)."""
    recover_dir(path)  # a stop inside save_checkpoint's fallback swap
    meta_path = Path(path) / "meta.json"
    if not meta_path.exists():
        raise UserError(f"{key}: {str(path)!r} has no meta.json, expected a checkpoint directory")
    if not meta_path.is_file():  # a FIFO would block the read, a device never end it
        raise UserError(f"{key}: {str(meta_path)!r} is not a regular file, expected a JSON object")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise UserError(
            f"{key}: {str(meta_path)!r} could not be read ({_first_line(err)}); expected a JSON object"
        ) from None
    if not isinstance(meta, dict):
        raise UserError(f"{key}: {str(meta_path)!r} holds {type(meta).__name__}, expected a JSON object")
    return meta


def load_checkpoint(
    path: str | Path, config: NetConfig | None = None
) -> tuple[NetConfig, NeuralNets, NeuralParams, dict]:
    """Restore a checkpoint. ``config``, if given, must equal the saved net config."""
    path = Path(path).resolve()
    meta = read_meta(path)
    if meta.get("format") == ENSEMBLE_FORMAT:
        raise UserError(
            f"cost_model.checkpoint: {str(path)!r} is a physics ensemble (format 4); load it with load_ensemble"
        )
    if meta.get("format") != FORMAT_VERSION:
        raise UserError(
            f"cost_model.checkpoint: {str(path)!r} has checkpoint format {meta.get('format')}, expected "
            f"{FORMAT_VERSION}; retrain it with python -m neuroshard_jax.train"
        )
    if meta.get("feature_names") != list(BASE_FEATURE_NAMES):  # this family reads the base features alone
        raise UserError(
            f"cost_model.checkpoint: {str(path)!r} scores features {meta.get('feature_names')}, expected the schema "
            f"{list(BASE_FEATURE_NAMES)}"
        )
    saved = _parsed(path, lambda: _net_config(meta["net_config"]))
    if config is not None and config != saved:
        raise UserError(
            f"cost_model: net config {dataclasses.asdict(config)} does not match the checkpoint's "
            f"{dataclasses.asdict(saved)}"
        )
    nets, template = init_nets(saved)
    target = {
        "compute": nnx.to_pure_dict(template.compute),
        "fwd": nnx.to_pure_dict(template.fwd),
        "bwd": nnx.to_pure_dict(template.bwd),
        "stats": {"mean": template.stats.mean, "std": template.stats.std},
    }
    tree = restore_tree(path / "state", target, digest=_digest_of(meta, "state"))
    states = []
    for name, state in (("compute", template.compute), ("fwd", template.fwd), ("bwd", template.bwd)):
        nnx.replace_by_pure_dict(state, tree[name])
        states.append(state)
    stats = FeatureStats(jnp.asarray(tree["stats"]["mean"]), jnp.asarray(tree["stats"]["std"]))
    return saved, nets, NeuralParams(*states, stats), meta


def _digest_of(meta: dict, name: str) -> str | None:
    """The recorded digest of a checkpoint's ``name``/ folder (None for checkpoints written before digests)."""
    digests = meta.get("digests")
    return digests.get(name) if isinstance(digests, dict) else None


def _parsed(path: Path, read):
    """``read()`` of a meta.json's net config; a missing key or a wrong value is one UserError naming the file."""
    try:
        return read()
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise UserError(
            f"cost_model.checkpoint: {str(Path(path) / 'meta.json')!r} has no valid net_config ({err!r:.120}); "
            "expected the one training wrote"
        ) from None


def _net_config(obj: dict) -> NetConfig:
    return NetConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in obj.items()})


def ensemble_config_of(meta: dict) -> EnsembleConfig:
    obj = dict(meta["net_config"])
    defaults = EnsembleConfig()
    return EnsembleConfig(
        members=obj["members"],
        hidden=tuple(obj["hidden"]),
        latent=obj.get("latent", defaults.latent),
        head_hidden=tuple(obj.get("head_hidden", defaults.head_hidden)),
        max_correction=obj["max_correction"],
        max_device_correction=obj.get("max_device_correction", defaults.max_device_correction),
        comm=_net_config(obj["comm"]),
        cache=bool(obj.get("cache", False)),  # checkpoints trained before the cache term have none
        fusion=obj.get("fusion", "pairwise"),  # and the pairwise fusion term
        kinds=bool(obj.get("kinds", False)),  # and before kernel kinds, sum-pooled bags alone
        kind_terms=int(obj.get("kind_terms", 2)),  # and before the sequence kernel's distinct rows, two kind terms
        max_label_spread=float(obj.get("max_label_spread", defaults.max_label_spread)),
        drop_faulted=bool(obj.get("drop_faulted", False)),  # the labels its training kept
    )


class EnsembleTree(TypedDict):
    """A physics ensemble's saved state, as orbax writes it (a pytree of plain dicts and arrays)."""

    members: dict
    fwd: dict
    bwd: dict
    stats: dict
    scalars: dict


def _ensemble_tree(params: EnsembleParams) -> EnsembleTree:
    return {
        "members": nnx.to_pure_dict(params.members),
        "fwd": nnx.to_pure_dict(params.fwd),
        "bwd": nnx.to_pure_dict(params.bwd),
        "stats": {"mean": params.stats.mean, "std": params.stats.std},
        "scalars": {name: getattr(params, name) for name in SCALARS},
    }


def save_ensemble(path: str | Path, config: EnsembleConfig, params: EnsembleParams, meta: dict) -> Path:
    """Write a physics-ensemble checkpoint (replacing one at ``path``); ``risk`` is saved as 0."""
    head = {
        "format": ENSEMBLE_FORMAT,
        "family": "ensemble",
        "net_config": dataclasses.asdict(config),
        "feature_names": list(KIND_MODEL_FEATURE_NAMES if config.kinds else BASE_FEATURE_NAMES),
        "inputs": list(input_names(config.kinds)),
    }
    return _save(path, _ensemble_tree(params._replace(risk=jnp.float32(0.0))), {**head, **meta})


def load_ensemble(path: str | Path) -> tuple[EnsembleConfig, EnsembleNets, EnsembleParams, dict]:
    """Restore a physics-ensemble checkpoint (format 4)."""
    path = Path(path).resolve()
    meta = read_meta(path)
    if meta.get("format") != ENSEMBLE_FORMAT:
        raise UserError(
            f"cost_model.checkpoint: {str(path)!r} has checkpoint format {meta.get('format')}, expected "
            f"{ENSEMBLE_FORMAT} (a physics ensemble)"
        )
    config = _parsed(path, lambda: ensemble_config_of(meta))
    features = KIND_MODEL_FEATURE_NAMES if config.kinds else BASE_FEATURE_NAMES  # before kinds: the base
    for key, expected in (("feature_names", list(features)), ("inputs", list(input_names(config.kinds)))):
        if meta.get(key) != expected:
            raise UserError(
                f"cost_model.checkpoint: {str(path)!r} was trained on {key} {meta.get(key)}, expected {expected}; "
                "retrain it with python -m neuroshard_jax.train"
            )
    nets, template = abstract_ensemble(config, np.zeros(NUM_COEFS, np.float32))
    tree = restore_tree(path / "state", _ensemble_tree(template), digest=_digest_of(meta, "state"))
    states = []
    for name in ("members", "fwd", "bwd"):
        state = getattr(template, name)
        nnx.replace_by_pure_dict(state, tree[name])
        states.append(state)
    stats = InputStats(jnp.asarray(tree["stats"]["mean"]), jnp.asarray(tree["stats"]["std"]))
    scalars = {name: jnp.asarray(tree["scalars"][name], jnp.float32) for name in SCALARS}
    return config, nets, EnsembleParams(*states, stats, **scalars), meta


def label_stacks(meta: dict) -> list[dict]:
    """The torch and FBGEMM versions that timed a model's compute labels: each dataset's (recorded in the model since
    kernel kinds), else read from the datasets' manifests where they are here; [] where none is known."""
    out = []
    for entry in (meta.get("datasets") or {}).get("compute") or []:
        versions = entry.get("versions") if isinstance(entry, dict) else None
        if versions is None and isinstance(entry, dict) and entry.get("dir"):
            manifest = resolve_dataset(entry["dir"]) / "manifest-compute.json"
            versions = read_json(manifest, "dataset", "a manifest").get("versions") if manifest.is_file() else None
        if isinstance(versions, dict) and versions.get("fbgemm_gpu"):
            out.append(versions)
    return out


def stack_change(meta: dict, installed: dict[str, str]) -> str | None:
    """A phrase where the release lines of torch or FBGEMM that timed the model's labels (``label_stacks``) are not
    this environment's (``installed``): kernels change between releases, so the model's milliseconds may too."""
    stacks = label_stacks(meta)
    if not stacks or not installed.get("fbgemm_gpu"):
        return None
    timed = {(release(s["fbgemm_gpu"]), release(str(s.get("torch", "?")))) for s in stacks}
    here = (release(installed["fbgemm_gpu"]), release(installed.get("torch", "?")))
    if here in timed:
        return None
    fbgemm, torch = sorted(timed)[0]
    return (
        f"its labels were timed with FBGEMM {fbgemm} and torch {torch}, this environment has FBGEMM {here[0]} and "
        f"torch {here[1]}: its kernels may differ"
    )
