"""Cost models by name (``conf/cost_model/``): the analytic roofline, or a trained neural checkpoint.

    model = make_cost_model("neural", task)            # checked against the task's batch size and precision
    model = make_cost_model("cpu-b4096", task)         # a shipped checkpoint by name (data/models/NAME)
    model = load_cost_model("neural")                  # the shipped default, for use in your own JAX code
    model = load_cost_model("path/to/checkpoint")      # a checkpoint of python -m neuroshard_jax.train
    model = load_cost_model("analytic", batch_size=4096)

Two checkpoint formats load (``checkpoints.py``): the physics ensemble (4, the default ``xeon-union``;
batch size is an input, its spread makes searchers cautious: ``risk``) and the first per-table MLP (3,
``cpu-b4096``, batch 4096 only).

Why one module of ~530 lines: choosing a model (names, the user's and the shipped checkpoints, this machine's kind,
the task's batch, precision and optimizer) and building it are one decision, made once per plan
(``build_cost_model``); the rules it weighs sit together so that the choice can be read, and changed, in one place.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from neuroshard_jax.core.config import typed
from neuroshard_jax.core.constants import SHIPPED_CHECKPOINT, SHIPPED_MODEL_NAME, SHIPPED_MODELS
from neuroshard_jax.core.errors import DamagedModel, UntrainedFor, UserError, first_line
from neuroshard_jax.core.folders import recover_dir
from neuroshard_jax.core.hardware import hardware, hardware_kind, installed_stack
from neuroshard_jax.core.memory import OPTIMIZERS
from neuroshard_jax.core.paths import cache_folder, own_entries, package_path, user_models_dir
from neuroshard_jax.core.task import Task
from neuroshard_jax.costs.analytic import ANALYTIC_FNS, AnalyticConfig, analytic_model, analytic_params
from neuroshard_jax.costs.checkpoints import ENSEMBLE_FORMAT, load_checkpoint, load_ensemble, read_meta, stack_change
from neuroshard_jax.costs.cost_model import CostModel
from neuroshard_jax.costs.ensemble import ensemble_cost_model
from neuroshard_jax.costs.input_dist import for_kinds as input_dist_for
from neuroshard_jax.costs.neural import neural_cost_model
from neuroshard_jax.costs.precision import factors_for, log_scales
from neuroshard_jax.costs.row_comm import for_kinds as row_comm_for

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NeuralConfig:
    checkpoint: str | None = None  # None: the model named by cost_model.name (``neural``: the shipped default)
    risk: float = 1.0  # an ensemble's score = its prediction + risk x the members' spread (0: trust the mean)
    # models not to choose for this machine (the user's or shipped): with every model of its kind left out, a run plans
    # as on a kind no model was trained on (first contact), honestly simulated
    exclude: tuple[str, ...] = ()

    def __post_init__(self):
        if not (isinstance(self.risk, (int, float)) and 0 <= self.risk < float("inf")):
            raise UserError(f"cost_model.risk: got {self.risk!r}, expected a finite number >= 0")


def _models_in(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    for stopped in root.glob(".*.old"):  # a save stopped between its two renames (replace_dir): the old model back
        recover_dir(root / stopped.name[1 : -len(".old")])
    return sorted(p.name for p in root.iterdir() if (p / "meta.json").exists())


def shipped_names() -> list[str]:
    """Names of the checkpoints shipped in the package (``cost_model.name=NAME``)."""
    return _models_in(package_path(SHIPPED_MODELS))


def user_names() -> list[str]:
    """Names of the models this user made with ``python -m neuroshard_jax.adapt`` (``user_models_dir``; none where
    that folder is not this user's alone: ``paths.cache_folder``)."""
    folder = cache_folder(user_models_dir().name, "models made by adapt", make=False)
    if folder is None:
        return []
    own = {p.name for p in own_entries(folder, "models made by adapt")}  # no link, none another user may write
    return [n for n in _models_in(folder) if n not in COST_MODELS and n in own]


def model_names() -> list[str]:
    """Every name ``cost_model.name`` and ``cost_model.checkpoint`` accept: the shipped models, then the user's."""
    shipped = shipped_names()
    return shipped + [n for n in user_names() if n not in shipped]


def checkpoint_path(model: str) -> str:
    """A shipped or user model's checkpoint directory by its name, else ``model`` (a directory, put back first if a
    save was stopped between its two renames: ``recover_dir``)."""
    if model in shipped_names():
        return str(package_path(f"{SHIPPED_MODELS}/{model}"))
    if model in user_names():
        return str(user_models_dir() / model)
    recover_dir(model)
    return model


@functools.lru_cache(maxsize=8)
def _load_neural(path: str) -> tuple[CostModel, dict]:
    if read_meta(path).get("format") == ENSEMBLE_FORMAT:
        _, nets, params, meta = load_ensemble(path)
        return ensemble_cost_model(nets, params, "neural"), meta
    _, nets, params, meta = load_checkpoint(path)
    return neural_cost_model(nets, params), meta


def neural_checkpoint(config: NeuralConfig = NeuralConfig()) -> tuple[CostModel, dict, str]:
    """(model, meta.json, path) of the configured checkpoint (the shipped default when none is given)."""
    path = checkpoint_path(config.checkpoint) if config.checkpoint else str(package_path(SHIPPED_CHECKPOINT))
    if not (Path(path) / "meta.json").exists():
        raise UserError(
            f"cost_model.checkpoint: no neural cost model at {path!r}; expected a checkpoint written by "
            f"python -m neuroshard_jax.train or adapt, or a model's name ({', '.join(model_names())}), or "
            "cost_model=analytic"
        )
    model, meta = _load_neural(str(Path(path).resolve()))
    if not (meta.get("datasets") or {}).get("comm"):
        raise UserError(
            f"cost_model.checkpoint: {path!r} has no trained comm nets (it was trained without a comm dataset); "
            "expected a checkpoint trained with one (a dataset folder with comm.jsonl), or cost_model=analytic"
        )
    return model, meta, path


def _trains(meta: dict, batch_size: int, precisions: tuple[str, ...]) -> bool:
    """Whether a checkpoint (its meta) prices every one of ``precisions`` (a task's tables' data types: a model is
    trained at one, and prices others its hardware kind has measured factors for, ``precision.py``) and was trained
    at a batch size range holding ``batch_size``."""
    sizes = meta.get("batch_sizes") or [meta["batch_size"]]
    return min(sizes) <= batch_size <= max(sizes) and set(precisions) <= _priced(meta)


def _priced(meta: dict) -> set[str]:
    """The precisions a checkpoint prices: its own, and those its hardware kind has a factor for over it."""
    trained = meta.get("precision", "fp32")
    return {trained} | set(factors_for(meta.get("hardware_kinds") or [], trained))


def trained_optimizer(meta: dict) -> str:
    """The fused optimizer a checkpoint's labels were measured with (exact SGD where its meta does not say)."""
    return meta.get("optimizer") or "exact_sgd"


def optimizer_distance(meta: dict, optimizer: str) -> int:
    """How far a checkpoint's labels are from kernels that run ``optimizer``: 0 the same optimizer, 1 another with
    optimizer state as it has (or none, as it has none: the backward's update reads and writes alike), 2 otherwise."""
    trained = trained_optimizer(meta)
    if trained == optimizer:
        return 0
    keeps = [bool(o.per_row or o.per_weight) for o in (OPTIMIZERS[trained], OPTIMIZERS[optimizer])]
    return 1 if keeps[0] == keeps[1] else 2


def fitting_models(batch_size: int, precisions: tuple[str, ...]) -> list[str]:
    """The shipped checkpoints trained where a task at ``batch_size`` with tables of ``precisions`` is."""
    metas = {n: read_meta(package_path(f"{SHIPPED_MODELS}/{n}")) for n in shipped_names()}
    return [n for n, meta in metas.items() if _trains(meta, batch_size, precisions)]


def _way_forward(task: Task) -> str:
    fits = fitting_models(task.batch_size, task.precisions)
    return f"cost_model={fits[0]} or cost_model=analytic" if fits else "cost_model=analytic"


def untrained(task: Task, meta: dict, path: str) -> str | None:
    """Why a checkpoint (its meta, at ``path``) cannot score ``task`` (None: it can): the task's batch size and
    precision must be ones it was trained at (a batch size within the range of an ensemble's training batch sizes);
    the line names a shipped model that fits, if any."""
    sizes = meta.get("batch_sizes") or [meta["batch_size"]]
    name = meta.get("name")  # a shipped or registered model by its name, a folder of the user's by its path
    shown = f"{name}" if name == Path(path).name and name in model_names() else f"at {path!r}"
    if not min(sizes) <= task.batch_size <= max(sizes):
        expected = f"{sizes[0]}" if len(sizes) == 1 else f"one in {min(sizes)}..{max(sizes)}"
        return (
            f"task.batch_size: got {task.batch_size}, but the neural cost model {shown} was trained at batch "
            f"sizes {sizes}; expected {expected} (or {_way_forward(task)})"
        )
    trained = meta.get("precision", "fp32")
    if not set(task.precisions) <= _priced(meta):
        got = f"{task.precision!r}" if len(task.precisions) == 1 else f"tables of {' and '.join(task.precisions)}"
        others = sorted(_priced(meta) - {trained})
        also = f" (and prices {', '.join(others)} by measured factors)" if others else ""
        return (
            f"task.precision: got {got}, but the neural cost model {shown} was trained at "
            f"precision {trained!r}{also}; expected the same (or {_way_forward(task)})"
        )
    return None


def neural_model(task: Task, config: NeuralConfig = NeuralConfig()) -> CostModel:
    """The trained Flax cost model at the task's batch size (an ensemble scores with ``config.risk``), pricing row
    groups' collectives and TorchRec's input distributions with the shipped fits of its labels' hardware kind, where
    there are (``row_comm.py``, ``input_dist.py``)."""
    model, meta, path = neural_checkpoint(config)
    why = untrained(task, meta, path)
    if why is not None:
        raise UntrainedFor(why)
    kinds = meta.get("hardware_kinds") or []
    model = dataclasses.replace(model, row_comm=row_comm_for(kinds), input_dist=input_dist_for(kinds))
    if meta.get("format") == ENSEMBLE_FORMAT:
        params = model.params._replace(batch_size=float(task.batch_size), risk=float(config.risk))
        model = dataclasses.replace(model, params=params)
    trained = meta.get("precision", "fp32")
    if task.precisions != (trained,):  # tables of other data types: their kernels' measured factor on this kind
        factors = factors_for(kinds, trained)
        model = model.with_precision_scales(log_scales(factors, task.precisions, trained))
        said = ", ".join(f"{p} {factors[p].factor:.2f}x" for p in task.precisions if p != trained)
        logger.info("cost model: tables priced at their data type's measured factor over %s (%s)", trained, said)
    return model


COST_MODELS = {"analytic": (analytic_model, AnalyticConfig), "neural": (neural_model, NeuralConfig)}


def _resolve(name: str, options: dict | None) -> tuple[str, dict | None]:
    """A shipped or user model's name is the neural model with that checkpoint."""
    if name in COST_MODELS:
        return name, options
    if name in model_names():
        options = dict(options or {})
        if options.get("checkpoint"):
            raise UserError(
                f"cost_model: name {name!r} and checkpoint {options['checkpoint']!r} both given; expected one"
            )
        return "neural", {**options, "checkpoint": checkpoint_path(name)}
    raise UserError(
        f"cost_model: got {name!r}, expected one of {', '.join(sorted(COST_MODELS))} or a model's name "
        f"({', '.join(model_names())})"
    )


NO_CALIBRATION = 1.0  # a cost model's calibration factor as trained: every device's compute as predicted


def split_calibration(options: dict | None) -> tuple[float, dict | None]:
    """``options``' ``calibration`` (this machine's measured / predicted compute, ``calibrate.py``; 1: none) and
    the rest of them, the model family's own."""
    rest = dict(options or {})
    factor = rest.pop("calibration", None)
    factor = NO_CALIBRATION if factor is None else factor
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < float("inf"):
        raise UserError(
            f"cost_model.calibration: got {factor!r}, expected a finite number > 0 (measured / predicted compute)"
        )
    return float(factor), rest or None


def cost_model_config(name: str, options: dict | None = None):
    """The typed config of cost model ``name`` from ``options`` (unknown names or options raise UserError)."""
    name, options = _resolve(name, split_calibration(options)[1])
    return typed(COST_MODELS[name][1], options, "cost_model")


def make_cost_model(name: str, task: Task, options: dict | None = None) -> CostModel:
    """Build a cost model by name (``analytic``, ``neural`` or a shipped checkpoint's name) with ``options``
    (the fields of its config, from conf/cost_model/, and ``calibration``: every device's compute scaled by it)."""
    return CostModelSpec(name, options or {}).for_task(task)


@dataclasses.dataclass(frozen=True)
class CostModelSpec:
    """A cost model before it meets a task: the name it was asked by (``analytic``, ``neural`` or a model's name)
    and its options (its config's fields, and ``calibration``), checked when made: an unknown name or option is a
    ``UserError`` here, once. ``for_task(task)`` builds the ``CostModel`` that scores ``task`` (checked against its
    batch size and precision, its hosts' comm scaled); a plan's model is built once (``build_cost_model``) and serves
    every stage. ``chosen``: to be picked for this machine's kind when a task comes (``spec_of("neural")``), not
    named by the user."""

    name: str = "neural"
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    chosen: bool = False

    def __post_init__(self):
        object.__setattr__(self, "options", dict(self.options))
        cost_model_config(self.name, self.options)

    @property
    def label(self) -> str:
        """The model by its own name, as a plan records it and ``explain`` builds it again: a checkpoint's folder
        where one is given, the shipped default for a bare ``neural``, else the name (``analytic``, a shipped or
        user model's)."""
        checkpoint = self.options.get("checkpoint")
        if checkpoint:  # a folder as the plan can find it again from anywhere; a model's name as it is
            return checkpoint if checkpoint in model_names() else str(Path(checkpoint).resolve())
        return SHIPPED_MODEL_NAME if self.name == "neural" else self.name

    def for_task(self, task: Task) -> CostModel:
        """The cost model of ``task``: this spec's model (a chosen one as chosen), checked against the task's batch
        size and precision, its hosts' comm scaled, named by ``label``. ``build_cost_model`` chooses and builds a
        plan's model once."""
        factor, own = split_calibration(self.options)
        family, _ = _resolve(self.name, own)
        model = COST_MODELS[family][0](task, cost_model_config(self.name, own))
        return dataclasses.replace(model.with_scales(task.comm_scale(), factor), name=self.label)


def spec_of(name: str, options: Mapping[str, Any] | None = None) -> CostModelSpec:
    """The spec of cost model ``name`` as a user names it: ``neural`` without a checkpoint is chosen for this
    machine's kind when a task comes (``build_cost_model``); any other name or checkpoint is kept as given."""
    options = dict(options or {})
    return CostModelSpec(name, options, chosen=name == "neural" and not options.get("checkpoint"))


def load_cost_model(
    name_or_path: str | None = None,
    *,
    batch_size: int = 4096,
    precision: str = "fp32",
    device: str = "cpu",
    **options,
) -> CostModel:
    """A cost model to call from your own code: None or ``"neural"``, the model the planner chooses on this machine
    for a task at ``batch_size`` and ``precision`` on ``device`` (``choose_cost_model``: the one of this machine's
    kind, else the shipped default), so that your scores and ``nsj.plan``'s are one model's; a shipped or user
    model's name; a checkpoint directory; or ``"analytic"`` (with AnalyticConfig ``options``).

    A neural model scores at ``batch_size`` if it was trained there (the ensemble: any size in its trained
    range; the format-3 MLP: its one size); ``options`` may set ``risk`` for an ensemble, and ``calibration`` (every
    device's compute scaled by it, ``calibrate.py``) for any model.
    """
    factor, options = split_calibration(options)
    options = options or {}
    if name_or_path == "analytic":
        config = typed(AnalyticConfig, options, "load_cost_model")
        model = CostModel("analytic", ANALYTIC_FNS, analytic_params(batch_size, precision, config))
        return model.with_scales(np.ones(1), factor)
    if name_or_path in (None, "neural"):
        probe = Task.uniform(1, 1.0, batch_size, (), precision)
        name_or_path = choose_cost_model("neural", {}, device, probe).name
    if name_or_path == "neural" or name_or_path in model_names():
        name, resolved = _resolve(name_or_path, {})
    else:
        resolved = {"checkpoint": name_or_path}
    unknown = sorted(set(options) - {"risk"})
    if unknown:
        raise UserError(f"load_cost_model: options {unknown} apply to 'analytic' only")
    config = typed(NeuralConfig, {**(resolved or {}), **options}, "load_cost_model")
    task = Task.uniform(1, 1.0, batch_size, (), precision)
    named = CostModelSpec("neural", {"checkpoint": name_or_path}) if name_or_path != "neural" else CostModelSpec()
    return dataclasses.replace(neural_model(task, config).with_scales(np.ones(1), factor), name=named.label)


def adapt_here(device: str = "cpu") -> str:
    """The command that makes a model of this machine (``learn/fine_tune.py``)."""
    return "python -m neuroshard_jax.adapt budget_min=10" + (" device=cuda" if device == "cuda" else "")


@functools.lru_cache(maxsize=32)
def model_kinds(path: str) -> tuple[str, ...]:
    """The hardware kinds a checkpoint's labels hold for (``hardware_kinds`` of its meta; a model from before they
    were recorded: the kind of the machine it names, its microarchitecture unknown)."""
    meta = read_meta(path)
    kinds = meta.get("hardware_kinds") or [hardware_kind(meta.get("hardware"), meta.get("device", "cpu"))]
    if not (isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)):
        raise UserError(
            f"cost_model.checkpoint: {path!r} meta.json hardware_kinds: got {kinds!r:.60}, expected a list of kinds"
        )
    return tuple(kinds)


