"""A cost model of this machine in minutes: pre-train, adapt, and search.

    python -m neuroshard_jax.adapt budget_min=10                 # this CPU
    python -m neuroshard_jax.adapt budget_min=10 device=cuda     # this machine's GPU

Within ``budget_min`` minutes of wall time, in three steps:

1. **Labels.** Spec shards (tables over the whole range users bring, ``SpecSamplerConfig``) measured on this
   machine's kernels, in an order fixed by the seed: picks that cover the space (sample 0, 1, 2, ... of the spec
   sampler) take turns with picks where the start model is least sure (of ``draws`` fresh samples, the one its
   members disagree on most); every ``heldout_every``-th covering pick is held out. Then, for ``plan_share`` of
   the measuring time, the devices of plans that beam and grid search with the start model (``collect
   kind=plans``): the shards a search will ask about.
2. **Fine-tune** the start model (the model chosen for this machine, else the default) on the labels that are
   not held out: the pre-trained model is the prior. ``reanchor`` first moves it onto the roofline fitted to the
   new labels (``ensemble_fit.reanchored``): a GPU's fixed launch cost is not a CPU's per-lookup cost.
3. **Report** MAPE, bias and Kendall tau on the held-out labels: the start model as shipped, the start model
   scaled by one factor (what ``calibrate=measured`` does), the adapted model and any ``compare`` models. Then
   **register** the model in the user's cache (``user_models_dir``) under ``name``, where it reads the held-out
   labels better than the start model both as it was and scaled by one factor (else the start model stays, and the
   run says so; ``register_worse`` registers it anyway): later runs on this kind of machine choose it
   (``choice.choose_cost_model``).

Resumable: the labels are datasets like ``collect``'s (``out/labels/specs``, ``out/labels/plans``; ``out``: the
user's cache, ``adapt/<name>``, unless given) and ``out/adapt.json`` keeps the measuring time spent; rerun the same
command and it measures for what is left of the budget, then trains again. The comm nets come with the start model;
on a CPU, TorchRec's input distribution is measured first (``input_labels`` comm labels on gloo ranks,
``costs/input_dist.py``), fitted, and added to this user's fits, so that models of this kind price it.

Why one module of ~760 lines: adapting is one resumable run over one folder (its budget, its two label sets, the
start model, the training and the registration), each step reading what the one before wrote; split by step, every
part would carry the folder's layout and the budget's bookkeeping with it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import bounded, check_bounds, typed
from neuroshard_jax.core.constants import MIN_CPU_SHARE, SHIPPED_MODEL_NAME
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, read_records, write_json
from neuroshard_jax.core.folders import one_writer, replace_dir
from neuroshard_jax.core.hardware import hardware, hardware_kind
from neuroshard_jax.core.memory import kernel_optimizer
from neuroshard_jax.core.paths import cache_folder, own_fits_dir, user_models_dir
from neuroshard_jax.costs.checkpoints import ENSEMBLE_FORMAT, load_ensemble, read_meta
from neuroshard_jax.costs.choice import COST_MODELS, checkpoint_path, choose_cost_model, model_kinds, shipped_names
from neuroshard_jax.costs.ensemble import EnsembleConfig
from neuroshard_jax.kernels.executors import ExecutorConfig, connected
from neuroshard_jax.kernels.processes import table_ref, timing_fields
from neuroshard_jax.learn.adapt_budget import FIRST_GUESS_S, REPORT_S, LabelCounts, Ledger, Rates, minutes_up
from neuroshard_jax.learn.cost_labels import CollectConfig, collect
from neuroshard_jax.learn.datasets import compute_batches, padded_shards, steady
from neuroshard_jax.learn.ensemble_fit import ensemble_ms, train_ensemble
from neuroshard_jax.learn.metrics import kendall_tau, relative_errors
from neuroshard_jax.learn.plan_labels import PlanLabelConfig
from neuroshard_jax.learn.row_comm_fit import fit_row_comm
from neuroshard_jax.learn.trainer import TrainConfig
from neuroshard_jax.workloads.samplers import CommSamplerConfig, SpecSamplerConfig, sample_spec_shard

logger = logging.getLogger(__name__)

UNCERTAIN_IDS = 1_000_000  # spec samples from here on are the candidates of uncertain picks (ids stay apart)
CHUNK_PICKS = 4  # uncertain picks scored together (one call of the start model; ~1 s of sampling: labels flow)
MIN_INPUT_LABELS = 12  # input-distribution labels worth a fit (4 of each of 2, 4 and 8 ranks); fewer: none measured
STEADY_PRIOR = 2  # steady labels assumed before any was measured: one noisy label of the first 4 is not a busy machine
MIN_STEADY = 0.05  # the least share of steady labels a budget is judged with (below: the machine is too busy)
NOISY = (  # why a label is left out of training (``datasets.steady``), in words
    f"their runs spread over {EnsembleConfig().max_label_spread:.0%} or the worker had under {MIN_CPU_SHARE:.0%} of "
    "its core: is the machine busy?"
)
RERUN_MEASURE_S = 30.0  # a rerun after a model was made measures and fine-tunes again only with this much more
PROBE_PER_WORKER = 2  # spec labels per worker (at least 4) timed first: what the rest cost, before the budget is judged
DISTINCT_DEVICES = 0.6  # of a plan task's device slots, the distinct devices measured (15 of 24 on the first task)
INPUT_CHUNK = 3  # input-distribution labels per launch of the gloo ranks (a deadline is checked between launches)


@dataclasses.dataclass(frozen=True)
class AdaptConfig:
    """conf/adapt.yaml."""

    # wall-clock minutes: measuring, fine-tuning and the report (a rerun spends what is left)
    budget_min: float = bounded(above=0, default=10.0)
    start: str | None = None  # the model adapted: a name or a checkpoint; null: the model chosen for this machine
    name: str | None = None  # the adapted model's name; null: adapted-<this machine's kind>, e.g. adapted-amd-f26m2
    # labels, report and the model before it is registered; null: adapt/<name> in the user's cache (private to them)
    out: str | None = None
    device: str = "cpu"  # cpu (fbgemm-gpu-cpu) | cuda (fbgemm-gpu): the kernels the model is of
    optimizer: str = "exact_sgd"  # the fused optimizer the labels run (exact_row_wise_adagrad: the common case)
    seed: int = bounded(at_least=0, default=0)
    uncertain_share: float = 0.5  # spec picks where the start model is least sure; the rest cover the space
    # fresh samples per uncertain pick; the one whose members' predictions spread most is measured
    draws: int = bounded(at_least=1, default=4)
    heldout_every: int = bounded(at_least=1, default=3)  # every Nth covering pick is held out: scored, never trained on
    # of the budget spent measuring at most; the rest (at least a fine-tune's time) trains
    label_share: float = bounded(above=0, at_most=1, default=0.95)
    # of the measuring time: the devices of plans searched with the start model (0: none)
    plan_share: float = bounded(at_least=0, at_most=1, default=0.2)
    # of the measuring time at most: TorchRec's input distribution (input_labels)
    input_share: float = bounded(at_least=0, at_most=1, default=0.2)
    reanchor: bool = True  # move the start model onto the roofline of the new labels before fine-tuning
    label_weight: float = bounded(above=0, default=2.0)  # loss weight of a plan device against a spec label
    # training labels needed to fine-tune (fewer: the run says how many it got and stops)
    min_labels: int = bounded(at_least=1, default=20)
    register: bool = True  # add the model to the user's models (later runs on this kind of machine choose it)
    # register it even where it reads the held-out labels no better than the start model (as it was, or x one factor)
    register_worse: bool = False
    compare: tuple[str, ...] = ()  # other models scored on the same held-out labels (names or checkpoints)
    # the spec shards drawn (as collect source=specs), with kernels of up to 48 tables, the heavy corner and dim 4
    # (docs/results/fusion.md)
    specs: SpecSamplerConfig = SpecSamplerConfig(dims=(4, 8, 16, 32, 64, 128), many_share=0.25, heavy_share=0.25)
    # TorchRec's input distribution on this machine (``costs/input_dist.py``; cpu: gloo ranks): ``input_labels`` comm
    # labels drawn by ``inputs`` (as collect kind=comm), fitted and, with ``register``, added to this user's fits,
    # which models of this kind price with (before a shipped fit); 0: none (a run on cuda measures none)
    input_labels: int = bounded(at_least=0, default=60)
    inputs: CommSamplerConfig = CommSamplerConfig(input_share=1.0)
    # as collect kind=plans; plans.model is the start model
    plans: PlanLabelConfig = PlanLabelConfig(searchers=("beam", "grid"), sources=("specs",), variants=4, comm=False)
    executor: ExecutorConfig = ExecutorConfig(workers=2)
    pin: bool | None = None  # each local CPU kernel worker on a core of its own; null: pinned locally, not on Ray
    warmup: int = bounded(at_least=0, default=5)
    iters: int = bounded(at_least=1, default=10)  # timed iterations; the label is the median
    # the label protocol (collect's); null: the device's own, queued on cuda (the GPU's time), fixed on cpu
    protocol: str | None = None
    timeout_s: float = bounded(above=0, default=300.0)
    finetune: TrainConfig = TrainConfig(epochs=60, learning_rate=1e-3)
    progress: bool = True

    def __post_init__(self):
        check_bounds(self)
        if self.plan_share + self.input_share > 1:
            raise UserError(
                f"plan_share + input_share: got {self.plan_share:g} + {self.input_share:g}, expected at most 1 (shares "
                "of one measuring time)"
            )
        if self.input_labels and self.inputs.input_share != 1.0:
            raise UserError(
                f"inputs.input_share: got {self.inputs.input_share}, expected 1.0 (every label a distribution)"
            )
        if not 0 <= self.uncertain_share < 1:  # a strict upper bound, which ``bounded`` does not express
            raise UserError(f"uncertain_share: got {self.uncertain_share!r}, expected a share >= 0 and < 1")
        if self.device not in ("cpu", "cuda"):
            raise UserError(f"device: got {self.device!r}, expected 'cpu' or 'cuda'")
        object.__setattr__(self, "optimizer", kernel_optimizer(self.optimizer, self.device).name)
        timing_fields(self.protocol, 1.0, 1.0, 1, self.device)  # refuses an unknown one, or queued/graph on a CPU
        if self.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise UserError(f"name: got {self.name!r}, expected letters, digits, '.', '_' or '-' (a folder name)")
        if self.name in shipped_names() or self.name in COST_MODELS:
            raise UserError(f"name: got {self.name!r}, which is a shipped model's; expected a name of your own")


def kind_slug(found: dict, device: str) -> str:
    """A short name for a kind of hardware: ``amd-f26m2``, ``intel-f6m207``, ``nvidia-h200``."""
    if device == "cuda" and found.get("gpu"):
        return re.sub(r"[^a-z0-9]+", "-", found["gpu"].lower()).strip("-")
    match = re.match(r"(\w+) family (\d+) model (\d+)", found.get("cpu_id", ""))
    if not match:
        return re.sub(r"[^a-z0-9]+", "-", str(found.get("cpu", "cpu")).lower()).strip("-")[:40]
    vendor = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(match[1], match[1].lower())
    return f"{vendor}-f{match[2]}m{match[3]}"


# ---------------------------------------------------------------------------------------------
# Which spec samples are measured, in which order


def spec_order(config: AdaptConfig, start: str, done: set[int], ahead: int = CHUNK_PICKS) -> Iterator[int]:
    """Spec sample ids in measuring order: covering picks (0, 1, 2, ...) and uncertain picks (the sample of
    ``draws`` candidates, ids from UNCERTAIN_IDS, whose start-model members spread most) in the proportion
    ``uncertain_share``. Deterministic for a seed and start model; a pick already in ``done`` costs nothing. The
    start model is loaded and the first ``ahead`` uncertain picks are made here, before any label is measured: the
    parent's sampling and scoring do not take a core from a measuring worker (its label would be too noisy to keep)."""
    uncertain = _uncertain_picks(config, load_ensemble(start), done) if config.uncertain_share else iter(())
    picks = itertools.chain([next(uncertain) for _ in range(ahead if config.uncertain_share else 0)], uncertain)
    return (next(picks) if covering is None else covering for covering in pick_kinds(config.uncertain_share))


