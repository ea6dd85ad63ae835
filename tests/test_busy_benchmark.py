"""``tools.busy_benchmark``: the returned plan and the model's pick read again on the quiet machine, with one ruler,
and the verdict's rule; its arguments refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from neuroshard_jax.core.plan import Plan
from neuroshard_jax.measure.evaluator import EvaluateConfig
from tests.conftest import make_table, make_task


@pytest.mark.fast
def test_bad_arguments_are_refused_in_one_line(capsys):
    from tools.busy_benchmark import main

    assert main(["run", "--run", "x", "--modes", "kernels,fast"]) == 2
    assert "--modes: got 'kernels,fast', expected some of kernels, loop, steps" in capsys.readouterr().err
    assert main(["measure", "--run", "x", "--repeats", "1"]) == 2
    assert "--repeats: got 1, expected >= 2" in capsys.readouterr().err
    assert main(["report", "--run", "x", "--suite", "sealed-x"]) == 2
    assert "--suite: got 'sealed-x'" in capsys.readouterr().err


@pytest.mark.fast
def test_a_plan_is_slower_than_the_pick_only_beyond_both_spreads():
    from tools.busy_benchmark import against_pick

    pick = np.array([10.0, 10.4, 10.2])
    assert against_pick(np.array([10.3, 10.9, 11.0]), pick)["slower_beyond_noise"] is False  # overlaps
    slower = against_pick(np.array([10.5, 10.9, 11.0]), pick)
    assert slower["slower_beyond_noise"] is True and slower["vs_pick"] == round(10.9 / 10.2, 4)


def test_quiet_steps_read_both_plans_on_the_real_worker_with_the_models_collectives():
    from tools.busy_benchmark import quiet_steps

    tables = [make_table(t, rows=20_000, dim=16, pooling=8.0) for t in range(4)]
    task = make_task(tables, num_devices=2, batch_size=2048)  # a batch the shipped models were trained at
    spread = Plan.from_assignment(task, [1] * 4, [[0], [1], [0], [1]])
    piled = Plan.from_assignment(task, [1] * 4, [[0]] * 4)
    steps = quiet_steps([spread, piled], 3, EvaluateConfig())
    assert steps.shape == (2, 3) and (steps > 0).all()
    assert np.median(steps[1]) > np.median(steps[0])  # four tables' lookups on one device against two on each
