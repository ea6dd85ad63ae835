"""The sealed benchmark: tasks from table generators written for it alone, generated and measured once, at the end of
issue 51's work, never used to choose features, models or settings. Its stages are the foreign benchmark's
(``tools/foreign_benchmark.py``: plan, measure, report, ...) run on this suite, into ``outputs/bench/sealed``.

    python -m tools.sealed_benchmark tasks                                   # the tasks, their tables and caps
    python -m tools.sealed_benchmark plan --checkpoint NAME                  # every searcher's plans (resumable)
    python -m tools.sealed_benchmark measure --checkpoint NAME --run R --repeats 3 --workers 2 --pin --drift 40
    python -m tools.sealed_benchmark report --checkpoint NAME --run R    # docs/results/sealed-benchmark.md
    python -m tools.sealed_benchmark --seal 1 plan ...                       # a fresh set of the same families

A sealed set is spent once its figures are read. ``--seal N`` (N >= 1) draws a fresh set from the same families with
seeds of its own, into ``outputs/bench/sealed-N``: seal 1 is issue 63's (the portfolio and autotune against
TorchRec's planners), measured once at the end of that work; seal 2 is issue 65's (the model as trained and
calibrated, two runs an hour apart, 2026-11-28, commit e9f7371; spent: its errors by family chose the next labels);
seal 3 is issue 65's second (the model retrained with the tiny corner's labels, 2026-11-28, commit 2cfcd43); seal 4
is issue 75's (``autotune=loop`` against the balance bound and TorchRec's plans, 2026-11-30, commit 713fd41); seal 5
is issue 76's (the model of this kind as trained and calibrated, two runs an hour apart, and a new kind simulated
with first contact, 2026-11-30, commit 6dd3cc9); seal 0 (no flag) is issue 51's, spent.

The generators share no code and no seed with the training sampler, the table pool or the foreign benchmark (a test
checks): their own laws, written here. Families, each at 4 and at 8 devices (12 tasks at each size, 12-120 tables):
* public recommendation datasets' shapes, from their published cardinalities and feature counts (``PUBLIC``):
  ``criteo_kaggle``, ``criteo_terabyte`` (multi-hot as MLPerf's DLRM-DCNv2), ``avazu``, ``taobao_behavior``,
  ``alibaba_display_ad``, ``movielens_20m``; one-hot fields look up once per sample, multi-hot ones their typical
  lengths; every field's access is Zipf-like with an exponent of its own;
* synthetic families unlike the foreign ones: ``fused_small`` (60-120 small tables), ``dim4_mixed`` (half the
  tables 4 wide), ``heavy_pooling_mid`` (100-400 lookups per sample on 1e4-1e6 rows), ``huge_low_pooling`` (1e6-1e7
  rows looked up 0.2-2 times), ``multi_skew`` (uniform to steep access side by side), ``sequence_groups`` (a few
  vocabularies each read by several features of different lengths, as behaviour sequences are).

Access law: ranks drawn from a bounded power law (P(rank k) ~ k^-s over the table's rows, any s >= 0: s = 0 is
uniform), optionally with a share of the lookups on one row (a missing value's id); a table's ``bins`` are the
histogram of one batch's per-row counts (``core.features``' format). Tables too large for the measuring machine are
hashed into fewer rows (a row cap over the task, as DLRM's ``max_ind_range``) until every device fits.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from neuroshard_jax.core.features import bin_shares, count_histogram
from neuroshard_jax.core.task import Task
from tools.foreign_benchmark import Suite, main

BASE_SEED = 283_117  # this benchmark's own seeds; no generator of the project uses them (a test checks)
TASKS_PER_SIZE = 12
BATCH_SIZE = 4096  # the labels' and the foreign benchmark's batch: what is tested is the tables, not the batch
MAX_DEVICE_GIB = 5.0  # the measuring machine has 24 GiB for two kernel workers (a device each) and the collection
ROW_CAP = 10_000_000  # the most rows of a table before the task's fit: the largest tables the machine measures
BYTES_PER_ELEMENT = 4  # fp32


class Field(NamedTuple):
    """One categorical feature of a public dataset: its published cardinality and lookups per sample."""

    name: str
    rows: int
    pooling: float = 1.0  # 1: one-hot; a multi-hot field's (mean) length


# Criteo Kaggle Display Advertising Challenge (criteo-research-kaggle-display-advertising-challenge-dataset): 26
# categorical features C1..C26, their distinct values over the 7 training days as DLRM's preprocessing counts them
# (facebookresearch/dlrm, data_utils.py; the counts its Kaggle runs build their tables from). One-hot.
CRITEO_KAGGLE = tuple(
    Field(f"C{i + 1}", n)
    for i, n in enumerate(
        (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306, 10)
        + (5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
    )
)
# Criteo 1TB Click Logs (24 days): the 26 features' distinct values as TorchRec's DLRM example gives them
# (pytorch/torchrec examples/dlrm, --num_embeddings_per_feature), with the multi-hot lengths of MLPerf Training's
# DLRM-DCNv2 benchmark (mlcommons/training recommendation_v2, --multi_hot_sizes: its synthetic multi-hot Criteo).
CRITEO_TERABYTE = tuple(
    Field(f"C{i + 1}", n, p)
    for i, (n, p) in enumerate(
        zip(
            (45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138, 10, 2209, 11267)
            + (128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606, 104, 35),
            (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1),
        )
    )
)
# Avazu Click-Through Rate Prediction (Kaggle, 10 days of mobile ad logs, 40,428,967 rows): the distinct values of the
# 22 categorical fields of train.csv (all but id and click). One-hot.
AVAZU = tuple(
    Field(name, n)
    for name, n in (
        ("hour", 240),
        ("C1", 7),
        ("banner_pos", 7),
        ("site_id", 4737),
        ("site_domain", 7745),
        ("site_category", 26),
        ("app_id", 8552),
        ("app_domain", 559),
        ("app_category", 36),
        ("device_id", 2686408),
        ("device_ip", 6729486),
        ("device_model", 8251),
        ("device_type", 5),
        ("device_conn_type", 4),
        ("C14", 2626),
        ("C15", 8),
        ("C16", 9),
        ("C17", 435),
        ("C18", 4),
        ("C19", 68),
        ("C20", 172),
        ("C21", 60),
    )
)
AVAZU_MISSING_DEVICE_ID = 33_358_308 / 40_428_967  # rows of train.csv whose device_id is the one missing-value id
# Taobao UserBehavior (Tianchi dataset 649: 987,994 users, 4,162,024 items, 9,439 categories, 100,150,807 behaviours
# of four types over 9 days): the target item, its category, the user, the behaviour type, and the user's history of
# items and categories per behaviour type, each as long as that type's behaviours per user (about 90% page views,
# 5.5% carts, 2.9% favourites, 2.0% buys of ~101 per user).
_TAOBAO_HISTORY = (("pv", 91.0), ("cart", 5.6), ("fav", 2.9), ("buy", 2.0))
TAOBAO_BEHAVIOR = (
    Field("user_id", 987994),
    Field("item_id", 4162024),
    Field("category_id", 9439),
    Field("behavior_type", 4),
    *(Field(f"hist_{kind}_items", 4162024, n) for kind, n in _TAOBAO_HISTORY),
    *(Field(f"hist_{kind}_categories", 9439, n) for kind, n in _TAOBAO_HISTORY),
)
# Ad Display/Click Data on Taobao.com (Tianchi dataset 56, 1.14M users, 26M impressions): user_profile's and
# ad_feature's fields, the ad position (pid, 2 values), and the behaviour log's category and brand sequences
# (DIN-style, at most 50); sizes are the id ranges public DIN reproductions give their tables (ids below these).
ALIBABA_DISPLAY_AD = (
    Field("userid", 1141729),
    Field("cms_segid", 97),
    Field("cms_group_id", 13),
    Field("final_gender_code", 2),
    Field("age_level", 7),
    Field("pvalue_level", 4),
    Field("shopping_level", 4),
    Field("occupation", 2),
    Field("new_user_class_level", 5),
    Field("adgroup_id", 846811),
    Field("cate_id", 12961),
    Field("campaign_id", 423437),
    Field("customer", 255876),
    Field("brand", 461498),
    Field("pid", 2),
    Field("hist_cate_id", 12961, 50.0),
    Field("hist_brand", 461498, 50.0),
)
# MovieLens 20M (GroupLens, ml-20m README: 20,000,263 ratings of 27,278 movies by 138,493 users, each user >= 20
# ratings, ~144 on average; 20 genre labels; the tag genome's 1,128 tags; ratings 0.5..5 in half stars): a ranking
# model's features, the user's rating history among them.
MOVIELENS_20M = (
    Field("user_id", 138493),
    Field("movie_id", 27278),
    Field("movie_genres", 20, 2.0),
    Field("movie_genome_top_tags", 1128, 10.0),
    Field("hour_of_day", 24),
    Field("day_of_week", 7),
    Field("hist_movies", 27278, 144.0),
    Field("hist_liked_movies", 27278, 72.0),
    Field("hist_ratings", 10, 144.0),
    Field("hist_genres", 20, 288.0),
    Field("hist_genome_top_tags", 1128, 200.0),
    Field("liked_genres", 20, 3.0),
)
PUBLIC = {
    "criteo_kaggle": CRITEO_KAGGLE,
    "criteo_terabyte": CRITEO_TERABYTE,
    "avazu": AVAZU,
    "taobao_behavior": TAOBAO_BEHAVIOR,
    "alibaba_display_ad": ALIBABA_DISPLAY_AD,
    "movielens_20m": MOVIELENS_20M,
}


class Draw(NamedTuple):
    """A table before the task's fit: its name, rows, width, lookups per sample and access law (exponent ``skew``,
    ``hot_share`` of the lookups on one row)."""

    name: str
    rows: int
    dim: int
    pooling: float
    skew: float
    hot_share: float = 0.0


# ---------------------------------------------------------------------------------------------
# Access: one batch's per-row counts under a bounded power law


def power_law_counts(rng: np.random.Generator, rows: int, lookups: int, skew: float, hot_share: float) -> np.ndarray:
    """Positive per-row counts of ``lookups`` ids over ``rows`` rows: ``hot_share`` of them on one row, the rest
    drawn with P(rank k) ~ k^-``skew``. Small tables (at most 4 rows per lookup) are drawn exactly, by a multinomial
    over their ranks; larger ones by the continuous law's inverse CDF, ranks counted."""
    hot = int(rng.binomial(lookups, hot_share)) if hot_share > 0 else 0
    rest = lookups - hot
    if rows <= 4 * rest:
        weights = np.arange(1, rows + 1, dtype=np.float64) ** -skew
        counts = rng.multinomial(rest, weights / weights.sum()).astype(np.int64)
    else:
        u = rng.random(rest)
        top = float(rows + 1)
        x = top**u if abs(skew - 1.0) < 1e-9 else (1.0 + u * (top ** (1.0 - skew) - 1.0)) ** (1.0 / (1.0 - skew))
        ranks = np.minimum(x.astype(np.int64), rows) - 1
        values, found = np.unique(ranks, return_counts=True)
        counts = np.concatenate([[0], found[values > 0]]).astype(np.int64)  # rank 0 first, drawn or not
        counts[0] = found[0] if len(values) and values[0] == 0 else 0
    counts[0] += hot  # the missing value's row: the law's first rank
    return counts[counts > 0]


