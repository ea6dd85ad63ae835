"""The package's shape: no import cycles, one function per rule, a curated public API, and the README's example."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import neuroshard_jax as nsj

from .conftest import REPO

PACKAGES = ("neuroshard_jax", "searchers")
# The only imports allowed inside functions: optional heavy dependencies behind the worker wall.
HEAVY = ("torch", "fbgemm_gpu", "torchrec", "matplotlib", "ray")


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


def test_each_rule_lives_in_one_function():
    sources = _sources()

    def where(pattern):
        return sorted(name for name, text in sources.items() if re.search(pattern, text))

    assert where(r"total_ms\.max\(") == ["neuroshard_jax/cost_models.py"]  # the plan-cost max: plan_cost_ms
    assert where(r"BYTES_PER_ELEMENT\[") == ["neuroshard_jax/analytic.py", "neuroshard_jax/sharding.py"]
    assert where(r"% DIM_ALIGNMENT|DIM_ALIGNMENT ==|>> \(k") == ["neuroshard_jax/sharding.py"]  # the split rule
    assert where(r"2\s*\*\*\s*30") == ["neuroshard_jax/constants.py"]
    assert len(re.findall(r"\* BYTES_PER_ELEMENT\[", sources["neuroshard_jax/sharding.py"])) == 1  # mem_bytes


def test_torch_stays_behind_its_walls():
    """torch and torchrec are imported at module level only by the TorchRec adapter (for users already in a torch
    process), inside functions only by the worker and the ShardingPlan conversion; nothing imports the adapter."""
    top, inner = set(), set()
    for m, f in _modules().items():
        tree = ast.parse(f.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(n.split(".")[0] in ("torch", "torchrec", "fbgemm_gpu") for n in names):
                    top.add(m)
                if any("torchrec_planner" in n for n in names + [a.name for a in node.names]):
                    raise AssertionError(f"{m} imports the TorchRec adapter")
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node not in tree.body:
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(n.split(".")[0] in ("torch", "torchrec", "fbgemm_gpu") for n in names):
                    inner.add(m)
    assert top == {"neuroshard_jax.torchrec_planner"}
    assert inner == {"neuroshard_jax.worker", "neuroshard_jax.torchrec_plans"}


def test_the_foreign_benchmark_shares_no_table_drawing_with_training():
    """Its generators are written apart from the training sampler: no shared code for drawing specs, no shared seeds."""
    text = (REPO / "tools" / "foreign_benchmark.py").read_text()
    for name in ("sample_spec_shard", "draw_table_spec", "SpecSamplerConfig", "_zipf_ranks", "synthetic_table_params"):
        assert name not in text
    assert "60013" not in text  # the spec sampler's seed constant


def test_public_api_resolves_and_importing_it_is_cheap():
    for name in nsj.__all__:
        assert getattr(nsj, name) is not None, name
    code = (
        "import sys, neuroshard_jax, neuroshard_jax.sharding, neuroshard_jax.tables; "
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
