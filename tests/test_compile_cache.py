"""Compiled search kernels are kept by JAX's own persistent compilation cache (``$NEUROSHARD_CACHE_DIR/jax``,
``search.pipeline.keep_compiled_kernels``): a plan in one process fills it, a second process planning the same task
reads every kernel from it and adds nothing. Nothing the package reads from the cache folder is unpickled, and
nothing reaches into JAX's private modules."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

# A child process: plan a small task with the analytic model (beam: the grid and scoring kernels), counting JAX's
# persistent-cache events (jax.monitoring, public), and print the counts as JSON.
_CHILD = textwrap.dedent(
    """
    import collections, json, warnings
    import jax.monitoring
    import neuroshard_jax as nsj

    events = collections.Counter()
    jax.monitoring.register_event_listener(lambda name, **kwargs: events.update([name]))
    tables = [{"rows": 1000 * (i + 1), "dim": 8 * (1 + i % 4), "pooling_factor": 1.0 + i % 3} for i in range(12)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # estimated statistics for made-up tables
        plan = nsj.plan(tables, 2, 1.0, "beam", "analytic")
    print(json.dumps({
        "hits": events["/jax/compilation_cache/cache_hits"],
        "misses": events["/jax/compilation_cache/cache_misses"],
        "cost": plan.costs.cost_ms,
    }))
    """
)


def _plan_in_child(cache, **env) -> dict:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    child_env.update(NEUROSHARD_CACHE_DIR=str(cache), JAX_PLATFORMS="cpu", **env)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, cwd=REPO, env=child_env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _files(folder) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


class _Planted:
    """A pickle that, were it ever unpickled, would write ``marker`` (as a planted file could run any code)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_second_process_reads_every_search_kernel_from_jaxs_cache_and_no_planted_file_is_run(tmp_path):
    cache, marker = tmp_path / "cache", tmp_path / "ran"
    # files where the former store kept its pickled executables, and beside them: none may be loaded
    for name in (
        "executables/searchers.grid.grid_search-0f9b7d70808594dcbf72ecaf270de77e3162cd0a.bin",
        "executables/neuroshard_jax.costs.scoring.single_shard_costs-d8314edb3d5d122dfcc81e3da0ba12346bb5d99e.bin",
        "kernels.pkl",
    ):
        (cache / name).parent.mkdir(parents=True, exist_ok=True)
        (cache / name).write_bytes(pickle.dumps(_Planted(marker)))

    first = _plan_in_child(cache)
    kept = _files(cache / "jax")
    assert first["misses"] > 0 and first["hits"] == 0  # a fresh folder: every kernel compiled...
    assert len(kept) >= first["misses"]  # ...and kept (none is too quick to compile to be kept)
    assert (cache / "jax").stat().st_mode & 0o077 == 0  # executables are code: the folder is the user's alone

    second = _plan_in_child(cache)
    assert second["hits"] >= first["misses"] and second["misses"] == 0, (first, second)  # read, none compiled
    assert _files(cache / "jax") == kept  # nothing new written
    assert second["cost"] == first["cost"]
    assert not marker.exists()  # no planted file was unpickled


def test_a_cache_folder_the_user_set_for_jax_is_kept(tmp_path):
    """``JAX_COMPILATION_CACHE_DIR`` (or ``jax_compilation_cache_dir`` set in the process) wins over ours, with the
    user's own settings: here every compile kept (JAX's default keeps only those over a second, which a quick
    machine may not reach)."""
    own = tmp_path / "own"
    settings = {"JAX_COMPILATION_CACHE_DIR": str(own), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    _plan_in_child(tmp_path / "cache", **settings)
    assert _files(own) and not (tmp_path / "cache" / "jax").exists()


@pytest.mark.fast
def test_no_private_jax_api_and_no_unpickling_in_the_packages():
    pattern = re.compile(r"jax\._src|serialize_executable|\bpickle\.loads?\(|^\s*(import|from) (cloud)?pickle\b", re.M)
    found = [
        f"{path.relative_to(REPO)}: {match.group(0).strip()}"
        for package in ("neuroshard_jax", "searchers")
        for path in sorted((REPO / package).rglob("*.py"))
        for match in pattern.finditer(path.read_text())
    ]
    assert found == []