def batch_bins(rng: np.random.Generator, rows: int, pooling: float, skew: float, hot_share: float) -> list[float]:
    """The 17 bin shares (``core.features``) of one batch of ``pooling`` x ``BATCH_SIZE`` lookups."""
    lookups = max(round(pooling * BATCH_SIZE), 1)
    shares = bin_shares(count_histogram(power_law_counts(rng, rows, lookups, skew, hot_share))[0])
    return [round(float(x), 6) for x in shares]


# ---------------------------------------------------------------------------------------------
# Families


def fourth_root_dim(rows: int, scale: float) -> int:
    """A width by the rule of thumb dim ~ cardinality^(1/4) (Google's "Introducing TensorFlow Feature Columns",
    2017), times ``scale``, as a power of two in 4..128."""
    return int(2 ** np.clip(np.round(np.log2(scale * rows**0.25)), 2, 7))


def public_tables(family: str, rng: np.random.Generator) -> list[Draw]:
    """The fields of public dataset ``family`` as tables: the published cardinalities and lengths, a width chosen per
    task, a Zipf exponent per field."""
    fields = PUBLIC[family]
    skews = rng.uniform(0.75, 1.35, size=len(fields))
    if family == "criteo_kaggle":  # DLRM's one width for all tables
        dim = int(rng.choice((16, 32, 64)))
        missing = np.where(rng.random(len(fields)) < 0.5, rng.uniform(0.0, 0.4, len(fields)), 0.0)
        return [Draw(f.name, f.rows, dim, f.pooling, s, m) for f, s, m in zip(fields, skews, missing)]
    if family == "criteo_terabyte":  # MLPerf's DLRM-DCNv2 is 128 wide: narrower, to measure it here
        dim = int(rng.choice((32, 64)))
        return [Draw(f.name, f.rows, dim, f.pooling, s) for f, s in zip(fields, skews)]
    if family == "avazu":
        scale = float(rng.choice((2.0, 4.0)))
        return [
            Draw(f.name, f.rows, fourth_root_dim(f.rows, scale), f.pooling, s)._replace(
                hot_share=AVAZU_MISSING_DEVICE_ID if f.name == "device_id" else 0.0
            )
            for f, s in zip(fields, skews)
        ]
    if family == "alibaba_display_ad":
        scale = float(rng.choice((2.0, 4.0)))
        length = float(rng.uniform(20, 50))  # behaviour sequences truncated at 50
        return [
            Draw(f.name, f.rows, fourth_root_dim(f.rows, scale), length if f.name.startswith("hist_") else 1.0, s)
            for f, s in zip(fields, skews)
        ]
    # taobao_behavior, movielens_20m: one width, histories as published
    dim = int(rng.choice((16, 32, 64)))
    return [Draw(f.name, f.rows, dim, f.pooling, s) for f, s in zip(fields, skews)]


