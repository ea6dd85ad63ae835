"""The search stage: check the task, build the cost model, run a searcher, validate and score the plan."""

from __future__ import annotations

import dataclasses
import time

import jax

from neuroshard_jax.constraints import KEYS, conflicts, has_constraints
from neuroshard_jax.errors import InfeasibleError, UserError
from neuroshard_jax.models import expected_cost_model, make_cost_model
from neuroshard_jax.scoring import with_costs
from neuroshard_jax.sharding import merge_colocated
from neuroshard_jax.tables import cache_dir
from neuroshard_jax.tasks import check_feasible
from neuroshard_jax.types import Plan, Task
from searchers import make_searcher, searcher_names


def enable_compilation_cache(min_compile_s: float = 0.2) -> None:
    """Keep XLA's compiled search kernels on disk (``$NEUROSHARD_CACHE_DIR/jax``, default
    ``~/.cache/neuroshard_jax/jax``): a later run of the same shapes skips compilation, most of a first search's
    time on a CPU. A cache directory the process already set (``jax_compilation_cache_dir``) is kept."""
    if jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_s)


def search_plan(
    task: Task,
    searcher: str,
    cost_model: str,
    seed: int,
    searcher_options: dict | None = None,
    cost_model_options: dict | None = None,
) -> Plan:
    """Search a plan for ``task``: validated, with its costs predicted by ``cost_model`` and its provenance."""
    check_feasible(task)
    model = make_cost_model(cost_model, task, cost_model_options)
    algorithm = make_searcher(searcher, searcher_options)
    if has_constraints(task.tables):
        check_constraints(task, searcher, algorithm)
    start = time.perf_counter()
    plan = algorithm.search(task, model, seed)
    # slices of one table left on one device are one shard's work done in pieces: undo those halvings
    plan = dataclasses.replace(plan, shards=merge_colocated(plan.shards))
    elapsed_s = time.perf_counter() - start
    plan.validate()
    # the reported costs are expectations: the search's risk term (an ensemble's spread) is not part of them
    scored = with_costs(expected_cost_model(model), plan)
    return dataclasses.replace(scored, searcher=searcher, seed=seed, search_time_s=elapsed_s)


def check_constraints(task: Task, searcher: str, algorithm) -> None:
    """A constrained task: its constraints must leave a placement (else InfeasibleError naming the smallest
    conflicting part found) and the searcher must honour them (else a UserError naming those that do)."""
    mem = [task.table_mem_bytes(i) for i in range(task.num_tables)]
    conflict = conflicts(task.tables, task.table_names(), mem, task.cap_bytes())
    if conflict:
        raise InfeasibleError(f"constraints cannot all hold: {conflict}")
    used = [k for k in KEYS if any(getattr(t, k) not in (None, False, ()) for t in task.tables)]
    missing = [k for k in used if k not in getattr(algorithm, "constraints", ())]
    if missing:
        able = [n for n in searcher_names() if set(used) <= set(getattr(make_searcher(n), "constraints", ()))]
        raise UserError(
            f"searcher {searcher}: does not take the constraint {missing[0]} (it takes "
            f"{', '.join(getattr(algorithm, 'constraints', ())) or 'none'}); expected one of {', '.join(able)}"
        )


def shard_task(
    task: Task,
    searcher: str,
    cost_model: str,
    seed: int,
    searcher_options: dict | None = None,
    cost_model_options: dict | None = None,
) -> dict:
    """``search_plan`` as the plan.json object."""
    return search_plan(task, searcher, cost_model, seed, searcher_options, cost_model_options).to_json()
