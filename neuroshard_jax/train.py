"""``python -m neuroshard_jax.train [datasets=[DIR,...] out=DIR train.epochs=200]``: train the neural cost models.

``family=ensemble`` (the default): the physics ensemble (``ensemble.py``) on every dataset in ``datasets``
(compute.jsonl of each; comm.jsonl of the first that has one). ``family=mlp``: the first shipped model, the
per-table MLP of ``neural.py``, on ``datasets[0]`` (kept for the ablation). Trains in log space with optax,
keeps the best-validation weights, prints test metrics per dataset, and saves an orbax checkpoint to ``out``.
``family=row_comm``: the row-split comm fit of a comm dataset (``learn.row_comm_fit``), written to
``out/NAME.json``; ``family=input_dist``: likewise the input distribution's fit (``costs.input_dist``);
``family=analytic``: the roofline's constants fitted to a dataset (``learn.analytic_fit``).
Settings: ``TrainAppConfig`` (conf/train.yaml).
"""

from __future__ import annotations

import json

import hydra
from omegaconf import DictConfig

from neuroshard_jax.core.cli import one_line_errors, run_app
from neuroshard_jax.core.paths import own_fits_dir
from neuroshard_jax.costs.choice import checkpoint_path
from neuroshard_jax.costs.ensemble import EnsembleConfig
from neuroshard_jax.costs.input_dist import InputDist
from neuroshard_jax.learn.analytic_fit import fit_analytic
from neuroshard_jax.learn.ensemble_fit import train_ensemble
from neuroshard_jax.learn.neural_fit import train_models
from neuroshard_jax.learn.row_comm_fit import fit_row_comm
from neuroshard_jax.learn.train_job import TrainAppConfig, app_config


@hydra.main(version_base="1.3", config_path="pkg://neuroshard_jax.conf", config_name="train")
@one_line_errors
def main(cfg: DictConfig) -> None:
    config = app_config(cfg)
    if config.family == "ensemble":
        how = f"python -m neuroshard_jax.train datasets=[{','.join(config.datasets)}] name={config.name}"
        if config.init:
            how += f" init={config.init} train.epochs={config.train.epochs}" + (" reanchor=true" * config.reanchor)
        # the physics settings that differ from the defaults
        defaults = EnsembleConfig()
        how += "".join(
            f" ensemble.{key}={str(getattr(config.ensemble, key)).lower()}"
            for key in ("kinds", "kind_terms", "cache", "fusion", "drop_faulted")
            if getattr(config.ensemble, key) != getattr(defaults, key)
        )
        report = train_ensemble(
            list(config.datasets),
            config.ensemble,
            config.train,
            config.out,
            config.name,
            how,
            allow_mixed_hardware=config.allow_mixed_hardware,
            init=checkpoint_path(config.init) if config.init else None,
            reanchor=config.reanchor,
        )
    elif config.family == "mlp":
        report = train_models(config.datasets[0], config.net, config.train, config.out)
    elif config.family in ("row_comm", "input_dist"):
        dataset = config.datasets[0]
        how = f"python -m neuroshard_jax.train family={config.family} datasets=[{dataset}] name={config.name}"
        mine = config.out == TrainAppConfig.out  # no out given: this user's fits, found by hardware kind
        out = own_fits_dir(config.family) if mine else config.out
        model, figures, path = fit_row_comm(dataset, config.name, out, how, config.family)
        for k in model.sizes:
            if isinstance(model, InputDist):
                a, b, c = model.terms(k, model.batch_size)
                print(
                    f"{k} devices at batch {model.batch_size}: {a:.2f} ms a distribution + {b * 100:.2f} ms per "
                    f"100 ids per sample taken + {c * 100:.2f} ms per 100 sent"
                )
            else:
                f, b = model.group_ms(k, 128, model.batch_size)
                print(f"group of {k}: width 128 at batch {model.batch_size}: fwd {f:.2f} ms, bwd {b:.2f} ms")
        print(f"held out: {figures}; written {path}")
        if mine:
            print(f"models of this hardware kind ({model.kind}) price with it from now on")
        return
    else:
        report = fit_analytic(config.datasets[0], config.steps, config.train.split)
        print(json.dumps(report, indent=1))
        overrides = " ".join(f"cost_model.{k}={v}" for k, v in report["constants"].items())
        print(f"use them: python -m neuroshard_jax cost_model=analytic {overrides}")
        return
    print(json.dumps(report, indent=1))
    print(f"checkpoint written to {config.out}")


if __name__ == "__main__":
    run_app(main, "train", app_config)
