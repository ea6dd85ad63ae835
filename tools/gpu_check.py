"""The prepared GPU check: one command on a lent GPU machine, the same steps dry on this CPU.

    python -m tools.gpu_check pack .gpu          # here: TorchRec's plans of the check's tasks (the GPU machine has no
                                                 # TorchRec), then FBGEMM GPU pruned for the card and hydra
                                                 # (../shared/gpu/prepare.sh, where this workplace has it)
    bash tools/gpu_check.sh                      # there (the device tool's command): unpack .gpu, then run
    python -m tools.gpu_check run OUT --dry      # here, on CPU, tiny: what the tests run
    python -m tools.gpu_check table OUT          # the README's GPU table from a run's files

``run`` takes steps in order, each within its share of ``--budget-s`` (it stops a step at its deadline and keeps what
it has), and writes one file per step into OUT (6 files in all):

a. ``smoke.json``: one fused TBE fwd+bwd on the device through the project's worker;
b. ``protocols.json``: the label protocols (``fixed``, ``timed``; on a GPU ``queued``, ``graph``) interleaved on the
   same spec requests, twice (the second round starts when half the step's time is spent): each protocol's
   run-to-run noise (the same request, one run against the other) and its spread within a run; the quietest one is
   ``chosen`` and the next steps use it;
c. ``search.json``: the main job's search (856 tables x 64 devices; dry: 60 x 8) on each JAX backend, cold (a fresh
   compilation cache) and warm, wall and search seconds;
d. ``labels.tgz``: spec labels with the chosen protocol (``collect``, resumable; a dataset like any other);
e. ``plans.json``: the devices of the plans of 8 foreign-benchmark tasks (beam and grid with the model chosen for
   this device, size_lookup_greedy, and TorchRec's plans packed beside, with the tasks), every device measured in up
   to 3 interleaved rounds, the file rewritten after each (the rounds the step's deadline left are said);
and ``log.txt``. A step that fails is logged and the next one runs (the GPU steps are skipped when the smoke
request fails). ``--dry`` runs every step on the CPU with tiny sizes and budgets.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JsonlLog, hardware, read_jsonl, write_json
from neuroshard_jax.core.types import Plan
from neuroshard_jax.costs.registry import choose_cost_model
from neuroshard_jax.kernels.executors import ExecutorConfig
from neuroshard_jax.kernels.processes import ComputeWorker, compute_request, measure_on, timing_fields
from neuroshard_jax.learn.collect import CollectConfig, collect
from neuroshard_jax.measure.plans import EvaluateConfig, measure_tables, plan_kernels
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.workloads.samplers import SpecSamplerConfig, sample_spec_shard
from tools.foreign_benchmark import SEARCHER_OPTIONS, TASKS_FILE, benchmark_tasks

SHARES = {"smoke": 0.03, "protocols": 0.27, "search": 0.25, "labels": 0.09, "plans": 0.36}  # of --budget-s, in order
GPU_STEPS = ("protocols", "labels", "plans")  # need the worker: skipped when the smoke request fails
TASKS = ("d4-00", "d4-01", "d4-02", "d4-03", "d8-00", "d8-01", "d8-02", "d8-03")
MODEL_SEARCHERS = ("beam", "grid")
TORCHREC_PLANS = "torchrec-plans.jsonl"


def log(out: Path, line: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {line}"
    print(line, flush=True)
    with open(out / "log.txt", "a") as f:
        f.write(line + "\n")


def smoke(out: Path, device: str) -> None:
    spec = {"rows": 100_000, "pooling_factor": 20.0, "bins": [0.2] * 4 + [0.1] * 2 + [0.0] * 11, "dim": 64, "seed": 1}
    worker = ComputeWorker(device)
    try:
        answer = worker.request(compute_request("smoke", [spec], None, 4096, device, warmup=5, iters=10), 120)
    finally:
        worker.close()
    write_json({"device": device, "answer": answer, "hardware": hardware()}, out / "smoke.json")
    if not answer.get("ok"):
        raise UserError(f"smoke: the worker failed on {device}: {answer.get('error')}")


def protocols(out: Path, device: str, count: int, deadline: float) -> str:
    """The protocols on the same ``count`` spec requests, interleaved (the order rotates), in two rounds: the first
    until half the time is spent, the second on the requests the first measured. Returns the quietest protocol
    (the lowest median run-to-run change) of those measured on at least half the requests of the second round."""
    names = ("fixed", "timed", "queued", "graph") if device == "cuda" else ("fixed", "timed")
    fields = {name: {} if name == "fixed" else timing_fields(name, 25.0, 100.0, 1000, device) for name in names}
    specs = SpecSamplerConfig()
    requests = []
    for i in range(count):
        batch_size, tables = sample_spec_shard(specs, 0, i)
        requests.append(compute_request(i, tables, None, batch_size, device, warmup=5, iters=10))
    runs: dict[str, list[dict]] = {name: [{}, {}] for name in names}
    errors: dict[str, list[str]] = {name: [] for name in names}
    half = time.monotonic() + (deadline - time.monotonic()) / 2
    worker = ComputeWorker(device)
    graphs = ComputeWorker(device) if "graph" in names else worker  # a failed capture must not touch the others
    try:
        for round_, until in ((0, half), (1, deadline)):
            for i, request in enumerate(requests):
                if time.monotonic() > until or (round_ == 1 and not any(i in runs[n][0] for n in names)):
                    break
                for k in range(len(names)):
                    name = names[(i + round_ + k) % len(names)]
                    if len(errors[name]) >= 3 and not any(runs[name]):
                        continue  # failed on its first 3 requests: not this device's protocol
                    answer = measure_on(graphs if name == "graph" else worker, {**request, **fields[name]}, 300)
                    if answer.get("ok"):
                        runs[name][round_][i] = answer
                    else:
                        errors[name].append(str(answer.get("error"))[:300])
    finally:
        worker.close()
        graphs.close()
    found = {name: {**noise(*runs[name]), "failed": len(errors[name]), "errors": errors[name][:3]} for name in names}
    for name in names:  # what each protocol reads against fixed on the same requests (first round)
        both = [i for i in runs[name][0] if i in runs["fixed"][0]]
        ratios = [runs[name][0][i]["total_ms"] / runs["fixed"][0][i]["total_ms"] for i in both]
        found[name]["over_fixed_median"] = round(float(np.median(ratios)), 4) if ratios else None
    measured = [n for n in names if found[n]["requests"] and found[n]["requests"] >= len(runs[names[0]][1]) / 2]
    chosen = min(measured, key=lambda n: found[n]["run_to_run_median"]) if measured else "fixed"
    write_json({"device": device, "requests": count, "chosen": chosen, **found}, out / "protocols.json")
    return chosen


def noise(first: dict[int, dict], second: dict[int, dict]) -> dict:
    """Run-to-run noise of one protocol: the same requests' labels, one run against the other; and the spread of
    the timed iterations within a run (IQR over median)."""
    both = sorted(set(first) & set(second))
    a = np.array([first[i]["total_ms"] for i in both])
    b = np.array([second[i]["total_ms"] for i in both])
    within = [spread(r) for r in [*first.values(), *second.values()]]
    if not both:
        return {"requests": 0}
    change = np.abs(b / a - 1)
    return {
        "requests": len(both),
        "median_label_ms": round(float(np.median(a)), 4),
        "run_to_run_median": round(float(np.median(change)), 4),
        "run_to_run_p90": round(float(np.quantile(change, 0.9)), 4),
        "second_over_first_median": round(float(np.median(b / a)), 4),
        "within_run_spread_median": round(float(np.median(within)), 4),
        "timed_iters_median": statistics.median(r.get("timed_iters", len(r["fwd_runs_ms"])) for r in first.values()),
    }


def spread(answer: dict) -> float:
    totals = np.add(answer["fwd_runs_ms"], answer["bwd_runs_ms"])
    q1, q3 = np.quantile(totals, [0.25, 0.75])
    return float((q3 - q1) / np.median(totals))


def labels(out: Path, work: Path, device: str, protocol: str, deadline: float, dry: bool) -> None:
    config = CollectConfig(
        kind="compute",
        source="specs",
        device=device,
        num_samples=100_000,
        out_dir=str(work / f"{device}-specs-{protocol}"),
        executor=ExecutorConfig(workers=1),
        pin=False,
        protocol=protocol,
        measure_ms=10.0 if dry else 100.0,
        progress=False,
        **({"specs": SpecSamplerConfig(max_tables=3, log10_rows=(2.0, 4.0))} if dry else {}),
    )
    collect(config, range(config.num_samples), until=deadline)
    with tarfile.open(out / "labels.tgz", "w:gz") as tar:
        tar.add(config.out_dir, arcname=Path(config.out_dir).name)


def torchrec_plans(tasks: dict, path: Path, only: tuple[str, ...] = TASKS) -> None:
    """TorchRec's plans of the check's tasks (made here: the GPU machine has no TorchRec)."""
    log_ = JsonlLog(path)
    for task_id in only:
        if task_id not in log_.ids:
            plan = search_plan(tasks[task_id], "torchrec", "neural", 0, SEARCHER_OPTIONS.get("torchrec"))
            log_.append({"id": task_id, "plan": plan.to_json()})


def plans(out: Path, pack: Path, device: str, protocol: str, deadline: float, dry: bool) -> None:
    """Every device of every plan of the check's tasks on ``device``, in up to 3 interleaved rounds (every device
    once per round), ``plans.json`` rewritten after each round; rounds stop at the deadline."""
    tasks = {task_id: task for task_id, _, task in benchmark_tasks(pack / TASKS_FILE if pack else None)}
    choice = choose_cost_model("neural", {}, device)
    made: dict[str, dict[str, Plan]] = {}
    for task_id in TASKS[:1] if dry else TASKS:
        made[task_id] = {}
        for searcher in (*MODEL_SEARCHERS, "size_lookup_greedy"):
            plan = search_plan(tasks[task_id], searcher, choice.name, 0, None, choice.options)
            made[task_id][searcher] = plan
    carried = {r["id"]: Plan.from_json(r["plan"]) for r in read_jsonl(pack / TORCHREC_PLANS)} if pack else {}
    for task_id in made:
        if task_id in carried:
            made[task_id]["torchrec"] = carried[task_id]
    measuring = {"protocol": protocol, "measure_ms": 10.0 if dry else 100.0}
    config = EvaluateConfig(device=device, executor=ExecutorConfig(workers=1), **measuring)
    jobs, keys = {}, {}  # keys[(task, searcher)]: each device's kernel keys (none: an empty device)
    for task_id, by_searcher in made.items():
        for searcher, plan in by_searcher.items():
            keys[task_id, searcher] = []
            for kernels in plan_kernels(plan):
                for key, at, tables in kernels:
                    jobs.setdefault(key, (at, tables))
                keys[task_id, searcher].append([key for key, _, _ in kernels])
    answers: dict[str, list[dict]] = {key: [] for key in jobs}
    for round_ in range(3):
        if round_ and time.monotonic() > deadline:
            break
        for key, got in measure_tables(jobs, config).items():
            answers[key] += got
        rows = {}
        for task_id, by_searcher in made.items():
            rows[task_id] = {}
            for searcher, plan in by_searcher.items():
                predicted = plan.costs.compute_ms if plan.costs is not None else None
                measured = [
                    sum(float(np.median([a["total_ms"] for a in answers[key]])) for key in device)
                    for device in keys[task_id, searcher]
                ]
                rows[task_id][searcher] = {
                    "measured_ms": measured,
                    "predicted_ms": None if predicted is None else [float(x) for x in predicted],
                    "slowest_ms": max(measured),
                }
        summary = {"device": device, "model": choice.line(), "protocol": protocol, "repeats": round_ + 1}
        write_json({**summary, "tasks": rows}, out / "plans.json")


def search(out: Path, platforms: list[str], dry: bool, deadline: float) -> None:
    """The main job's search on each JAX backend, cold (a fresh compilation cache per backend and searcher) then
    warm, the backends interleaved so that a deadline cuts the same runs of each."""
    size = ["task.num_tables=60", "task.num_devices=8"] if dry else ["task.num_tables=856", "task.num_devices=64"]
    rows = []
    with tempfile.TemporaryDirectory() as caches:
        for searcher in MODEL_SEARCHERS:
            for state in ("cold", "warm"):
                for platform in platforms:
                    if rows and time.monotonic() > deadline:  # the first run always: a step that started late
                        break
                    cache = f"{caches}/{platform}-{searcher}"
                    env = {**os.environ, "JAX_PLATFORMS": platform, "NEUROSHARD_CACHE_DIR": cache}
                    args = [sys.executable, "-m", "neuroshard_jax", f"searcher={searcher}", *size]
                    started = time.perf_counter()
                    done = subprocess.run(
                        [*args, f"hydra.run.dir={cache}/run"], capture_output=True, text=True, env=env, timeout=300
                    )
                    wall = time.perf_counter() - started
                    found = re.search(r"search ([0-9.]+) s", done.stdout + done.stderr)
                    rows.append(
                        {
                            "platform": platform,
                            "searcher": searcher,
                            "state": state,
                            "wall_s": round(wall, 2),
                            "search_s": float(found[1]) if found else None,
                            "ok": done.returncode == 0,
                            **({} if done.returncode == 0 else {"error": done.stderr[-600:]}),
                        }
                    )
    write_json({"size": size, "runs": rows}, out / "search.json")


def run(out: Path, dry: bool, budget_s: float, pack: Path | None, only: tuple[str, ...] = ()) -> None:
    out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if dry else "cuda"
    start = time.monotonic()
    deadline = start
    log(out, f"gpu check on {hardware().get('gpu') or hardware().get('cpu')}, device={device}, budget {budget_s} s")
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    chosen = ["fixed"]  # the protocols step replaces it with the quietest
    steps = {
        "smoke": lambda until: smoke(out, device),
        "protocols": lambda until: chosen.append(protocols(out, device, 6 if dry else 60, until)),
        "search": lambda until: search(out, ["cpu"] if dry else ["cuda", "cpu"], dry, until),
        "labels": lambda until: labels(out, work, device, chosen[-1], until, dry),
        "plans": lambda until: plans(out, pack, device, chosen[-1], until, dry),
    }
    failed = set()
    for name, step in steps.items():
        if only and name not in only:
            continue
        deadline += SHARES[name] * budget_s / sum(SHARES[n] for n in only or SHARES)
        if name in GPU_STEPS and "smoke" in failed:
            log(out, f"{name}: skipped (the smoke request failed)")
            continue
        log(out, f"{name}: until {deadline - start:.0f} s" + (f", protocol {chosen[-1]}" if name in GPU_STEPS else ""))
        try:
            step(deadline)
        except Exception as err:  # noqa: BLE001 - one failed step must not cost the others their device time
            failed.add(name)
            detail = str(err) if isinstance(err, UserError) else traceback.format_exc()
            log(out, f"{name} failed: {detail}")
        log(out, f"{name}: done at {time.monotonic() - start:.0f} s")
    if failed:
        raise UserError(f"the GPU check's steps {', '.join(sorted(failed))} failed; {out / 'log.txt'} says why")


def table(out: Path) -> str:
    """The README's GPU table from a run's files."""
    lines = []
    read = {
        name: json.loads((out / f"{name}.json").read_text())
        for name in ("protocols", "plans", "search")
        if (out / f"{name}.json").exists()
    }  # a step that failed wrote no file: its table is left out
    proto = read.get("protocols", {})
    lines += ["| protocol | requests | median label | run-to-run (median, p90) | within a run | timed iterations |"]
    lines += ["| --- | --- | --- | --- | --- | --- |"]
    for name in ("fixed", "timed", "queued", "graph"):
        p = proto.get(name, {})
        mark = " (chosen)" if proto.get("chosen") == name else ""
        if p.get("requests"):
            lines.append(
                f"| {name}{mark} | {p['requests']} | {p['median_label_ms']:.3f} ms | {p['run_to_run_median']:.1%}, "
                f"{p['run_to_run_p90']:.1%} | {p['within_run_spread_median']:.1%} | {p['timed_iters_median']} |"
            )
        elif p.get("failed"):
            lines.append(f"| {name} | failed {p['failed']} | {p['errors'][0][:120]} | | | |")
    plans_ = read.get("plans", {"tasks": {}})
    searchers = (*MODEL_SEARCHERS, "size_lookup_greedy", "torchrec")
    lines += ["", "| task | " + " | ".join(f"{s}: slowest device (of TorchRec's)" for s in searchers) + " |"]
    lines += ["| --- " * 5 + "|"]
    for task_id, rows in plans_["tasks"].items():
        base = rows.get("torchrec", {}).get("slowest_ms")
        cells = []
        for s in searchers:
            ms = rows.get(s, {}).get("slowest_ms")
            cells.append("-" if ms is None else f"{ms:.3f} ms" + (f" ({ms / base:.0%})" if base else ""))
        lines.append(f"| {task_id} | " + " | ".join(cells) + " |")
    runs = read.get("search", {"runs": []})["runs"]
    lines += ["", "| backend | searcher | cold wall / search s | warm wall / search s |", "| --- | --- | --- | --- |"]
    for platform in dict.fromkeys(r["platform"] for r in runs):
        for s in MODEL_SEARCHERS:
            got = {r["state"]: r for r in runs if r["platform"] == platform and r["searcher"] == s}
            cells = [f"{got[k]['wall_s']} / {got[k]['search_s']}" if k in got else "-" for k in ("cold", "warm")]
            lines.append(f"| {platform} | {s} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def pack(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tasks = {task_id: task for task_id, _, task in benchmark_tasks(out / TASKS_FILE)}  # carried: 24 s to draw
    torchrec_plans(tasks, out / TORCHREC_PLANS)
    prepare = Path(__file__).resolve().parents[1].parent / "shared" / "gpu" / "prepare.sh"
    if prepare.exists():
        subprocess.run(["bash", str(prepare), str(out.resolve())], check=True)  # it cds
    else:
        print(f"no {prepare}: pack FBGEMM GPU (pruned for the card) and hydra into {out} by hand", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("pack", "run", "table"))
    parser.add_argument("out")
    parser.add_argument("--dry", action="store_true", help="run: every step on this CPU, tiny")
    parser.add_argument("--budget-s", type=float, default=450.0, help="run: wall seconds for every step together")
    parser.add_argument("--pack", default=None, help="run: the folder pack made (TorchRec's plans)")
    parser.add_argument("--steps", default="", help=f"run: these steps only, comma-separated ({', '.join(SHARES)})")
    args = parser.parse_args()
    try:
        if args.stage == "pack":
            pack(Path(args.out))
        elif args.stage == "run":
            only = tuple(step for step in args.steps.split(",") if step)
            if set(only) - set(SHARES):
                raise UserError(f"--steps: got {args.steps!r}, expected some of {', '.join(SHARES)}")
            run(Path(args.out), args.dry, args.budget_s, Path(args.pack) if args.pack else None, only)
        else:
            print(table(Path(args.out)))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