def _rows(rng: np.random.Generator, low: float, high: float) -> int:
    return int(round(10 ** rng.uniform(low, high)))


def fused_small(rng: np.random.Generator) -> list[Draw]:
    """60-120 tables of 1e2-1e4 rows, 1-60 lookups: many small tables fused in each device's kernel."""
    return [
        Draw(
            f"small_{j}",
            _rows(rng, 2, 4),
            int(rng.choice((8, 16, 32))),
            float(np.clip(rng.lognormal(1.5, 1.0), 1, 60)),
            float(rng.uniform(0.5, 1.3)),
        )
        for j in range(int(rng.integers(60, 121)))
    ]


def dim4_mixed(rng: np.random.Generator) -> list[Draw]:
    """20-50 tables, about half 4 wide, the rest 8 or 16; 1e3-3e6 rows, 1-30 lookups."""
    return [
        Draw(
            f"narrow_{j}",
            _rows(rng, 3, 6.5),
            4 if rng.random() < 0.5 else int(rng.choice((8, 16))),
            float(10 ** rng.uniform(0, 1.5)),
            float(rng.uniform(0.6, 1.3)),
        )
        for j in range(int(rng.integers(20, 51)))
    ]


def heavy_pooling_mid(rng: np.random.Generator) -> list[Draw]:
    """12-32 tables of 1e4-1e6 rows, each looked up 100-400 times per sample."""
    return [
        Draw(
            f"heavy_{j}",
            _rows(rng, 4, 6),
            int(rng.choice((16, 32, 64))),
            float(rng.uniform(100, 400)),
            float(rng.uniform(0.4, 1.2)),
        )
        for j in range(int(rng.integers(12, 33)))
    ]