@dataclasses.dataclass(frozen=True)
class SkippedModel:
    """A model of the user's left out of a choice (``adapt`` made it; nobody named it), and why."""

    name: str
    folder: str
    why: str

    def line(self) -> str:
        return f"skipping your model {self.name} ({self.folder}): {self.why}"


def _usable_user_models(exclude: frozenset[str] = frozenset()) -> tuple[dict[str, dict], tuple[SkippedModel, ...]]:
    """The user's models whose meta.json reads (``model_kinds``), with their metas, less ``exclude``; and those
    whose meta is torn or malformed, left out so that they block no run that does not name them."""
    usable, skipped = {}, []
    for name in user_names():
        if name in exclude:
            continue
        try:
            model_kinds(checkpoint_path(name))
            usable[name] = read_meta(checkpoint_path(name))
        except UserError as err:
            skipped.append(SkippedModel(name, str(user_models_dir() / name), first_line(err)))
    return usable, tuple(skipped)


@dataclasses.dataclass(frozen=True)
class ModelChoice:
    """Which cost model plans on this machine: ``name`` and ``options`` for ``make_cost_model``, the kinds of
    hardware its labels came from, this machine's kind, and whether the two match."""

    name: str
    options: dict
    kinds: tuple[str, ...]
    here: str
    matches: bool
    chosen: bool  # picked for this machine (the user named none)
    device: str = "cpu"
    optimizer: str = "exact_sgd"  # the fused optimizer its labels ran
    skipped: tuple[SkippedModel, ...] = ()  # the user's models passed over to reach this one
    instead: str | None = None  # why this model plans in place of the one asked for (``build_cost_model``'s fallback)
    # the torch and FBGEMM its labels were timed with, where they are not this environment's (``stack_change``)
    stack: str | None = None
    contact: str | None = None  # how first contact scaled it to this machine (``measure.first_contact``), if it did

    @functools.cached_property
    def spec(self) -> CostModelSpec:
        """The chosen model, ready to build for a task (checked once, built once per choice)."""
        return CostModelSpec(self.name, self.options, self.chosen)

    def line(self) -> str:
        """One line: the model, what it was trained on, whether it matches, and the way forward where not."""
        label = self.spec.label
        if label in user_names() and label not in shipped_names():
            label += " (yours, made by adapt)"
        if not self.kinds:
            return f"cost model: {label} (the roofline, not trained on this machine's labels)"
        trained = " or ".join(self.kinds) + (f" with {self.optimizer}" if self.optimizer != "exact_sgd" else "")
        stack = f"; {self.stack} ({adapt_here(self.device)} re-times them here)" if self.stack else ""
        if self.matches:
            how = "chosen for this machine" if self.chosen else "trained on"
            return f"cost model: {label}, {how}: {trained}{stack}"
        if self.chosen:  # the rule that chose it (``nearest_models``), so that the choice can be read
            label += " (the nearest kind's)"
        if self.contact:
            return (
                f"cost model: {label}, trained on {trained}{stack}; this machine is {self.here}: no model of its kind; "
                f"{self.contact}; a model of this kind in minutes: {adapt_here(self.device)}"
            )
        return (
            f"cost model: {label}, trained on {trained}{stack}; this machine is {self.here}: no model of its kind, so "
            f"predictions may be far off; make one in minutes: {adapt_here(self.device)}"
        )


