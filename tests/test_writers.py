"""What happens around the data: two writers of one dataset, a kill -9 inside a checkpoint save, a full disk, a
Ray address where nothing listens. Nothing already written is lost; each is one ``error:`` line."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from neuroshard_jax.core import cli, folders
from neuroshard_jax.core.cli import one_line_errors
from neuroshard_jax.core.constants import SHIPPED_MODEL_NAME
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JsonlLog, read_records, write_json
from neuroshard_jax.core.folders import one_writer, replace_dir
from neuroshard_jax.core.manifests import write_manifest
from neuroshard_jax.costs.checkpoints import load_ensemble, save_ensemble
from neuroshard_jax.costs.choice import checkpoint_path
from neuroshard_jax.kernels.executors import ExecutorConfig, connect
from neuroshard_jax.learn.cost_labels import collect
from neuroshard_jax.learn.datasets import compute_batches, split_indices
from neuroshard_jax.learn.fine_tune import adapt
from tests.conftest import REPO
from tests.test_adapt import small_config
from tests.test_profiling import _collect_config

COLLECT_ARGS = [
    "num_samples=6",
    "progress=false",
    "pool.num_tables=120",
    "batch_size=256",
    "warmup=1",
    "iters=3",
    "sampler.max_tables=3",
    "sampler.mem_cap_gb=0.05",
]


def _paused(cmd: list[str], where: str, pause_file: Path) -> subprocess.Popen:
    """``cmd`` started and stopped at the pause point ``where`` (``folders.pause_point``)."""
    env = {**os.environ, "NEUROSHARD_PAUSE_AT": where, "NEUROSHARD_PAUSE_FILE": str(pause_file)}
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not pause_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{cmd} never reached {where}: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    return proc


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def _error_line(done: subprocess.CompletedProcess) -> str:
    """The run's one ``error:`` line, checked to be the only line of its stderr that is ours."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    [line] = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    return line


# ---------------------------------------------------------------------------------------------
# one writer per dataset


def test_a_second_collect_into_a_dataset_being_written_is_refused_and_nothing_is_doubled(tmp_path):
    """The first collect holds the folder (stopped just after taking it); the second is one line naming the
    folder and the first's process, writing nothing. Once the first is gone (kill -9 frees the lock), the
    second runs and every sample is there once."""
    out = tmp_path / "data"
    first = _paused(
        [sys.executable, "-m", "neuroshard_jax.collect", f"out_dir={out}", *COLLECT_ARGS],
        "one_writer:held",
        tmp_path / "paused",
    )
    try:
        line = _error_line(_cli("neuroshard_jax.collect", f"out_dir={out}", *COLLECT_ARGS))
        assert f"out_dir: {str(out)!r} is being written by pid {first.pid} on" in line
        assert "neuroshard_jax.collect" in line and "expected one writer per dataset" in line
        assert not (out / "compute.jsonl").exists() and not (out / "manifest-compute.json").exists()
    finally:
        _kill(first)
    summary = collect(_collect_config(out, 6))
    ids = [r["id"] for r in read_records(out / "compute.jsonl", ok_only=False)]
    assert summary["records"] == 6 and sorted(ids) == list(range(6))


HOLD = (
    "import sys, time\n"
    "from neuroshard_jax.core.folders import one_writer\n"
    "with one_writer(sys.argv[1]):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(600)\n"
)