def pick_kinds(share: float) -> Iterator[int | None]:
    """The measuring order's picks by kind: a covering pick's spec sample id, or None for an uncertain pick (kept
    at ``share`` of the picks so far)."""
    taken = 0
    for step in itertools.count():
        if share > 0 and (taken + 1) <= share * (step + 1):
            taken += 1
            yield None
        else:
            yield step - taken


def is_heldout(config: AdaptConfig, sample_id: int) -> bool:
    """Held out: every ``heldout_every``-th covering pick (the first one included), never an uncertain pick."""
    return sample_id < UNCERTAIN_IDS and sample_id % config.heldout_every == 0


def _uncertain_picks(config: AdaptConfig, start: tuple, done: set[int]) -> Iterator[int]:
    """Uncertain pick k, for k = 0, 1, 2, ...: of candidates UNCERTAIN_IDS + k * draws + j (j < draws), the one the
    start model is least sure of (its members' relative spread). A pick with a candidate in ``done`` is that one,
    not scored again: the k-th pick is the same whatever was measured (a resumed order goes on where it was).
    ``start``: the loaded start model (``load_ensemble``)."""
    _, nets, params, _ = start
    for first in itertools.count(0, CHUNK_PICKS):
        picks = range(first, first + CHUNK_PICKS)
        known = {
            k: next((c for j in range(config.draws) if (c := _candidate(config, k, j)) in done), None) for k in picks
        }
        open_picks = [k for k in picks if known[k] is None]
        if open_picks:
            ids = [_candidate(config, k, j) for k in open_picks for j in range(config.draws)]
            drawn = [sample_spec_shard(config.specs, config.seed, i) for i in ids]
            batch = np.array([b for b, _ in drawn], np.float32)
            shard_sets = [[table_ref(t) for t in tables] for _, tables in drawn]  # the sampler's draws: the worker's
            feats, mask = padded_shards(shard_sets, batch, None)  # one shape per power of two
            _, spread = ensemble_ms(nets, params, feats, mask, batch)
            for n, k in enumerate(open_picks):
                known[k] = ids[n * config.draws + int(np.argmax(spread[n * config.draws : (n + 1) * config.draws]))]
        yield from (known[k] for k in picks)