def choose_cost_model(
    name: str,
    options: dict | None = None,
    device: str = "cpu",
    task: Task | None = None,
    exclude: frozenset[str] = frozenset(),
) -> ModelChoice:
    """The cost model for this machine: ``neural`` without a checkpoint is the user's latest model of this
    machine's kind (made by ``adapt``), else the shipped model of its kind, else the nearest kind's
    (``nearest_models``: another AMD EPYC's on an AMD EPYC; the default ``xeon-union`` where no kind is nearer); of
    several, one trained at ``task``'s batch size and precision where given and one is; a named model or checkpoint
    is kept as given. ``device``: the compute device the plan is for (``cuda``: the kind includes the
    GPU); ``exclude``: user models not to choose. The user's models left out (``skipped``) are each logged once."""
    options = dict(options or {})
    chosen = name == "neural" and not options.get("checkpoint")
    skipped: tuple[SkippedModel, ...] = ()
    if chosen:  # the default stays "neural" unless another model, not the default, is of this kind
        exclude = exclude | frozenset(options.get("exclude") or ())
        of_kind, skipped = _model_of_kind(hardware_kind(hardware(), device), task, exclude)
        name = of_kind or (_default_besides(exclude) if SHIPPED_MODEL_NAME in exclude else name)
    for skip in skipped:
        logger.warning("%s", skip.line())
    return dataclasses.replace(model_choice(CostModelSpec(name, options, chosen), device), skipped=skipped)


