"""The CLI as a user runs it: real subprocesses, real Hydra, real files."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from neuroshard_jax.core.cli import check_command_line, check_output_folder
from neuroshard_jax.core.constants import GIB_BYTES
from neuroshard_jax.costs.choice import CostModelSpec, choose_cost_model
from neuroshard_jax.evaluate import app_config as evaluate_config
from neuroshard_jax.learn.cost_labels import config_from as collect_config
from neuroshard_jax.learn.policy_training import app_config as policy_config
from neuroshard_jax.search.job import main_config
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.stats import app_config as stats_config
from neuroshard_jax.torchrec.plan_export import app_config as export_config
from neuroshard_jax.train import app_config as train_config
from searchers import make_searcher

from .conftest import make_table, make_task, run_cli

# Small tasks at batch 512: the analytic model (the shipped neural one is trained at batch 4096).
SMALL = [
    "cost_model=analytic",
    "task.num_tables=20",
    "task.pool.num_tables=120",
    "task.batch_size=512",
    "task.mem_cap_gb=0.2",
]


def _check_contract(plan):
    assert {"searcher", "cost_model", "seed", "task", "shards", "devices", "cost_ms", "search_time_s"} <= set(plan)
    task = plan["task"]
    dims = {t["id"]: t["dim"] for t in task["tables"]}
    covered = {i: 0 for i in dims}
    for s in plan["shards"]:
        covered[s["table"]] += s["dim"]
        assert s["col_offset"] % s["dim"] == 0 and 0 <= s["device"] < task["num_devices"]
    assert covered == dims
    assert len(plan["devices"]) == task["num_devices"]
    assert plan["cost_ms"] == pytest.approx(max(d["cost_ms"]["total"] for d in plan["devices"]))
    for d in plan["devices"]:
        c = d["cost_ms"]
        assert c["total"] == pytest.approx(c["compute"] + c["fwd_comm"] + c["bwd_comm"])
        assert d["mem_gb"] <= task["mem_cap_gb"]


def test_default_run_prints_and_writes_a_plan(tmp_path):
    done = run_cli(f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    assert "predicted cost" in done.stdout and "mem_GB" in done.stdout
    assert "INFO" not in done.stdout + done.stderr  # no library log lines (orbax, JAX) around the plan
    # one line says which model planned, what it was trained on, and whether that is this machine's kind
    [line] = [x for x in done.stderr.splitlines() if x.startswith("cost model: ")]
    assert line == choose_cost_model("neural").line()  # the model of this machine's kind, or the default
    plan = json.loads((tmp_path / "plan.json").read_text())
    _check_contract(plan)
    # plan.json names the model that planned, as the line above does: the model of this machine's kind (or the default)
    assert plan["cost_model"] == choose_cost_model("neural").spec.label
    assert plan["searcher"] == "portfolio" and len(plan["task"]["tables"]) == 50
    # the default portfolio: every member's candidate, the model's pick among them, in the file and the printout
    members = [c["member"] for c in plan["portfolio"]["candidates"]]
    assert members == ["beam", "grid", "beam:hot"] and plan["portfolio"]["chosen"] in members
    assert "portfolio: 3 candidates" in done.stdout and "<- the model's pick" in done.stdout


def test_overrides_and_same_seed_same_plan_and_the_files_hydra_main_writes(tmp_path):
    """A seeded searcher in two processes (in-process determinism of every searcher: test_searchers): one as the
    command runs (``core.cli.run_app``: the checks, then ``hydra.main``), one through the bare ``hydra.main``; the
    same plan, and the same ``.hydra`` files but for the run folder."""
    args = ["searcher=random", "task.num_devices=8", "seed=3", *SMALL]
    ours = "from neuroshard_jax.__main__ import run; run()"
    first = subprocess.run(
        [sys.executable, "-c", ours, *args, f"hydra.run.dir={tmp_path / 'a'}"], capture_output=True, text=True
    )
    hydras = "from neuroshard_jax.__main__ import main; main()"
    second = subprocess.run(
        [sys.executable, "-c", hydras, *args, f"hydra.run.dir={tmp_path / 'b'}"], capture_output=True, text=True
    )
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    a, b = (json.loads((tmp_path / x / "plan.json").read_text()) for x in "ab")
    _check_contract(a)
    assert a["task"]["num_devices"] == 8 and a["seed"] == 3
    assert a["shards"] == b["shards"] and a["cost_ms"] == b["cost_ms"]
    for name in ("config.yaml", "overrides.yaml", "hydra.yaml"):
        ours, hydras = ((tmp_path / x / ".hydra" / name).read_text() for x in "ab")
        assert ours == hydras.replace(str(tmp_path / "b"), str(tmp_path / "a")), name


def test_task_file_input(tmp_path):
    task = make_task([make_table(i, rows=1000 + i, dim=16) for i in range(6)], num_devices=3)
    (tmp_path / "task.json").write_text(json.dumps(task.to_json()))
    done = run_cli(
        "searcher=lookup_greedy",
        "cost_model=analytic",
        f"task.path={tmp_path / 'task.json'}",
        f"hydra.run.dir={tmp_path / 'out'}",
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["task"] == task.to_json()
    # a task key the file's run would ignore is refused, not planned past (the file's caps were used, silently)
    ignored = run_cli(f"task.path={tmp_path / 'task.json'}", "task.mem_cap_gb=2", f"hydra.run.dir={tmp_path / 'o2'}")
    _one_line_error(ignored, "task.mem_cap_gb: given beside task.path, whose file's task is planned as it is")


def _one_line_error(done, *fragments):
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.mark.fast
def test_unknown_searcher(tmp_path):
    _one_line_error(run_cli("searcher=nope", f"hydra.run.dir={tmp_path}"), "searcher: got 'nope'", "size_lookup_greedy")


@pytest.mark.fast
def test_malformed_task_file(tmp_path):
    obj = make_task([make_table(0), make_table(1)]).to_json()
    obj["tables"][1]["dim"] = 0
    (tmp_path / "task.json").write_text(json.dumps(obj))
    _one_line_error(run_cli(f"task.path={tmp_path / 'task.json'}", f"hydra.run.dir={tmp_path}"), "tables[1].dim: got 0")


@pytest.mark.parametrize(
    "tables, cap_gb, fragment",
    [
        ([(10**6, 16)], 4 * 10**6 * 4 / GIB_BYTES * 0.9, "no split fits"),  # even a 4-wide shard is too big
        ([(10**5, 16)] * 3, 10**5 * 16 * 4 * 1.2 / GIB_BYTES, "in total"),
    ],
)
def test_infeasible_task(tmp_path, tables, cap_gb, fragment):
    task = make_task(
        [make_table(i, rows=r, dim=d) for i, (r, d) in enumerate(tables)], num_devices=2, mem_cap_gb=cap_gb
    )
    (tmp_path / "task.json").write_text(json.dumps(task.to_json()))
    _one_line_error(run_cli(f"task.path={tmp_path / 'task.json'}", f"hydra.run.dir={tmp_path}"), fragment)


def test_table_too_big_for_table_wise_greedy(tmp_path):
    task = make_task(
        [make_table(0, rows=10**5, dim=64), make_table(1, rows=10, dim=4)],
        num_devices=2,
        mem_cap_gb=10**5 * 64 * 4 * 0.6 / GIB_BYTES,
    )
    (tmp_path / "task.json").write_text(json.dumps(task.to_json()))
    args = ["cost_model=analytic", f"task.path={tmp_path / 'task.json'}", "row_split=off"]
    _one_line_error(run_cli("searcher=size_lookup_greedy", *args, f"hydra.run.dir={tmp_path}"), "fits on no device")
    for searcher in ("random", "beam"):  # column-wise searchers split it (in-process: the CLI path is above)
        assert (
            len(
                search_plan(
                    task, make_searcher(searcher), CostModelSpec("analytic").for_task(task), 0, row_split="off"
                ).shards
            )
            > 2
        )
    # with row splits (the default) the table-wise greedy plans it as row blocks over both devices
    rows = search_plan(
        task, make_searcher("size_lookup_greedy"), CostModelSpec("analytic").for_task(task), 0
    ).shards_of(0)
    assert [(s.device, s.num_rows) for s in rows] == [(0, 50_000), (1, 50_000)]


def test_bad_override_value(tmp_path):
    _one_line_error(run_cli("task.num_devices=0", *SMALL, f"hydra.run.dir={tmp_path}"), "task.num_devices: got 0")
    # a bad value inside a sweep is refused before any job runs: no run directory is made
    done = run_cli("-m", "searcher=random", "searcher.num_samples=4,abc", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    _one_line_error(done, "searcher.num_samples: got 'abc', expected an integer")
    assert not (tmp_path / "sweep").exists()


@pytest.mark.fast
def test_hydras_own_overrides_are_checked_in_one_line(tmp_path):
    done = run_cli("hydra.job.chdir=abc", *SMALL, f"hydra.run.dir={tmp_path / 'run'}")
    _one_line_error(done, "hydra.job.chdir=abc", "not a valid bool")
    assert not (tmp_path / "run").exists()


@pytest.mark.fast
def test_the_commands_use_no_private_hydra_api():
    """Hydra's public entry points only (``hydra.main``, the Compose API): private ones break silently on upgrade."""
    root = Path(__file__).resolve().parent.parent
    users = [
        p
        for d in ("neuroshard_jax", "searchers")
        for p in (root / d).rglob("*.py")
        if "hydra._internal" in p.read_text()
    ]
    assert not users, users


