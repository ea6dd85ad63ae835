"""Files: append-only JSONL logs that survive kill -9, JSON files read with one-line errors, atomic writes.

A record is one line. Appends are flushed and fsynced one by one; on open, a torn last line (a
write cut by a kill) is cut off, so a file holds only whole records. Each record has a unique
``id``; a resumed collection skips the ids it finds.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from neuroshard_jax.core.errors import UserError, os_error

logger = logging.getLogger(__name__)

# A JSON document: what a file, a plan.json, a manifest or the worker's pipe holds. A function returns one (or takes
# one) only where the document is the point; everything else passes typed records.
JSONDoc = dict[str, Any]


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
            logger.warning(
                "%s: dropped a torn last line (%d bytes, no newline) left by an interrupted write; its record is "
                "made again",
                self.path,
                len(data) - keep,
            )
            with open(self.path, "r+b") as f:
                f.truncate(keep)

    def records(self) -> Iterator[JSONDoc]:
        """The log's records, the first of each id (a log two writers of an older version doubled)."""
        if not self.path.exists():
            return
        with open(self.path) as f:
            yield from _first_of_each_id(_record(line, self.path, n) for n, line in enumerate(f, 1) if line.strip())

    def write_record(self, record: JSONDoc) -> None:
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


MAX_JSON_BYTES = 1 << 30  # a task, plan or meta file past 1 GiB is not one of ours


def read_json(path: str | Path, key: str, expected: str = "a JSON file") -> JSONDoc:
    """The JSON object in ``path``; a missing, unreadable, torn or non-object file is one UserError naming
    ``key`` (the setting or file kind), the file, the line and what was expected."""
    path = Path(path)
    try:
        if path.exists() and not path.is_file():  # a folder, a FIFO (blocks), a device (/dev/zero: never ends)
            raise UserError(f"{key}: {str(path)!r} is not a regular file, expected {expected}")
        if path.exists() and path.stat().st_size > MAX_JSON_BYTES:
            raise UserError(
                f"{key}: {str(path)!r} holds {path.stat().st_size / 2**20:.0f} MiB, expected {expected} of at most "
                f"{MAX_JSON_BYTES // 2**20} MiB"
            )
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
    except RecursionError:  # Python's JSON reader recurses once a level: ~1,000 levels end it
        raise UserError(f"{key}: {str(path)!r} is nested too deep to read, expected {expected}") from None
    if not isinstance(obj, dict):
        raise UserError(f"{key}: {str(path)!r} holds a JSON {type(obj).__name__}, expected {expected} with an object")
    return obj


def read_jsonl(path: str | Path) -> list[JSONDoc]:
    """The whole records of a JSONL file, read without modifying it (a writer may still be appending): a torn
    last line is left out with a warning; a corrupt line before it is an error naming the file and line."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"dataset: {str(path)!r} does not exist")
    if not path.is_file():  # a FIFO would block the read, a device never end it
        raise UserError(f"dataset: {str(path)!r} is not a regular file, expected a JSONL file")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UserError(f"dataset: cannot read {str(path)!r} ({err.strerror or err})") from None
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    if torn.strip():
        logger.warning("%s: left out a torn last line (%d bytes, no newline)", path, len(torn))
    every = [_record(line, path, n) for n, line in enumerate(lines, 1) if line.strip()]
    records = list(_first_of_each_id(every))
    if len(records) < len(every):
        logger.warning(
            "%s: left out %d records whose id an earlier line has (two writers at once?); the first of each is kept",
            path,
            len(every) - len(records),
        )
    return records


def _first_of_each_id(records: Iterable[JSONDoc]) -> Iterator[JSONDoc]:
    """The first record of each id (a dataset two writers of an older version doubled holds each twice)."""
    seen = set()
    for record in records:
        if record["id"] not in seen:
            seen.add(record["id"])
            yield record


def _record(line: str | bytes, path: Path, number: int) -> JSONDoc:
    """One JSONL line as a record (a JSON object with an ``id``); else a UserError naming the file and line."""
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError):  # torn, or nested past what the reader recurses
        record = None
    if not isinstance(record, dict) or "id" not in record:
        raise UserError(f"dataset: {str(path)!r} line {number} is not a JSON record; expected one object per line")
    return record


def read_records(path: str | Path, ok_only: bool = True) -> list[JSONDoc]:
    return [r for r in read_jsonl(path) if r.get("ok", True) or not ok_only]


def now_utc() -> str:
    """This moment in UTC, ISO 8601 to the second: when a manifest or checkpoint was written."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def write_json(obj: JSONDoc, path: str | Path) -> Path:
    """Write atomically (a reader never sees half a file)."""
    return write_text(path, json.dumps(obj, indent=1) + "\n")


def output_file(path: str | Path, key: str) -> Path:
    """``path`` as a file this process can write, its folder made: before any work, one UserError naming ``key``
    where it cannot be (a folder there, a file where a folder should be, no permission)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{key}: {str(path)!r} is a folder, expected a file's path")
    above = next((folder for folder in path.parents if folder.exists()), None)
    if above is not None and not above.is_dir():
        raise UserError(f"{key}: {str(path)!r} lies under {str(above)!r}, which is a file; expected a folder there")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        cause = getattr(err, "strerror", None) or str(err)
        raise UserError(f"{key}: {str(path)!r} cannot be written ({cause}), expected a path in a folder") from None
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise UserError(f"{key}: {str(path)!r} cannot be written (no permission), expected a folder you can write")
    return path


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
