"""Kept executables (``costs.executables``): a search kernel compiled in one process runs in the next without
tracing or compiling, with the same results as ``jax.jit``; a damaged file is compiled afresh; calls under another
trace, unkeyed static arguments and a JAX persistent cache keep nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

from neuroshard_jax.costs import executables
from neuroshard_jax.costs.analytic import ANALYTIC_FNS
from neuroshard_jax.costs.cost_model import CostFns, issued
from neuroshard_jax.costs.executables import KeptJit, code_key, static_key
from tests.conftest import REPO

# A child process: the shipped ensemble's single-shard costs of fixed features, with executables kept in FOLDER.
# With "load", the function may not trace or compile: kept files only.
_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import numpy as np
    import neuroshard_jax as nsj
    from neuroshard_jax.costs import executables, scoring

    folder, mode, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    model = nsj.load_cost_model("neural")
    feats = np.random.default_rng(0).uniform(0.0, 2.0, (3, 16, 64)).astype(np.float32)
    if mode == "plain":
        latents, ms = scoring.single_shard_costs.jitted(model.fns, model.params, feats)
    else:
        executables.keep_executables(folder)
        if mode == "load":
            class NoCompile:
                def lower(self, *args, **kwargs):
                    raise AssertionError("traced and compiled: expected the kept executable")
            scoring.single_shard_costs.jitted = NoCompile()
        latents, ms = scoring.single_shard_costs(model.fns, model.params, feats)
    np.savez(out, latents=np.asarray(latents), ms=np.asarray(ms))
    """
)


def _child(tmp_path, mode: str) -> dict:
    out = tmp_path / f"{mode}.npz"
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "kept"), mode, str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


def test_a_kernel_kept_by_one_process_runs_in_the_next_without_compiling_and_as_jit_does(tmp_path):
    kept = _child(tmp_path, "keep")
    files = sorted((tmp_path / "kept").glob("*.bin"))
    assert len(files) == 1 and files[0].name.startswith("neuroshard_jax.costs.scoring.single_shard_costs-")
    loaded = _child(tmp_path, "load")  # another process: the nets rebuilt, the same key, the file run as it is
    plain = _child(tmp_path, "plain")
    for name in ("latents", "ms"):
        np.testing.assert_array_equal(loaded[name], plain[name])
        np.testing.assert_array_equal(kept[name], plain[name])
    assert sorted((tmp_path / "kept").glob("*.bin")) == files  # nothing compiled again


def _double(fns: CostFns, x, scale=2.0):
    return fns.head(None, x) * scale


@pytest.fixture()
def kept(tmp_path):
    """Keep executables in a fresh folder for one test (the process's setting restored after)."""
    before = executables.kept_folder()
    executables.keep_executables(tmp_path)
    yield tmp_path
    executables.keep_executables(before)


def _fns(key):
    """Functions issued under ``key`` (as the package's factories issue theirs); None: no key."""
    return issued(CostFns(None, lambda p, z: z.sum(-1), None, None, key=key))


def test_keys_name_shapes_dtypes_statics_and_a_damaged_file_is_compiled_again(kept):
    fn = KeptJit(_double, static_argnums=(0,))
    x = np.ones((4, 3), np.float32)
    np.testing.assert_array_equal(fn(_fns("a"), x, 2.0), np.full(4, 6.0, np.float32))
    np.testing.assert_array_equal(fn(_fns("a"), x, 3.0), np.full(4, 9.0, np.float32))  # one weakly typed float
    fn(_fns("a"), x.astype(np.float16), 2.0)  # another dtype
    fn(_fns("a"), np.ones((5, 3), np.float32), 2.0)  # another shape
    fn(_fns("b"), x, 2.0)  # other functions
    assert len(list(kept.glob("*.bin"))) == 4 and fn._cache_size() == 4

    other = KeptJit(_double, static_argnums=(0,))  # a new process's function: reads the files
    for path in kept.glob("*.bin"):
        path.write_bytes(path.read_bytes()[:-7] + b"damaged")
    np.testing.assert_array_equal(other(_fns("a"), x, 2.0), np.full(4, 6.0, np.float32))  # compiled again
    assert len(list(kept.glob("*.bin"))) == 4  # the damaged one replaced, the others left until used


