"""neuroshard-jax: shard the embedding tables of recommendation models, with cost models learned on real kernels.

The public API (everything else is internal and may move):

* ``plan(tables, num_devices=..., mem_cap_gb=..., searcher="portfolio", cost_model="neural", **options) -> Plan``
  (``devices=[{"mem_cap_gb": ..., "speed": ...}, ...]`` for heterogeneous devices)
* ``Plan`` (``to_json`` / ``from_json``, ``costs``, ``placement()``), ``PlanCosts``, ``Task``, ``Device``, ``Table``,
  ``Shard``;
  ``load_plan(path)``; ``to_torchrec(plan, ...)``: a plan as a TorchRec ``ShardingPlan`` (imports torch on call)
* ``load_cost_model(name_or_path)`` -> ``CostModel`` (``.fns``, ``.params``), and the jitted scoring functions
  that take them: ``plan_costs``, ``shard_costs``, ``table_latents``, ``costs_from_latents``, ``device_costs``,
  ``plan_cost_ms``, over a plan's ``PlanArrays`` (``DeviceArrays``); host-side ``plan_arrays``, ``apart_arrays``,
  ``score_plan``, ``score_plans``
* ``Planner`` (``planner=`` of ``plan``): a searcher, a ``CostModelSpec`` and the measured stages, built once;
  ``PlannerOptions``: every option of a planning run by name (``.planner()`` builds the ``Planner``)
* ``searcher_names()``; the errors ``UserError``, ``InfeasibleError``, ``PlanError``

Names load on first use, so ``import neuroshard_jax`` is cheap and the torch worker (which imports a few numpy-only
modules of this package) never loads JAX.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "plan": "neuroshard_jax.api",
    "Planner": "neuroshard_jax.search.sharding_planner",
    "PlannerOptions": "neuroshard_jax.search.sharding_planner",
    "CostModelSpec": "neuroshard_jax.costs.choice",
    "task_from_tables": "neuroshard_jax.workloads.builders",
    "Plan": "neuroshard_jax.core.plan",
    "PlanCosts": "neuroshard_jax.core.plan",
    "Task": "neuroshard_jax.core.task",
    "Table": "neuroshard_jax.core.table",
    "Device": "neuroshard_jax.core.devices",
    "Shard": "neuroshard_jax.core.sharding",
    "load_plan": "neuroshard_jax.core.plan_file",
    "to_torchrec": "neuroshard_jax.kernels.torchrec_format",
    "load_cost_model": "neuroshard_jax.costs.choice",
    "make_cost_model": "neuroshard_jax.costs.choice",
    "CostModel": "neuroshard_jax.costs.cost_model",
    "CostFns": "neuroshard_jax.costs.cost_model",
    "DeviceCosts": "neuroshard_jax.costs.cost_model",
    "PlanArrays": "neuroshard_jax.costs.cost_model",
    "DeviceArrays": "neuroshard_jax.costs.cost_model",
    "device_costs": "neuroshard_jax.costs.cost_model",
    "plan_cost_ms": "neuroshard_jax.costs.cost_model",
    "plan_costs": "neuroshard_jax.costs.scoring",
    "shard_costs": "neuroshard_jax.costs.scoring",
    "table_latents": "neuroshard_jax.costs.scoring",
    "costs_from_latents": "neuroshard_jax.costs.scoring",
    "plan_arrays": "neuroshard_jax.costs.scoring",
    "apart_arrays": "neuroshard_jax.core.assignment",
    "score_plan": "neuroshard_jax.costs.scoring",
    "score_plans": "neuroshard_jax.costs.scoring",
    "searcher_names": "searchers",
    "UserError": "neuroshard_jax.core.errors",
    "InfeasibleError": "neuroshard_jax.core.errors",
    "PlanError": "neuroshard_jax.core.errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'neuroshard_jax' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
