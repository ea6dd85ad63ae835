"""What a new user meets first: the README's examples, `make`'s set-up and the package build say nothing alarming."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from .conftest import REPO

# Lines of other projects that a first run prints and this one cannot prevent: torch 2.13 logs this once, on the first
# KeyedJaggedTensor any TorchRec program builds (the user's own loader builds it here).
FOREIGN_WARNINGS = ()  # other projects' warnings a README example may print: none (torch's is_fx_tracing is dropped)


def readme_example(section: str) -> str:
    """The first ```python block under the README heading ``section``."""
    readme = (REPO / "README.md").read_text()
    text = readme[readme.index(f"## {section}\n") :]
    start = text.index("```python\n") + len("```python\n")
    return text[start : text.index("```\n", start)]


def run_example(code: str, cwd) -> subprocess.CompletedProcess:
    """The example as a user runs it: a fresh interpreter, so that once-only warnings of every library show."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )


def warning_lines(stderr: str) -> list[str]:
    """The warnings a run printed, less those of other projects and, on a machine of a kind no shipped model is of
    (the CPU kind of a test machine varies), the line that says so: that one is the right thing to print there."""
    from neuroshard_jax.costs.choice import choose_cost_model

    expected = FOREIGN_WARNINGS if choose_cost_model("neural").matches else (*FOREIGN_WARNINGS, "no model of its kind")
    return [line for line in stderr.splitlines() if "warn" in line.lower() and not any(f in line for f in expected)]


def test_python_api_example_prints_labelled_results_and_no_warning(tmp_path):
    done = run_example(readme_example("Python API"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not warning_lines(done.stderr), done.stderr
    lines = done.stdout.splitlines()
    assert lines, "the example prints nothing"
    for line in lines:  # "slowest device: 2.86 ms", never a bare number
        assert re.match(r"[A-Za-z][^:]*: \S", line), f"unlabelled output line: {line!r}"
    assert any(line.startswith("slowest device: ") and line.split()[2].replace(".", "").isdigit() for line in lines)


def test_torchrec_example_plans_with_the_users_topology_and_no_warning(tmp_path):
    pytest.importorskip("torchrec")
    done = run_example(readme_example("From a TorchRec model"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # TorchRec's "constructed directly ... the job will fail" and our own "warning:" lines both count
    assert not warning_lines(done.stderr), done.stderr
    # the plan names the module path its tables live at (DistributedModelParallel looks them up by it)
    modules = [line.split(":", 1)[1].strip() for line in done.stdout.splitlines() if line.startswith("module:")]
    assert modules == ["sparse"], done.stdout
    # the memory the example gives its Topology, not a default nobody set
    assert re.search(r"\bcap=4\.0 GiB\b", done.stderr), done.stderr


@pytest.mark.fast
def test_make_hides_pip_unless_it_fails(tmp_path):
    """The set-up recipe: pip's chatter goes to the log; a failing step prints its end and stops make."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    venv = tmp_path / "venv"
    venv.mkdir()  # PYTHON=true: no real venv is made, the recipe's pip steps run the fake below

    def make(pip_lines: str, status: int) -> subprocess.CompletedProcess:
        fake = tmp_path / "python"
        fake.write_text(f"#!/bin/sh\nprintf '{pip_lines}'\nexit {status}\n")
        fake.chmod(0o755)
        target = f"{venv}/.installed"
        return subprocess.run(
            ["make", "--no-print-directory", f"VENV={venv}", f"PY={fake}", "PYTHON=true", target],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )

    quiet = make("Collecting numpy\\nWARNING: Location is ignored\\nSuccessfully installed numpy\\n", 0)
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert (quiet.stdout + quiet.stderr).strip().splitlines() == [
        f"installing {venv} (a few minutes; pip's log: {venv}/install.log)"
    ]
    assert "Successfully installed numpy" in (venv / "install.log").read_text()
    assert (venv / ".installed").exists()

    (venv / ".installed").unlink()
    failed = make("ERROR: No matching distribution found for torch==99\\n", 3)
    assert failed.returncode != 0
    shown = failed.stdout + failed.stderr
    assert "ERROR: No matching distribution found for torch==99" in shown
    assert f"error: installing {venv} failed, full log: {venv}/install.log" in shown
    assert not (venv / ".installed").exists()


@pytest.mark.fast
def test_wheel_declares_its_subpackages_and_ships_configs_and_models(tmp_path):
    """A wheel built from a copy of the sources (as pip builds one, but without its isolated environment): setuptools
    warns of no undeclared folder, even with an earlier install's egg-info listing the training labels, and the wheel
    holds the Hydra configs and the shipped models, not the labels."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__}: the build needs >= 77")
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.log", "*.egg-info")
    for name in ("conf", "neuroshard_jax", "searchers"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    # what an editable install of an older layout leaves behind: a manifest that lists the labels
    stale = src / "neuroshard_jax.egg-info"
    stale.mkdir()
    labels = sorted(p.relative_to(src).as_posix() for p in (src / "neuroshard_jax/data/profiles").rglob("*.json*"))
    (stale / "SOURCES.txt").write_text("\n".join(["pyproject.toml", *labels[:3]]) + "\n")
    out = tmp_path / "dist"
    done = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_wheel({str(out)!r}))"],
        capture_output=True,
        text=True,
        cwd=src,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert "absent from the `packages` configuration" not in log, log[-3000:]
    assert "Package would be ignored" not in log, log[-3000:]
    names = zipfile.ZipFile(out / done.stdout.strip().splitlines()[-1]).namelist()
    for path in (
        "neuroshard_jax/conf/config.yaml",
        "neuroshard_jax/conf/searcher/beam.yaml",
        "neuroshard_jax/conf/hydra/launcher/slurm.yaml",
        "neuroshard_jax/data/dlrm_datasets_stats.json",
        "searchers/registry.py",
    ):
        assert path in names, path
    for folder in ("neuroshard_jax/data/models/xeon-union/", "neuroshard_jax/data/policies/", "data/row_comm/"):
        assert any(folder in n for n in names), folder
    assert not [n for n in names if "/data/profiles/" in n]


@pytest.mark.parametrize(
    "module, says",
    [
        ("neuroshard_jax", "python -m neuroshard_jax: plan how to shard"),
        ("neuroshard_jax.adapt", "python -m neuroshard_jax.adapt: make a cost model of this machine"),
    ],
)
def test_help_says_what_the_command_does_its_main_options_and_an_example(module, says):
    """``--help`` is a page a new user reads, not Hydra's config dump (that stays behind ``--cfg job``)."""
    from tests.conftest import run_cli

    done = run_cli("--help", module=module)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith(says) and "Main options:" in text and "Example" in text and "--cfg job" in text
    assert "_schema" not in text and "== Config ==" not in text and len(text.splitlines()) < 40
