"""``python -m neuroshard_jax.loop [out=DIR rounds=3 tasks=30]``: pre-train, search, measure, learn.

Round r: the searchers plan ``tasks`` fresh tasks of the training side with model r (the shipped default for
r = 0), the devices of their plans and of selected variants are measured (``collect kind=plans`` into
``out/labels``), model r's figures on those labels are recorded (held out: it never saw them), and model r+1
is model r fine-tuned on the union of the base datasets and every label so far (``out/models/round-{r+1}``).
``scratch=true`` also trains a model from scratch on the union after the last round, for comparison.
Everything is resumable: a rerun skips finished collections and trained rounds. ``out/loop.json`` holds the
table of every round's figures. Settings live in conf/loop.yaml.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from omegaconf import DictConfig

from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import bounded, check_bounds, typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, write_json
from neuroshard_jax.core.folders import one_writer
from neuroshard_jax.core.hardware import hardware, hardware_kind
from neuroshard_jax.core.manifests import load_manifest, manifest_kinds
from neuroshard_jax.core.paths import resolve_dataset
from neuroshard_jax.costs.choice import checkpoint_path
from neuroshard_jax.costs.ensemble import EnsembleConfig
from neuroshard_jax.kernels.executors import ExecutorConfig, connected
from neuroshard_jax.learn.cost_labels import CollectConfig, collect
from neuroshard_jax.learn.ensemble_fit import train_ensemble
from neuroshard_jax.learn.plan_labels import plan_label_report
from neuroshard_jax.learn.trainer import TrainConfig

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """conf/loop.yaml."""

    out: str = "runs/loop"
    rounds: int = bounded(at_least=1, default=3)
    # tasks per round (each: every searcher's plan + ``plans.variants`` variants)
    tasks: int = bounded(at_least=1, default=30)
    start_model: str = "xeon-union"  # model 0: a shipped name or a checkpoint directory
    base_datasets: tuple[str, ...] = ()  # datasets of this machine's kind (checked before measuring)
    label_weight: float = bounded(above=0, default=2.0)  # loss weight of a plan label against a base record
    scratch: bool = False  # also train from scratch on the union after the last round (reported)
    allow_mixed_hardware: bool = False  # train on base datasets measured on another kind of hardware than the labels
    # as conf/collect.yaml (kind=plans); plans.round and plans.model are set per round
    collect: CollectConfig = CollectConfig(kind="plans")
    executor: ExecutorConfig = ExecutorConfig(workers=2)  # where the plans are measured (conf/executor/)
    ensemble: EnsembleConfig = EnsembleConfig()  # as conf/train.yaml (a fine-tune keeps the checkpoint's own net sizes)
    finetune: TrainConfig = TrainConfig(epochs=60, learning_rate=1e-3)

    def __post_init__(self):
        check_bounds(self)


def model_dir(out: Path, round_: int) -> Path:
    return out / "models" / f"round-{round_}"


def run_loop(config: LoopConfig) -> JSONDoc:
    """Every round (resumable; a line each, logged at INFO); returns the per-round table also written to
    ``out/loop.json``. The executor is reached before anything is written, and ``out`` is held for this run alone
    (``one_writer``)."""
    if not config.allow_mixed_hardware:
        check_base_hardware(config.base_datasets, config.collect.device)
    with connected(config.executor), one_writer(config.out, "out"):
        return _rounds(config)


def _rounds(config: LoopConfig) -> JSONDoc:
    out = Path(config.out)
    labels = out / "labels"
    datasets = [*config.base_datasets, str(labels)]
    scale = (1.0,) * len(config.base_datasets) + (config.label_weight,)
    table = _read(out / "loop.json")
    model = config.start_model
    for r in range(config.rounds):
        plans = dataclasses.replace(config.collect.plans, round=r, model=model)
        collected = collect(
            dataclasses.replace(
                config.collect,
                kind="plans",
                num_samples=config.tasks,
                out_dir=str(labels),
                plans=plans,
                executor=config.executor,
            )
        )
        entry = table.setdefault(str(r), {})
        entry.update(model=model, collected=collected, held_out=plan_label_report(labels, r).get(str(r)))
        write_json(table, out / "loop.json")
        logger.info("round %s: model %s: %s", r, model, json.dumps(entry["held_out"]))
        nxt = model_dir(out, r + 1)
        if not (nxt / "meta.json").exists():
            how = f"python -m neuroshard_jax.loop out={config.out} (round {r + 1}, fine-tuned from {model})"
            report = train_ensemble(
                datasets,
                config.ensemble,
                config.finetune,
                nxt,
                f"loop-round-{r + 1}",
                how,
                init=checkpoint_path(model),
                dataset_scale=scale,
                allow_mixed_hardware=config.allow_mixed_hardware,
            )
            entry["next_model_test"] = report["compute"]
            write_json(table, out / "loop.json")
        model = str(nxt)
    if config.scratch and not (out / "models" / "scratch" / "meta.json").exists():
        how = f"python -m neuroshard_jax.loop out={config.out} scratch=true (from scratch on every label)"
        report = train_ensemble(
            datasets,
            config.ensemble,
            TrainConfig(),
            out / "models" / "scratch",
            "loop-scratch",
            how,
            dataset_scale=scale,
            allow_mixed_hardware=config.allow_mixed_hardware,
        )
        table["scratch"] = {"test": report["compute"]}
        write_json(table, out / "loop.json")
    return table


def check_base_hardware(base_datasets: tuple[str, ...], device: str) -> None:
    """Before any measuring: the labels this machine will add must be of the base datasets' kind of hardware, or
    training would refuse them after the round's measurements (``ensemble_fit.check_one_hardware``)."""
    here = hardware_kind(hardware(), device)
    for base in base_datasets:
        manifest = load_manifest(resolve_dataset(base), "compute")
        there = hardware_kind(manifest.get("hardware"), manifest["settings"].get("device"))
        if here not in manifest_kinds(manifest):
            raise UserError(
                f"base_datasets: {base!r} was measured on {there}, this machine is {here}; expected base datasets "
                "of this machine's kind (base_datasets=[] fine-tunes on this machine's labels only; "
                "python -m neuroshard_jax.probe record=true BASE records that this machine measures like it; "
                "allow_mixed_hardware=true mixes them anyway)"
            )


def _read(path: Path) -> JSONDoc:
    return json.loads(path.read_text()) if path.exists() else {}


def app_config(cfg: DictConfig) -> LoopConfig:
    return typed(LoopConfig, resolved(cfg))
