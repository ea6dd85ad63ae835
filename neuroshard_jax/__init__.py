"""neuroshard-jax: shard the embedding tables of recommendation models, with cost models learned on real kernels.

The public API (everything else is internal and may move):

* ``plan(tables, num_devices=..., mem_cap_gb=..., searcher="beam", cost_model="neural", **options) -> Plan``
  (``devices=[{"mem_cap_gb": ..., "speed": ...}, ...]`` for heterogeneous devices)
* ``Plan`` (``to_json`` / ``from_json``, ``costs``, ``placement()``), ``PlanCosts``, ``Task``, ``Device``, ``Table``,
  ``Shard``;
  ``load_plan(path)``
* ``load_cost_model(name_or_path)`` -> ``CostModel`` (``.fns``, ``.params``), and the jitted scoring functions
  that take them: ``plan_costs``, ``shard_costs``, ``table_latents``, ``costs_from_latents``, ``device_costs``,
  ``plan_cost_ms``; host-side ``plan_arrays``, ``score_plan``, ``score_plans``
* ``searcher_names()``; the errors ``UserError``, ``InfeasibleError``, ``PlanError``

Names load on first use, so ``import neuroshard_jax`` is cheap and the torch worker (which imports a few numpy-only
modules of this package) never loads JAX.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "plan": "neuroshard_jax.api",
    "task_from_tables": "neuroshard_jax.api",
    "Plan": "neuroshard_jax.types",
    "PlanCosts": "neuroshard_jax.types",
    "Task": "neuroshard_jax.types",
    "Table": "neuroshard_jax.types",
    "Device": "neuroshard_jax.types",
    "Shard": "neuroshard_jax.sharding",
    "load_plan": "neuroshard_jax.plans",
    "load_cost_model": "neuroshard_jax.models",
    "make_cost_model": "neuroshard_jax.models",
    "CostModel": "neuroshard_jax.cost_models",
    "CostFns": "neuroshard_jax.cost_models",
    "DeviceCosts": "neuroshard_jax.cost_models",
    "device_costs": "neuroshard_jax.cost_models",
    "plan_cost_ms": "neuroshard_jax.cost_models",
    "plan_costs": "neuroshard_jax.scoring",
    "shard_costs": "neuroshard_jax.scoring",
    "table_latents": "neuroshard_jax.scoring",
    "costs_from_latents": "neuroshard_jax.scoring",
    "plan_arrays": "neuroshard_jax.scoring",
    "score_plan": "neuroshard_jax.scoring",
    "score_plans": "neuroshard_jax.scoring",
    "searcher_names": "searchers",
    "UserError": "neuroshard_jax.errors",
    "InfeasibleError": "neuroshard_jax.errors",
    "PlanError": "neuroshard_jax.errors",
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
