"""Paths: this user's folders (the cache, the models ``adapt`` made, the fits ``train`` wrote), what ships inside the
package, datasets as checkpoints record them, a DLRM benchmark file's identity."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from importlib import resources
from pathlib import Path

from neuroshard_jax.core.errors import UserError

CACHE_HINT = "set NEUROSHARD_CACHE_DIR to a folder you can write"  # what a cache that cannot be written says
logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """This user's folder for what the project makes and keeps (pool features, compiled search kernels, the models
    ``adapt`` made): ``$NEUROSHARD_CACHE_DIR``, default ``~/.cache/neuroshard_jax`` (also where the variable is set
    but empty: an empty value is no folder, not the current one)."""
    return Path(os.environ.get("NEUROSHARD_CACHE_DIR") or Path.home() / ".cache" / "neuroshard_jax")


def cache_folder(sub: str, what: str, make: bool = True, quiet: bool = False) -> Path | None:
    """``cache_dir() / sub``, where the cache and it are this user's alone: made private to this user (0700) where
    missing (``make``; else None while missing: nothing kept there yet). A folder another user owns, or others may
    write in, could hold files planted to be loaded as this user (compiled kernels, models) or change under a run:
    it is neither read nor written, and one warning per process and cause names it and why (``what`` is kept there;
    ``quiet``: no warning, for what is only a speed-up)."""
    root = cache_dir()
    folder = root / sub
    if not make and not folder.is_dir():
        return None
    for path in (root, folder):  # the cache first: a cache that cannot be made is one cause, said once
        try:
            path.mkdir(mode=0o700, parents=path is root, exist_ok=True)
            reason = _not_private(path)
        except OSError as err:
            reason = f"cannot be made ({getattr(err, 'strerror', None) or err})"
        if reason:
            if not quiet:  # the cache itself: one warning for every use of it
                _refused(
                    f"{str(path)!r} {reason}", "cached files (compiled kernels, models, fits)" if path is root else what
                )
            return None
    return folder


def _not_private(path: Path) -> str | None:
    """Why ``path`` is not this user's alone (None: it is): another user owns it, or others may write in it (all
    users, or a group other than the user's own: a umask of 002 with a group of one's own is private). Where the
    system has no owners (Windows), every folder is."""
    if not hasattr(os, "getuid"):
        return None
    stat = path.stat()
    if stat.st_uid != os.getuid():
        return f"is owned by another user (uid {stat.st_uid})"
    shared_group = stat.st_mode & 0o020 and stat.st_gid != os.getgid()
    if stat.st_mode & 0o002 or shared_group:
        return f"is writable by others (mode {oct(stat.st_mode & 0o777)}: chmod go-w it, or {CACHE_HINT})"
    return None


def own_entries(folder: Path, what: str, pattern: str = "*") -> list[Path]:
    """The entries of a private cache folder (``cache_folder``) matching ``pattern`` that are this user's alone: not
    a link (which could lead anywhere: a model folder another user may write), owned by this user, not writable by
    others; the others are left out with one warning each."""
    out = []
    for entry in sorted(folder.glob(pattern)):
        try:
            why = "is a symbolic link" if entry.is_symlink() else _not_private(entry)
        except OSError as err:
            why = f"cannot be read ({err.strerror or err})"
        if why:
            _refused(f"{str(entry)!r} {why}", what)
        else:
            out.append(entry)
    return out


@functools.cache  # one warning a cause, use and process: a plan asks for its folders many times
def _refused(why: str, what: str) -> None:
    hint = "" if "chmod" in why else f"; {CACHE_HINT}"
    logger.warning(f"{what} are not kept or read: {why}{hint}")


def user_models_dir() -> Path:
    """Where ``python -m neuroshard_jax.adapt`` registers the models it makes, one folder per name."""
    return cache_dir() / "models"


def own_fits_dir(family: str) -> Path:
    """``user_fits_dir(family)`` where the cache is this user's alone (``cache_folder``), to write a fit into; else a
    UserError naming why (the warning says it too)."""
    folder = cache_folder(family, f"{family} fits of this machine")
    if folder is None:
        raise UserError(
            f"out: this user's {family} fits cannot be kept in {str(user_fits_dir(family))!r} (the warning above says "
            "why); expected out=FOLDER for this fit"
        )
    return folder


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
