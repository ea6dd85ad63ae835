"""``searcher=rl``: the DreamShard-style placement policy (``neuroshard_jax.rl``), table-wise.

Greedy decoding (argmax at every step) plus, when ``samples`` > 0, that many sampled episodes; the
plan with the lowest cost under the run's cost model wins. The policy's own inputs (cost-model
latents and predicted kernel costs) come from the cost model it was trained with, saved beside it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from neuroshard_jax.cost_models import CostModel, score_plans
from neuroshard_jax.errors import InfeasibleError, UserError
from neuroshard_jax.types import Plan, Task
from searchers.registry import register

SHIPPED_POLICY = "data/policies/cpu-b4096"


@functools.lru_cache(maxsize=4)
def _load(path: str):
    from neuroshard_jax.checkpoints import load_checkpoint
    from neuroshard_jax.neural import neural_cost_model
    from neuroshard_jax.train_policy import load_policy, policy_dir

    graph, params, _, meta = load_policy(path)
    _, nets, cost_params, _ = load_checkpoint(policy_dir(path) / "cost_model")
    return graph, params, neural_cost_model(nets, cost_params), meta


@register("rl")
@dataclasses.dataclass(frozen=True)
class RLSearch:
    policy: str | None = None  # a train_policy output or round directory; None: the policy shipped in the package
    samples: int = 16  # sampled episodes besides the greedy one (best-of-K); 0: greedy only

    def __post_init__(self):
        if self.samples < 0:
            raise UserError(f"searcher.samples: got {self.samples}, expected an integer >= 0")

    def path(self) -> str:
        from importlib import resources
        from pathlib import Path

        path = self.policy or str(resources.files("neuroshard_jax") / SHIPPED_POLICY)
        if not Path(path).exists():
            raise UserError(
                f"searcher.policy: no policy at {path!r}; expected a directory written by "
                "python -m neuroshard_jax.train_policy"
            )
        return str(Path(path).resolve())

    def search(self, task: Task, cost_model: CostModel, seed: int) -> Plan:
        from neuroshard_jax.rl import decode, plan_from_actions, stack_tasks, task_arrays

        graph, params, policy_model, meta = _load(self.path())
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
                f"({task.num_devices} x {task.mem_cap_gb} GiB)"
            )
        return plans[int(np.argmin(score_plans(cost_model, plans)))]
