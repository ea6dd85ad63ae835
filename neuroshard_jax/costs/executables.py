"""Compiled cost kernels kept across processes: a search's jitted functions, loaded ready to run.

A new process that plans pays, for every jitted kernel and shape, Python tracing and lowering to StableHLO (about
0.4 s for the beam's ``grid_search`` on a CPU) before XLA's persistent cache can even be asked. ``KeptJit`` wraps a
function as ``jax.jit`` does and keeps each executable it compiles as one file (``$NEUROSHARD_CACHE_DIR/
executables``), so a later process with the same code, library versions, machine and argument shapes loads it in a
millisecond instead of tracing. Nothing is kept until a command turns the store on (``keep_executables``); called
inside another trace, with unkeyed static arguments, or with the store off, it is ``jax.jit`` itself.

A file's key covers what the executable depends on: the source of ``neuroshard_jax`` and ``searchers``, the
versions of jax, jaxlib, flax and numpy, the device and this CPU's model and instruction-set flags (an XLA:CPU
executable uses the host's vector instructions), XLA's flags, the function, its static arguments (``CostFns`` by
their ``key``) and each array argument's shape, dtype and weak type. A file carries a digest of its payload: a
damaged one is compiled afresh and replaced.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import logging
import os
import pickle
import platform
import re
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax.experimental import serialize_executable

from neuroshard_jax.costs.cost_model import CostFns

logger = logging.getLogger(__name__)

MAX_FILES = 512  # kept executables beyond this many: the least recently used are removed
_PACKAGES = ("neuroshard_jax", "searchers")
_VERSIONS = ("jax", "jaxlib", "flax", "numpy")
_folder: Path | None = None


def keep_executables(folder: Path | None) -> None:
    """Keep (and load) compiled kernels in ``folder`` from now on in this process; None: keep none."""
    global _folder
    _folder = folder


def kept_folder() -> Path | None:
    """Where this process keeps compiled kernels (None: nowhere)."""
    return _folder


def code_key(kind: str, value) -> str:
    """``kind`` and a digest of ``value``'s repr with object addresses left out (a function in it is named by its
    name): the same in every process for the same static structure (an NNX ``GraphDef``, a config)."""
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))
    return f"{kind}:{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def static_key(value) -> str | None:
    """A static argument as a string that is the same in every process, or None where there is none (then its
    executables are not kept): plain scalars, tuples of them, ``CostFns`` by their ``key`` and NNX graph
    definitions by their structure (``code_key``)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, nnx.GraphDef):
        return code_key("GraphDef", value)
    if isinstance(value, CostFns):
        return None if value.key is None else f"CostFns({value.key})"
    if isinstance(value, tuple):
        parts = [static_key(v) for v in value]
        return None if None in parts else f"({','.join(parts)})"
    return None