def huge_low_pooling(rng: np.random.Generator) -> list[Draw]:
    """12-30 tables of 1e6-1e7 rows looked up 0.2-2 times per sample: large working sets, few lookups."""
    return [
        Draw(
            f"huge_{j}",
            _rows(rng, 6, 7),
            int(rng.choice((8, 16, 32))),
            float(10 ** rng.uniform(-0.7, 0.3)),
            float(rng.uniform(0.6, 1.1)),
        )
        for j in range(int(rng.integers(12, 31)))
    ]


def multi_skew(rng: np.random.Generator) -> list[Draw]:
    """20-60 tables of every size whose access laws span uniform (s = 0) to steep (s = 1.5) in one task."""
    return [
        Draw(
            f"skew_{j}",
            _rows(rng, 3, 7),
            int(rng.choice((16, 32, 64, 128))),
            float(10 ** rng.uniform(0, 1.7)),
            float(rng.choice((0.0, 0.5, 0.8, 1.0, 1.2, 1.5))),
        )
        for j in range(int(rng.integers(20, 61)))
    ]


def sequence_groups(rng: np.random.Generator) -> list[Draw]:
    """4-8 vocabularies, each read by 3-8 features of lengths 1-100 (a target id and its histories over several
    windows): tables of one shape and law side by side, different only in their lookups."""
    out = []
    for v in range(int(rng.integers(4, 9))):
        rows, dim, skew = _rows(rng, 3, 6.5), int(rng.choice((16, 32, 64))), float(rng.uniform(0.7, 1.2))
        lengths = rng.choice((1.0, 5.0, 20.0, 50.0, 100.0), size=int(rng.integers(3, 9)))
        out += [Draw(f"vocab{v}_len{int(n)}_{j}", rows, dim, float(n), skew) for j, n in enumerate(lengths)]
    return out


SYNTHETIC: dict[str, Callable[[np.random.Generator], list[Draw]]] = {
    "fused_small": fused_small,
    "dim4_mixed": dim4_mixed,
    "heavy_pooling_mid": heavy_pooling_mid,
    "huge_low_pooling": huge_low_pooling,
    "multi_skew": multi_skew,
    "sequence_groups": sequence_groups,
}
FAMILIES = (*PUBLIC, *SYNTHETIC)


