"""Paths: this user's folders (the cache, the models ``adapt`` made, the fits ``train`` wrote), what ships inside the
package, datasets as checkpoints record them, a DLRM benchmark file's identity."""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path

from neuroshard_jax.core.errors import UserError

CACHE_HINT = "set NEUROSHARD_CACHE_DIR to a folder you can write"  # what a cache that cannot be written says


def cache_dir() -> Path:
    """This user's folder for what the project makes and keeps (pool features, compiled search kernels, the models
    ``adapt`` made): ``$NEUROSHARD_CACHE_DIR``, default ``~/.cache/neuroshard_jax`` (also where the variable is set
    but empty: an empty value is no folder, not the current one)."""
    return Path(os.environ.get("NEUROSHARD_CACHE_DIR") or Path.home() / ".cache" / "neuroshard_jax")


def user_models_dir() -> Path:
    """Where ``python -m neuroshard_jax.adapt`` registers the models it makes, one folder per name."""
    return cache_dir() / "models"


def user_fits_dir(family: str) -> Path:
    """Where ``python -m neuroshard_jax.train family=FAMILY`` (``row_comm``, ``input_dist``) writes the fits of this
    user's machines when no ``out`` is given: models of a fit's hardware kind price with it, as with a shipped one."""
    return cache_dir() / family


def package_path(relative: str) -> Path:
    """A path inside the installed neuroshard_jax package (its shipped data)."""
    return Path(str(resources.files("neuroshard_jax"))) / relative


def resolve_dataset(path: str | Path) -> Path:
    """A dataset directory as given, or, if relative and absent here, relative to the package's parent
    (so the shipped ``neuroshard_jax/data/profiles/...`` recorded in checkpoints resolves from anywhere)."""
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    return package_path("").parent / path


def portable_path(path: str | Path) -> str:
    """``path`` relative to the package's parent where it lies inside it (shipped data: the same on every machine),
    else as given."""
    try:
        return Path(path).resolve().relative_to(package_path("").parent.resolve()).as_posix()
    except ValueError:
        return str(path)


def pool_file_digest(path: Path) -> str:
    """A DLRM benchmark file's identity (path, size, mtime): its pool id and its cache key."""
    if not path.is_file():
        raise UserError(f"pool.path: {str(path)!r} does not exist or is not a file, expected a DLRM benchmark file")
    stat = path.stat()
    return hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:12]
