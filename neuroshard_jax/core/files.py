"""Files: measured datasets (append-only JSONL files that survive kill -9, plus their manifest), atomic JSON
writes, and the paths of what ships inside the package.

A record is one line. Appends are flushed and fsynced one by one; on open, a torn last line (a
write cut by a kill) is cut off, so a file holds only whole records. Each record has a unique
``id``; a resumed collection skips the ids it finds.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import datetime
import errno
import fcntl
import functools
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from neuroshard_jax.core.errors import UserError, is_disk_full, os_error


class JsonlLog:
    """Append-only record log keyed by ``id`` (thread-safe appends)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()
        self.ids = {record["id"] for record in self.records()}
        self._lock = threading.Lock()

    def _repair(self) -> None:
        """Cut a torn last line (an interrupted append) before appending again, and say what was dropped."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            print(
                f"warning: {self.path}: dropped a torn last line ({len(data) - keep} bytes, no newline) left by an "
                "interrupted write; its record is made again",
                file=sys.stderr,
            )
            with open(self.path, "r+b") as f:
                f.truncate(keep)

    def records(self) -> Iterator[dict]:
        """The log's records, the first of each id (a log two writers of an older version doubled)."""
        if not self.path.exists():
            return
        with open(self.path) as f:
            yield from _first_of_each_id(_record(line, self.path, n) for n, line in enumerate(f, 1) if line.strip())

    def append(self, record: dict) -> None:
        """Append one record (skipped if its id is in the log). A write the OS refuses (a full disk) is cut back
        to the last whole record and raised as one UserError naming the file and the cause: the records before
        it stay, and a rerun once there is room makes this one again."""
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            if record["id"] in self.ids:
                return
            size = self.path.stat().st_size if self.path.exists() else 0
            try:
                with open(self.path, "a") as f:
                    f.write(line)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as err:
                with contextlib.suppress(OSError), open(self.path, "r+b") as f:
                    f.truncate(size)
                raise os_error(err, self.path, "appending a record to") from None
            self.ids.add(record["id"])


def read_json(path: str | Path, key: str, expected: str = "a JSON file") -> dict:
    """The JSON object in ``path``; a missing, unreadable, torn or non-object file is one UserError naming
    ``key`` (the setting or file kind), the file, the line and what was expected."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{key}: {str(path)!r} does not exist, expected {expected}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{key}: cannot read {str(path)!r} ({err}), expected {expected}") from None
    except json.JSONDecodeError as err:
        raise UserError(
            f"{key}: {str(path)!r} line {err.lineno} is not valid JSON ({err.msg}; torn by an interrupted write?), "
            f"expected {expected}"
        ) from None
    if not isinstance(obj, dict):
        raise UserError(f"{key}: {str(path)!r} holds a JSON {type(obj).__name__}, expected {expected} with an object")
    return obj


def read_jsonl(path: str | Path) -> list[dict]:
    """The whole records of a JSONL file, read without modifying it (a writer may still be appending): a torn
    last line is left out and said on stderr; a corrupt line before it is an error naming the file and line."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"dataset: {str(path)!r} does not exist")
    data = path.read_bytes()
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    if torn.strip():
        print(f"warning: {path}: left out a torn last line ({len(torn)} bytes, no newline)", file=sys.stderr)
    every = [_record(line, path, n) for n, line in enumerate(lines, 1) if line.strip()]
    records = list(_first_of_each_id(every))
    if len(records) < len(every):
        print(
            f"warning: {path}: left out {len(every) - len(records)} records whose id an earlier line has (two "
            "writers at once?); the first of each is kept",
            file=sys.stderr,
        )
    return records


def _first_of_each_id(records: Iterable[dict]) -> Iterator[dict]:
    """The first record of each id (a dataset two writers of an older version doubled holds each twice)."""
    seen = set()
    for record in records:
        if record["id"] not in seen:
            seen.add(record["id"])
            yield record


