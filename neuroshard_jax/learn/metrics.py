"""How well predictions match measurements: relative and absolute error, rank agreement, and the measurements' own
noise (NumPy and SciPy only: what reports and benchmarks import without the training code)."""

from __future__ import annotations

import statistics

import numpy as np

from neuroshard_jax.core.files import JSONDoc


def mape(pred, true) -> float:
    pred, true = np.asarray(pred, float), np.asarray(true, float)
    return float(np.mean(np.abs(pred - true) / np.maximum(true, 1e-9)))


def relative_errors(pred, true) -> tuple[float, float, float]:
    """(MAPE, mean signed relative error, worst ratio either way) of predictions against positive measurements:
    what every held-out and benchmark judgement reports (each in its own record)."""
    ratio = np.asarray(pred, float) / np.asarray(true, float)
    return float(np.mean(np.abs(ratio - 1))), float(np.mean(ratio - 1)), float(np.max(np.maximum(ratio, 1 / ratio)))


def rmse(pred, true) -> float:
    return float(np.sqrt(np.mean((np.asarray(pred, float) - np.asarray(true, float)) ** 2)))


def log_rmse(pred, true) -> float:
    """Root mean squared error of log(pred / true): the ensemble's training objective, unweighted."""
    ratio = np.maximum(np.asarray(pred, float), 1e-12) / np.maximum(np.asarray(true, float), 1e-12)
    return float(np.sqrt(np.mean(np.log(ratio) ** 2)))


def kendall_tau(pred, true) -> float:
    """Kendall's tau-b of ``pred`` against ``true`` (ties counted as tau-b counts them; O(n log n)); 0 where it is
    undefined (fewer than two items, or one side all ties)."""
    if len(pred) < 2:  # scipy warns and returns NaN
        return 0.0
    from scipy.stats import kendalltau  # a quarter second of every start otherwise

    tau = kendalltau(np.asarray(pred, float), np.asarray(true, float)).statistic
    return 0.0 if np.isnan(tau) else float(tau)


def noise_floor(measured: dict[str, list[float]]) -> JSONDoc:
    """The measurements' own noise, the floor under any model's error: the mean relative distance of one repeat
    from the median of its device's repeats (devices measured 3 times or more), and how many repeats a device had."""
    runs = [(np.asarray(r), statistics.median(r)) for r in measured.values() if len(r) >= 3 and statistics.median(r)]
    if not runs:
        return {"one_repeat_vs_median": None, "devices": 0}
    distance = np.concatenate([np.abs(r - m) / m for r, m in runs])
    return {
        "one_repeat_vs_median": float(distance.mean()),
        "devices": len(runs),
        "repeats": float(np.median([len(r) for r, _ in runs])),
    }


def ranking_tau(pairs: list[tuple[float, float]], tie: float) -> float | None:
    """Kendall's tau of predicted against measured over (predicted, measured) plans, counting only the pairs whose
    measured figures differ by more than ``tie`` (relative): plans within the noise have no order to get right.
    None where no pair does."""
    agree = disagree = 0
    for i, (p, m) in enumerate(pairs):
        for q, n in pairs[i + 1 :]:
            if abs(m - n) > tie * min(m, n):
                agree += (p - q) * (m - n) > 0
                disagree += (p - q) * (m - n) <= 0
    return (agree - disagree) / (agree + disagree) if agree + disagree else None


def metrics(pred, true) -> JSONDoc:
    """A report's figures of ``pred`` against ``true``: MAPE, RMSE (ms), Kendall's tau, the count."""
    return {
        "mape": mape(pred, true),
        "rmse_ms": rmse(pred, true),
        "kendall_tau": kendall_tau(pred, true),
        "count": len(true),
    }