def _candidate(config: AdaptConfig, pick: int, j: int) -> int:
    return UNCERTAIN_IDS + pick * config.draws + j


# ---------------------------------------------------------------------------------------------
# Scoring on held-out labels


def subset(source: Path, keep: Callable[[dict], bool], out: Path) -> Path:
    """A dataset folder of ``source``'s compute records that ``keep`` accepts, with its compute manifest."""
    out.mkdir(parents=True, exist_ok=True)
    records = [r for r in read_records(source / "compute.jsonl") if keep(r)]
    (out / "compute.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    shutil.copy(source / "manifest-compute.json", out / "manifest-compute.json")
    return out


def predicted(checkpoint: str | Path, dataset: Path) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, measured) ms f64[S] of a checkpoint on a compute dataset's records."""
    _, nets, params, _ = load_ensemble(checkpoint)
    feats, mask, batch, target, _ = compute_batches(dataset)
    return ensemble_ms(nets, params, feats, mask, batch)[0], target.astype(np.float64)


@dataclasses.dataclass(frozen=True)
class Scores:
    """MAPE, bias (mean signed relative error) and Kendall tau of predictions against ``count`` measurements."""

    mape: float
    bias: float
    kendall_tau: float
    count: int

    def to_json(self) -> JSONDoc:
        """A row of adapt.json's ``heldout`` table."""
        return dataclasses.asdict(self)


