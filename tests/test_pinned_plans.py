"""Plans pinned for a few (searcher, seed) pairs, made by the main job's planner: a refactor must not change
them. A change of the cost model, a searcher or the task generator that changes them on purpose re-pins them
(``python -m tests.test_pinned_plans`` rewrites tests/data/pinned_plans.json) and says so in its commit."""

import json
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from neuroshard_jax.search.job import main_config
from neuroshard_jax.workloads.builders import make_task

PINS = Path(__file__).parent / "data" / "pinned_plans.json"


def plan_of(searcher: str, seed: int, overrides: list[str]) -> dict:
    with initialize_config_module(config_module="neuroshard_jax.conf", version_base="1.3"):
        # the pins are xeon-union's: named, so that a machine with a model of its own kind plans them alike
        named = [] if any(o.startswith("cost_model") for o in overrides) else ["cost_model.checkpoint=xeon-union"]
        cfg = compose(config_name="config", overrides=[f"searcher={searcher}", f"seed={seed}", *overrides, *named])
    config = main_config(cfg)
    task = make_task(config.task, config.task.seed)
    result = config.planner.planner().plan(task).to_json()  # the main job's planner
    return {
        "searcher": searcher,
        "seed": seed,
        "overrides": overrides,
        "shards": [[s["table"], s["col_offset"], s["dim"], s["device"]] for s in result["shards"]],
        "cost_ms": round(result["cost_ms"], 4),
    }


@pytest.mark.parametrize("pin", json.loads(PINS.read_text()), ids=lambda p: f"{p['searcher']}-{p['seed']}")
def test_plan_is_pinned(pin):
    got = plan_of(pin["searcher"], pin["seed"], pin["overrides"])
    assert got["shards"] == pin["shards"]
    assert got["cost_ms"] == pytest.approx(pin["cost_ms"], rel=1e-4)


if __name__ == "__main__":  # re-pin on purpose
    pins = [plan_of(p["searcher"], p["seed"], p["overrides"]) for p in json.loads(PINS.read_text())]
    PINS.write_text("[\n" + ",\n".join(json.dumps(p, separators=(",", ":")) for p in pins) + "\n]\n")
    print(f"re-pinned {len(pins)} plans in {PINS}", file=sys.stderr)