def _record(line: str | bytes, path: Path, number: int) -> dict:
    """One JSONL line as a record (a JSON object with an ``id``); else a UserError naming the file and line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        record = None
    if not isinstance(record, dict) or "id" not in record:
        raise UserError(f"dataset: {str(path)!r} line {number} is not a JSON record; expected one object per line")
    return record


def read_records(path: str | Path, ok_only: bool = True) -> list[dict]:
    return [r for r in read_jsonl(path) if r.get("ok", True) or not ok_only]


ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile")


def hardware() -> dict[str, Any]:
    """``_hardware()``, read once per process (a copy: /proc/cpuinfo and ``nvidia-smi`` do not change under it)."""
    return copy.deepcopy(_hardware())


@functools.cache
def _hardware() -> dict[str, Any]:
    """This machine as a dataset's manifest records it. ``cpu`` (the model name) is not enough to tell kinds
    apart: this project's machines all print "AMD EPYC", from Zen 3 (family 25 model 1) to Zen 4 (model 17), and
    the same shard measures 1.75x faster on the latter. So ``cpu_id`` (vendor, family, model: the
    microarchitecture), the ISA extensions the kernels can use, the clock and the GPU (where ``nvidia-smi`` runs)
    are recorded too; ``hardware_kind`` is what must match."""
    info = _cpuinfo()
    found = {
        "cpu": info.get("model name") or platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "system": platform.system(),
    }
    if "cpu family" in info and "model" in info:
        found["cpu_id"] = f"{info.get('vendor_id', '?')} family {info['cpu family']} model {info['model']}"
        found["stepping"] = info.get("stepping")
        flags = set(info.get("flags", "").split())
        found["isa"] = [f for f in ISA_FLAGS if f in flags]
        found["mhz"] = round(float(info["cpu MHz"])) if "cpu MHz" in info else None
    gpu = _gpu_name()
    if gpu:
        found["gpu"] = gpu
    return found


def hardware_kind(found: dict | None, device: str | None = "cpu") -> str:
    """One string per kind of hardware: the CPU's name and its microarchitecture where recorded, and on
    ``device="cuda"`` the GPU. Manifests written before 2026-11-24 lack ``cpu_id``; theirs reads
    "<name> [model not recorded]", a kind of its own."""
    found = found or {}
    kind = f"{found.get('cpu', 'unknown')} [{found.get('cpu_id', 'model not recorded')}]"
    return f"{kind} + {found.get('gpu', 'GPU not recorded')}" if device == "cuda" else kind


PROTOCOL_KEYS = ("device", "optimizer", "precision", "protocol", "warmup", "iters", "pin")
TIMED_KEYS = ("warmup_ms", "measure_ms", "max_iters")  # the ``timed`` and ``graph`` protocols' own


def label_protocol(settings: dict) -> dict:
    """How a dataset's labels were timed, from its manifest's settings: the device, the step measured (optimizer,
    precision), the protocol (``fixed``: warm-up and timed iterations, the label their median; ``timed``: warm-up
    and timed iterations by kernel time; ``graph``: ``timed`` over CUDA-graph replays), and whether each worker had
    a core of its own (``pin``; absent: not pinned). Plan labels record no precision: theirs is collect's fp32."""
    absent = {"pin": False, "precision": "fp32", "protocol": "fixed"}
    found = {k: settings.get(k, absent.get(k)) for k in PROTOCOL_KEYS}
    return {**found, **{k: settings[k] for k in TIMED_KEYS if found["protocol"] != "fixed"}}


