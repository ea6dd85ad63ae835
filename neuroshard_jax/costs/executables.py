"""Compiled cost kernels kept across processes: a search's jitted functions, loaded ready to run.

A new process that plans pays, for every jitted kernel and shape, Python tracing and lowering to StableHLO (about
0.4 s for the beam's ``grid_search`` on a CPU) before a persistent compilation cache can even be asked. ``KeptJit``
wraps a function as ``jax.jit`` does and keeps each executable it compiles as one file (``$NEUROSHARD_CACHE_DIR/
executables``), so a later process with the same code, library versions, machine and argument shapes loads it in a
millisecond instead of tracing. Nothing is kept until a command turns the store on (``keep_executables``); called
inside another trace, with unkeyed static arguments, under ``jax.disable_jit`` or with the store off, it is
``jax.jit`` itself.

A file's key covers what the executable depends on: the source of ``neuroshard_jax`` and ``searchers``, the
versions of jax, jaxlib, flax and numpy, the device and this CPU's model and instruction-set flags (an XLA:CPU
executable uses the host's vector instructions), XLA's flags, the JAX settings that change a traced program (x64,
matmul precision, the PRNG, dtype and rank promotion: read at every call), the function, its static arguments by name
(``CostFns`` by the key the package issued them under) and each array argument's tree, shape, dtype and weak type. A
file carries a digest of its payload: a damaged one, or one that fails on its first run, is compiled afresh and
replaced. JAX's own persistent cache is not used beside it (``_keep`` says why).
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
import threading
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax._src import compilation_cache as _jax_cache
from jax.experimental import serialize_executable

from neuroshard_jax.core.errors import first_line
from neuroshard_jax.costs.cost_model import CostFns, stable_key

logger = logging.getLogger(__name__)

MAX_FILES = 512  # kept executables beyond this many: the least recently used are removed
STALE_PART_S = 3600.0  # a partly written file this old was left by a process that died: removed
_PACKAGES = ("neuroshard_jax", "searchers")
_VERSIONS = ("jax", "jaxlib", "flax", "numpy")
# JAX settings that change what a traced function computes: read at every call (a context may change them)
_SETTINGS = (
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_default_prng_impl",
    "jax_threefry_partitionable",
    "jax_numpy_dtype_promotion",
    "jax_numpy_rank_promotion",
)
_CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "flags")
_CPU_FIELDS += ("CPU implementer", "CPU architecture", "CPU variant", "CPU part", "Features")  # ARM's /proc/cpuinfo
_folder: Path | None = None
_graph_keys: dict = {}  # GraphDef -> its code_key (a repr of ~25 kB, made once per graph)


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
    executables are not kept): plain scalars, tuples of them, ``CostFns`` by the key the package issued them
    under (``cost_model.stable_key``) and NNX graph definitions by their structure (``code_key``)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, nnx.GraphDef):
        if value not in _graph_keys:
            _graph_keys[value] = code_key("GraphDef", value)
        return _graph_keys[value]
    if isinstance(value, CostFns):
        key = stable_key(value)
        return None if key is None else f"CostFns({key})"
    if isinstance(value, tuple):
        parts = [static_key(v) for v in value]
        return None if None in parts else f"({','.join(parts)})"
    return None


@functools.cache
def _environment() -> str:
    """A digest of what every kept executable depends on beside its arguments and JAX's settings (once per process):
    the packages' source, the libraries' versions, the device and this CPU, XLA's flags."""
    digest = hashlib.sha256()
    for package in _PACKAGES:
        root = Path(__import__(package).__file__).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    versions = [f"{name}={importlib.metadata.version(name)}" for name in _VERSIONS]
    device = jax.devices()[0]
    parts = [digest.hexdigest(), *versions, device.platform, device.device_kind, _cpu()]
    parts.append(os.environ.get("XLA_FLAGS", ""))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _cpu() -> str:
    """This CPU's model and instruction-set flags (Linux's /proc/cpuinfo, first processor), else what Python says."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()} {platform.processor()} {platform.platform()}"
    first = text.split("\n\n", 1)[0]
    fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    return " ".join(f"{k}={fields[k].strip()}" for k in _CPU_FIELDS if k in fields) or platform.machine()


def _leaf_sig(leaf) -> tuple:
    """An argument as ``jit`` takes it: shape, dtype (numpy's canonicalized: f64 is f32 without x64), weak type."""
    if isinstance(leaf, jax.Array):
        return leaf.shape, leaf.dtype, leaf.weak_type
    if isinstance(leaf, (bool, int, float)):
        return (), type(leaf).__name__, True  # a Python scalar: a weakly typed argument
    array = np.asarray(leaf)
    return array.shape, jax.dtypes.canonicalize_dtype(array.dtype), False


def _jax_cache_on() -> bool:
    """Whether JAX's persistent compilation cache may have given this process's executables: its folder set, or
    initialised earlier in this process (it stays live after the setting is put back; jax 0.10)."""
    return bool(jax.config.jax_compilation_cache_dir) or getattr(_jax_cache, "_cache", None) is not None


class KeptJit:
    """``jax.jit(fn, static_argnums=..., static_argnames=...)`` whose executables are kept across processes (the
    module docstring); called as the function is."""

    def __init__(self, fn: Callable, static_argnums: tuple[int, ...] = (), static_argnames: tuple[str, ...] = ()):
        functools.update_wrapper(self, fn)
        self.jitted = jax.jit(fn, static_argnums=static_argnums, static_argnames=static_argnames)
        names = self._names = list(inspect.signature(fn).parameters)
        self._static_positions = set(static_argnums) | {names.index(n) for n in static_argnames if n in names}
        self._static_names = set(static_argnames) | {names[i] for i in static_argnums if i < len(names)}
        self._name = f"{fn.__module__}.{fn.__qualname__}"
        self._loaded: dict[tuple, Callable] = {}  # by call signature (settings, statics, tree, arguments)

    def lower(self, *args, **kwargs):
        """``jax.jit``'s ``lower``."""
        return self.jitted.lower(*args, **kwargs)

    def _cache_size(self) -> int:
        """How many executables this function holds in this process (``jax.jit``'s count, kept ones added)."""
        return self.jitted._cache_size() + len(self._loaded)

    def __call__(self, *args, **kwargs):
        folder = _folder
        if folder is None or jax.config.jax_disable_jit:
            return self.jitted(*args, **kwargs)
        statics = [(self._arg_name(i), a) for i, a in enumerate(args) if i in self._static_positions]
        statics += [(k, kwargs[k]) for k in sorted(kwargs) if k in self._static_names]
        dynamic_args = tuple(a for i, a in enumerate(args) if i not in self._static_positions)
        dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_names}
        leaves, structure = jax.tree_util.tree_flatten((dynamic_args, dynamic_kwargs))
        statics_key = static_key(tuple(value for _, value in statics))
        if statics_key is None or any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
            return self.jitted(*args, **kwargs)
        settings = tuple(getattr(jax.config, name) for name in _SETTINGS)
        names = tuple(name for name, _ in statics)
        signature = (settings, names, statics_key, structure, tuple(map(_leaf_sig, leaves)))
        compiled = self._loaded.get(signature)
        if compiled is not None:  # the common case: a dict lookup, no digest (the tree's text alone is ~80 us)
            return compiled(*dynamic_args, **dynamic_kwargs)
        text = [_environment(), repr(settings), self._name, repr(names), statics_key, str(structure)]
        key = hashlib.sha256("\n".join([*text, repr(signature[-1])]).encode()).hexdigest()[:40]
        path = folder / f"{self._name}-{key}.bin"
        compiled = _load(path)
        if compiled is not None:
            try:  # a file that loads may still fail to run (a kernel missing from it): run once, and wait for it
                out = jax.block_until_ready(compiled(*dynamic_args, **dynamic_kwargs))
            except Exception as err:  # noqa: BLE001 - any failure of a kept file: removed and compiled afresh
                logger.debug(f"kept executable {path.name} failed to run ({first_line(err)}); compiling it again")
                _remove(path)
            else:
                self._loaded[signature] = compiled
                return out
        compiled = self.jitted.lower(*args, **kwargs).compile()
        if not _jax_cache_on():  # fresh from XLA (see _keep)
            _keep(path, compiled)
        self._loaded[signature] = compiled
        return compiled(*dynamic_args, **dynamic_kwargs)

    def _arg_name(self, position: int) -> str:
        return self._names[position] if position < len(self._names) else f"#{position}"


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
        logger.debug(f"kept executable {path.name} not loaded ({first_line(err)}); compiling it again")
        _remove(path)
        return None
    try:
        os.utime(path)  # recently used: kept when the folder is pruned
    except OSError:
        pass
    return compiled