def scores(pred: np.ndarray, target: np.ndarray) -> Scores:
    """``Scores`` of predictions against measurements (each figure rounded to 4 places)."""
    error, bias, _ = relative_errors(pred, target)
    return Scores(round(error, 4), round(bias, 4), round(kendall_tau(pred, target), 4), int(len(target)))


def heldout_scores(checkpoint: str | Path, heldout: Path, factor: float = 1.0) -> Scores:
    """``scores`` of a checkpoint (x ``factor``) on ``heldout``."""
    pred, target = predicted(checkpoint, heldout)
    return scores(pred * factor, target)


def median_factor(checkpoint: str | Path, labelled: Path) -> float:
    """Measured / predicted compute of a checkpoint over ``labelled``, the median: one factor for a machine."""
    pred, target = predicted(checkpoint, labelled)
    return float(np.median(target / pred))


# ---------------------------------------------------------------------------------------------
# The run


def start_model(config: AdaptConfig) -> tuple[str, str]:
    """(label, checkpoint path) of the model adapted: ``start``, else the model chosen for this machine."""
    if config.start:
        path = checkpoint_path(config.start)
        label = config.start
    else:
        choice = choose_cost_model("neural", {}, config.device)
        label = choice.options.get("checkpoint") or (choice.name if choice.name != "neural" else SHIPPED_MODEL_NAME)
        path = checkpoint_path(label)
    return label, ensemble_path("start", label, path)


def ensemble_path(key: str, label: str, path: str) -> str:
    """``path`` if a physics-ensemble checkpoint is there; else one UserError naming ``key``."""
    if not (Path(path) / "meta.json").exists():
        raise UserError(f"{key}: no model at {path!r}; expected a model's name or a checkpoint directory")
    if read_meta(path, key).get("format") != ENSEMBLE_FORMAT:
        raise UserError(f"{key}: {label!r} is not a physics ensemble (format 4); expected one, e.g. xeon-union")
    return path


def check_device(device: str, found: dict) -> None:
    """Before any measuring: ``device=cuda`` needs a GPU here (else every sample would fail, one by one)."""
    if device == "cuda" and not found.get("gpu"):
        raise UserError("device: got 'cuda', but nvidia-smi finds no GPU on this machine; expected device=cpu")


def adapt(config: AdaptConfig) -> JSONDoc:
    """Measure, fine-tune, report and register (see the module); returns the report written to adapt.json. What it
    does and the held-out table are INFO lines of this module's logger. The executor is reached before anything is
    written, and ``out`` is held for this run alone (``one_writer``)."""
    check_device(config.device, hardware())
    start = start_model(config)
    compare = {other: ensemble_path("compare", other, checkpoint_path(other)) for other in config.compare}
    with connected(config.executor), one_writer(out_dir(config), "out"):
        return _adapt(config, start, compare)


def model_name(config: AdaptConfig) -> str:
    return config.name or f"adapted-{kind_slug(hardware(), config.device)}"


def out_dir(config: AdaptConfig) -> Path:
    """Where the run's labels, report and model are kept: ``out``, else ``adapt/<name>`` in the user's cache (a cache
    that is not theirs alone is refused: give ``out``)."""
    if config.out:
        return Path(config.out)
    runs = cache_folder("adapt", "adapt's labels and progress")
    if runs is None:
        raise UserError(
            "out: missing, and the cache is not this user's alone (the warning above says why); expected out=FOLDER"
        )
    return runs / model_name(config)