def _held_by_another(folder: Path) -> subprocess.Popen:
    """A process holding ``folder``'s writer lock until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.fast
def test_one_writer_nests_in_one_process_and_frees_the_folder_for_others_after(tmp_path):
    folder = tmp_path / "nested"
    with one_writer(folder), one_writer(folder / "."):  # collect inside adapt, the same folder
        assert f"pid {os.getpid()}" in (folder / folders.WRITER_FILE).read_text()
    other = _held_by_another(folder)  # taken by another process once this one let go
    try:
        with pytest.raises(UserError, match=rf"is being written by pid {other.pid} on .*python -c"):
            with one_writer(folder):
                pass
    finally:
        _kill(other)
    with one_writer(folder):  # freed by the kill
        pass


@pytest.mark.fast
def test_adapt_into_a_folder_being_written_is_refused_before_measuring(tmp_path):

    other = _held_by_another(tmp_path / "run")
    try:
        with pytest.raises(UserError, match=r"out: '.*run' is being written by pid .*expected one writer per dataset"):
            adapt(small_config(tmp_path))
    finally:
        _kill(other)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [folders.WRITER_FILE]


@pytest.mark.fast
def test_training_reads_a_doubled_dataset_as_the_single_one(tmp_path, caplog):
    """What ``train`` reads of a dataset whose every record is there twice equals what it reads of the dataset:
    the same arrays, so the seeded split puts each sample in one part."""

    shipped = REPO / "neuroshard_jax" / "data" / "profiles" / "epyc26-specs"
    lines = (shipped / "compute.jsonl").read_text().splitlines()[:40]
    for name, copies in (("single", 1), ("doubled", 2)):
        (tmp_path / name).mkdir()
        shutil.copy(shipped / "manifest-compute.json", tmp_path / name)
        (tmp_path / name / "compute.jsonl").write_text("\n".join(lines * copies) + "\n")
    single, doubled = (compute_batches(tmp_path / name) for name in ("single", "doubled"))
    assert "left out 40 records whose id an earlier line has" in caplog.text
    for a, b in zip(single[:4], doubled[:4]):
        np.testing.assert_array_equal(a, b)


def test_readers_drop_repeated_ids_with_a_warning_and_training_splits_by_sample(tmp_path, caplog):
    """A dataset that two writers of an older version doubled: each sample is read once (the first line of its
    id), so no sample is in two of the train / validation / test splits."""

    lines = [json.dumps({"id": i % 20, "ok": True, "ms": float(i)}) for i in range(40)]
    (tmp_path / "compute.jsonl").write_text("\n".join(lines) + "\n")
    records = read_records(tmp_path / "compute.jsonl")
    assert [r["id"] for r in records] == list(range(20)) and [r["ms"] for r in records] == [float(i) for i in range(20)]
    assert [(r.levelname, r.name) for r in caplog.records] == [("WARNING", "neuroshard_jax.core.files")]
    assert "left out 20 records whose id an earlier line has" in caplog.text
    parts = [{records[i]["id"] for i in part} for part in split_indices(len(records), (0.8, 0.1, 0.1), 0)]
    assert sum(len(p) for p in parts) == 20 and not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])


# ---------------------------------------------------------------------------------------------
# checkpoints replaced whole

SAVE = (
    "import sys\n"
    "from neuroshard_jax.costs.checkpoints import load_ensemble, save_ensemble\n"
    "config, _, params, meta = load_ensemble(sys.argv[1])\n"
    "save_ensemble(sys.argv[2], config, params, {**meta, 'name': 'new'})\n"
)


@pytest.fixture(scope="module")
def shipped():
    return checkpoint_path(SHIPPED_MODEL_NAME)


def _saved_old(shipped: str, target: Path) -> None:
    config, _, params, meta = load_ensemble(shipped)
    save_ensemble(target, config, params, {**meta, "name": "old"})


@pytest.mark.parametrize(("moment", "survivor"), [("replace_dir:written", "old"), ("replace_dir:exchanged", "new")])
def test_a_kill_9_inside_a_checkpoint_save_leaves_a_loadable_model(tmp_path, shipped, moment, survivor):
    """A save over an existing model killed with the new one written beside it (the old stays), or just after
    the two traded places (the new one is there; the old one, left beside, goes at the next save)."""
    target = tmp_path / "model"
    _saved_old(shipped, target)
    proc = _paused([sys.executable, "-c", SAVE, shipped, str(target)], moment, tmp_path / "paused")
    _kill(proc)
    assert load_ensemble(target)[3]["name"] == survivor
    _saved_old(shipped, target)
    assert _beside(tmp_path) == ["model"]


def _beside(folder: Path) -> list[str]:
    """What a save left in ``folder``, its lock file aside."""
    return sorted(p.name for p in folder.iterdir() if "model" in p.name and not p.name.endswith(".lock"))


@pytest.mark.fast
def test_a_kill_9_between_the_fallback_renames_is_mended_on_load(tmp_path, shipped):
    """Where the file system cannot exchange two folders, the old one is renamed aside first: a save killed before
    the new one takes its name leaves ``.model.old``, which the next load, by path or by name, puts back."""

    target = tmp_path / "model"
    _saved_old(shipped, target)
    no_exchange = "import neuroshard_jax.core.folders as f\nf._exchange = lambda a, b: False\n" + SAVE
    _kill(_paused([sys.executable, "-c", no_exchange, shipped, str(target)], "replace_dir:moved_old", tmp_path / "p"))
    assert not target.exists() and (tmp_path / ".model.old").is_dir()
    assert load_ensemble(checkpoint_path(str(target)))[3]["name"] == "old"


@pytest.mark.fast
def test_a_second_save_into_a_folder_being_saved_is_refused(tmp_path, shipped):
    target = tmp_path / "model"
    _saved_old(shipped, target)
    proc = _paused([sys.executable, "-c", SAVE, shipped, str(target)], "replace_dir:written", tmp_path / "paused")
    try:
        with pytest.raises(UserError, match=rf"'.*model' is being written by pid {proc.pid} .*one writer of a folder"):
            _saved_old(shipped, target)
    finally:
        _kill(proc)
    assert load_ensemble(target)[3]["name"] == "old"


def test_a_failing_write_leaves_the_old_folder_and_no_half_made_one(tmp_path):
    target = tmp_path / "out"
    replace_dir(target, lambda f: (f / "a").write_text("old"))

    def broken(folder: Path) -> None:
        (folder / "a").write_text("half")
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(UserError, match=r"writing the folder '.*out' failed: Input/output error"):
        replace_dir(target, broken)
    assert (target / "a").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out"]


# ---------------------------------------------------------------------------------------------
# a full disk


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """A 2 MiB tmpfs where this user may mount one (root, as on our machines): ``fill()`` takes the rest of its
    space with a file, ``free()`` removes it. Elsewhere the folder is an ordinary one and ``fill()`` makes
    every fsync refuse with ENOSPC, as a full disk does (the in-process cases only)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True
        ).returncode
        == 0
    )

    class Disk:
        path, real = folder, mounted

        def fill(self) -> None:
            if not self.real:
                monkeypatch.setattr(os, "fsync", _no_space)
                return
            with open(folder / "filler", "ab", buffering=0) as f:
                for size in (65536, 4096, 1):  # to the last byte
                    with contextlib.suppress(OSError):
                        while True:
                            f.write(b"\0" * size)

        def free(self) -> None:
            if self.real:
                (folder / "filler").unlink()
            else:
                monkeypatch.undo()

    yield Disk()
    if mounted:
        subprocess.run(["umount", str(folder)], check=True)


