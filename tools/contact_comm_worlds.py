"""First contact's collectives factor at more worlds than it measures: how this machine's gloo exchanges stand
against a model's collectives as the ranks grow (``measure.first_contact.contact_comm``: the same fixed exchanges, no
compute before them, the median measured / predicted of each world's devices).

    python -m tools.contact_comm_worlds --model epyc-f25m17 [--worlds 2,4,8] [--probes 3] [--out FILE]

Each probe measures every world once, in a fresh set of rank processes, one probe after the other; prints each
probe's factors and seconds and, with ``--out``, writes them as JSON with the date, commit and machine. What it
decided: ``CommCalibration.factor_at`` does not extend the trend of first contact's two worlds past the larger.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import write_json
from neuroshard_jax.core.manifests import result_stamp
from neuroshard_jax.costs.choice import CostModelSpec, build_cost_model, checkpoint_path
from neuroshard_jax.measure import first_contact
from neuroshard_jax.measure.calibration import CalibrateConfig


def probe(model_name: str, worlds: tuple[int, ...], probes: int) -> dict:
    if not worlds or min(worlds) < 2:
        raise UserError(f"--worlds: got {list(worlds)}, expected ranks >= 2")
    task = first_contact.contact_tasks()[0]
    model, _ = build_cost_model(CostModelSpec("neural", {"checkpoint": checkpoint_path(model_name)}), task)
    rows = []
    for i in range(probes):
        record = first_contact.contact_comm(model, CalibrateConfig(name="measured"), worlds)
        rows.append({"factors": dict(zip(map(str, worlds), record.factors)), "seconds": record.seconds})
        print(f"probe {i}: factors {rows[-1]['factors']} in {record.seconds} s", flush=True)
    return {
        **result_stamp(),
        "model": model_name,
        "worlds": list(worlds),
        "probes": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.contact_comm_worlds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a shipped model's name or a checkpoint directory")
    parser.add_argument("--worlds", default="2,4,8")
    parser.add_argument("--probes", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    try:
        worlds = tuple(sorted({int(w) for w in args.worlds.split(",")}))
        result = probe(args.model, worlds, args.probes)
    except ValueError:
        print(f"error: --worlds: got {args.worlds!r}, expected ranks such as 2,4,8", file=sys.stderr)
        return 2
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        write_json(result, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