def build_cost_model(
    spec: CostModelSpec, task: Task, device: str = "cpu", fallback: bool = False
) -> tuple[CostModel, ModelChoice]:
    """The cost model that scores ``task``, built once for a plan, and which model it is (``ModelChoice``): the
    model ``task_choice`` picks. A user's model chosen for this machine (nobody named it) whose saved state cannot be
    restored is passed over, with one warning, for the next choice: a model nobody named blocks no run."""
    passed: tuple[SkippedModel, ...] = ()
    while True:
        choice = task_choice(spec, task, device, fallback, frozenset(s.name for s in passed))
        passed += choice.skipped
        try:
            model = choice.spec.for_task(task)
        except DamagedModel as err:
            if not (choice.chosen and choice.name in user_names()):
                raise
            skip = SkippedModel(choice.name, str(user_models_dir() / choice.name), err.why)
            logger.warning("%s", skip.line())
            passed += (skip,)
            continue
        return model, dataclasses.replace(choice, skipped=passed)


def task_choice(
    spec: CostModelSpec, task: Task, device: str = "cpu", fallback: bool = False, exclude: frozenset[str] = frozenset()
) -> ModelChoice:
    """Which model scores ``task``: ``spec``'s, or where it is to be chosen for this machine, its kind's model
    trained nearest the task (``choose_cost_model``, less the user's models ``exclude``). ``fallback``: a model not
    trained at the task's batch size or precision gives way to a shipped one that is, else to the analytic roofline
    (``instead`` says why), for callers that must plan whatever the batch (the TorchRec adapter)."""
    choice = choose_cost_model("neural", spec.options, device, task, exclude) if spec.chosen else None
    choice = choice or model_choice(spec, device)
    path = _checkpoint_of(choice.name, choice.options)
    why = None if path is None or not fallback else untrained(task, read_meta(path), path)
    if why is None:
        return choice
    fits = fitting_models(task.batch_size, task.precisions)
    named = CostModelSpec(fits[0] if fits else "analytic")
    instead = f"{why}; planning with cost_model={named.name} instead"
    return dataclasses.replace(model_choice(named, device), skipped=choice.skipped, instead=instead)