def test_traced_unkeyed_and_persistent_cache_calls_keep_nothing(kept, tmp_path_factory):
    fn = KeptJit(_double, static_argnums=(0,))
    x = np.ones((2, 3), np.float32)
    grad = jax.grad(lambda v: fn(_fns("a"), v).sum())(jnp.asarray(x))  # under another trace: jax.jit itself
    np.testing.assert_array_equal(grad, np.full((2, 3), 2.0, np.float32))
    np.testing.assert_array_equal(jax.jit(lambda v: fn(_fns("a"), v))(x), np.full(2, 6.0, np.float32))
    with jax.disable_jit():
        fn(_fns("a"), x)
    fn(_fns(None), x)  # functions without a key: compiled in this process only
    # a factory's functions with one replaced keep the key, not its binding: compiled afresh, never a kept file's
    changed = ANALYTIC_FNS._replace(head=lambda p, z: z.sum(-1) * 100.0)
    np.testing.assert_array_equal(fn(changed, x), np.full(2, 600.0, np.float32))
    assert not list(kept.glob("*.bin"))

    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("jax")))
    try:  # an executable JAX may have read from its own cache: never kept (its object code is not serialized)
        fn(_fns("c"), x)
        jax.config.update("jax_compilation_cache_dir", before)
        fn(_fns("d"), x)  # the setting put back, JAX's cache stays live in this process: still nothing kept
        assert not list(kept.glob("*.bin"))
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        compilation_cache.reset_cache()
    fn(_fns("e"), x)
    assert len(list(kept.glob("*.bin"))) == 1


def test_settings_and_static_names_are_in_the_key_and_a_kept_file_that_fails_to_run_is_compiled_again(
    kept, monkeypatch
):
    fn = KeptJit(_flags, static_argnames=("a", "b"))
    x = np.ones(2, np.float32)
    assert fn(x, a=True).tolist() == [1.0, 1.0] and fn(x, b=True).tolist() == [10.0, 10.0]  # by name, not order
    with jax.enable_x64(True):
        assert fn(np.ones(2), a=True).dtype == np.float64  # x64 on: another executable
    assert fn(np.ones(2), a=True).dtype == np.float32
    assert len(list(kept.glob("*.bin"))) == 3

    def broken(path):
        def run(*args, **kwargs):
            raise RuntimeError("NOT_FOUND: Function fusion not found")

        return run

    monkeypatch.setattr(executables, "_load", broken)
    other = KeptJit(_flags, static_argnames=("a", "b"))  # a new process's function, its files failing to run
    assert other(x, a=True).tolist() == [1.0, 1.0]
    assert len(list(kept.glob("*.bin"))) == 3  # the failing file replaced by a fresh compile


def _flags(x, a=False, b=False):
    return x * (1.0 if a else 0.0) + x * (10.0 if b else 0.0)


def test_static_keys_are_stable_strings_or_none():
    assert static_key((1, True, None, "a", 2.5)) == "(1,True,None,'a',2.5)"
    assert static_key(ANALYTIC_FNS) == "CostFns(analytic)"
    assert static_key(_fns(None)) is None and static_key((1, object())) is None
    assert static_key(CostFns(None, lambda p, z: z, None, None, key="analytic")) is None  # not issued under it
    # an address in a repr (a function held by a config) is left out; anything else that differs is not
    one, two = (lambda: 0), (lambda: 0)
    assert code_key("x", {"f": one, "n": 1}) == code_key("x", {"f": two, "n": 1}) != code_key("x", {"f": one, "n": 2})


def test_the_folder_is_pruned_to_the_most_recently_used(kept, monkeypatch):
    monkeypatch.setattr(executables, "MAX_FILES", 2)
    fn = KeptJit(_double, static_argnums=(0,))
    for n in range(1, 5):
        fn(_fns("a"), np.ones((n, 3), np.float32))
    assert len(list(kept.glob("*.bin"))) == 2