def _remove(path: Path) -> None:
    """Remove a kept file that failed; one that cannot be removed (a folder made read-only since) is left."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _keep(path: Path, compiled) -> None:
    """Write ``compiled`` to ``path`` (whole or not at all); a folder that cannot be written keeps nothing.

    Only an executable XLA compiled in this process is kept. One that JAX read from its own persistent cache
    (``jax_compilation_cache_dir``, where a user set it) serializes without its kernels' object code on XLA:CPU
    (jaxlib 0.10: half the bytes), and another process running it fails with ``NOT_FOUND: Function ... not
    found``; so nothing is kept while that cache is on (kept files are still loaded)."""
    try:
        payload = pickle.dumps(serialize_executable.serialize(compiled))
    except Exception as err:  # noqa: BLE001 - an executable or tree that cannot be serialized: not kept
        logger.debug(f"executable {path.name} not kept ({first_line(err)})")
        return
    part = path.with_suffix(f".{os.getpid()}-{threading.get_ident()}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(hashlib.sha256(payload).digest() + payload)
        os.replace(part, path)
        _prune(path.parent)
    except OSError:
        part.unlink(missing_ok=True)


def _prune(folder: Path) -> None:
    """Remove the least recently used executables past ``MAX_FILES``, and partly written files of dead processes."""
    now = time.time()
    for part in folder.glob("*.part"):
        if now - part.stat().st_mtime > STALE_PART_S:
            part.unlink(missing_ok=True)
    files = list(folder.glob("*.bin"))
    if len(files) <= MAX_FILES:
        return
    for old in sorted(files, key=lambda p: p.stat().st_mtime)[: len(files) - MAX_FILES]:
        old.unlink(missing_ok=True)
