"""``python -m neuroshard_jax.kernels.worker <command>``: the commands of the package docstring."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from pathlib import Path

from neuroshard_jax.kernels.messages import ExportJob, PlanJob
from neuroshard_jax.kernels.worker.comm import run_rank
from neuroshard_jax.kernels.worker.dlrm import dlrm_to_npz
from neuroshard_jax.kernels.worker.tbe import serve
from neuroshard_jax.kernels.worker.torchrec_jobs import (
    torchrec_export,
    torchrec_memory,
    torchrec_plan,
    torchrec_run,
    torchrec_steps,
)


def die_with_parent() -> None:
    """On Linux, ask to be killed when the process (strictly: the thread) that started this worker ends, so a
    collection or evaluation killed with kill -9 leaves no kernel workers or rank processes behind; exit at once
    if that parent is already gone."""
    parent = os.environ.get("NEUROSHARD_PARENT_PID")
    if not parent or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):
        raise SystemExit("the process that started this worker is gone")


def pin_to_core() -> None:
    """Run on the one core ``NEUROSHARD_CORE`` names (``processes.run_ranks``), before any thread starts."""
    core = os.environ.get("NEUROSHARD_CORE")
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(core)})


def main(argv: list[str]) -> None:
    die_with_parent()
    pin_to_core()
    if argv == ["serve"]:
        serve()
        return
    if len(argv) == 6 and argv[0] == "comm":
        run_rank(int(argv[1]), int(argv[2]), argv[3], argv[4], argv[5])
        return
    if len(argv) == 3 and argv[0] == "dlrm-to-npz":
        try:
            dlrm_to_npz(argv[1], argv[2])
        except (OSError, RuntimeError, ValueError) as err:
            raise SystemExit(f"{type(err).__name__}: {err}") from None
        return
    if len(argv) == 3 and argv[0] == "torchrec-export":
        result = torchrec_export(ExportJob.from_json(json.loads(Path(argv[1]).read_text())), argv[2])
        print(json.dumps(result.to_json()))
        return
    if len(argv) == 6 and argv[0] == "torchrec-run":
        torchrec_run(int(argv[1]), int(argv[2]), argv[3], argv[4], argv[5])
        return
    if len(argv) == 6 and argv[0] == "torchrec-steps":
        torchrec_steps(int(argv[1]), int(argv[2]), argv[3], argv[4], argv[5])
        return
    if len(argv) == 6 and argv[0] == "torchrec-memory":
        torchrec_memory(int(argv[1]), int(argv[2]), argv[3], argv[4], argv[5])
        return
    if len(argv) == 3 and argv[0] == "torchrec-plan":
        result = torchrec_plan(PlanJob.from_json(json.loads(Path(argv[1]).read_text())))
        Path(argv[2]).write_text(json.dumps(result.to_json()))
        return
    raise SystemExit(
        "usage: python -m neuroshard_jax.kernels.worker serve | comm ... | dlrm-to-npz IN OUT | torchrec-plan IN OUT | "
        "torchrec-export IN OUT | torchrec-run RANK WORLD INIT IN OUT | torchrec-steps RANK WORLD INIT IN OUT | "
        "torchrec-memory RANK WORLD INIT IN OUT "
        f"(got {argv})"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
