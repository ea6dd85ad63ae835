"""Compare searchers from a Hydra multirun directory: a markdown table and PNG plots.

    python -m neuroshard_jax.compare sweep=MULTIRUN_DIR [out=DIR]

Reads suite runs (``-m experiment=compare``: suite.json, results.jsonl and measured.jsonl in each job
directory) and single-task runs (``plan.json``, with ``evaluation.json`` beside it when measured). A run
is named by its searcher plus the overrides that differ between the runs (``beam searcher.k=5``,
``grid cost_model=analytic``); task and seed overrides name tasks, not runs.

One table per device count, then all tasks together. Per run: tasks, infeasible tasks, mean and median
predicted and measured cost, mean cost relative to the best greedy baseline on the same task, wins
(lowest cost of a task among the runs, ties to each), mean search time. Costs are compared on the tasks
every run solved (measured costs: on those of them every run's plan was measured); infeasible tasks are
counted, never dropped silently. The ranking uses measured costs when there are any, else predicted.
Writes ``compare.md``, ``cost_by_searcher.png`` (cost distribution per device count) and
``search_time.png`` (search time vs number of tables).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
from collections import defaultdict
from pathlib import Path

from omegaconf import OmegaConf

from neuroshard_jax.core.cli import resolved
from neuroshard_jax.core.config import typed
from neuroshard_jax.core.errors import UserError
from neuroshard_jax.core.files import JSONDoc, read_json, read_jsonl

GREEDY = ("dim_greedy", "size_greedy", "lookup_greedy", "size_lookup_greedy")
TASK_OVERRIDES = ("task.", "task=", "seed=", "output=")  # these choose tasks, not searchers


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


def _jsonl(path: Path) -> dict[str, JSONDoc]:
    """The records of a run's JSONL file by id (a torn last line, a run still being written, is left out)."""
    return {r["id"]: r for r in read_jsonl(path)} if path.exists() else {}


def _raw_overrides(run_dir: Path) -> list[str]:
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.exists():
        return []
    return [str(o) for o in OmegaConf.load(path)]


def _hydra_overrides(run_dir: Path) -> list[str]:
    skip = ("searcher=", "experiment=", "hydra.", "hydra/")
    return [o for o in _raw_overrides(run_dir) if not o.lstrip("+~").startswith(skip)]


def suite_entries(run_dir: Path) -> list[dict]:
    settings = read_json(run_dir / "suite.json", "suite", "the suite.json of a suite run")
    tasks = _digest(settings["task"])
    measured = _jsonl(run_dir / "measured.jsonl")
    base = {"run": str(run_dir), "searcher": settings["searcher"], "overrides": settings["overrides"]}
    out = []
    for r in _jsonl(run_dir / "results.jsonl").values():
        entry = {**base, "task": f"{tasks}/{r['id']}", "devices": r["devices"], "tables": r["tables"]}
        if "infeasible" in r:
            out.append({**entry, "infeasible": r["infeasible"]})
            continue
        m = measured.get(r["id"])
        out.append(
            {
                **entry,
                "predicted": r["predicted_ms"],
                "measured": m["measured_ms"] if m else None,
                "search_s": r["search_s"],
            }
        )
    return out


def plan_entry(path: Path) -> JSONDoc:
    plan = read_json(path, "plan", "a plan.json written by python -m neuroshard_jax")
    overrides = _hydra_overrides(path.parent)
    named = [o.partition("=")[2] for o in _raw_overrides(path.parent) if o.startswith("searcher=")]
    searcher = plan.get("searcher") or (named[-1] if named else None)
    if not isinstance(searcher, str):
        raise UserError(f"plan: {str(path)!r} names no searcher (nor its run's overrides), expected a plan.json")
    base = {"run": str(path.parent), "searcher": searcher, "overrides": overrides}
    task = plan.get("task") if isinstance(plan.get("task"), dict) else {}
    devices, tables = task.get("num_devices"), task.get("tables")
    if "infeasible" in plan:  # counted, never compared
        tables = len(tables) if isinstance(tables, list) else None
        return {**base, "task": _digest(task), "devices": devices, "tables": tables, "infeasible": plan["infeasible"]}
    evaluation = path.with_name("evaluation.json")
    try:
        return {
            **base,
            "task": _digest(task),
            "devices": int(devices),
            "tables": len(tables),
            "predicted": float(plan["cost_ms"]),
            "measured": float(read_json(evaluation, "evaluation")["cost_ms"]) if evaluation.exists() else None,
            "search_s": float(plan["search_time_s"]),
        }
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"plan: {str(path)!r} lacks a valid {err}, expected a plan.json (or evaluation.json)") from None


