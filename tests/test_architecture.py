"""The package's shape: no import cycles, one function per rule, a curated public API, and the README's example."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import neuroshard_jax as nsj

from .conftest import REPO

PACKAGES = ("neuroshard_jax", "searchers")
# The only imports allowed inside functions: optional heavy dependencies behind the worker wall, and what the
# planner's start-up need not pay for (orbax: a checkpoint written or first read; scipy: the input-distribution fit).
HEAVY = ("torch", "fbgemm_gpu", "torchrec", "matplotlib", "ray", "orbax", "scipy")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            mods[".".join(f.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")] = f
    return mods


def _targets(node, mods) -> set[str]:
    names = (
        [a.name for a in node.names]
        if isinstance(node, ast.Import)
        else [f"{node.module}.{a.name}" for a in node.names] + [node.module]
    )
    out = set()
    for name in names:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


@pytest.mark.fast
def test_no_import_cycles_and_no_project_imports_inside_functions():
    mods = _modules()
    edges = {m: set() for m in mods}
    inner = []
    for m, f in mods.items():
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges[m] |= _targets(node, mods) - {m}
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        top = (node.names[0].name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
                        if top not in HEAVY:
                            inner.append(f"{m}:{node.lineno} {ast.unparse(node)}")
    assert not inner, f"imports inside functions: {inner}"
    # a package importing its own modules (its __init__) is not a cycle
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in edges.items()}
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for t in sorted(edges[m]):
            assert state.get(t) != 1, f"import cycle: {' -> '.join([*path, m, t])}"
            if t not in state:
                visit(t, [*path, m])
        state[m] = 2

    for m in sorted(mods):
        if m not in state:
            visit(m, [])


def _sources() -> dict[str, str]:
    return {str(f.relative_to(REPO)): f.read_text() for f in _modules().values()}


@pytest.mark.fast
def test_each_rule_lives_in_one_function():
    sources = _sources()

    def where(pattern):
        return sorted(name for name, text in sources.items() if re.search(pattern, text))

    assert where(r"total_ms\.max\(") == ["neuroshard_jax/costs/cost_model.py"]  # the plan-cost max: plan_cost_ms
    assert where(r"BYTES_PER_ELEMENT\[") == ["neuroshard_jax/core/sharding.py", "neuroshard_jax/costs/analytic.py"]
    assert where(r"% DIM_ALIGNMENT|DIM_ALIGNMENT ==|>> \(k") == ["neuroshard_jax/core/sharding.py"]  # the split rule
    assert where(r"2\s*\*\*\s*30") == ["neuroshard_jax/core/constants.py"]
    assert len(re.findall(r"\* BYTES_PER_ELEMENT\[", sources["neuroshard_jax/core/sharding.py"])) == 1  # mem_bytes


# Stages from the ground up: a module imports its own stage and the ones below it, never one above.
STAGES = ("core", "workloads", "kernels", "costs", "searchers", "measure", "search", "learn", "torchrec", "entry")
# The top level of the package: the public API, the main job and the other commands (thin Hydra mains).
ENTRIES = {"__init__", "__main__", "api", "collect", "evaluate", "explain", "export", "loop", "stats", "train"}
ENTRIES |= {"train_policy", "compare", "compare_models", "probe", "adapt"}
TORCH = ("torch", "torchrec", "fbgemm_gpu")


def _stage(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "searchers":
        return "searchers"
    return parts[1] if len(parts) > 2 or parts[1:] and parts[1] in STAGES else "entry"


@pytest.mark.fast
def test_every_module_sits_in_a_stage():
    for m in _modules():
        parts = m.split(".")
        if parts[0] == "neuroshard_jax" and len(parts) == 2 and parts[1] not in STAGES:
            assert parts[1] in ENTRIES, f"{m}: a top-level module that is not a command; move it into a stage"
    names = [m.rpartition(".")[2] for m in _modules() if not m.endswith("__main__")]
    stems = {}
    for n in names:
        stems.setdefault(n.rstrip("s").removesuffix("ion").removesuffix("ing").removesuffix("e"), set()).add(n)
    pairs = [sorted(v) for v in stems.values() if len(v) > 1]
    assert not pairs, f"module names that differ only by a suffix: {pairs}"


@pytest.mark.fast
def test_imports_flow_down_the_stages():
    mods = _modules()
    upward = []
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _targets(node, mods) - {m}:
                    if STAGES.index(_stage(t)) > STAGES.index(_stage(m)):
                        upward.append(f"{m} ({_stage(m)}) imports {t} ({_stage(t)})")
    assert not upward, "imports against the stage order: " + "; ".join(upward)


@pytest.mark.fast
def test_torch_stays_behind_its_walls():
    """torch, torchrec and fbgemm_gpu are imported only in the worker package (a subprocess), in the ShardingPlan
    conversion (inside its functions: it runs in a torch process) and in the TorchRec adapter (for users already in
    a torch process); nothing below the adapter imports it."""
    walls = ("neuroshard_jax.kernels.worker", "neuroshard_jax.kernels.torchrec_format", "neuroshard_jax.torchrec")
    top, inner = set(), set()
    for m, f in _modules().items():
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(n.split(".")[0] in TORCH for n in names):
                    (top if node in tree.body else inner).add(m)
                    assert m.startswith(walls), f"{m} imports torch outside its walls"
    assert "neuroshard_jax.kernels.torchrec_format" in inner and "neuroshard_jax.kernels.worker.tbe" in inner
    assert {m for m in top if not m.startswith("neuroshard_jax.torchrec")} == set(), top


def test_the_foreign_benchmark_shares_no_table_drawing_with_training():
    """Its generators are written apart from the training sampler: no shared code for drawing specs, no shared seeds."""
    text = (REPO / "tools" / "foreign_benchmark.py").read_text()
    for name in ("sample_spec_shard", "draw_table_spec", "SpecSamplerConfig", "zipf_ids", "synthetic_table_params"):
        assert name not in text
    assert "60013" not in text  # the spec sampler's seed constant


@pytest.mark.fast
def test_public_api_resolves_and_importing_it_is_cheap():
    for name in nsj.__all__:
        assert getattr(nsj, name) is not None, name
    code = (
        "import sys, neuroshard_jax, neuroshard_jax.core.sharding, neuroshard_jax.workloads.pool; "
        "print(sorted(m for m in ('jax', 'torch', 'flax') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"  # the torch worker imports these modules: JAX must stay out of it


def test_readme_python_api_example_runs():
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Python API") :]
    code = section[
        section.index("```python\n") + len("```python\n") : section.index("```\n", section.index("```python"))
    ]
    exec(compile(code, "README.md (Python API)", "exec"), {})


def test_file_schemas_type_every_field():
    """The task and plan files' schema: every field typed with what its checks need, none ``Any``."""
    import dataclasses
    import typing

    from neuroshard_jax.core import schema

    loose = [
        f"{cls.__name__}.{name}"
        for cls in vars(schema).values()
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == schema.__name__
        for name, hint in typing.get_type_hints(cls).items()
        if hint is typing.Any
    ]
    assert not loose, loose


def test_the_library_never_imports_hydra():
    """``nsj.plan``, the ``Planner`` and the TorchRec adapter run inside a user's program: Hydra and OmegaConf are the
    commands' (``core.cli``), never the library's."""
    code = (
        "import sys, neuroshard_jax as nsj, neuroshard_jax.search.sharding_planner, neuroshard_jax.torchrec.planner; "
        "nsj.plan; print(sorted(m for m in sys.modules if m.split('.')[0] in ('hydra', 'omegaconf')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
