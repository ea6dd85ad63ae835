"""Fit the synthetic pool's generator settings to the published DLRM 2021 statistics.

    pip install scipy   # only this tool needs it
    python -m tools.fit_pool [--evals 300] [--start name=value ...]

Sampling 887M indices per try is too slow for a search, so each table's expected access histogram at
batch 65536 is computed in closed form: row r of a table with popularity sigma s has a Poisson
access count with mean N p_r, where p_r follows the log-normal popularity law of
``lognormal_popularity_ranks``; ranks are grouped geometrically past the head. Nelder-Mead then
minimises max(L1 unique share, L1 access share) + 0.3 x their sum (+ a penalty if the mean pooling
factor leaves 15.8 +- 1). The fitted numbers become the defaults of ``SyntheticPoolConfig``;
``tools/calibrate_pool.py`` then checks them on real sampled streams.
"""

import argparse
import dataclasses
import json

import numpy as np
from scipy.optimize import minimize
from scipy.special import pdtr
from scipy.stats import norm

from neuroshard_jax.workloads.pool import SyntheticPoolConfig, published_statistics, synthetic_table_params

REF = published_statistics()
BATCH = REF["batch_size"]
LOW = np.array([1] + [2 ** (k - 1) + 1 for k in range(1, 17)], dtype=float)  # bin k holds counts [LOW, HIGH]
HIGH = np.array([2**k for k in range(16)] + [np.inf])
FITTED = ("rows_shape_a", "rows_shape_b", "pooling_sigma", "skew_min", "skew_max", "skew_power",
          "pooling_rows_corr", "skew_low_share", "skew_low", "small_share", "small_log10_rows_max")  # fmt: skip


def poisson_cdf(c, lam):
    c = np.broadcast_to(c, np.broadcast_shapes(np.shape(c), np.shape(lam)))
    out = np.where(c < 0, 0.0, pdtr(np.maximum(np.where(np.isinf(c), 0, c), 0), lam))
    return np.where(np.isinf(c), 1.0, out)


def expected_table_histogram(rows: int, sigma: float, accesses: float):
    """Expected (unique rows f64[17], accesses f64[17]) of one table in one batch."""
    if rows <= 600:
        starts = np.arange(rows)
        ends = starts + 1
    else:
        edges = np.unique(np.concatenate([np.arange(300), np.geomspace(300, rows, 300).astype(np.int64), [rows]]))
        starts, ends = edges[:-1], edges[1:]
    z = norm.isf((starts + ends) / 2 / rows)
    p = np.exp(sigma * z - sigma**2 / 2) / rows  # E[exp(sigma Z)] = exp(sigma^2 / 2)
    lam = (accesses * p)[:, None]
    weight = (ends - starts).astype(float)[:, None]
    unique = poisson_cdf(HIGH[None], lam) - poisson_cdf(LOW[None] - 1, lam)
    hits = lam * (poisson_cdf(HIGH[None] - 1, lam) - poisson_cdf(LOW[None] - 2, lam))
    return (weight * unique).sum(0), (weight * hits).sum(0)


def distances(config: SyntheticPoolConfig, num_tables: int = 856) -> dict:
    params = synthetic_table_params(0, num_tables, config)
    unique, hits = np.zeros(17), np.zeros(17)
    for t in range(num_tables):
        u, a = expected_table_histogram(int(params.rows[t]), float(params.skew[t]), BATCH * params.pooling[t])
        unique += u
        hits += a
    return {
        "unique_row_share_l1": float(np.abs(unique / unique.sum() - REF["unique_row_share"]).sum()),
        "access_share_l1": float(np.abs(hits / hits.sum() - REF["access_share"]).sum()),
        "mean_pooling_factor": float(params.pooling.mean()),
        "access_share": (hits / hits.sum()).round(3).tolist(),
    }


def objective(x, base: SyntheticPoolConfig) -> float:
    values = dict(zip(FITTED, x))
    if (min(values["rows_shape_a"], values["rows_shape_b"], values["pooling_sigma"]) <= 0.2
            or not 0 <= values["skew_min"] <= values["skew_max"] or values["skew_power"] < 0.1
            or abs(values["pooling_rows_corr"]) >= 0.95 or not 0 <= values["skew_low_share"] < 0.95
            or values["skew_low"] < 0 or not 0 <= values["small_share"] < 0.6
            or not 2.1 < values["small_log10_rows_max"] < 5):  # fmt: skip
        return 10.0
    d = distances(dataclasses.replace(base, **values))
    du, da = d["unique_row_share_l1"], d["access_share_l1"]
    return max(du, da) + 0.3 * (du + da) + 0.05 * max(0.0, abs(d["mean_pooling_factor"] - 15.8) - 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evals", type=int, default=300)
    parser.add_argument("--start", nargs="*", default=[], help="name=value overrides of the starting point")
    args = parser.parse_args()
    base = SyntheticPoolConfig()
    start = dataclasses.replace(base, **{k: float(v) for k, v in (s.split("=") for s in args.start)})
    x0 = [getattr(start, name) for name in FITTED]
    print(json.dumps({"start": distances(start)}), flush=True)
    result = minimize(objective, x0, args=(base,), method="Nelder-Mead", options={"maxfev": args.evals})
    fitted = dataclasses.replace(base, **dict(zip(FITTED, result.x)))
    print(
        json.dumps({"fitted": {k: round(float(getattr(fitted, k)), 4) for k in FITTED}, **distances(fitted)}, indent=1)
    )


if __name__ == "__main__":
    main()