def family_draws(family: str, rng: np.random.Generator) -> list[Draw]:
    """The tables of one task of ``family`` before the fit."""
    return public_tables(family, rng) if family in PUBLIC else SYNTHETIC[family](rng)


# ---------------------------------------------------------------------------------------------
# Fitting the measuring machine


def table_gib(rows: int, dim: int) -> float:
    return rows * dim * BYTES_PER_ELEMENT / 2**30


def roomy_cap_gib(draws: list[Draw], devices: int) -> float:
    """A device's memory cap: 2.5x the mean device's tables, 1.5x the largest table, at least 1 GiB: room for
    TorchRec's planner, which also reserves memory for inputs, optimizer state and headroom (memory is not what this
    benchmark is about)."""
    sizes = [table_gib(d.rows, d.dim) for d in draws]
    return max(2.5 * sum(sizes) / devices, 1.5 * max(sizes), 1.0)


def with_row_cap(draws: list[Draw], devices: int) -> list[Draw]:
    """``draws`` hashed into at most ``ROW_CAP`` rows, the cap lowered by a quarter at a time until the task's cap
    (``roomy_cap_gib``) is at most ``MAX_DEVICE_GIB``: every device of every plan is measurable here."""
    cap = ROW_CAP
    while True:
        fitted = [d._replace(rows=min(d.rows, cap)) for d in draws]
        if roomy_cap_gib(fitted, devices) <= MAX_DEVICE_GIB:
            return fitted
        cap = int(cap * 0.75)


def sealed_task(family: str, devices: int, index: int, seal: int = 0) -> Task:
    """Task ``index`` at ``devices`` devices of ``family`` in sealed set ``seal``: its own seed, tables drawn, fitted,
    then each batch's histogram drawn at its fitted rows."""
    rng = np.random.default_rng([BASE_SEED, devices, index] if seal == 0 else [BASE_SEED, seal, devices, index])
    draws = [d._replace(pooling=round(d.pooling, 3)) for d in with_row_cap(family_draws(family, rng), devices)]
    tables = [
        {
            "id": j,
            "name": f"{family}.{d.name}",
            "rows": d.rows,
            "dim": d.dim,
            "pooling_factor": d.pooling,
            "bins": batch_bins(rng, d.rows, d.pooling, d.skew, d.hot_share),
        }
        for j, d in enumerate(draws)
    ]
    obj = {
        "num_devices": devices,
        "mem_cap_gb": float(np.round(roomy_cap_gib(draws, devices), 2)),
        "batch_size": BATCH_SIZE,
        "tables": tables,
    }
    return Task.from_json(obj, where=f"sealed task d{devices}-{index:02d}")


def generate_tasks(seal: int = 0) -> list[tuple[str, str, Task]]:
    """(task id, family, task) of sealed set ``seal``: ``TASKS_PER_SIZE`` tasks at 4 and at 8 devices, every family
    once at each size."""
    return [
        (
            f"d{devices}-{i:02d}",
            FAMILIES[i % len(FAMILIES)],
            sealed_task(FAMILIES[i % len(FAMILIES)], devices, i, seal),
        )
        for devices in (4, 8)
        for i in range(TASKS_PER_SIZE)
    ]


SEALED = Suite("sealed", generate_tasks, BASE_SEED, "outputs/bench/sealed")


def sealed_suite(seal: int) -> Suite:
    """Sealed set ``seal`` (0: issue 51's, ``SEALED``)."""
    if seal == 0:
        return SEALED
    return Suite(f"sealed-{seal}", lambda: generate_tasks(seal), BASE_SEED, f"outputs/bench/sealed-{seal}")


def seal_of(argv: list[str]) -> tuple[int, list[str]]:
    """``--seal N`` taken out of ``argv`` (0 where absent): the set, and the stages' own arguments."""
    if "--seal" not in argv:
        return 0, argv
    at = argv.index("--seal")
    try:
        seal = int(argv[at + 1])
    except (IndexError, ValueError):
        seal = -1
    if seal < 0:
        print(
            f"error: --seal: got {' '.join(argv[at + 1 : at + 2]) or 'nothing'}, expected a set number >= 0",
            file=sys.stderr,
        )
        sys.exit(2)
    return seal, argv[:at] + argv[at + 2 :]


if __name__ == "__main__":
    chosen, sys.argv[1:] = seal_of(sys.argv[1:])
    main(sealed_suite(chosen), __doc__)
