"""The one-call entry of the library: tables in, a validated and scored ``Plan`` out.

import neuroshard_jax as nsj
plan = nsj.plan(
    {"user_id": {"rows": 1_000_000, "dim": 64, "pooling_factor": 1.0, "bins": [1.0] + [0.0] * 16},
     "item_id": {"rows": 200_000, "dim": 128, "pooling_factor": 20.0, "bins": [0.6, 0.3, 0.1] + [0.0] * 14}},
    num_devices=2, mem_cap_gb=4.0)
plan.costs.cost_ms, plan.placement()["item_id"], plan.to_json()
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence

from neuroshard_jax.core.plan import Plan
from neuroshard_jax.core.plan_file import estimated_line
from neuroshard_jax.search.sharding_planner import Planner, planner_from
from neuroshard_jax.workloads.builders import TableSpecs, TaskOptions, task_from_tables

logger = logging.getLogger(__name__)


def plan(
    tables: TableSpecs,
    num_devices: int | None = None,
    mem_cap_gb: float = 4.0,
    searcher: str | None = None,
    cost_model: str | None = None,
    *,
    batch_size: int = TaskOptions.batch_size,
    precision: str = TaskOptions.precision,
    optimizer: str = TaskOptions.optimizer,
    mem_reserve: float = TaskOptions.mem_reserve,
    devices: Sequence[Mapping[str, float]] | None = None,
    zipf: float = TaskOptions.zipf,
    planner: Planner | None = None,
    **options,
) -> Plan:
    """Shard ``tables`` over ``num_devices`` devices of ``mem_cap_gb`` GiB each (4 where not given), or over
    ``devices``: ``[{"mem_cap_gb": 16, "speed": 1.0}, ...]``, heterogeneous memory caps and relative compute speeds
    (a ``num_devices`` given beside them must be their count).

    ``planner``: a ``Planner`` built from its parts (``search.sharding_planner``), planning every call alike; or, as a
    convenience that builds one, the fields of ``PlannerOptions`` as keywords (``options``, with ``searcher`` and
    ``cost_model`` also the 4th and 5th arguments): ``searcher``, a registered name (``searcher_names()``), with its
    options beside it (``k=5`` for beam); ``cost_model``: ``"neural"`` (the model chosen for this machine's kind) or
    ``"analytic"`` or a model's name, with ``cost_model_options`` (``{"checkpoint": DIR}``); ``calibrate``,
    ``polish``, ``row_split``, ``seed`` (the same seed gives the same plan) and ``device``. A keyword that is none of
    these is refused with the nearest name; one given beside ``planner`` is refused too. A table without ``bins`` gets
    estimated ones from its rows and pooling factor (a Zipf law of exponent ``zipf``, as the TorchRec adapter's),
    with a ``UserWarning`` naming it; ``python -m neuroshard_jax.stats`` measures them. Numpy numbers and arrays are
    taken wherever Python's are. Raises ``UserError`` (bad input) or ``InfeasibleError`` (the tables fit no
    placement). The returned plan carries its predicted per-device costs (``plan.costs``). Compiled search kernels
    are kept on disk (``search.pipeline.keep_compiled_kernels``), so a second call on the same shapes in a new
    process skips compiling. ``precision`` (the weights'), ``optimizer`` (the fused optimizer the tables train
    with, FBGEMM's or TorchRec's name: ``"exact_row_wise_adagrad"``, ``"EXACT_ROWWISE_ADAGRAD"``, ``"adam"``) and
    ``mem_reserve`` (the share of every cap held back) decide what a device's tables hold while they train: weights,
    optimizer state and the step's buffers (``core.task``); every plan fits them. ``calibrate=True`` (or a
    ``CalibrateConfig``) first scales the cost model to this machine from measurements of the tables on the real
    kernels (``plan.calibration`` says by how much);
    ``polish=True`` (or a ``PolishConfig``) then improves the plan on the real kernels (``plan.polish`` records what
    was measured). Both run the same ``Planner`` as the main job and the TorchRec adapter. A model trained on
    another kind of hardware than this machine's plans with a ``UserWarning`` saying so (``choose_cost_model``); a
    task past the model's labels, or whose plan its ensemble's members disagree on, is logged as a warning
    (``costs.coverage.out_of_depth_warning``, logger ``neuroshard_jax.api``).
    """
    given = {k: v for k, v in (("searcher", searcher), ("cost_model", cost_model)) if v is not None}
    planner = planner_from({**given, **options}, planner)
    trains = TaskOptions(
        batch_size=batch_size, precision=precision, optimizer=optimizer, mem_reserve=mem_reserve, zipf=zipf
    )
    task = task_from_tables(tables, num_devices, mem_cap_gb, options=trains, devices=devices, seed=planner.seed)
    estimated = [t.name or t.id for t in task.tables if t.estimated]
    if estimated:
        warnings.warn(estimated_line(estimated, task.num_tables), UserWarning, stacklevel=2)
    planned = planner.run(task)
    choice = planned.choice
    if choice.instead:
        logger.warning("%s", choice.instead)
    if choice.kinds and not choice.matches:  # a model of other hardware: say so, once per call
        warnings.warn(choice.line(), UserWarning, stacklevel=2)
    depth = planned.depth_warning()
    if depth:
        logger.warning("%s", depth)
    return planned.plan