def _adapt(config: AdaptConfig, start_of: tuple[str, str], compare: dict[str, str]) -> JSONDoc:
    """The stages in order of need, each in its slice of the budget (``adapt_budget``): spec labels until a
    fine-tune has enough (``picks_short``), TorchRec's input distribution (``input_share``), plan devices
    (``plan_share``), more spec labels, then the fine-tune and the report in the time left."""
    began = time.monotonic()
    found = hardware()
    here = hardware_kind(found, config.device)
    name, out = model_name(config), out_dir(config)
    label, start = start_of
    ledger = Ledger(out / "adapt.json")
    labels = LabelDirs(out)
    rates = _rates(config, ledger, labels)
    budget_s, spent_before = config.budget_min * 60, ledger.total()
    short = picks_short(config, labels.spec_records())
    if "heldout" in ledger.state and budget_s - spent_before < rates.fit + RERUN_MEASURE_S:
        logger.info(
            f"adapt: the budget of {config.budget_min:g} min is spent ({spent_before / 60:.1f} min); the model of "
            "that run stands (a larger budget_min measures more and fine-tunes again)"
        )
        return ledger.state
    _check_budget(config, rates, short, spent_before)
    logger.info(
        f"adapt: this machine is {here}; adapting {label} (trained on {' or '.join(model_kinds(start))}) into "
        f"{name} within {config.budget_min:g} min"
        + (
            f" (a fine-tune needs at least {_least_words(config, rates, short, spent_before)})"
            if rates.measured
            else ""
        )
    )
    measure_until = began + min(budget_s * config.label_share, budget_s - rates.fit) - spent_before
    fit_until = began + budget_s - spent_before
    common = _collect_settings(config)
    spec_config = dataclasses.replace(common, kind="compute", source="specs", out_dir=str(labels.specs))
    rates = _measure_floor(config, start, spec_config, labels, ledger, rates, measure_until)
    measure_s = measure_until - began + spent_before  # this budget's measuring time, earlier runs' included
    if config.input_labels and config.device == "cpu":
        _measure_inputs(config, common, labels, ledger, rates, measure_s, measure_until)
    plan_left = min(measure_s * config.plan_share - ledger.spent.get("plans", 0.0), measure_until - time.monotonic())
    if plan_left >= rates.plan_task:
        logger.info(f"measuring the devices of plans searched with {label} for {plan_left / 60:.1f} min")
        with ledger.stage("plans"):
            plan_config = dataclasses.replace(common, kind="plans", out_dir=str(labels.plans))
            _measure_plans(config, plan_config, start, plan_left, rates)
    elif config.plan_share:
        logger.info(
            f"no plan devices: a plan task takes about {rates.plan_task:.0f} s here, more than their "
            f"{max(plan_left, 0):.0f} s (plan_share {config.plan_share:g} of the measuring time)"
        )
    spec_left = measure_until - _in_flight(config, rates) - time.monotonic()
    if spec_left > 0:
        uncertain = f"uncertain picks: {config.uncertain_share:.0%}"
        logger.info(f"measuring spec shards for {spec_left / 60:.1f} min ({uncertain})")
        with ledger.stage("specs"):
            done = labels.spec_ids()
            order = spec_order(config, start, done, _ahead(config, len(done), 2 * CHUNK_PICKS))
            collect(spec_config, order, until=measure_until - _in_flight(config, rates))
    fit_started = time.monotonic()
    if fit_until - fit_started < rates.fit * 0.5:
        least = ledger.total() + rates.fit
        raise UserError(
            f"budget_min: got {config.budget_min:g}, of which {fit_until - fit_started:.0f} s is left for the "
            f"fine-tune, which takes about {rates.fit:.0f} s here; expected at least {minutes_up(least):g} (rerun "
            f"with budget_min={minutes_up(least):g}: the labels so far are kept)"
        )
    with ledger.stage("fit"):
        report = _fit_and_report(config, name, out, (label, start), compare, labels, fit_until - REPORT_S)
    report.update(
        budget_min=config.budget_min,
        fit_s=round(time.monotonic() - fit_started, 1),
        this_run_s=round(time.monotonic() - began, 1),
        machine=found,
        kind=here,
    )
    ledger.finish(report)
    return ledger.state


def _collect_settings(config: AdaptConfig) -> CollectConfig:
    """What every ``collect`` of the run shares with it (the kernels, their timing, the spec sampler): a
    ``CollectConfig`` each collect replaces its kind, folder and counts in."""
    keys = ("device", "optimizer", "seed", "executor", "pin", "warmup", "iters", "timeout_s", "specs", "progress")
    shared = {key: getattr(config, key) for key in keys} | {"protocol": config.protocol}  # protocol null: the device's
    return CollectConfig(**shared)


def _measure_floor(
    config: AdaptConfig,
    start: str,
    spec_config: CollectConfig,
    labels: LabelDirs,
    ledger: Ledger,
    rates: Rates,
    measure_until: float,
) -> Rates:
    """Measure the spec labels a fine-tune needs (``picks_short``), the first few alone and timed: then the least
    budget is stated, or a smaller one refused (``_check_budget``); a deadline that passes first is one UserError
    naming the budget that would do. Returns the rates as measured."""
    short = picks_short(config, labels.spec_records())
    if short:
        logger.info(f"measuring the {short} spec labels a fine-tune needs first")
    while short and time.monotonic() < measure_until - _in_flight(config, rates):
        probe = not rates.measured  # the first few, timed: what a label costs here, before the rest is judged
        called = time.time()
        with ledger.stage("specs"):
            done = labels.spec_ids()
            count = min(short, max(4, PROBE_PER_WORKER * config.executor.workers)) if probe else short
            order = (i for i in spec_order(config, start, done, _ahead(config, len(done), count)) if i not in done)
            collect(spec_config, itertools.islice(order, count), until=measure_until - _in_flight(config, rates))
        short = picks_short(config, labels.spec_records())
        rates = _rates(config, ledger, labels)
        if probe and rates.measured:
            first = min(labels.spec_times())  # a label takes about workers x the flow's gap on its worker
            ledger.note("start_s", round(max(0.0, first - called - rates.spec_label * config.executor.workers), 2))
            rates = _rates(config, ledger, labels)
            _check_budget(config, rates, short, ledger.total())
            logger.info(f"a fine-tune needs at least {_least_words(config, rates, short, ledger.total())}")
    if short:
        least = minutes_up(_least(rates, short, ledger.total()))
        taken = labels.counts().specs
        noisy = taken - round(taken * rates.steady)
        why = f", {noisy} of them too noisy to train on ({NOISY})" if noisy else ""
        raise UserError(
            f"budget_min: got {config.budget_min:g}, which measured {taken} spec labels{why}: {short} more steady "
            f"ones are needed, at {rates.spec_label:.2g} s each here; expected at least {least:g} (rerun with "
            f"budget_min={least:g}: the labels so far are kept)"
        )
    return rates