def manifest_kinds(manifest: dict) -> list[str]:
    """The kinds of hardware a dataset's labels hold for: the kind it was measured on, then every kind a
    ``python -m neuroshard_jax.probe record=true`` run found to measure like it (``probes`` in the manifest, each
    with its measured ratio): one CPU name spans several kinds, and one kind may be recorded under two names (a dataset
    from before ``cpu_id`` was recorded)."""
    device = manifest.get("settings", {}).get("device")
    probed = [p["kind"] for p in manifest.get("probes", ()) if p.get("same_kind") and p.get("kind")]
    return list(dict.fromkeys([hardware_kind(manifest.get("hardware"), device), *probed]))


def common_kinds(manifests: list[dict]) -> list[str]:
    """The kinds of hardware every dataset's labels hold for (``manifest_kinds``), in the first one's order."""
    kinds = manifest_kinds(manifests[0])
    return [k for k in kinds if all(k in manifest_kinds(m) for m in manifests[1:])]


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                if info:
                    break
                continue
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def _gpu_name() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = sorted({line.strip() for line in done.stdout.splitlines() if line.strip()})
    return ", ".join(names) if done.returncode == 0 and names else None


def git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
        return done.stdout.strip() or None
    except OSError:
        return None


def write_manifest(path: Path, settings: dict, extra: dict) -> dict:
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
        keys = [*settings, *(k for k in ("protocol", *TIMED_KEYS, "pin") if k in manifest["settings"])]
        for key in dict.fromkeys(keys):
            value = settings.get(key)
            if manifest["settings"].get(key) != value:
                raise UserError(
                    f"{key}: got {value!r}, but the dataset in {str(path.parent)!r} was collected with "
                    f"{manifest['settings'].get(key)!r}; expected the same settings or another out_dir"
                )
    else:
        manifest = {"settings": settings, "created": now_utc()}
    manifest.update(extra)
    manifest["updated"] = now_utc()
    write_text(path, json.dumps(manifest, indent=1) + "\n")
    return manifest


def now_utc() -> str:
    """This moment in UTC, ISO 8601 to the second: when a manifest or checkpoint was written."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def write_json(obj: dict[str, Any], path: str | Path) -> Path:
    """Write atomically (a reader never sees half a file)."""
    return write_text(path, json.dumps(obj, indent=1) + "\n")


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically: into ``path.tmp``, then renamed over ``path``. A write the OS refuses
    (a full disk, no permission) leaves ``path`` as it was, removes the ``.tmp`` and is one UserError naming the
    path and the cause."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise os_error(err, path, "writing") from None
    return path


# ---------------------------------------------------------------------------------------------
# Folders replaced whole, and one writer per dataset


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
def one_writer(folder: str | Path, key: str = "out_dir") -> Iterator[Path]:
    """Hold ``folder``'s writer lock for the block (made if absent; an advisory ``flock`` on ``folder/.writer``,
    released by the OS even on kill -9). A second process that asks is refused in one UserError naming the
    folder and the process writing it; the same process may nest (collect inside adapt)."""
    folder = Path(folder).resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, folder, "making the output folder") from None
    with _locked(folder / WRITER_FILE, f"{key}: {str(folder)!r}", "one writer per dataset"):
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


def cache_dir() -> Path:
    """This user's folder for what the project makes and keeps (pool features, compiled search kernels, the models
    ``adapt`` made): ``$NEUROSHARD_CACHE_DIR``, default ``~/.cache/neuroshard_jax``."""
    return Path(os.environ.get("NEUROSHARD_CACHE_DIR", Path.home() / ".cache" / "neuroshard_jax"))


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


def load_manifest(dataset_dir: Path, kind: str) -> dict:
    path = Path(dataset_dir) / f"manifest-{kind}.json"
    return read_json(path, "dataset", f"the manifest of a {kind} dataset collected by neuroshard_jax.collect")


def pool_file_digest(path: Path) -> str:
    """A DLRM benchmark file's identity (path, size, mtime): its pool id and its cache key."""
    if not path.is_file():
        raise UserError(f"pool.path: {str(path)!r} does not exist or is not a file, expected a DLRM benchmark file")
    stat = path.stat()
    return hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:12]