def _no_space(fd):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_is_one_line_and_keeps_what_was_written(small_disk):
    """Appending a record, writing a plan.json over an old one, writing a manifest: each refusal names the path
    and says "disk full"; the log keeps its whole records, the old plan.json stays, no .tmp is left; once there
    is room again, the same writes succeed."""
    disk = small_disk.path
    log = JsonlLog(disk / "compute.jsonl")
    log.write_record({"id": 0, "ok": True})
    write_json({"plan": "old"}, disk / "plan.json")
    small_disk.fill()
    with pytest.raises(UserError, match=r"appending a record to '.*compute.jsonl' failed: disk full"):
        log.write_record({"id": 1, "ok": True, "pad": "x" * 8192})
    with pytest.raises(UserError, match=r"writing '.*plan.json' failed: disk full: no space left on device"):
        write_json({"plan": "new", "pad": "x" * 8192}, disk / "plan.json")
    with pytest.raises(UserError, match=r"writing '.*manifest-compute.json' failed: disk full"):
        write_manifest(disk / "manifest-compute.json", {"kind": "compute", "pad": "x" * 8192}, {})
    assert [r["id"] for r in read_records(disk / "compute.jsonl")] == [0]
    assert json.loads((disk / "plan.json").read_text()) == {"plan": "old"}
    assert not list(disk.glob("*.tmp"))
    small_disk.free()
    log.write_record({"id": 1, "ok": True})
    assert [r["id"] for r in read_records(disk / "compute.jsonl")] == [0, 1]