def _ahead(config: AdaptConfig, done: int, count: int) -> int:
    """The uncertain picks among the order's first ``done + count`` places: made before a call's first label (those
    measured already cost nothing)."""
    return sum(c is None for c in itertools.islice(pick_kinds(config.uncertain_share), done + count))


def _check_budget(config: AdaptConfig, rates: Rates, short: int, spent: float) -> None:
    """Refuse, in one line naming the least budget, a budget that cannot end in a model here: the spec labels a
    fine-tune still needs at this machine's rate (before one was timed: the fastest any device measures one), then
    the fine-tune."""
    if config.budget_min * 60 < _least(rates, short, spent):
        kept = " (rerun with it: the labels so far are kept)" if spent else ""
        raise UserError(
            f"budget_min: got {config.budget_min:g}, expected at least {_least_words(config, rates, short, spent)}"
            + kept
        )


def _least_words(config: AdaptConfig, rates: Rates, short: int, spent: float) -> str:
    """``1.1 min here: about 5 s to start, 24 spec labels at about 2 s each, then about 15 s to fine-tune``."""
    each = f"about {rates.spec_label:.2g} s each" if rates.measured else f"no less than {rates.spec_label:g} s each"
    kept = f" ({rates.steady:.0%} of them steady enough to train on so far)" if rates.steady < 1 else ""
    labels = f"about {rates.start:.0f} s to start, {short} spec labels at {each}{kept}, then " if short else ""
    words = f"{minutes_up(_least(rates, short, spent)):g} min here: {labels}about {rates.fit:.0f} s to fine-tune"
    return words + (f", after the {spent / 60:.1f} min spent so far in this out folder" if spent else "")


def _least(rates: Rates, short: int, spent: float) -> float:
    """The least budget that ends in a model: what was spent, the ``short`` steady spec labels (a measuring call's
    start first; as many more as this machine's labels were too noisy to keep), the fine-tune."""
    labels = short / max(rates.steady, MIN_STEADY)
    return spent + (rates.start if short else 0.0) + labels * rates.spec_label + rates.fit


def _rates(config: AdaptConfig, ledger: Ledger, labels: LabelDirs) -> Rates:
    guess = functools.partial(plan_task_guess, config.plans)
    records = labels.spec_records()  # read once: the counts, the times and the steady share are all of it
    steady_share = (sum(map(is_steady, records)) + STEADY_PRIOR) / (len(records) + STEADY_PRIOR)
    times = [r["at"] for r in records if "at" in r]
    return Rates.of(ledger, labels.counts(specs=len(records)), times, guess, steady_share)


def is_steady(record: dict) -> bool:
    """A spec label training keeps: measured, and steady (``datasets.steady``)."""
    return record.get("ok", True) and steady(record, EnsembleConfig().max_label_spread)


def _in_flight(config: AdaptConfig, rates: Rates) -> float:
    """Seconds before a measuring deadline at which no label is started: the labels in flight then finish."""
    return rates.spec_label * config.executor.workers


def plan_task_guess(plans: PlanLabelConfig, spec_label_s: float) -> float:
    """A plan task's seconds before one was done here: each searcher's search, then the distinct devices of its
    plans (about ``DISTINCT_DEVICES`` of their device slots), each about a spec label."""
    slots = (len(plans.searchers) + plans.variants) * float(np.mean(plans.num_devices))
    return FIRST_GUESS_S["search"] * len(plans.searchers) + DISTINCT_DEVICES * slots * spec_label_s


@dataclasses.dataclass(frozen=True)
class LabelDirs:
    """The label datasets of a run under ``out``: spec shards, plan devices, input distributions."""

    out: Path

    @property
    def specs(self) -> Path:
        return self.out / "labels" / "specs"

    @property
    def plans(self) -> Path:
        return self.out / "labels" / "plans"

    @property
    def inputs(self) -> Path:
        return self.out / "labels" / "inputs"

    def spec_records(self) -> list[dict]:
        """Every spec label taken, failures included (their picks are spent)."""
        path = self.specs / "compute.jsonl"
        return read_records(path, ok_only=False) if path.exists() else []

    def spec_times(self) -> list[float]:
        """When each spec label came in (unix seconds; labels of older versions have none)."""
        return [r["at"] for r in self.spec_records() if "at" in r]

    def spec_ids(self) -> set[int]:
        return {r["id"] for r in self.spec_records()}

    def counts(self, specs: int | None = None) -> LabelCounts:
        """Spec labels, input labels and plan tasks on disk (what ``Rates`` divides the time spent by); ``specs``:
        the spec labels where the caller has just read them."""

        def lines(path: Path) -> int:
            return len(read_records(path, ok_only=False)) if path.exists() else 0

        return LabelCounts(
            specs=lines(self.specs / "compute.jsonl") if specs is None else specs,
            inputs=lines(self.inputs / "comm.jsonl"),
            plans=lines(self.plans / "plans.jsonl"),
        )


