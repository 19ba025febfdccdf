"""How far below its start a quickstart run's cost could go: perfect routing, from the run's own trajectories.

    python bench/quickstart_cost_ceiling.py runs/quickstart [more run folders: extra calls to price aliases]

Reads the held-out trajectories of one quickstart run (`eval_<initial|final>_<preset>.jsonl`, the
unseen-tools catalog left out) and prices each held-out task on the cheapest route that is right
for it: any reasoner for a sum, any search for a city question, the deep `search-3` for a year
question, then the cheapest answer alias. An alias's price per call is the mean expert cost of
its calls on that kind of question in the run (pooled over kinds, then over the extra folders,
where the run never called it); the orchestrator's own cost is the mean over the run's two-turn
episodes.  Prints the start's cost per task (`initial`, `cost` preset), that perfect routing, and
the policy that sends every lookup to the deep search, with their cuts. docs/training.md (sixth
round) quotes it.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

RIGHT = {"arithmetic": ["reasoner-1", "reasoner-2"], "city": ["search-1", "search-2", "search-3"],
         "year": ["search-3"]}


def kind(row: dict) -> str:
    return "arithmetic" if row["task_id"].startswith("arith") else row["task_id"].rsplit("-", 1)[-1]


def episodes(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.glob("eval_*_*.jsonl")) if "unseen_tools" not in f.name
            for line in f.read_text().splitlines()]


def call_prices(rows: list[dict]) -> tuple[dict, dict]:
    """(kind, alias) -> mean expert cost per call, alias -> the same pooled over kinds (answers: kind "any")."""
    by_kind, pooled = defaultdict(list), defaultdict(list)
    for r in rows:
        for turn in r["turns"]:
            expert = turn.get("expert")
            if expert and expert.get("cost") is not None:
                k = "any" if expert["tool"] == "answer" else kind(r)
                by_kind[(k, expert["alias"])].append(expert["cost"])
                pooled[expert["alias"]].append(expert["cost"])
    mean = lambda xs: sum(xs) / len(xs)
    return {k: mean(v) for k, v in by_kind.items()}, {a: mean(v) for a, v in pooled.items()}


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(__doc__)
    run, extra = Path(argv[0]), [Path(a) for a in argv[1:]]
    rows = episodes(run)
    if not rows:
        sys.exit(f"{run}: no eval_<initial|final>_<preset>.jsonl (a finished quickstart run's folder)")
    own, own_pooled = call_prices(rows)
    _, extra_pooled = call_prices([r for folder in extra for r in episodes(folder)])
    two_turns = [sum(t.get("policy_cost") or 0.0 for t in r["turns"]) for r in rows if len(r["turns"]) == 2]
    policy = sum(two_turns) / len(two_turns)

    def price(k: str, alias: str) -> float:
        for table, key in ((own, (k, alias)), (own_pooled, alias), (extra_pooled, alias)):
            if key in table:
                return table[key]
        sys.exit(f"{alias}: never called in {run} or the extra folders; pass a run that called it")

    answer = min(price("any", a) for a in ("answer-1", "answer-4", "answer-math-2"))
    tasks = [json.loads(line) for line in (run / "eval_initial_cost.jsonl").read_text().splitlines()]
    start = json.loads((run / "summary.json").read_text())["initial"]["cost"]["cost_per_task"]

    def per_task(right: dict) -> float:
        return sum(policy + answer + min(price(kind(r), a) for a in right[kind(r)]) for r in tasks) / len(tasks)

    perfect, deep = per_task(RIGHT), per_task({**RIGHT, "city": ["search-3"]})
    print(f"{run}: start ${start:.6f}/task; perfect routing ${perfect:.6f} ({100 * (perfect / start - 1):+.0f}%); "
          f"every lookup on search-3 ${deep:.6f} ({100 * (deep / start - 1):+.0f}%); "
          f"orchestrator's own two turns ${policy:.6f}")


if __name__ == "__main__":
    main(sys.argv[1:])