def test_a_collect_that_fills_the_disk_stops_in_one_line_and_resumes(small_disk, tmp_path):
    """The real collect on a disk with no room: exit 2, one line naming the file and "disk full", whole records
    only; with room again, the rerun completes every sample once."""
    if not small_disk.real:
        pytest.skip("no tmpfs can be mounted here (needs root): the in-process case covers the refusal")
    out = small_disk.path / "data"
    started = _cli("neuroshard_jax.collect", f"out_dir={out}", *COLLECT_ARGS[1:], "num_samples=2")
    assert started.returncode == 0, started.stderr
    small_disk.fill()
    line = _error_line(_cli("neuroshard_jax.collect", f"out_dir={out}", *COLLECT_ARGS))
    assert re.search(r"'.*/data/(compute.jsonl|manifest-compute.json)' failed: disk full: no space left", line), line
    small_disk.free()
    done = _cli("neuroshard_jax.collect", f"out_dir={out}", *COLLECT_ARGS)
    assert done.returncode == 0, done.stderr
    assert sorted(r["id"] for r in read_records(out / "compute.jsonl", ok_only=False)) == list(range(6))


@pytest.mark.fast
def test_a_plan_that_cannot_be_written_is_kept_elsewhere_in_one_line(small_disk):
    """The main job on a full disk: the finished search is not lost (written to the temporary folder, which the
    line names); exit 2, no traceback."""
    if not small_disk.real:
        pytest.skip("no tmpfs can be mounted here (needs root)")
    small_disk.fill()
    run = small_disk.path / "run"
    line = _error_line(
        _cli(
            "neuroshard_jax",
            "searcher=random",
            "cost_model=analytic",
            "task.num_tables=6",
            f"hydra.run.dir={run}",
            "hydra.output_subdir=null",
            "hydra/job_logging=disabled",
        )
    )
    match = re.search(r"output: writing '.*plan.json' failed: disk full: .*; the result is in (\S+)$", line)
    assert match, line
    spare = Path(match.group(1))
    assert json.loads(spare.read_text())["searcher"] == "random"
    spare.unlink()


@pytest.mark.fast
def test_a_checkpoint_save_on_a_full_disk_leaves_the_old_model(small_disk, shipped):
    if not small_disk.real:
        pytest.skip("no tmpfs can be mounted here (needs root)")
    target = small_disk.path / "model"
    _saved_old(shipped, target)
    small_disk.fill()
    config, _, params, meta = load_ensemble(shipped)
    with pytest.raises(UserError, match=r"disk full"):
        save_ensemble(target, config, params, {**meta, "name": "new"})
    assert load_ensemble(target)[3]["name"] == "old"
    assert _beside(small_disk.path) == ["model"]


# ---------------------------------------------------------------------------------------------
# executors fail fast


def test_a_ray_address_where_nothing_answers_is_one_line_before_anything_is_written(tmp_path):
    """Refused at once (nothing listens) and after ``connect_timeout_s`` (something listens that is no Ray
    cluster); ``out_dir`` is not made. ``pin`` is left to the executor (no ``pin=false`` needed)."""
    pytest.importorskip("ray")
    out = tmp_path / "data"
    line = _error_line(_cli("neuroshard_jax.collect", f"out_dir={out}", "executor=ray", "executor.address=127.0.0.1:1"))
    assert "executor.address: got '127.0.0.1:1', nothing answers there (Connection refused)" in line
    assert not out.exists()
    with socket_listening() as port:  # in a process of its own: Ray's connecting thread is left behind
        line = _error_line(
            _cli(
                "neuroshard_jax.collect",
                f"out_dir={out}",
                "executor=ray",
                f"executor.address=127.0.0.1:{port}",
                "executor.connect_timeout_s=2",
            )
        )
    assert "no Ray cluster answered within 2 s (executor.connect_timeout_s)" in line
    assert not out.exists()
    for address, fragment in (("[::1]:1", "nothing answers there"), ("head-node", "expected HOST:PORT")):
        with pytest.raises(UserError, match=re.escape(f"executor.address: got {address!r}, ") + f".*{fragment}"):
            connect(ExecutorConfig(name="ray", address=address, connect_timeout_s=2))