@functools.cache
def _environment() -> str:
    """A digest of what every kept executable depends on beside its own arguments (computed once per process)."""
    digest = hashlib.sha256()
    for package in _PACKAGES:
        root = Path(__import__(package).__file__).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    versions = [f"{name}={importlib.metadata.version(name)}" for name in _VERSIONS]
    device = jax.devices()[0]
    parts = [
        digest.hexdigest(),
        *versions,
        device.platform,
        device.device_kind,
        _cpu(),
        os.environ.get("XLA_FLAGS", ""),
        str(jax.config.jax_enable_x64),
        str(jax.config.jax_default_matmul_precision),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _cpu() -> str:
    """This CPU's model and instruction-set flags (Linux's /proc/cpuinfo, first processor), else what Python says."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    first = text.split("\n\n", 1)[0]
    fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    return " ".join(fields.get(k, "").strip() for k in ("vendor_id", "cpu family", "model", "model name", "flags"))


def _leaf_key(leaf) -> str:
    if isinstance(leaf, jax.Array):
        aval = leaf.aval
        return f"{aval.dtype}{list(aval.shape)}{'w' if aval.weak_type else ''}"
    if isinstance(leaf, (bool, int, float)):
        return f"{type(leaf).__name__}w"  # a Python scalar: a weakly typed argument
    array = np.asarray(leaf)
    return f"{array.dtype}{list(array.shape)}"


class KeptJit:
    """``jax.jit(fn, static_argnums=..., static_argnames=...)`` whose executables are kept across processes (the
    module docstring); called as the function is."""

    def __init__(self, fn: Callable, static_argnums: tuple[int, ...] = (), static_argnames: tuple[str, ...] = ()):
        functools.update_wrapper(self, fn)
        self.jitted = jax.jit(fn, static_argnums=static_argnums, static_argnames=static_argnames)
        names = list(inspect.signature(fn).parameters)
        self._static_positions = set(static_argnums) | {names.index(n) for n in static_argnames if n in names}
        self._static_names = set(static_argnames) | {names[i] for i in static_argnums}
        self._name = f"{fn.__module__}.{fn.__qualname__}"
        self._loaded: dict[str, Callable] = {}

    def _cache_size(self) -> int:
        """How many executables this function holds in this process (``jax.jit``'s count, kept ones added)."""
        return self.jitted._cache_size() + len(self._loaded)

    def __call__(self, *args, **kwargs):
        folder = _folder
        if folder is None:
            return self.jitted(*args, **kwargs)
        statics = [a for i, a in enumerate(args) if i in self._static_positions]
        statics += [kwargs[k] for k in sorted(kwargs) if k in self._static_names]
        dynamic_args = tuple(a for i, a in enumerate(args) if i not in self._static_positions)
        dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_names}
        leaves, structure = jax.tree_util.tree_flatten((dynamic_args, dynamic_kwargs))
        statics_key = static_key(tuple(statics))
        if statics_key is None or any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
            return self.jitted(*args, **kwargs)
        key = hashlib.sha256(
            "\n".join([_environment(), self._name, statics_key, str(structure), *map(_leaf_key, leaves)]).encode()
        ).hexdigest()[:40]
        compiled = self._loaded.get(key)
        if compiled is None:
            path = folder / f"{self._name}-{key}.bin"
            compiled = _load(path)
            if compiled is None:
                compiled = self.jitted.lower(*args, **kwargs).compile()
                if not jax.config.jax_compilation_cache_dir:  # fresh from XLA (see _keep)
                    _keep(path, compiled)
            self._loaded[key] = compiled
        return compiled(*dynamic_args, **dynamic_kwargs)


def kept_jit(static_argnums: tuple[int, ...] = (), static_argnames: tuple[str, ...] = ()):
    """``KeptJit`` as a decorator, as ``functools.partial(jax.jit, ...)`` is used."""
    return functools.partial(KeptJit, static_argnums=static_argnums, static_argnames=static_argnames)


def _load(path: Path) -> Callable | None:
    """The executable kept in ``path``, or None where there is none or it is damaged (then it is removed)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        digest, payload = data[:32], data[32:]
        if hashlib.sha256(payload).digest() != digest:
            raise ValueError("its digest differs")
        blob, in_tree, out_tree = pickle.loads(payload)
        compiled = serialize_executable.deserialize_and_load(blob, in_tree, out_tree)
    except Exception as err:  # noqa: BLE001 - a damaged or foreign file of ours: compiled afresh
        logger.debug(f"kept executable {path.name} not loaded ({err}); compiling it again")
        path.unlink(missing_ok=True)
        return None
    try:
        os.utime(path)  # recently used: kept when the folder is pruned
    except OSError:
        pass
    return compiled


def _keep(path: Path, compiled) -> None:
    """Write ``compiled`` to ``path`` (whole or not at all); a folder that cannot be written keeps nothing.

    Only an executable XLA compiled in this process is kept. One that JAX read from its own persistent cache
    (``jax_compilation_cache_dir``, where a user set it) serializes without its kernels' object code on XLA:CPU
    (jaxlib 0.10: half the bytes), and another process running it fails with ``NOT_FOUND: Function ... not
    found``; so nothing is kept while that cache is on (kept files are still loaded)."""
    try:
        payload = pickle.dumps(serialize_executable.serialize(compiled))
    except Exception as err:  # noqa: BLE001 - an executable or tree that cannot be serialized: not kept
        logger.debug(f"executable {path.name} not kept ({err})")
        return
    part = path.with_suffix(f".{os.getpid()}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(hashlib.sha256(payload).digest() + payload)
        os.replace(part, path)
        _prune(path.parent)
    except OSError:
        part.unlink(missing_ok=True)


def _prune(folder: Path) -> None:
    """Remove the least recently used executables past ``MAX_FILES``."""
    files = list(folder.glob("*.bin"))
    if len(files) <= MAX_FILES:
        return
    for old in sorted(files, key=lambda p: p.stat().st_mtime)[: len(files) - MAX_FILES]:
        old.unlink(missing_ok=True)