def picks_short(config: AdaptConfig, records: list[dict]) -> int:
    """Spec picks still to measure, in ``spec_order``, before ``records`` (the picks taken) hold ``min_labels``
    steady training labels and 2 held-out ones (``datasets.steady``: the ones training keeps)."""
    steady_ones = [r for r in records if is_steady(r)]
    held = sum(is_heldout(config, r["id"]) for r in steady_ones)
    train = len(steady_ones) - held
    for n, covering in enumerate(itertools.islice(pick_kinds(config.uncertain_share), len(records), None)):
        if train >= config.min_labels and held >= 2:
            return n
        if covering is not None and is_heldout(config, covering):
            held += 1
        else:
            train += 1
    raise AssertionError("unreachable: the order is endless")


def _measure_inputs(config, common, labels, ledger, rates, measure_s, measure_until) -> None:
    """TorchRec's input distribution on gloo ranks, in ``input_share`` of the measuring time: skipped (a line says
    so) where that cannot hold the ``MIN_INPUT_LABELS`` a fit needs."""
    have = labels.counts().inputs
    left = min(measure_s * config.input_share - ledger.spent.get("inputs", 0.0), measure_until - time.monotonic())
    if have >= config.input_labels:
        return
    in_flight = INPUT_CHUNK * rates.input_label  # the launch running when the deadline passes finishes
    need = max(1, min(config.input_labels, MIN_INPUT_LABELS) - have)
    if left - in_flight < rates.input_label * need:
        logger.info(
            f"no input-distribution labels: the {need} a fit needs take about "
            f"{rates.input_label * need + in_flight:.0f} s here, more than their {max(left, 0):.0f} s "
            f"(input_share {config.input_share:g} of the measuring time)"
        )
        return
    logger.info(f"measuring TorchRec's input distribution for up to {left / 60:.1f} min: comm labels on gloo ranks")
    inputs = dataclasses.replace(
        common,
        kind="comm",
        out_dir=str(labels.inputs),
        comm=config.inputs,
        num_samples=config.input_labels,
        comm_chunk=INPUT_CHUNK,
    )
    with ledger.stage("inputs"):
        collect(inputs, until=time.monotonic() + left)  # a chunk is launched where it is expected to end by then


def _measure_plans(config: AdaptConfig, collect_config: CollectConfig, start: str, left_s: float, rates: Rates) -> None:
    """Plan tasks one at a time (each resumable) while the slice holds another, no device started past it."""
    plans = dataclasses.replace(config.plans, model=start)
    until = time.monotonic() + left_s
    for tasks in itertools.count(1):
        if tasks > 1 and until - time.monotonic() < rates.plan_task:
            break
        collect(dataclasses.replace(collect_config, num_samples=tasks, plans=plans), until=until)
        if time.monotonic() >= until:
            break