@contextlib.contextmanager
def socket_listening():
    """A TCP port that accepts connections and says nothing (not a Ray cluster)."""

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def test_an_os_refusal_anywhere_in_a_command_is_one_line(capsys, monkeypatch):
    """What no writer above converts (a report written with ``write_text``, a folder made on a full disk) still
    ends a command in one line: every Hydra main is wrapped by ``one_line_errors``."""
    monkeypatch.setattr(cli, "setup_logging", lambda: None)  # a command's logging would outlive the test (caplog)

    @one_line_errors
    def main(cfg):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "outputs/compare.md")

    with pytest.raises(SystemExit) as exit_:
        main(None)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "error: using 'outputs/compare.md' failed: disk full: no space left on device; what was written before stays\n"
    )


def test_a_second_main_run_into_a_run_folder_in_use_is_refused_before_it_writes(tmp_path):
    """Two runs of the main job into one ``hydra.run.dir`` (a script run twice, a sweep misconfigured): the first
    holds the folder from before Hydra writes its ``.hydra/`` files (stopped just after taking it); the second is one
    line naming the folder and the first's process, and leaves the folder's files as they were."""
    run = tmp_path / "run"
    args = ["searcher=size_greedy", "cost_model=analytic", f"hydra.run.dir={run}"]
    first = _paused([sys.executable, "-m", "neuroshard_jax", *args, "seed=1"], "one_writer:held", tmp_path / "paused")
    try:
        line = _error_line(_cli("neuroshard_jax", *args, "seed=2"))
        assert f"hydra.run.dir: {str(run)!r} is being written by pid {first.pid} on" in line, line
        assert "expected one run per run folder" in line
        assert not (run / ".hydra").exists() and not (run / "plan.json").exists()
    finally:
        _kill(first)
    done = _cli("neuroshard_jax", *args, "seed=2")  # the folder is free once the first is gone
    assert done.returncode == 0, done.stderr
    assert "seed=2" in (run / ".hydra" / "overrides.yaml").read_text() and (run / "plan.json").exists()


def test_a_run_writes_only_its_own_file_in_its_own_folder_and_never_over_a_finished_run(tmp_path):
    """``output=`` is a file name in the run folder (a path, absolute or with ``..``, is refused before any folder
    is made, and nothing is written there); a run into a folder that holds a finished run is refused in one line and
    the finished plan.json is left byte for byte."""
    run = tmp_path / "run"
    args = ["searcher=size_greedy", "cost_model=analytic", f"hydra.run.dir={run}"]
    assert _cli("neuroshard_jax", *args).returncode == 0
    finished = (run / "plan.json").read_bytes()
    line = _error_line(_cli("neuroshard_jax", *args, "seed=4"))
    assert f"hydra.run.dir: {str(run)!r} holds a finished run (plan.json)" in line
    assert (run / "plan.json").read_bytes() == finished
    outside = tmp_path / "outside.json"
    outside.write_text("theirs")
    for output in (str(outside), "../outside.json", "sub/plan.json", ".."):
        other = tmp_path / f"run-{abs(hash(output))}"
        line = _error_line(_cli("neuroshard_jax", *args[:2], f"hydra.run.dir={other}", f"output={output}"))
        assert f"output: got {output!r}, expected a file name" in line
        assert not other.exists() and outside.read_text() == "theirs"