def load_runs(root: Path) -> list[dict]:
    """One entry per (run, task), each with its run's ``label``."""
    suite_dirs = sorted(p.parent for p in root.rglob("suite.json"))
    entries = [e for d in suite_dirs for e in suite_entries(d)]
    entries += [plan_entry(p) for p in sorted(root.rglob("plan.json")) if p.parent not in suite_dirs]
    by_run = defaultdict(list)
    for e in entries:
        by_run[e["run"]].append([o for o in e["overrides"] if not o.startswith(TASK_OVERRIDES)])
    options = {run: set(v[0]) for run, v in by_run.items()}
    common = set.intersection(*options.values()) if options else set()
    for e in entries:
        e["label"] = " ".join([e["searcher"], *sorted(options[e["run"]] - common)])
    return entries


def summarize(entries: list[JSONDoc]) -> JSONDoc:
    """Rows per label; predicted costs over the tasks every label solved, measured costs over those of
    them where every label's plan was measured (all of them once a sweep is fully measured). The ranking
    (vs best greedy, wins) uses measured costs when any task has them all, else predicted."""
    labels = sorted({e["label"] for e in entries})
    solved = [e for e in entries if "infeasible" not in e]
    by_key = {(e["label"], e["task"]): e for e in solved}
    tasks = sorted({e["task"] for e in solved})
    common = [t for t in tasks if all((name, t) in by_key for name in labels)]
    measured = [t for t in common if all(by_key[name, t]["measured"] is not None for name in labels)]
    kind, ranked = ("measured", measured) if measured else ("predicted", common)
    cost = {key: e[kind] for key, e in by_key.items()}
    greedy = [name for name in labels if name.split()[0] in GREEDY]
    mean = lambda xs: statistics.mean(xs) if xs else float("nan")  # noqa: E731
    median = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    best_greedy = min(greedy, key=lambda g: mean([cost[g, t] for t in ranked])) if greedy and ranked else None
    best = {t: min(cost[name, t] for name in labels) for t in ranked}
    rows = []
    for name in labels:
        mine = [e for e in entries if e["label"] == name]
        ok = [e for e in mine if "infeasible" not in e]
        row = {
            "label": name,
            "tasks": len(mine),
            "infeasible": len(mine) - len(ok),
            "mean_predicted": mean([by_key[name, t]["predicted"] for t in common]),
            "median_predicted": median([by_key[name, t]["predicted"] for t in common]),
            "mean_measured": mean([by_key[name, t]["measured"] for t in measured]),
            "median_measured": median([by_key[name, t]["measured"] for t in measured]),
            "wins": sum(cost[name, t] <= best[t] for t in ranked),
            "search_s": mean([e["search_s"] for e in ok]),
            "mean": mean([cost[name, t] for t in ranked]),
        }
        if best_greedy:
            row["vs_best_greedy"] = mean([1 - cost[name, t] / cost[best_greedy, t] for t in ranked])
        rows.append(row)
    return {
        "rows": rows,
        "kind": kind,
        "tasks": len(tasks),
        "common": len(common),
        "measured": len(measured),
        "best_greedy": best_greedy,
    }


def _ms(x: float) -> str:
    return "" if x != x else f"{x:.2f}"


