"""Folders one process writes: one writer per folder (an advisory ``flock`` the OS releases even on kill -9), and
folders replaced whole (an atomic exchange), so that a stop at any moment leaves a whole folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from neuroshard_jax.core.errors import UserError, is_disk_full, os_error
from neuroshard_jax.core.files import now_utc


def replace_dir(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Make the folder ``path`` anew with ``write(folder)``, replacing any there, so that a stop at any moment
    leaves the old folder or the new one whole at ``path``: ``write`` fills ``.NAME.new`` beside it, which
    then trades places with the old folder in one atomic exchange (``renameat2``; where the file system has
    none, two renames, and ``recover_dir`` puts the old folder back if a stop falls between them). What is
    left beside it by a stop is removed by the next call."""
    path = Path(path).absolute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, path.parent, "making the folder") from None
    with _locked(path.with_name(f".{path.name}.lock"), repr(str(path)), "one writer of a folder"):
        return _replace_dir(path, write)


def _replace_dir(path: Path, write: Callable[[Path], object]) -> Path:
    fresh, old = path.with_name(f".{path.name}.new"), path.with_name(f".{path.name}.old")
    try:
        recover_dir(path)
        for leftover in (fresh, old):
            shutil.rmtree(leftover, ignore_errors=True)
        fresh.mkdir()
        write(fresh)
        pause_point("replace_dir:written")
        if path.exists() and _exchange(fresh, path):
            pause_point("replace_dir:exchanged")
            shutil.rmtree(fresh)  # now the old folder
            return path
        if path.exists():
            path.rename(old)
            pause_point("replace_dir:moved_old")
        fresh.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as err:  # the half-made folder goes, the old one stays; an OS refusal is one line
        shutil.rmtree(fresh, ignore_errors=True)
        recover_dir(path)
        if isinstance(err, OSError) or is_disk_full(err):
            raise os_error(err, path, "writing the folder") from None
        raise
    return path


def recover_dir(path: str | Path) -> None:
    """Put back the old folder that a stop between ``replace_dir``'s two renames left as ``.NAME.old``."""
    path = Path(path)
    if not path.name:
        return
    old = path.with_name(f".{path.name}.old")
    if not path.exists() and old.is_dir():
        with contextlib.suppress(OSError):  # a folder we may not write in: left as it is, said by its reader
            old.rename(path)


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where that is not available."""
    renameat2 = getattr(_libc(), "renameat2", None)
    if renameat2 is None:
        return False
    at_cwd = -100
    done = renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), _RENAME_EXCHANGE)
    if done == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


@functools.cache
def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def pause_point(name: str) -> None:
    """Where a test stops a writer at a dangerous moment: with ``NEUROSHARD_PAUSE_AT=name`` in the environment,
    touch ``$NEUROSHARD_PAUSE_FILE`` and wait there until killed. Nothing otherwise."""
    if os.environ.get("NEUROSHARD_PAUSE_AT") != name:
        return
    Path(os.environ["NEUROSHARD_PAUSE_FILE"]).touch()
    while True:
        time.sleep(1)


def _command(width: int = 100) -> str:
    """This process's command line as typed (``python -m MODULE ...``), cut to ``width`` characters."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec:
        head = f"python -m {spec.name.removesuffix('.__main__')}"
    else:
        head = "python -c" if sys.argv[:1] == ["-c"] else " ".join(sys.argv[:1]) or "python"
    line = " ".join([head, *sys.argv[1:]])
    return line if len(line) <= width else line[: width - 3] + "..."


WRITER_FILE = ".writer"
_held: dict[Path, int] = {}  # lock files this process holds, and how many holders deep


@contextlib.contextmanager
def one_writer(folder: str | Path, key: str = "out_dir", expected: str = "one writer per dataset") -> Iterator[Path]:
    """Hold ``folder``'s writer lock for the block (made if absent; an advisory ``flock`` on ``folder/.writer``,
    released by the OS even on kill -9). A second process that asks is refused in one UserError naming the
    folder and the process writing it; the same process may nest (collect inside adapt)."""
    folder = Path(folder).resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, folder, "making the output folder") from None
    with _locked(folder / WRITER_FILE, f"{key}: {str(folder)!r}", expected):
        pause_point("one_writer:held")
        yield folder


@contextlib.contextmanager
def _locked(lock_file: Path, what: str, expected: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``lock_file`` for the block, or one UserError "``what`` is being written by
    <its holder>; expected ``expected``" (the holder's pid, host, command and start are in the file)."""
    if lock_file in _held:
        _held[lock_file] += 1
        try:
            yield
        finally:
            _held[lock_file] -= 1
        return
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise os_error(err, lock_file, "opening the lock file") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            raise UserError(
                f"{what} is being written by {holder}; expected {expected}: wait for it to end or give another folder"
            ) from None
        with contextlib.suppress(OSError):  # who holds it is said to the next writer if there is room to say it
            line = f"pid {os.getpid()} on {socket.gethostname()} ({_command()}), since {now_utc()}\n".encode()
            os.pwrite(fd, line, 0)
            os.ftruncate(fd, len(line))
        _held[lock_file] = 1
        try:
            yield
        finally:
            del _held[lock_file]
    finally:
        os.close(fd)  # closing releases the lock