def _fit_and_report(
    config: AdaptConfig,
    name: str,
    out: Path,
    start_at: tuple[str, str],
    compare: dict[str, str],
    labels: LabelDirs,
    until: float | None = None,
) -> JSONDoc:
    """Fine-tune (no epoch started after ``until``), score on the held-out labels, register; fit the input
    distribution where its labels are enough."""
    (label, start), specs_dir, plans_dir = start_at, labels.specs, labels.plans
    if not (specs_dir / "compute.jsonl").exists():
        raise UserError(
            f"budget_min: got {config.budget_min}, and no spec label was measured in it; expected a larger budget"
        )
    train_dir = subset(specs_dir, lambda r: not is_heldout(config, r["id"]), out / "split" / "train")
    heldout_dir = subset(specs_dir, lambda r: is_heldout(config, r["id"]), out / "split" / "heldout")
    counts = {
        "train": len(read_records(train_dir / "compute.jsonl")),
        "heldout": len(read_records(heldout_dir / "compute.jsonl")),
        "plan_devices": len(read_records(plans_dir / "compute.jsonl")) if (plans_dir / "compute.jsonl").exists() else 0,
    }
    if counts["train"] + counts["plan_devices"] < config.min_labels or counts["heldout"] < 2:
        raise UserError(
            f"budget_min: got {config.budget_min}, which measured {counts['train']} training and "
            f"{counts['heldout']} held-out labels; expected at least {config.min_labels} and 2 (rerun with a larger "
            "budget: the labels so far are kept)"
        )
    datasets = [train_dir] + ([plans_dir] if counts["plan_devices"] else [])
    scale = (1.0, config.label_weight)[: len(datasets)]
    model_dir = out / "model"
    logger.info(
        f"fine-tuning {label} on {counts['train']} spec labels and {counts['plan_devices']} plan devices"
        + (" (reanchored)" if config.reanchor else "")
    )
    started = time.monotonic()
    how = f"python -m neuroshard_jax.adapt name={name} start={label} budget_min={config.budget_min}"
    trained = train_ensemble(
        datasets,
        EnsembleConfig(),
        dataclasses.replace(config.finetune, progress=config.finetune.progress and config.progress),
        model_dir,
        name,
        how,
        init=start,
        dataset_scale=scale,
        reanchor=config.reanchor,
        until=until,
    )
    train_s = time.monotonic() - started
    epochs = trained["compute"]["epochs"]
    if epochs < config.finetune.epochs:
        logger.info(
            f"the fine-tune stopped after {epochs} of {config.finetune.epochs} epochs: the budget's end (a larger "
            "budget_min trains longer)"
        )
    start_pred, target = predicted(start, heldout_dir)
    rows = {
        f"{label} as it was": scores(start_pred, target),
        f"{label} x one factor": scores(start_pred * median_factor(start, train_dir), target),
        name: heldout_scores(model_dir, heldout_dir),
    }
    for other, path in compare.items():
        rows[other] = heldout_scores(path, heldout_dir)
    logger.info(f"held out: {counts['heldout']} spec labels of this machine, never trained on")
    logger.info(f"  {'model':<40} {'MAPE':>7} {'bias':>7} {'tau':>6}")
    for row, s in rows.items():
        logger.info(f"  {row:<40} {s.mape:>7.1%} {s.bias:>+7.1%} {s.kendall_tau:>6.3f}")
    heldout = {row: s.to_json() for row, s in rows.items()}
    report = {"name": name, "start": label, "labels": counts, "heldout": heldout, "train_s": round(train_s, 1)}
    _annotate(model_dir, report)
    worse = no_better(rows, name, label)
    if worse:
        report["worse"] = worse
    if config.register and (worse is None or config.register_worse):
        report["registered"] = str(_register(model_dir, name))
        logger.info(f"registered {name} in {user_models_dir()}: later runs on this kind of machine choose it")
    elif config.register:
        logger.warning(
            f"{name} is not registered: {worse}; later runs keep {label} (its checkpoint: {model_dir}; "
            "register_worse=true registers it anyway)"
        )
    inputs = len(read_records(labels.inputs / "comm.jsonl")) if (labels.inputs / "comm.jsonl").exists() else 0
    if inputs >= min(config.input_labels, MIN_INPUT_LABELS):
        report["input_dist"] = _fit_inputs(config, name, labels.inputs, out)
    elif inputs:
        least = min(config.input_labels, MIN_INPUT_LABELS)
        logger.info(f"input distribution: {inputs} labels, fewer than the {least} a fit needs; not fitted")
    return report


def no_better(rows: dict[str, Scores], name: str, label: str) -> str | None:
    """Why the adapted model ``name`` is no better than the start model ``label`` on the held-out labels (its MAPE not
    below the start model's as it was and scaled by one factor), or None where it is."""
    start = min((f"{label} as it was", f"{label} x one factor"), key=lambda row: rows[row].mape)
    if rows[name].mape < rows[start].mape:
        return None
    return f"it reads the held-out labels at {rows[name].mape:.1%} MAPE, {start} at {rows[start].mape:.1%}"


def _fit_inputs(config: AdaptConfig, name: str, labels: Path, out: Path) -> JSONDoc:
    """The input distribution fit of this machine's labels, with its held-out figures; with ``register`` in this
    user's fits (models of this kind price with it), else beside the model."""
    where = own_fits_dir("input_dist") if config.register else out / "input_dist"
    how = f"python -m neuroshard_jax.adapt name={name} input_labels={config.input_labels}"
    fit, figures, path = fit_row_comm(labels, name, where, how, "input_dist")
    a, b, c = fit.terms(fit.sizes[-1], fit.batch_size)
    logger.info(
        f"input distribution: {a:.2f} ms + {100 * b:.2f} per 100 ids taken + {100 * c:.2f} per 100 sent at "
        f"{fit.sizes[-1]} devices, held out {figures.get('fwd_mape', float('nan')):.1%}; written {path}"
    )
    return {"path": str(path), "sizes": list(fit.sizes), "held_out": figures}


def _annotate(model_dir: Path, report: JSONDoc) -> None:
    """The checkpoint's meta gains what adapt measured (its held-out figures, the labels it saw)."""
    meta_path = model_dir / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["adapt"] = {k: report[k] for k in ("start", "labels", "heldout")}
    write_json(meta, meta_path)


def _register(model_dir: Path, name: str) -> Path:
    """Copy the model into the user's models under ``name`` (``replace_dir``: a stop at any moment leaves a
    loadable model there)."""
    models = cache_folder(user_models_dir().name, "models made by adapt")
    if models is None:
        raise UserError(
            f"adapt: the model is not registered: {str(user_models_dir())!r} is not this user's alone (the warning "
            f"above says why); it is in {str(model_dir)!r}, to plan with it: cost_model.checkpoint={model_dir}"
        )
    return replace_dir(models / name, lambda folder: shutil.copytree(model_dir, folder, dirs_exist_ok=True))


def app_config(cfg: DictConfig) -> AdaptConfig:
    return typed(AdaptConfig, resolved(cfg))
