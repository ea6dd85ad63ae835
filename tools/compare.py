"""Compare searchers from a Hydra multirun directory: a markdown table and PNG plots.

    python tools/compare.py MULTIRUN_DIR [--out DIR]

Reads every ``plan.json`` under the directory (and the ``evaluation.json`` beside it when the plan was
measured with ``python -m neuroshard_jax.evaluate``). Per searcher: runs, infeasible runs, mean and
median predicted and measured cost, mean cost relative to the best greedy baseline on the same tasks,
wins (lowest cost of a task among the searchers), mean search time. Costs are compared only on tasks
every searcher solved; infeasible runs are counted, never dropped silently. Writes ``compare.md``,
``cost_by_searcher.png`` (cost distribution) and ``search_time.png`` (search time vs number of tables).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

GREEDY = ("dim_greedy", "size_greedy", "lookup_greedy", "size_lookup_greedy")


def task_key(plan: dict) -> str:
    return json.dumps(plan["task"], sort_keys=True)


def load_runs(root: Path) -> list[dict]:
    runs = []
    for path in sorted(root.rglob("plan.json")):
        plan = json.loads(path.read_text())
        evaluation = path.with_name("evaluation.json")
        measured = json.loads(evaluation.read_text())["cost_ms"] if evaluation.exists() else None
        if "infeasible" in plan:
            runs.append({"searcher": plan.get("searcher"), "infeasible": plan["infeasible"], "task": plan.get("task")})
            continue
        runs.append(
            {
                "searcher": plan["searcher"],
                "task": task_key(plan),
                "tables": len(plan["task"]["tables"]),
                "predicted": plan["cost_ms"],
                "measured": measured,
                "search_s": plan["search_time_s"],
            }
        )
    return runs


def summarize(runs: list[dict]) -> tuple[list[dict], str, int, str | None]:
    """Per-searcher rows; the cost used (measured when every solved plan was measured, else predicted);
    the number of tasks every searcher solved; the best greedy baseline."""
    by_searcher: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by_searcher[r["searcher"]].append(r)
    solved = [r for r in runs if "infeasible" not in r]
    kind = "measured" if solved and all(r["measured"] is not None for r in solved) else "predicted"
    tasks = {r["task"] for r in solved}
    cost = {(r["searcher"], r["task"]): r[kind] for r in solved}
    common = [t for t in tasks if all((s, t) in cost for s in by_searcher)]
    greedy = [s for s in by_searcher if s in GREEDY]
    best_greedy = min(greedy, key=lambda s: statistics.mean(cost[s, t] for t in common)) if greedy and common else None
    winners = [min(by_searcher, key=lambda s: cost[s, t]) for t in common]
    rows = []
    for name, items in sorted(by_searcher.items()):
        ok = [r for r in items if "infeasible" not in r]
        values = [cost[name, t] for t in common]
        row = {
            "searcher": name,
            "runs": len(items),
            "infeasible": len(items) - len(ok),
            "mean": statistics.mean(values) if values else float("nan"),
            "median": statistics.median(values) if values else float("nan"),
            "mean_predicted": statistics.mean(r["predicted"] for r in ok) if ok else float("nan"),
            "wins": winners.count(name),
            "search_s": statistics.mean(r["search_s"] for r in ok) if ok else float("nan"),
        }
        if best_greedy:
            row["vs_best_greedy"] = statistics.mean(1 - cost[name, t] / cost[best_greedy, t] for t in common)
        rows.append(row)
    return rows, kind, len(common), best_greedy


def markdown(rows, kind: str, common: int, best_greedy: str | None) -> str:
    lines = [
        f"Costs: {kind} ms over the {common} tasks every searcher solved; relative to {best_greedy or 'n/a'}.",
        "",
        f"| searcher | runs | infeasible | mean {kind} | median {kind} | mean predicted (solved) | vs best greedy "
        "| wins | search s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(rows, key=lambda r: r["mean"]):
        rel = f"{100 * r['vs_best_greedy']:+.1f}%" if "vs_best_greedy" in r else ""
        lines.append(
            f"| `{r['searcher']}` | {r['runs']} | {r['infeasible']} | {r['mean']:.2f} | {r['median']:.2f} | "
            f"{r['mean_predicted']:.2f} | {rel} | {r['wins']} | {r['search_s']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def plots(runs: list[dict], kind: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    solved = [r for r in runs if "infeasible" not in r]
    names = sorted({r["searcher"] for r in solved})
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(names)), 4))
    ax.boxplot([[r[kind] for r in solved if r["searcher"] == n] for n in names])
    ax.set_xticks(range(1, len(names) + 1), names, rotation=30, ha="right")
    ax.set_ylabel(f"{kind} plan cost (ms)")
    fig.tight_layout()
    fig.savefig(out / "cost_by_searcher.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in names:
        points = sorted((r["tables"], r["search_s"]) for r in solved if r["searcher"] == n)
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=n, markersize=3)
    ax.set_xlabel("tables")
    ax.set_ylabel("search time (s)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "search_time.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("multirun_dir")
    parser.add_argument("--out", default=None, help="default: the multirun directory")
    args = parser.parse_args(argv)
    root = Path(args.multirun_dir)
    runs = load_runs(root) if root.is_dir() else []
    if not runs:
        print(f"error: {str(root)!r} holds no plan.json, expected a multirun directory of python -m neuroshard_jax -m")
        return 2
    out = Path(args.out or root)
    out.mkdir(parents=True, exist_ok=True)
    rows, kind, common, best_greedy = summarize(runs)
    table = markdown(rows, kind, common, best_greedy)
    (out / "compare.md").write_text(table)
    plots(runs, kind, out)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
