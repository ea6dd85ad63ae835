"""python -m neuroshard_jax.compare on a real (small) Hydra multirun of the CLI."""

import subprocess
import sys

import pytest

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.measure.searcher_comparison import CompareConfig, compare_sweep

from .conftest import run_cli

SMALL = ["cost_model=analytic", "task.num_tables=12", "task.pool.num_tables=120", "task.batch_size=512"]


def test_compare_a_multirun(tmp_path):
    sweep = tmp_path / "sweep"
    done = run_cli("-m", "searcher=grid,size_lookup_greedy,random", "seed=0,1", *SMALL, f"hydra.sweep.dir={sweep}")
    assert done.returncode == 0, done.stderr
    out = subprocess.run(
        [sys.executable, "-m", "neuroshard_jax.compare", f"sweep={sweep}"], capture_output=True, text=True, check=True
    )
    assert "2 tasks, 2 solved by every run, 0 of them measured for every run. Ranked by predicted cost" in out.stdout
    assert "`grid`" in out.stdout and "`size_lookup_greedy`" in out.stdout
    assert "The measured columns are empty: no run of the sweep was measured on the kernels" in out.stdout
    assert "mean per-task gain over `size_lookup_greedy`" in out.stdout  # the greedy baseline the sweep ran
    assert (sweep / "compare.md").exists()
    assert (sweep / "cost_by_searcher.png").stat().st_size > 1000 and (sweep / "search_time.png").exists()


def test_compare_refuses_a_directory_without_plans(tmp_path):
    with pytest.raises(UserError, match="sweep: .* holds no suite run or plan.json, expected a multirun directory"):
        compare_sweep(CompareConfig(sweep=str(tmp_path)))
    with pytest.raises(UserError, match="sweep: missing"):
        compare_sweep(CompareConfig())