def _checkpoint_of(name: str, options: Mapping[str, Any]) -> str | None:
    """The checkpoint folder cost model ``name`` with ``options`` loads (None: the analytic model loads none)."""
    family, resolved = _resolve(name, split_calibration(options)[1])
    if family != "neural":
        return None
    checkpoint = (resolved or {}).get("checkpoint")
    return checkpoint_path(checkpoint) if checkpoint else str(package_path(SHIPPED_CHECKPOINT))


def model_choice(spec: CostModelSpec, device: str = "cpu") -> ModelChoice:
    """What ``spec`` is on this machine: the kinds of hardware its labels came from, this machine's kind (with
    ``device``: ``cuda`` includes the GPU), and whether the two match."""
    here = hardware_kind(hardware(), device)
    if spec.name == "analytic":
        return ModelChoice(spec.name, spec.options, (), here, False, False, device)
    checkpoint = spec.options.get("checkpoint")
    path = checkpoint_path(checkpoint or (SHIPPED_MODEL_NAME if spec.name == "neural" else spec.name))
    found = (Path(path) / "meta.json").exists()
    kinds = model_kinds(path) if found else ()
    meta = read_meta(path) if found else {}
    optimizer = trained_optimizer(meta) if found else "exact_sgd"
    choice = ModelChoice(spec.name, spec.options, kinds, here, of_kind(here, kinds), spec.chosen, device, optimizer)
    return dataclasses.replace(choice, stack=stack_change(meta, installed_stack()))