def markdown_table(summary: dict, title: str) -> str:
    lines = [
        f"### {title}",
        "",
        f"{summary['tasks']} tasks, {summary['common']} solved by every run, {summary['measured']} of them measured "
        f"for every run. Ranked by {summary['kind']} cost over the "
        f"{summary['measured'] if summary['kind'] == 'measured' else summary['common']} tasks; predicted means over "
        + (
            f"the {summary['common']}; vs best greedy: mean per-task gain over `{summary['best_greedy']}` "
            "(positive: faster)."
            if summary["best_greedy"]
            else f"the {summary['common']}; vs best greedy: empty, no greedy baseline ran in the sweep."
        ),
        *(
            [
                "",
                "The measured columns are empty: no run of the sweep was measured on the kernels (rerun it with "
                "`evaluate=true`, or `python -m neuroshard_jax.evaluate plan=...` on its plans).",
            ]
            if not summary["measured"]
            else []
        ),
        "",
        "| run | tasks | infeasible | mean measured ms | median measured ms | mean predicted ms "
        "| median predicted ms | vs best greedy | wins | search s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in sorted(summary["rows"], key=lambda r: (r["mean"] != r["mean"], r["mean"])):
        rel = f"{100 * r['vs_best_greedy']:+.1f}%" if "vs_best_greedy" in r else ""
        lines.append(
            f"| `{r['label']}` | {r['tasks']} | {r['infeasible']} | {_ms(r['mean_measured'])} | "
            f"{_ms(r['median_measured'])} | {_ms(r['mean_predicted'])} | {_ms(r['median_predicted'])} | {rel} | "
            f"{r['wins']} | {r['search_s']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def report(entries: list[dict]) -> tuple[str, dict]:
    """The markdown (a table per device count, then all tasks) and the summaries by group."""
    groups = {
        f"{n} devices": [e for e in entries if e["devices"] == n]
        for n in sorted({e["devices"] for e in entries if e["devices"]})
    }
    if len(groups) != 1 or any(not e["devices"] for e in entries):  # a bare infeasible record counts here
        groups["all tasks"] = entries
    summaries = {name: summarize(group) for name, group in groups.items()}
    return "\n".join(markdown_table(s, name) for name, s in summaries.items()), summaries


def plots(entries: list[dict], summaries: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    solved = [e for e in entries if "infeasible" not in e]
    groups = [name for name in summaries if name != "all tasks"] or list(summaries)
    labels = sorted({e["label"] for e in solved})
    fig, axes = plt.subplots(1, len(groups), figsize=(max(6, 0.9 * len(labels)) * len(groups), 4.5), squeeze=False)
    for ax, name in zip(axes[0], groups):
        kind = summaries[name]["kind"]
        members = [e for e in solved if name == "all tasks" or f"{e['devices']} devices" == name]
        ax.boxplot([[e[kind] for e in members if e["label"] == lab] for lab in labels])
        ax.set_xticks(range(1, len(labels) + 1), labels, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(f"{kind} plan cost (ms)")
        ax.set_title(name)
    fig.tight_layout()
    fig.savefig(out / "cost_by_searcher.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for lab in labels:
        by_tables = defaultdict(list)
        for e in solved:
            if e["label"] == lab:
                by_tables[e["tables"]].append(e["search_s"])
        xs = sorted(by_tables)
        ax.plot(xs, [statistics.median(by_tables[x]) for x in xs], "o-", label=lab, markersize=3)
    ax.set_xlabel("tables")
    ax.set_ylabel("search time (s, median)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "search_time.png", dpi=110)
    plt.close(fig)


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """conf/compare.yaml."""

    sweep: str | None = None  # a Hydra multirun directory of python -m neuroshard_jax -m (suite runs or plans)
    out: str | None = None  # where compare.md, compare.json and the plots go (null: the sweep directory)


def app_config(cfg) -> CompareConfig:
    return typed(CompareConfig, resolved(cfg))


def compare_sweep(config: CompareConfig) -> str:
    """Read the sweep's runs, write compare.md, compare.json and the plots; the markdown report."""
    if not config.sweep:
        raise UserError("sweep: missing, expected sweep=PATH of a multirun directory of python -m neuroshard_jax -m")
    root = Path(config.sweep)
    entries = load_runs(root) if root.is_dir() else []
    if not entries:
        raise UserError(
            f"sweep: {str(root)!r} holds no suite run or plan.json, expected a multirun directory of "
            "python -m neuroshard_jax -m"
        )
    out = Path(config.out or root)
    out.mkdir(parents=True, exist_ok=True)
    text, summaries = report(entries)
    (out / "compare.md").write_text(text)
    (out / "compare.json").write_text(json.dumps(summaries, indent=1) + "\n")
    plots(entries, summaries, out)
    return text
