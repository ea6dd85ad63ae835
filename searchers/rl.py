"""``searcher=rl``: the DreamShard-style placement policy (``searchers.policy``), table-wise.

Greedy decoding (argmax at every step) plus, when ``samples`` > 0, that many sampled episodes; the
plan with the lowest cost under the run's cost model wins. The policy's own inputs (cost-model
latents and predicted kernel costs) come from the cost model it was trained with, saved beside it.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import numpy as np

from neuroshard_jax.core.config import bounded, check_bounds
from neuroshard_jax.core.constraints import KEYS
from neuroshard_jax.core.errors import InfeasibleError, UserError
from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.costs.scoring import score_plans
from searchers.policy import decode, plan_from_actions, stack_tasks, task_arrays
from searchers.policy_store import load_search_policy, resolve_policy
from searchers.registry import Searcher, register


@register("rl")
@dataclasses.dataclass(frozen=True)
class RLSearch(Searcher):
    policy: str | None = None  # a train_policy output or round directory; None: the policy shipped in the package
    # sampled episodes besides the greedy one (best-of-K); 0: greedy only
    samples: int = bounded(at_least=0, default=16)
    constraints: ClassVar[tuple[str, ...]] = KEYS  # table-wise; illegal devices are masked out of the policy's choice

    def __post_init__(self):
        check_bounds(self, "searcher.")

    def search(self, task: Task, cost_model: CostModel, seed: int) -> Plan:
        graph, params, policy_model, meta = load_search_policy(resolve_policy(self.policy))
        for field in ("batch_size", "precision"):
            if getattr(task, field) != meta[field]:
                raise UserError(
                    f"task.{field}: got {getattr(task, field)!r}, but the rl policy was trained at {field} "
                    f"{meta[field]!r}; expected the same (or another searcher)"
                )
        arrays, order = task_arrays(task, policy_model)
        batch = stack_tasks([arrays])
        fns, cost_params = policy_model.fns, policy_model.params
        greedy = decode(graph, params, fns, cost_params, batch, np.zeros((1, 1, 2), np.uint32), True)
        episodes = [(greedy.feasible[0, 0], greedy.actions[0, 0])]
        if self.samples:
            keys = jax.random.split(jax.random.PRNGKey(seed), self.samples)[None]
            sampled = decode(graph, params, fns, cost_params, batch, keys, False)
            episodes += list(zip(sampled.feasible[0], sampled.actions[0]))
        plans = [plan_from_actions(task, order, np.asarray(a)) for ok, a in episodes if bool(ok)]
        if not plans:
            raise InfeasibleError(
                f"rl: every episode ({len(episodes)}) reached a table that fits on no device "
                f"({task.describe_devices()})"
            )
        return plans[int(np.argmin(score_plans(cost_model, plans)))]
