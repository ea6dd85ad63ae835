"""The portfolio (``searcher=portfolio``: several searchers, the cheapest by the model) and ``autotune=kernels`` (the
candidates and TorchRec's plans measured on the real FBGEMM worker, the measured fastest returned)."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest

from tests.conftest import make_table, make_task


@pytest.fixture(scope="module")
def task():
    rng = np.random.default_rng(5)
    tables = [
        make_table(i, int(rng.integers(20_000, 200_000)), int(rng.choice([8, 16, 32])), float(rng.uniform(1, 12)))
        for i in range(14)
    ]
    return make_task(tables, num_devices=4, mem_cap_gb=1.0, batch_size=512)


@pytest.fixture(scope="module")
def model(task):
    from neuroshard_jax.costs.choice import spec_of

    return spec_of("analytic").for_task(task)


@pytest.mark.fast
def test_the_portfolio_is_its_members_cheapest_plan_with_every_candidate_recorded(task, model):
    from neuroshard_jax.core.plan import Plan
    from neuroshard_jax.costs.scoring import score_plans
    from neuroshard_jax.search.pipeline import search_candidates, search_plan
    from searchers import make_searcher

    portfolio = make_searcher("portfolio", {"searchers": ["beam", "grid", "beam:hot", "size_greedy"]})
    plan, members = search_candidates(task, portfolio, model, seed=0)
    alone = {
        "beam": search_plan(task, make_searcher("beam"), model, 0),
        "grid": search_plan(task, make_searcher("grid"), model, 0),
        "beam:hot": search_plan(task, make_searcher("beam"), model, 0, "hot"),
        "size_greedy": search_plan(task, make_searcher("size_greedy"), model, 0),
    }
    # each member's plan is the plan it makes alone (the runs they share searched once), its costs the model's
    for name, own in alone.items():
        assert members[name] == own and members[name].costs.cost_ms == pytest.approx(own.costs.cost_ms)
    scores = dict(zip(alone, score_plans(model, list(alone.values()))))
    record = plan.portfolio
    assert [c.member for c in record.candidates] == list(alone)
    assert plan == alone[record.chosen] and plan.searcher == "portfolio"
    assert scores[record.chosen] == min(scores.values())  # the cheapest by the search's own score
    for c in record.candidates:
        assert c.error is None and c.score_ms == pytest.approx(float(scores[c.member]), rel=1e-5)
        if c.same_as is not None:  # a repeat names the earlier member with the same plan
            assert alone[c.member] == alone[c.same_as]
    distinct = sorted({float(scores[c.member]) for c in record.candidates if c.same_as is None})
    if len(distinct) > 1:
        assert record.margin == pytest.approx((distinct[1] - distinct[0]) / distinct[1], rel=1e-4)
    else:
        assert record.margin is None
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))  # plan.json keeps the record
    assert again.portfolio == record and again == plan


def test_a_member_that_cannot_plan_is_recorded_and_the_others_plan(task, model):
    from neuroshard_jax.core.errors import UserError
    from neuroshard_jax.search.pipeline import search_plan
    from searchers import make_searcher

    pinned = dataclasses.replace(task, tables=(task.tables[0].constrained(pin=2), *task.tables[1:]))
    plan = search_plan(pinned, make_searcher("portfolio", {"searchers": ["torchrec", "grid"]}), model, 0)
    torchrec, grid = plan.portfolio.candidates
    assert "does not take the constraint pin" in torchrec.error and torchrec.cost_ms is None
    assert plan.portfolio.chosen == "grid" and grid.error is None
    assert {s.device for s in plan.shards_of(0)} == {2}
    with pytest.raises(UserError, match="does not take the constraint pin"):  # none can: the first member's why
        search_plan(pinned, make_searcher("portfolio", {"searchers": ["torchrec"]}), model, 0)


@pytest.mark.parametrize(
    "members, said",
    [
        (["bem"], "did you mean 'beam'"),
        (["beam", "portfolio"], "a portfolio holds no portfolio"),
        (["beam:warm"], "expected NAME:ROW_SPLIT with ROW_SPLIT one of fit, hot, off"),
        (["grid", "grid"], "got 'grid' twice"),
        ([], "expected members such as"),
    ],
)
def test_bad_members_are_refused_in_one_line(members, said):
    from neuroshard_jax.core.errors import UserError
    from searchers import make_searcher

    with pytest.raises(UserError, match=said) as err:
        make_searcher("portfolio", {"searchers": members})
    assert "\n" not in str(err.value)


def test_autotune_returns_the_measured_fastest_and_never_a_planted_slow_plan(task, model, tmp_path):
    from neuroshard_jax.core.plan import Plan
    from neuroshard_jax.costs.scoring import with_costs
    from neuroshard_jax.measure.autotune import AutotuneConfig, Entrant, autotune_kernels
    from neuroshard_jax.search.pipeline import search_plan
    from searchers import make_searcher

    good = search_plan(task, make_searcher("grid"), model, 0)
    # every table on device 0: its one device does every lookup (4x the work of a balanced plan's slowest)
    planted = with_costs(model, Plan.from_assignment(task, [1] * task.num_tables, [[0]] * task.num_tables))
    readings = tmp_path / "readings.jsonl"
    config = AutotuneConfig(name="kernels", rounds=4, readings=str(readings), warmup=1, iters=3)
    entrants = [Entrant("planted", planted), Entrant("grid", good), Entrant("copy", good), Entrant("none", None, "x")]
    chosen, record = autotune_kernels(entrants, model, config)
    assert record.chosen == "grid" and chosen == good and chosen.autotune == record
    by_name = {c.name: c for c in record.candidates}
    # the one device's kernel does every lookup (4x the lookups of the balanced plan's slowest; a kernel's fixed start
    # and a busy machine's noise take some of that away: CI read 1.97x): measured, well over the balanced plan's slowest
    assert by_name["planted"].compute_ms > 1.5 * by_name["grid"].compute_ms
    assert by_name["planted"].low_ms > by_name["grid"].high_ms
    assert not by_name["copy"].kept and by_name["copy"].why == "the same plan as grid"
    assert not by_name["none"].kept and by_name["none"].why == "x"
    assert record.stopped == "leader" and record.rounds == 2  # it led beyond the noise after two rounds
    lines = readings.read_text().splitlines()
    assert len(lines) >= record.devices * record.rounds  # every kernel's readings kept (a busy one taken again)
    # a run stopped and started again reads what was kept and measures nothing already read
    _, resumed = autotune_kernels(entrants, model, config)
    assert resumed.resumed == len(lines) and len(readings.read_text().splitlines()) == len(lines)
    assert resumed.chosen == "grid"


def test_noise_never_overrules_the_model():
    """``decide``: the fastest by median replaces the model's pick only where it leads beyond the spread of both and
    neither was read on a busy machine; else the pick stays and the reason is said."""
    from neuroshard_jax.measure.autotune import decide

    names = ["pick", "other"]
    clear = np.array([[10.0, 10.4, 10.2], [8.0, 8.3, 8.1]])  # other's slowest round beats the pick's fastest
    assert decide(clear, None, 0, names) == (1, None)
    overlap = np.array([[10.0, 10.6, 9.4], [9.6, 9.9, 9.5]])  # faster by median, inside the pick's spread
    index, why = decide(overlap, None, 0, names)
    assert index == 0 and why.startswith("other measured 4.0% faster, within the rounds' spread (9.500-9.900 vs")
    busy = np.array([[False, True, False], [False, False, False]])
    index, why = decide(clear, busy, 0, names)
    assert index == 0 and why == "other measured 20.6% faster, read on a busy machine: the model's pick kept"
    assert decide(clear, None, 1, names) == (1, None)  # the pick measured fastest: nothing to overrule


def test_a_busy_machine_never_overrules_the_model_s_pick(task, model, tmp_path):
    """CPU hogs beside autotune=kernels (three busy loops on every core): the kernels read busy are read again while the
    budget lasts, and a candidate read busy does not replace the model's pick, even one truly faster; on the quiet
    machine the same candidates, the faster leading beyond the spread, it does."""
    import os
    import subprocess
    import sys

    from neuroshard_jax.core.plan import Plan
    from neuroshard_jax.costs.scoring import with_costs
    from neuroshard_jax.measure.autotune import AutotuneConfig, Entrant, autotune_kernels
    from neuroshard_jax.search.pipeline import search_plan
    from searchers import make_searcher

    good = search_plan(task, make_searcher("grid"), model, 0)
    slow = with_costs(model, Plan.from_assignment(task, [1] * task.num_tables, [[0]] * task.num_tables))
    # the model's pick made the slow one: its score set below grid's (a model wrong by 4x)
    picked = dataclasses.replace(slow, costs=dataclasses.replace(slow.costs, cost_ms=good.costs.cost_ms / 2))
    entrants = [Entrant("grid", good), Entrant("picked", picked)]
    config = AutotuneConfig(name="kernels", rounds=2, warmup=1, iters=3, budget_s=12.0, baselines=())
    # three busy loops a core: with one, the scheduler may leave the worker a core of its own (the hogs paired on
    # the other), and a fresh clone's run once read every kernel quiet
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3 * (os.cpu_count() or 2))]
    time.sleep(1.0)  # spinning before the first reading (an interpreter starts in ~0.1 s)
    try:
        chosen, record = autotune_kernels(entrants, model, dataclasses.replace(config, readings=str(tmp_path / "r")))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert record.busy > 0 and record.stopped == "busy" and record.model_pick == "picked"
    assert record.chosen == "picked" and chosen == picked
    measured = {c.name: c.measured_ms for c in record.candidates}
    # the faster one, read busy, did not replace it: the record says why
    if (measured["grid"] or 0.0) < (measured["picked"] or 0.0):
        assert "read on a busy machine" in record.kept_pick
    else:  # the hog slowed grid's kernels past the pick's (the pick read fastest: nothing was overruled)
        assert record.kept_pick is None
    lines = [json.loads(line) for line in (tmp_path / "r").read_text().splitlines()]
    assert len(lines) > record.devices and sum(line["busy"] for line in lines) >= record.busy  # busy ones read again
    # quiet: grid's 4x fewer lookups on the slowest device lead beyond the spread: the measurement overrules
    chosen, record = autotune_kernels(entrants, model, dataclasses.replace(config, budget_s=300.0))
    assert record.chosen == "grid" and record.kept_pick is None and record.busy == 0


def test_the_planner_autotunes_the_portfolio_against_torchrecs_plans(task, tmp_path):
    from neuroshard_jax.core.plan import Plan
    from neuroshard_jax.core.plan_file import format_plan
    from neuroshard_jax.search.sharding_planner import PlannerOptions

    options = PlannerOptions(cost_model="analytic", autotune="kernels")
    options = dataclasses.replace(options, autotune=dataclasses.replace(options.autotune, warmup=1, iters=3))
    plan = options.planner().plan(task)
    record = plan.autotune
    names = [c.name for c in record.candidates]
    assert names[-2:] == ["torchrec_default", "torchrec"] or {"torchrec_default", "torchrec"} <= set(names)
    kept = [c for c in record.candidates if c.kept]
    fastest = min(kept, key=lambda c: c.measured_ms).name
    # the measured fastest, unless it led within the noise: then the model's pick, and the record says why
    assert record.chosen == fastest if record.kept_pick is None else record.chosen == record.model_pick != fastest
    assert record.vs_torchrec_default is not None and (record.vs_torchrec_default <= 1.0 or record.kept_pick)
    assert plan.portfolio is not None  # the search's record kept beside the measurement's
    assert Plan.from_json(plan.to_json()).autotune == record
    # one typed sequence of the stages' records, in the order they were made, each under its key in plan.json
    assert [type(r).key for r in plan.records] == ["portfolio", "autotune"] and plan.stages == ("search", "autotune")
    assert Plan.from_json(plan.to_json()).records == plan.records
    assert (
        plan.with_record(type(record), None).autotune is None
        and "autotune" not in plan.with_record(type(record), None).to_json()
    )
    printed = format_plan(plan.to_json())
    assert "autotune=kernels:" in printed and ("<- chosen: the measured fastest" in printed or record.kept_pick)
    # explain says why this plan won: the model's pick, and the measurement that chose
    from neuroshard_jax.core.files import write_json
    from neuroshard_jax.measure.breakdown import ExplainConfig, explain_file

    path = write_json(plan.to_json(), tmp_path / "plan.json")
    said = explain_file(ExplainConfig(plan=str(path), chart=False, model="analytic"))
    assert "why this plan:" in said and f"measured (kernels, {record.rounds} rounds): {record.chosen}'s plan" in said
    assert record.kept_pick is None or record.kept_pick in said
    assert f"the task's balance bound from the measured candidates: {record.bound_ms:.3f} ms" in said


def _steps_plans():
    """A task whose kernels dominate the step (8,192 bags of 10 lookups of 256 floats a table, 2 ranks), so that
    balance shows: its tables, the analytic model, grid's plan and every table on rank 0 (with a core per rank its
    step waits for one rank doing all the lookups)."""
    from neuroshard_jax.core.plan import Plan
    from neuroshard_jax.costs.choice import spec_of
    from neuroshard_jax.costs.scoring import with_costs
    from neuroshard_jax.search.pipeline import search_plan
    from searchers import make_searcher

    rng = np.random.default_rng(3)
    tables = [make_table(i, int(rng.integers(100_000, 150_000)), 256, 10.0) for i in range(4)]
    task = make_task(tables, num_devices=2, mem_cap_gb=2.0, batch_size=8192)
    model = spec_of("analytic").for_task(task)
    good = search_plan(task, make_searcher("grid"), model, 0)
    piled = with_costs(model, Plan.from_assignment(task, [1] * task.num_tables, [[0]] * task.num_tables))
    return tables, model, good, piled


def test_autotune_steps_times_each_candidate_in_distributed_model_parallel_and_drops_one_that_fails(model, tmp_path):
    from neuroshard_jax.core.plan import Plan
    from neuroshard_jax.costs.scoring import with_costs
    from neuroshard_jax.measure.autotune import AutotuneConfig, Entrant
    from neuroshard_jax.measure.autotune_steps import autotune_steps

    tables, model, good, planted = _steps_plans()
    odd = make_task(tables, num_devices=2, mem_cap_gb=2.0, batch_size=8191)  # its batch cannot be sliced evenly
    failing = with_costs(model, Plan.from_assignment(odd, [1] * odd.num_tables, [[1]] * odd.num_tables))
    readings = tmp_path / "steps.jsonl"
    config = AutotuneConfig(name="steps", rounds=3, steps=6, step_warmup=1, readings=str(readings))
    entrants = [Entrant("planted", planted), Entrant("failing", failing), Entrant("grid", good)]
    chosen, record = autotune_steps(entrants, config)
    assert record.chosen == "grid" and chosen == good and record.mode == "steps"
    assert record.pinned  # this machine has a core for each of the 2 ranks
    by_name = {c.name: c for c in record.candidates}
    assert not by_name["failing"].kept and "multiple of the 2 devices" in by_name["failing"].why
    assert by_name["planted"].kept and by_name["planted"].measured_ms > by_name["grid"].measured_ms
    assert 2 <= record.rounds <= 3 and by_name["grid"].low_ms <= by_name["grid"].measured_ms
    assert record.model_pick == "grid"  # priced cheapest by the model: measured first
    # kept: a rerun into the same readings times nothing it has (a Ctrl-C loses no round)
    _, again = autotune_steps(entrants, config)
    kept = [json.loads(line) for line in readings.read_text().splitlines()]
    quiet = [r for r in kept if not r["busy"]]  # a busy machine's readings are kept too, and retaken quiet
    assert again.resumed == len(kept) and len(quiet) == 2 * record.rounds and again.seconds < 1.0
    assert again.chosen == "grid" and again.rounds == record.rounds
    # the budget is kept: past it, no other candidate's ranks are started (the model's pick, first, always is)
    _, short = autotune_steps(entrants, dataclasses.replace(config, readings=None, budget_s=1e-3))
    dropped = {c.name: c.why for c in short.candidates if not c.kept}
    assert short.chosen == "grid" and short.stopped == "budget" and short.rounds == 1
    assert dropped["planted"] == "not started within autotune.budget_s (0.001 s)"


def test_a_busy_machine_never_overrules_the_model_s_pick_in_training_steps(tmp_path):
    """``autotune=steps`` beside a busy loop on every core: a step read while other work loads the cores is read
    busy (``hardware.OtherLoad``: the ranks' own CPU is not counted), read again after a wait while the budget
    lasts, and never replaces the model's pick, even where the other candidate is truly faster."""
    import os
    import subprocess
    import sys

    from neuroshard_jax.core.hardware import OtherLoad
    from neuroshard_jax.measure.autotune import AutotuneConfig, Entrant
    from neuroshard_jax.measure.autotune_steps import autotune_steps

    spin = "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass"
    with OtherLoad() as own:  # a child's CPU is this run's own, not another user's
        subprocess.run([sys.executable, "-c", spin], check=True)
    assert own.cores is not None and own.cores < 0.5 and not own.busy
    _, _, good, slow = _steps_plans()
    picked = dataclasses.replace(slow, costs=dataclasses.replace(slow.costs, cost_ms=good.costs.cost_ms / 2))
    readings = tmp_path / "steps.jsonl"
    config = AutotuneConfig(name="steps", rounds=2, steps=4, step_warmup=1, budget_s=25.0, readings=str(readings))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        with OtherLoad() as load:
            chosen, record = autotune_steps([Entrant("grid", good), Entrant("picked", picked)], config)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert load.busy and load.cores > 0.5  # the hogs, seen
    assert record.model_pick == "picked" and record.chosen == "picked" and chosen == picked
    assert record.busy >= 1 and record.stopped in ("busy", "budget")
    lines = [json.loads(line) for line in readings.read_text().splitlines()]
    assert lines and lines[0]["busy"]  # the pick, read first, read busy (and read again while the budget lasted)
    measured = {c.name: c.measured_ms for c in record.candidates if c.kept}
    if measured.get("grid") is not None and measured["grid"] < measured["picked"]:
        assert "read on a busy machine" in record.kept_pick


def test_collective_plan_autotunes_in_steps_on_the_live_gloo_group_and_every_rank_returns_the_same_plan(tmp_path):
    """Two gloo ranks (a core each) of one live group: rank 0 searches, both time every candidate in
    DistributedModelParallel on the group, the plan of every table on rank 0 is measured and never chosen, a plan of
    other tables fails on both ranks and is dropped, and both ranks return the same plan."""
    import subprocess
    import sys

    from tests.conftest import REPO

    script = REPO / "tests" / "collective_autotune_rank.py"
    init = f"file://{tmp_path / 'init'}"
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    ranks = [
        subprocess.Popen([sys.executable, str(script), str(r), "2", init, str(out)], cwd=REPO, stderr=subprocess.PIPE)
        for r, out in enumerate(outs)
    ]
    try:
        said = [rank.communicate(timeout=600)[1].decode() for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0], said
    rank0, rank1 = (json.loads(out.read_text()) for out in outs)
    assert rank0["shards"] == rank1["shards"] and rank0["autotune"] == rank1["autotune"]  # one plan, one record
    record = rank0["autotune"]
    by_name = {c["name"]: c for c in record["candidates"]}
    assert record["mode"] == "steps" and record["pinned"] and record["chosen"] == "grid"
    assert rank0["stages"] == rank1["stages"] == ["search", "autotune"]  # the planner's own sequence, in its order
    assert by_name["planted"]["kept"] and by_name["planted"]["measured_ms"] > by_name["grid"]["measured_ms"]
    assert not by_name["stale"]["kept"] and "not a plan of the module's tables" in by_name["stale"]["why"]
    assert {tuple(on) for _, on in rank0["shards"].values()} != {(0,)}  # not the planted plan
    assert "features f1, f2, f3 missing" in rank0["refused"] and rank0["refused"] == rank1["refused"]


def test_autotune_from_the_command_line_stops_cleanly_on_ctrl_c_and_resumes_in_its_run_folder(tmp_path):
    """SIGINT while autotune measures: exit 130, one line, no traceback, no plan.json (the run is not finished), the
    readings kept; the same command into the same folder resumes them and finishes."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    args = ["cost_model=analytic", "task.num_tables=12", "autotune=kernels", "autotune.baselines=[size_greedy]"]
    args += ["autotune.warmup=1", "autotune.iters=2", f"hydra.run.dir={run}"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    # as from a terminal: Ctrl-C raises KeyboardInterrupt (a process whose parent ignores SIGINT, as pytest may after
    # a library set it so, starts with it ignored: Python then installs no handler of its own)
    terminal = "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    terminal += "runpy.run_module('neuroshard_jax', run_name='__main__', alter_sys=True)"
    long = [sys.executable, "-c", terminal, *args, "autotune.rounds=1000", "autotune.min_rounds=1000"]
    said = tmp_path / "stderr.txt"  # a file, not a pipe: no worker left behind can hold the test's read open
    with open(said, "w") as err_file:
        proc = subprocess.Popen(long, stderr=err_file, stdout=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while "autotune: round 1/" not in said.read_text():  # measuring: its first round said, the second under way
            assert proc.poll() is None and time.monotonic() < deadline, said.read_text()[-2000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything of the run still there
    err = said.read_text()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and any(line.startswith("interrupted:") for line in err.splitlines())
    assert f"autotune's readings are kept in {run}: the same command with hydra.run.dir={run} resumes" in err
    assert not (run / "plan.json").exists()
    kept = (run / "autotune-readings.jsonl").read_text().splitlines()
    assert len(kept) >= 2
    done = subprocess.run(
        [sys.executable, "-m", "neuroshard_jax", *args, "autotune.rounds=2"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((run / "plan.json").read_text())["autotune"]
    assert record["resumed"] == len(kept) and "readings resumed" in done.stdout


def test_a_readings_file_that_is_not_a_regular_file_is_refused_before_anything_is_measured(task, model, tmp_path):
    import os

    from neuroshard_jax.core.errors import UserError
    from neuroshard_jax.measure.autotune import AutotuneConfig, Entrant, autotune_kernels
    from neuroshard_jax.search.pipeline import search_plan
    from searchers import make_searcher

    fifo = tmp_path / "readings.jsonl"
    os.mkfifo(fifo)  # reading or appending to it would block for ever
    config = AutotuneConfig(name="kernels", readings=str(fifo))
    plan = search_plan(task, make_searcher("grid"), model, 0)
    with pytest.raises(UserError, match="is not a regular file, expected a JSONL file"):
        autotune_kernels([Entrant("grid", plan)], model, config)


def test_a_readings_file_is_only_ever_one_autotune_wrote_and_its_bad_lines_are_measured_again(task, model, tmp_path):
    """A file that holds something else (a shell rc file) is refused and left as it was; a readings file's lines that
    are not readings (a stray non-UTF-8 byte, NaN, a negative time) are warned of by file and line and measured
    again, and the rerun reads the rest; min_rounds above rounds is refused in one line."""
    from neuroshard_jax.core.errors import UserError
    from neuroshard_jax.measure.autotune import AutotuneConfig, Entrant, autotune_kernels
    from neuroshard_jax.search.pipeline import search_plan
    from searchers import make_searcher

    plan = search_plan(task, make_searcher("grid"), model, 0)
    rc = tmp_path / ".bashrc"
    rc.write_text("export PATH=$HOME/bin:$PATH\nalias ll='ls -l'\n")
    config = AutotuneConfig(name="kernels", rounds=2, warmup=1, iters=2, baselines=(), readings=str(rc))
    with pytest.raises(UserError, match=r"\.bashrc' holds something else \(its first line is not an autotune") as err:
        autotune_kernels([Entrant("grid", plan)], model, config)
    assert "\n" not in str(err.value) and rc.read_text() == "export PATH=$HOME/bin:$PATH\nalias ll='ls -l'\n"
    readings = tmp_path / "readings.jsonl"
    config = dataclasses.replace(config, readings=str(readings))
    _, first = autotune_kernels([Entrant("grid", plan)], model, config)
    good = readings.read_bytes().splitlines()
    row = json.loads(good[0])
    bad = [b"\xff\xfe" + good[0][2:], json.dumps({**row, "ms": float("nan")}).encode()]
    bad.append(json.dumps({**row, "ms": -1.0}).encode())
    readings.write_bytes(b"\n".join([*good[1:], *bad]) + b"\n")
    _, again = autotune_kernels([Entrant("grid", plan)], model, config)
    assert again.resumed == len(good) - 1 and again.chosen == "grid"  # the first kernel's reading taken again
    with pytest.raises(UserError, match=r"^autotune.min_rounds: got 9, expected at most autotune.rounds \(2\)$"):
        AutotuneConfig(name="kernels", rounds=2, min_rounds=9)
    assert AutotuneConfig(name="kernels", rounds=1).rounds == 1  # the default min_rounds follows fewer rounds


def test_autotune_steps_counts_its_rank_processes_and_keeps_its_budget(model):
    """64 gloo ranks are not started where the machine cannot hold their processes (0.35 GiB each), one line;
    the planner's own memory figures alone would have let them start."""
    from neuroshard_jax.core.constants import GIB_BYTES
    from neuroshard_jax.measure.autotune import AutotuneConfig
    from neuroshard_jax.measure.autotune_steps import LocalRanks

    task = make_task([make_table(i, 20_000, 16, 2.0) for i in range(64)], num_devices=64, batch_size=1024)
    plan = Plan_from_assignment(task)
    ranks = LocalRanks(64, AutotuneConfig(name="steps"))
    ranks.room = 16 * GIB_BYTES  # a machine with 16 GiB available
    assert sum(p.total for p in plan.memory()) < 0.1 * GIB_BYTES  # the modules alone fit many times over
    why = ranks.admits(plan)
    assert why.startswith("its 64 ranks need about 22.") and "64 rank processes), this machine has 16.0 GiB" in why


def Plan_from_assignment(task):
    from neuroshard_jax.core.plan import Plan

    return Plan.from_assignment(task, [1] * task.num_tables, [[t] for t in range(task.num_tables)])


def test_the_planner_runs_autotune_steps_when_asked():
    from neuroshard_jax.search.sharding_planner import PlannerOptions

    task = make_task([make_table(i, 20_000, 16, 2.0) for i in range(4)], num_devices=2, batch_size=1024)
    options = PlannerOptions(cost_model="analytic", autotune="steps")
    steps = dataclasses.replace(options.autotune, k=1, baselines=(), rounds=1, steps=1, step_warmup=0)
    plan = dataclasses.replace(options, autotune=steps).planner().plan(task)
    assert plan.autotune.mode == "steps" and plan.autotune.rounds == 1 and plan.autotune.candidates[0].kept


def test_autotune_loop_learns_from_the_measured_devices_and_searches_again(task, model, tmp_path):
    """autotune=loop on the real kernels: the only first candidate is the plan of every table on one device; the
    model tuned on its measured devices searches again, the new plan is measured, leads beyond the spread and is
    returned; the record says how many searches, why they stopped, the tuning's MAPE and the task's balance bound."""
    from neuroshard_jax.core.plan import Plan
    from neuroshard_jax.costs.scoring import with_costs
    from neuroshard_jax.measure.autotune import AutotuneConfig, Entrant, autotune_kernels
    from neuroshard_jax.search.pipeline import search_plan
    from searchers import make_searcher

    planted = with_costs(model, Plan.from_assignment(task, [1] * task.num_tables, [[0]] * task.num_tables))
    tuned_models = []

    def search(tuned):
        tuned_models.append(tuned)
        return [Entrant("grid", search_plan(task, make_searcher("grid"), tuned, 0))]

    config = AutotuneConfig(name="loop", rounds=2, warmup=1, iters=3, baselines=(), readings=str(tmp_path / "r"))
    chosen, record = autotune_kernels([Entrant("planted", planted)], model, config, search)
    assert record.mode == "loop" and record.loop.searches >= 1 and tuned_models
    assert record.loop.stopped in ("bound", "converged", "no better", "searches")
    assert record.chosen == "loop1:grid" and record.model_pick == "planted" and record.kept_pick is None
    by_name = {c.name: c for c in record.candidates}
    assert by_name["loop1:grid"].high_ms < by_name["planted"].low_ms
    assert record.bound_ms is not None and record.bound_ms <= by_name["loop1:grid"].measured_ms * 1.1
    assert record.loop.devices >= 1 and record.loop.mape_before is not None
    printed = "\n".join(autotune_lines_of(chosen))
    assert "loop: " in printed and "the task's balance bound from the measured candidates" in printed
    # the readings of every plan measured are kept: a rerun measures nothing again
    lines = len((tmp_path / "r").read_text().splitlines())
    _, again = autotune_kernels([Entrant("planted", planted)], model, config, search)
    assert again.resumed == lines and again.chosen == record.chosen


def autotune_lines_of(plan):
    from neuroshard_jax.core.plan_file import autotune_lines

    return autotune_lines(plan.autotune)
