"""How far below its start a quickstart run's cost could go: perfect routing, from the run's own trajectories.

    python bench/quickstart_cost_ceiling.py runs/quickstart [more run folders: extra calls to price aliases]

Reads the held-out trajectories of one quickstart run (`eval_<initial|final>_<preset>.jsonl`, the
unseen-tools catalog left out) and prices each held-out task (`world/eval.jsonl`) on the cheapest
route that is right for it (`right_aliases`: any reasoner for a sum, any search for a city
question, a deep one for a year question), then the cheapest answer alias. An alias's price per
call is the mean expert cost of its calls on that kind of question in the run (pooled over kinds,
then over the extra folders, where the run never called it); the orchestrator's own cost is the
mean over the run's two-turn episodes.  Prints each alias's price per call, the start's cost per
task (`initial`, `cost` preset), that perfect routing, and the policy that sends every lookup to
the deep search, with their cuts. docs/history.md (sixth round) quotes it.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

ANSWER = "answer"


def right_aliases() -> dict[str, list[str]]:
    """Question kind (`question_kind`) -> the aliases whose evidence answers it (training/quickstart/env.py)."""
    from training.quickstart.env import DEEP, SEARCH_DEPTH, TOOL_ALIASES

    searches = TOOL_ALIASES["search"]
    return {"arithmetic": TOOL_ALIASES["enhance_reasoning"], "city": searches,
            "year": [a for a in searches if SEARCH_DEPTH[a] == DEEP]}


def call_prices(rows: list[dict], kinds: dict[str, str]) -> tuple[dict, dict]:
    """(kind, alias) -> mean expert cost per call (answers: kind ANSWER), and alias -> the same pooled over kinds."""
    by_kind, pooled = defaultdict(list), defaultdict(list)
    for r in rows:
        for turn in r["turns"]:
            expert = turn.get("expert")
            if expert and expert.get("cost") is not None:
                k = ANSWER if expert["tool"] == "answer" else kinds.get(r["task_id"], "?")
                by_kind[(k, expert["alias"])].append(expert["cost"])
                pooled[expert["alias"]].append(expert["cost"])
    mean = lambda xs: sum(xs) / len(xs)
    return {k: mean(v) for k, v in by_kind.items()}, {a: mean(v) for a, v in pooled.items()}


def ceiling(rows: list[dict], held_out: list[str], right: dict[str, list[str]], answers: list[str],
            extra_rows: list[dict] = ()) -> dict:
    """Perfect-routing cost per held-out task.  `rows` (and `extra_rows`, used only to price aliases
    the run never called): episodes with `task_id`, `question_kind` and `turns` (each with
    `policy_cost` and `expert` {tool, alias, cost}); `held_out`: each held-out task's question kind;
    `right`: kind -> the aliases that answer it; `answers`: the answer aliases.  Returns the
    orchestrator's own two-turn cost (`policy`), each alias's price per call (`prices`), and the cost
    per task of perfect routing (`perfect`) and of every lookup on the deep search (`all_deep`)."""
    kinds = {r["task_id"]: r["question_kind"] for r in [*rows, *extra_rows]}
    own, own_pooled = call_prices(rows, kinds)
    _, extra_pooled = call_prices(list(extra_rows), kinds)
    two_turns = [sum(t.get("policy_cost") or 0.0 for t in r["turns"]) for r in rows if len(r["turns"]) == 2]
    if not two_turns:
        raise ValueError("no two-turn episode to price the orchestrator's own turns")
    policy = sum(two_turns) / len(two_turns)

    def price(kind: str, alias: str) -> float:
        for table, key in ((own, (kind, alias)), (own_pooled, alias), (extra_pooled, alias)):
            if key in table:
                return table[key]
        raise ValueError(f"{alias}: never called in the run or the extra folders; pass a run that called it")

    answer = min(price(ANSWER, a) for a in answers)
    per_task = lambda r: sum(policy + answer + min(price(k, a) for a in r[k]) for k in held_out) / len(held_out)
    deep = {**right, "city": right["year"]}
    return {"policy": policy, "prices": {a: price(k, a) for k, aliases in [*right.items(), (ANSWER, answers)]
                                         for a in aliases},
            "perfect": per_task(right), "all_deep": per_task(deep)}


def main(argv: list[str]) -> None:
    from training.quickstart.env import TOOL_ALIASES, question_kind
    from training.tasks import load_tasks

    if not argv:
        sys.exit(__doc__)
    run, extra = Path(argv[0]), [Path(a) for a in argv[1:]]

    def episodes(folder: Path) -> list[dict]:
        kinds = {t.id: question_kind(t) for t in load_tasks([str(folder / "world" / "eval.jsonl")])}
        rows = [json.loads(line) for f in sorted(folder.glob("eval_*_*.jsonl")) if "unseen_tools" not in f.name
                for line in f.read_text().splitlines()]
        return [{**r, "question_kind": kinds[r["task_id"]]} for r in rows]

    if not (run / "summary.json").exists():
        sys.exit(f"{run}: no summary.json (a finished quickstart run's folder, e.g. runs/quickstart)")
    held_out = [question_kind(t) for t in load_tasks([str(run / "world" / "eval.jsonl")])]
    try:
        got = ceiling(episodes(run), held_out, right_aliases(), TOOL_ALIASES["answer"],
                      [r for folder in extra for r in episodes(folder)])
    except ValueError as e:
        sys.exit(f"{run}: {e}")
    start = json.loads((run / "summary.json").read_text())["initial"]["cost"]["cost_per_task"]
    cut = lambda x: f"${x:.6f} ({100 * (x / start - 1):+.0f}%)"
    print(f"{run}: start ${start:.6f}/task; perfect routing {cut(got['perfect'])}; every lookup on the deep search "
          f"{cut(got['all_deep'])}; orchestrator's own two turns ${got['policy']:.6f}; per call: "
          + ", ".join(f"{a} ${p:.6f}" for a, p in got["prices"].items()))


if __name__ == "__main__":
    main(sys.argv[1:])
