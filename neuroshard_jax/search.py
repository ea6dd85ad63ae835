"""The search stage: build the task and cost model, run a searcher, validate and score the plan."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from neuroshard_jax.cost_models import make_cost_model, score_plan
from neuroshard_jax.plans import plan_to_json, validate_plan
from neuroshard_jax.tasks import check_feasible
from neuroshard_jax.types import Task


def shard_task(
    task: Task,
    searcher: str,
    cost_model: str,
    seed: int,
    searcher_options: dict | None = None,
    cost_model_options: dict | None = None,
) -> dict[str, Any]:
    """Search a plan for ``task``; returns the plan.json object (costs predicted by ``cost_model``)."""
    from searchers import make_searcher  # the searchers package depends on this library, not the reverse

    check_feasible(task)
    model = make_cost_model(cost_model, task, cost_model_options)
    algorithm = make_searcher(searcher, searcher_options)
    start = time.perf_counter()
    plan = algorithm.search(task, model, seed)
    elapsed_s = time.perf_counter() - start
    validate_plan(plan)
    return plan_to_json(plan, score_plan(model, plan), searcher, cost_model, seed, elapsed_s)


def write_json(obj: dict[str, Any], path: str | Path) -> Path:
    """Write atomically (a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)
    return path
