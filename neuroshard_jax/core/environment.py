"""The process environment JAX reads, checked before any work: one line where it would make JAX fail later with
another message. No Hydra here: the library (``Planner.run``) and the commands (``core.cli``) both call it."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

from neuroshard_jax.core.errors import UserError

TRUE_WORDS = ("y", "yes", "t", "true", "on", "1")


def check_jax_environment() -> None:
    """``_jax_environment`` of this process's environment (a library's callers: ``Planner.run``; a setting that
    passed is not tried again)."""
    _jax_environment(*(os.environ.get(k, "") for k in ("JAX_ENABLE_X64", "XLA_FLAGS", "JAX_PLATFORMS")))


@functools.cache  # an environment that passed, once a process (a failing one raises: nothing kept)
def _jax_environment(x64: str, flags: str, platforms: str) -> None:
    """One UserError naming the variable where the environment would make JAX fail later with another message: 64-bit
    mode (the cost models and their saved state are float32: the restore would blame the model), a ``JAX_PLATFORMS``
    this machine cannot start (XLA's bare AssertionError), flags in ``XLA_FLAGS`` this XLA does not know (XLA ends
    the process with its own fatal line). The platforms and flags are tried in a child process, only where they are
    set (``cpu`` alone always starts); nothing is run otherwise."""
    if x64.strip().lower() in TRUE_WORDS:  # JAX's own reading of a boolean variable
        raise UserError(
            f"JAX_ENABLE_X64: got {x64!r}, expected it unset or 0: the cost models and their saved state are float32"
        )
    if not flags and platforms.strip().lower() in ("", "cpu"):
        return
    try:
        tried = subprocess.run(
            [sys.executable, "-c", "import jax; jax.devices()"],
            capture_output=True,
            text=True,
            env=dict(os.environ),
            timeout=120,
        )
    except subprocess.TimeoutExpired:  # a device that starts slowly: the command finds out for itself
        return
    if tried.returncode == 0:
        return
    lines = tried.stderr.strip().splitlines()
    unknown = [line for line in lines if "Unknown flag" in line]
    if flags and unknown:
        said = unknown[0].split("] ", 1)[-1]
        raise UserError(f"XLA_FLAGS: got {flags!r:.120}: {said}; expected flags this XLA knows, or no XLA_FLAGS")
    if platforms:
        why = (lines or ["no message"])[-1][:120]
        raise UserError(
            f"JAX_PLATFORMS: got {platforms!r}, but JAX cannot start it on this machine ({why}); expected a "
            "platform it has (cpu), or JAX_PLATFORMS unset"
        )
