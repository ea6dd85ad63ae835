"""The comparison suite: one searcher over a fixed set of tasks, every plan optionally measured.

    python -m neuroshard_jax -m experiment=compare 'searcher=glob(*)' [evaluate=true] [suite.tasks=10]
    python -m neuroshard_jax.evaluate sweep=MULTIRUN_DIR      # measure a finished sweep's plans later
    python -m neuroshard_jax.compare sweep=MULTIRUN_DIR       # the table and the plots

A run (one searcher with its options) writes into its Hydra job directory:
  suite.json       what it ran: searcher, cost model, their options, the task options, the job's overrides
  results.jsonl    one record per task (devices, task seed, predicted cost, search time, shards, or
                   "infeasible" with the reason); a stopped run resumes where it stopped
  measured.jsonl   the evaluator's measurements of those plans (same ids), appended chunk by chunk
and the sweep directory holds plan_measurements.jsonl: each distinct plan's measurement, reused by every
run whose plan is identical (same task, shards and evaluator settings).

Tasks are regenerated from the task options and their seeds (``suite.first_seed + i`` for i < tasks,
for each device count), so every searcher of a sweep sees the same tasks. The searcher's seed is the
task's seed. Measurements of concurrent jobs (``hydra/launcher=joblib``) never overlap each other or a
search: searching holds a shared lock on ``<sweep dir>/.measure.lock``, measuring an exclusive one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

from neuroshard_jax.core.config import bounded, check_bounds
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.files import JSONDoc, JsonlLog, write_json
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.costs.choice import CostModelSpec
from neuroshard_jax.measure.evaluator import EvaluateConfig, measure_plans
from neuroshard_jax.search.pipeline import search_plan
from neuroshard_jax.workloads.builders import make_task, task_config
from searchers import make_searcher

logger = logging.getLogger(__name__)

RESULTS = "results.jsonl"
MEASURED = "measured.jsonl"
SETTINGS = "suite.json"
LOCK = ".measure.lock"
PLAN_CACHE = "plan_measurements.jsonl"  # in the sweep directory: measurements by plan identity


@dataclasses.dataclass(frozen=True)
class SuiteConfig:
    tasks: int = bounded(at_least=1, default=50)  # tasks per device count
    devices: tuple[int, ...] = bounded(at_least=1, default=(4, 8))
    # task seeds first_seed .. first_seed + tasks - 1: held-out tasks, the same in tools/bench_search
    first_seed: int = 20_000
    # plans searched (and measured, with evaluate=true) per batch; a stopped run resumes
    chunk: int = bounded(at_least=1, default=25)

    def __post_init__(self):
        object.__setattr__(self, "devices", tuple(self.devices))
        check_bounds(self, "suite.")
        if not self.devices:
            raise UserError("suite.devices: got [], expected a non-empty list of integers >= 1")

    def keys(self) -> list[tuple[int, int]]:
        """(devices, task seed) of every task, in run order."""
        return [(n, self.first_seed + i) for n in self.devices for i in range(self.tasks)]


def record_id(devices: int, task_seed: int) -> str:
    return f"{devices}/{task_seed}"


@contextlib.contextmanager
def sweep_lock(folder: Path, exclusive: bool) -> Iterator[None]:
    """Shared (search) or exclusive (measure) lock on the sweep directory's lock file."""
    with open(folder / LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def suite_task(task_options: dict, devices: int, task_seed: int):
    return make_task(task_config({**task_options, "num_devices": devices}), task_seed)


def write_settings(run_dir: Path, settings: dict) -> None:
    """suite.json of a run; resuming a run with other settings is refused (its records would mix)."""
    path = run_dir / SETTINGS
    settings = json.loads(json.dumps(settings))  # tuples -> lists, as the file reads back
    if path.exists():
        old = json.loads(path.read_text())
        if old != settings:
            changed = sorted(k for k in settings if old.get(k) != settings[k])
            raise UserError(
                f"{path}: this run directory holds a suite run with other {', '.join(changed)}; "
                "expected the same settings to resume, or another hydra.sweep.dir"
            )
        return
    write_json(settings, path)


def run_suite(
    run_dir: str | Path,
    suite: SuiteConfig,
    settings: JSONDoc,
    evaluate: EvaluateConfig | None = None,
    sweep_dir: str | Path | None = None,
) -> SuiteCounts:
    """Search every task of ``suite`` with the run's searcher; measure the plans when ``evaluate`` (an
    EvaluateConfig) is given. ``settings`` (what suite.json records, read where the run resumes): searcher,
    searcher_options, cost_model, cost_model_options, task (options), overrides; the searcher and the cost model are
    made from them once. Returns its counts (``SuiteCounts``)."""
    searcher = make_searcher(settings["searcher"], settings["searcher_options"])
    cost_model = CostModelSpec(settings["cost_model"], settings["cost_model_options"])
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_dir = Path(sweep_dir or run_dir)
    write_settings(run_dir, settings)
    results = JsonlLog(run_dir / RESULTS)
    todo = [key for key in suite.keys() if record_id(*key) not in results.ids]
    for start in range(0, len(todo), suite.chunk):
        with sweep_lock(lock_dir, exclusive=False):
            for devices, task_seed in todo[start : start + suite.chunk]:
                task = suite_task(settings["task"], devices, task_seed)
                record = {"id": record_id(devices, task_seed), "devices": devices, "task_seed": task_seed}
                record["tables"] = task.num_tables
                try:
                    plan = search_plan(task, searcher, cost_model.for_task(task), task_seed).to_json()
                except InfeasibleError as err:  # counted, never dropped
                    results.write_record({**record, "infeasible": str(err)})
                    continue
                record.update(predicted_ms=plan["cost_ms"], search_s=plan["search_time_s"], shards=plan["shards"])
                if plan.get("data_parallel"):  # absent without any: older records read alike
                    record["data_parallel"] = plan["data_parallel"]
                results.write_record(record)
        if evaluate is not None:
            measure_run(run_dir, evaluate, lock_dir)
    if evaluate is not None and not todo:  # resumed after its searches: measure what was left
        measure_run(run_dir, evaluate, lock_dir)
    return counts(run_dir)


@dataclasses.dataclass(frozen=True)
class SuiteCounts:
    """A suite run's tasks searched, those of them infeasible, and its plans measured."""

    tasks: int
    infeasible: int
    measured: int


def counts(run_dir: Path) -> SuiteCounts:
    records = list(JsonlLog(run_dir / RESULTS).records())
    return SuiteCounts(
        tasks=len(records),
        infeasible=sum("infeasible" in r for r in records),
        measured=len(JsonlLog(run_dir / MEASURED).ids),
    )


def find_runs(root: str | Path) -> list[Path]:
    """Run directories of a sweep (those holding suite.json), sorted."""
    return sorted(p.parent for p in Path(root).rglob(SETTINGS))


def unmeasured(run_dir: Path) -> list[tuple[Path, dict, dict]]:
    """(run dir, settings, record) of the run's solved plans not measured yet."""
    settings = json.loads((run_dir / SETTINGS).read_text())
    done = JsonlLog(run_dir / MEASURED).ids
    return [
        (run_dir, settings, r) for r in JsonlLog(run_dir / RESULTS).records() if "shards" in r and r["id"] not in done
    ]


def plan_key(settings: dict, record: dict, config: EvaluateConfig) -> str:
    """Identity of a measurement: the task (options, devices, seed), the plan's shards and the evaluator
    settings that change timings."""
    evaluator = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("plan", "timeout_s", "executor")}
    evaluator["workers"] = config.executor.workers  # parallel workers contend: a timing setting (key as before)
    if config.executor.name != "local":
        evaluator["executor"] = config.executor.name
    task = {"options": settings["task"], "devices": record["devices"], "seed": record["task_seed"]}
    content = {"task": task, "shards": record["shards"], "evaluator": evaluator}
    if record.get("data_parallel"):  # a plan's data-parallel tables are part of what is measured
        content["data_parallel"] = record["data_parallel"]
    blob = json.dumps(content, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def measure_pending(
    pending: list[tuple[Path, dict, dict]], config: EvaluateConfig, cache_dir: Path, chunk: int = 50
) -> int:
    """Measure plans (of one or many runs) in batches and append each to its run's measured.jsonl.

    A plan identical to one already measured in this sweep (``cache_dir``/plan_measurements.jsonl: the
    same task, shards and evaluator settings, e.g. beam with k=3 and k=5 often agree) reuses that
    measurement, so identical plans never differ by timing noise; identical device shard sets within a
    batch are measured once. Returns the number of plans handled."""
    cache = JsonlLog(cache_dir / PLAN_CACHE)
    known = {r["id"]: r for r in cache.records()}
    for start in range(0, len(pending), chunk):
        batch = pending[start : start + chunk]
        keys = [plan_key(s, r, config) for _, s, r in batch]
        new = {key: item for key, item in zip(keys, batch) if key not in known}
        plans = [
            Plan.from_json(
                {
                    "task": suite_task(s["task"], r["devices"], r["task_seed"]).to_json(),
                    "shards": r["shards"],
                    "data_parallel": r.get("data_parallel", []),
                },
                where=f"{run}/{RESULTS} {r['id']}",
            )
            for run, s, r in new.values()
        ]
        for key, result in zip(new, measure_plans(plans, config) if plans else []):
            known[key] = {"id": key, "measured_ms": result["cost_ms"], "devices": result["devices"]}
            cache.write_record(known[key])
        for (run, _, record), key in zip(batch, keys):
            m = known[key]
            JsonlLog(run / MEASURED).write_record(
                {"id": record["id"], "measured_ms": m["measured_ms"], "devices": m["devices"], "plan_key": key}
            )
        logger.info("%d / %d plans measured (%d new in this batch)", start + len(batch), len(pending), len(new))
    return len(pending)


def measure_run(run_dir: Path, config: EvaluateConfig, lock_dir: Path) -> int:
    with sweep_lock(lock_dir, exclusive=True):
        return measure_pending(unmeasured(run_dir), config, lock_dir)


def measure_sweep(root: str | Path, config: EvaluateConfig) -> int:
    """Measure every unmeasured plan of every run under ``root`` (``python -m neuroshard_jax.evaluate
    sweep=DIR``); all runs' plans share batches, so devices common to several searchers are measured once."""
    runs = find_runs(root)
    if not runs:
        raise UserError(
            f"sweep: {str(root)!r} holds no suite run (suite.json), expected a directory of "
            "python -m neuroshard_jax -m experiment=compare"
        )
    pending = [item for run in runs for item in unmeasured(run)]
    # A task's plans share a batch; seeds interleave the device counts, so a stopped run covers both.
    pending.sort(key=lambda item: (item[2]["task_seed"], item[2]["devices"]))
    with sweep_lock(Path(root), exclusive=True):
        return measure_pending(pending, config, Path(root))