@pytest.mark.parametrize(
    "config_name, validate, argv, fragment",
    [
        ("config", main_config, ["seed=abc"], "seed: got 'abc', expected an integer"),
        ("config", main_config, ["seed=-1"], "seed: got -1, expected an integer >= 0"),
        ("config", main_config, ["searcher=beam", "searcher.k=2.5"], "searcher.k: got 2.5, expected an integer"),
        (
            "config",
            main_config,
            ["searcher=beam", "searcher.nope=1"],
            "searcher.nope: unknown key 'nope', expected one of alphas",
        ),
        (
            "config",
            main_config,
            ["searcher=beam", "+searcher.nope=1"],
            "searcher.nope: unknown key, expected one of alphas",
        ),
        (
            "config",
            main_config,
            ["searcher.searchers=[beam,bem]"],
            "searcher.searchers: got 'bem', did you mean 'beam'",
        ),
        ("config", main_config, ["autotune=fast"], "Could not find 'autotune/fast'"),
        ("config", main_config, ["task.mem_cap_gb=big"], "task.mem_cap_gb: got 'big', expected a finite number > 0"),
        ("config", main_config, ["task.pool.source=zzz"], "task.pool.source: got 'zzz'"),
        ("config", main_config, ["searcher=grid", "searcher.alphas=[1,x]"], "searcher.alphas[1]: got 'x', expected a"),
        ("config", main_config, ["task.num_device=3"], "unknown key 'num_device', did you mean 'num_devices'?"),
        ("config", main_config, ["+task.num_device=3"], "task.num_device: unknown key, did you mean 'num_devices'?"),
        ("config", main_config, ["sercher.k=5"], "sercher: unknown key 'sercher', did you mean 'searcher'?"),
        ("collect", collect_config, ["executor.connect_timeout_s=0"], "executor.connect_timeout_s: got 0.0"),
        ("config", main_config, ["-m", "seed=0,1,x"], "seed: got 'x'"),
        ("config", main_config, ["executor.workers=0"], "executor.workers: got 0, expected an integer >= 1"),
        ("config", main_config, ["task.num_tables=[3"], "task.num_tables=[3"),
        ("train", train_config, ["train.epochs=abc"], "train.epochs: got 'abc', expected an integer"),
        ("train", train_config, ["family=big"], "family: got 'big', expected one of ensemble, mlp"),
        ("config", main_config, ["cost_model.risk=-1"], "cost_model.risk: got -1.0, expected a finite number >= 0"),
        ("config", main_config, ["cost_model.name=nope"], "cost_model: got 'nope', expected one of analytic, neural"),
        ("collect", collect_config, ["source=mine"], "source: got 'mine', expected 'pool' or 'specs'"),
        ("train_policy", policy_config, ["executor.workers=1.5"], "executor.workers: got 1.5, expected an integer"),
        ("collect", collect_config, ["pool.seed=x"], "pool.seed: got 'x', expected an integer"),
        ("evaluate", evaluate_config, ["executor.workers=0"], "executor.workers: got 0, expected an integer >= 1"),
        ("export", export_config, ["plan=p.json", "check=maybe"], "check: got 'maybe', expected true or false"),
        ("stats", stats_config, ["batch_size=0"], "batch_size: got 0, expected an integer >= 1"),
        ("stats", stats_config, ["format=csv"], "format: got 'csv', expected one of auto, npz, dlrm"),
    ],
)
def test_every_override_is_checked_before_any_work(capsys, config_name, validate, argv, fragment):
    with pytest.raises(SystemExit) as exit_:
        check_command_line(config_name, argv, validate)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and fragment in err, err


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc, where no folder can be made")
def test_an_output_folder_that_cannot_be_made_is_one_line(capsys):
    """Root may write everywhere by access(), yet /proc takes no folder: the check makes and removes one."""
    with pytest.raises(SystemExit) as exit_:
        check_output_folder(["hydra.run.dir=/proc/nsj"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == "error: hydra.run.dir: cannot make a folder in '/proc' (No such file or directory), expected a "
        "writable folder"
    ), err


@pytest.mark.fast
def test_a_good_command_line_passes_the_check():
    check_command_line("config", ["-m", "searcher=grid,beam", "seed=0,1", "task.num_tables=12"], main_config)


def test_multirun(tmp_path):
    done = run_cli("-m", "searcher=random,size_lookup_greedy", *SMALL, f"hydra.sweep.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    plans = sorted(tmp_path.glob("*/plan.json"))
    assert len(plans) == 2
    names = {json.loads(p.read_text())["searcher"] for p in plans}
    assert names == {"random", "size_lookup_greedy"}
    # a second sweep into it would write its jobs' folders again: refused before any job starts, nothing touched
    kept = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    again = run_cli("-m", "searcher=grid,random", *SMALL, f"hydra.sweep.dir={tmp_path}")
    _one_line_error(again, f"hydra.sweep.dir: {str(tmp_path)!r} holds finished runs (0/plan.json)")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == kept
    # and a run into a finished run's folder, whatever its output is named
    into = run_cli("searcher=random", "output=mine.json", *SMALL, f"hydra.run.dir={tmp_path / '0'}")
    _one_line_error(into, f"hydra.run.dir: {str(tmp_path / '0')!r} holds a finished run (plan.json)")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == kept
    # a multirun asked for by the config, not the flag
    done = run_cli("hydra.mode=MULTIRUN", "searcher=random", *SMALL, f"hydra.sweep.dir={tmp_path / 'mode'}")
    assert done.returncode == 0, done.stderr
    assert len(list((tmp_path / "mode").glob("*/plan.json"))) == 1


def test_rl_with_the_shipped_policy(tmp_path):
    done = run_cli("searcher=rl", "task.num_devices=8", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    _check_contract(plan)
    assert plan["searcher"] == "rl" and len(plan["shards"]) == len(plan["task"]["tables"])