def kernels_missing(meta: dict, task: Task) -> int:
    """How many of the kernel kinds ``task``'s tables run a model's labels never held (its meta's coverage; a model
    from before kinds learned sum-pooled bags alone)."""
    learned = set(((meta.get("coverage") or {}).get("kernels")) or ("sum",))
    return len({t.kernel for t in task.tables} - learned)


def of_kind(here: str, kinds: tuple[str, ...]) -> bool:
    """Whether a model of ``kinds`` is of this machine's kind ``here``. A GPU kind ("CPU [id] + GPU") matches by
    its GPU: a GPU's kernels are the GPU's, whichever host CPU launched them."""
    gpu = here.partition(" + ")[2]
    return here in kinds or (bool(gpu) and gpu != "GPU not recorded" and any(k.endswith(f" + {gpu}") for k in kinds))


def _default_besides(exclude: frozenset[str]) -> str:
    """The shipped CPU model that plans where the default is left out (``NeuralConfig.exclude``): the first by name
    not left out, else the roofline."""
    for name in shipped_names():
        kinds = model_kinds(checkpoint_path(name))
        if name not in exclude and kinds and not any(" + " in k for k in kinds):
            return name
    return "analytic"


def _model_of_kind(
    here: str, task: Task | None = None, exclude: frozenset[str] = frozenset()
) -> tuple[str | None, tuple[SkippedModel, ...]]:
    """The user's most recently made model of kind ``here`` (less ``exclude``), else the first shipped one, else of
    the nearest kind's (``nearest_models``), unless that is the default (None: keep ``neural``), and the user's models
    left out as unreadable; with ``task``, a model trained at its batch size and precision before one that is not (an
    H200's ``h200-union`` plans 2k-8k batches, ``h200-queued`` 16k-64k), and of those, the one whose labels ran the
    task's optimizer (``epyc-f25m17-rowwise`` for row-wise Adagrad) before the others; before both, one whose labels
    hold every kernel the task's tables run (``epyc-f25m17-kinds`` for sequence, weighted or mean-pooled tables; a task
    of sum-pooled bags keeps the first)."""

    def best(names: list[str], metas: dict[str, dict]) -> str:
        """Of ``names`` (in order of preference), the first trained at the task's batch size and precision whose
        labels miss the fewest of the task's kernels (``kernels_missing``), then nearest its optimizer
        (``optimizer_distance``); else the first. ``metas``: those already read."""
        if task is None:
            return names[0]
        fits = [
            (kernels_missing(meta, task), optimizer_distance(meta, task.training.optimizer), i)
            for i, meta in enumerate(metas.get(n) or read_meta(checkpoint_path(n)) for n in names)
            if _trains(meta, task.batch_size, task.precisions)
        ]
        return names[min(fits)[-1]] if fits else names[0]

    usable, skipped = _usable_user_models(exclude)
    mine = {n: usable[n] for n in models_of_kind(here, list(usable))}
    if mine:
        return best(sorted(mine, key=lambda n: mine[n].get("trained", ""), reverse=True), mine), skipped
    shipped = models_of_kind(here, [n for n in shipped_names() if n not in exclude])
    if not shipped:  # no model of this kind: the nearest kind's (the user's before the shipped ones at one distance)
        newest = sorted(usable, key=lambda n: usable[n].get("trained", ""), reverse=True)
        shipped = nearest_models(here, [*newest, *(n for n in shipped_names() if n not in exclude)])
        usable = {n: usable[n] for n in shipped if n in usable}
    if not shipped or SHIPPED_MODEL_NAME in shipped:
        return None, skipped
    return best(shipped, usable), skipped


