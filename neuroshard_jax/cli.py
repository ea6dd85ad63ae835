"""Helpers shared by the Hydra entry points: config translation and user-facing failures."""

from __future__ import annotations

import sys
from importlib import resources
from typing import NoReturn

from neuroshard_jax.errors import UserError
from neuroshard_jax.tables import PoolSpec
from neuroshard_jax.tasks import TaskConfig

CONFIG_GROUPS = ("searcher", "task", "cost_model", "experiment")


def fail(err: Exception) -> NoReturn:
    """Print a one-line error and exit with code 2 (no traceback: the input was wrong, not the code)."""
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)


def group_options(group: str) -> list[str]:
    """Names of the options of a config group (the YAML stems under conf/<group>/)."""
    folder = resources.files("neuroshard_jax.conf") / group
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def check_group_overrides(argv: list[str]) -> None:
    """Reject ``searcher=nope`` before Hydra does (Hydra exits 1 with a multi-line message)."""
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key.lstrip("+~") not in CONFIG_GROUPS or value.startswith(("glob(", "choice(", "range(")):
            continue
        known = group_options(key.lstrip("+~"))
        for name in value.split(","):
            if name not in known:
                fail(UserError(f"{key.lstrip('+~')}: got {name!r}, expected one of {', '.join(known)}"))


def task_config(options: dict):
    """TaskConfig from the resolved ``task`` group (path and seed are handled by the caller)."""
    fields = {k: v for k, v in options.items() if k not in ("path", "seed", "style")}
    pool = fields.pop("pool", None) or {}
    dims = tuple(fields.pop("dims", ()) or ())
    try:
        return TaskConfig(**fields, dims=dims, pool=PoolSpec(**pool))
    except TypeError as err:
        raise UserError(f"task: {err}") from None