def models_of_kind(here: str, names: list[str]) -> list[str]:
    """Of ``names`` (models by name, in order), those trained on this machine's kind ``here`` (``of_kind``)."""
    return [n for n in names if of_kind(here, model_kinds(checkpoint_path(n)))]


_CPU_ID = re.compile(r"\[(\w+) family (\d+) model (\d+)\]")
_VENDORS = (("AMD", "AuthenticAMD"), ("Intel", "GenuineIntel"))  # a kind recorded without its cpu_id: by its name
FAR = 1 << 16  # a family or model number not recorded


def kind_distance(here: str, kind: str) -> tuple[int, int, int] | None:
    """How far a model trained on ``kind`` stands from this machine's kind ``here`` (``hardware_kind``), for choosing
    where no model is of this kind: (another vendor, families apart, models apart) for a CPU; for a GPU plan
    (``here`` names a GPU) (another GPU maker, 0, 0); None where the model cannot price this device at all (a GPU's
    model for a CPU plan, a CPU's for a GPU one). Why the vendor and the family first: a model's error moves with
    the device's content from one kind to another unless the two kinds are one line of processors (2026-11-30, the
    two AMD EPYC kinds' models against the Intel Xeon's on each other's labels: docs/results/first-contact.md)."""
    gpu, there = here.partition(" + ")[2], kind.partition(" + ")[2]
    if bool(gpu) != bool(there):
        return None
    if gpu:
        return (int(gpu.split()[0] != there.split()[0]), 0, 0)

    def cpu(k: str) -> tuple[str, int, int]:
        found = _CPU_ID.search(k)
        if found:
            return found[1], int(found[2]), int(found[3])
        vendor = next((v for word, v in _VENDORS if word in k), k)
        return vendor, -FAR, -FAR

    (v, f, m), (v2, f2, m2) = cpu(here), cpu(kind)
    if v != v2:  # another vendor's family numbers say nothing of this one's: every such model stands as far
        return (1, FAR, FAR)
    return (0, abs(f - f2), abs(m - m2) if f == f2 else FAR)


def nearest_models(here: str, names: list[str]) -> list[str]:
    """Of ``names`` (in order of preference), those trained on the kind nearest this machine's (``kind_distance``),
    in that order; none where none can price this device."""
    far = {
        n: [d for d in map(functools.partial(kind_distance, here), model_kinds(checkpoint_path(n))) if d] for n in names
    }
    ranked = {n: min(d) for n, d in far.items() if d}
    least = min(ranked.values(), default=None)
    return [n for n in names if ranked.get(n) == least]
