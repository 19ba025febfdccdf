"""Preference and unseen-tools evaluation (PAPER.md §9) for run_hle.py, run_frames.py, run_tau2.py.

- `--preference NAME_OR_VECTOR`: the orchestrator reads the problem the way a training example
  states it (data_synthesis/examples.py `render_instruction`): the problem, the tools with
  their models, prices and listed latencies, then "Preference: <text>", where the text and the
  weights come from data_synthesis/preferences.py (`resolve_preference`, the one place the
  words live).  For tau2 the same instruction (no problem line: the user simulator brings it)
  ends the agent's system prompt, as it does for ToolScale training tasks.
- `--catalog PATH`: the run's catalog (what `--tools` loads) declared to be an unseen-tools
  evaluation: refused unless it offers an alias model that the training catalog
  (`--training-catalog`, default the repository's tools.json) never offers for that tool.
  Every run records what its catalog offers beyond the training catalog (`unseen_tools`).
- The preference-following score (`preference_scores`): the paper's reward (PAPER.md §4,
  orchestrator/preference_reward.py) of each run's rollouts under its own vector, normalised per task over
  the rollouts of that task in every run reported together; see docs/evaluation.md.
"""
from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from typing import Any

from data_synthesis.examples import REQUIRED, latencies, render_instruction
from data_synthesis.preferences import PreferenceError, resolve_preference as resolve
from evaluation.cli import CLIError, content_hash
from orchestrator.catalog import CatalogError, load_catalog
from orchestrator.preference_reward import preference_rewards

KIND_TOOLS = {"qa": ("search", "code", "answer"), "tau2": ("expert",)}


@dataclass(frozen=True)
class StatedPreference:
    """One preference as the orchestrator reads it: training's words over the run's tools."""

    spec: str                                   # as given on the command line
    name: str                                   # training's preset name (cheapest, avoid_tool:search, ...)
    weights: dict[str, float]                   # training's keys: "outcome", "cost", "latency", aliases
    text: str                                   # the sentence after "Preference: "
    tools: dict[str, dict[str, str]]            # tool -> {alias: model} the instruction lists
    prices: dict[str, Any]                      # model -> Price
    latency_s: dict[str, float]                 # alias -> listed latency

    def instruction(self, question: str) -> str:
        """What the orchestrator reads in place of `question` (training's `instruction`)."""
        return render_instruction(question, self.tools, self.prices, self.latency_s, self.text)

    def record(self) -> dict[str, Any]:
        return {"spec": self.spec, "name": self.name, "weights": self.weights, "text": self.text,
                "tools": self.tools}


def offered_tools(catalog, kind: str, search: bool = True) -> dict[str, dict[str, str]]:
    """tool -> {alias: model} of what an episode of `kind` offers (QA: no search without a retriever)."""
    kinds = [k for k in KIND_TOOLS[kind] if search or k != "search"]
    return {t.name: {a: s.model for a, s in t.aliases.items()} for t in catalog.tools_for(kind) if t.kind in kinds}


def resolve_preference(args: argparse.Namespace, catalog, kind: str, search: bool = True) -> StatedPreference | None:
    """`--preference` as the run states it, or None; a preference training cannot state is a CLIError."""
    if getattr(args, "preference", None) is None:
        return None
    if args.mode != "all":
        raise CLIError(f"--preference needs --mode all (got --mode {args.mode}): training states preferences over "
                       f"the expert catalog, which --mode {args.mode} does not offer")

    try:
        return state_preference(args.preference, catalog, kind, search)
    except PreferenceError as exc:
        raise CLIError(f"--preference {args.preference}: {exc}") from None


def state_preference(spec: str, catalog, kind: str, search: bool = True) -> StatedPreference:
    """`spec` (a preset name or a vector) stated over what an episode of `kind` offers; raises
    data_synthesis.preferences.PreferenceError for one training cannot state (the server,
    orchestrator/serve/, states a request's `preference` with this too)."""
    tools = offered_tools(catalog, kind, search)
    name, weights, text = resolve(spec, tools, REQUIRED[kind])
    prices = {m: catalog.price(m) for per in tools.values() for m in per.values()}
    return StatedPreference(spec, name, weights, text, tools, prices, latencies(catalog, tools))


def unseen_tools(catalog, args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """What the run's catalog offers for `kind` beyond the training catalog: per tool, the alias
    models training never offered through that tool (aliases are renumbered in training, so the
    models are what is new), and the tool and alias names it never used."""
    path = getattr(args, "training_catalog", None)
    try:
        training = load_catalog(path)
    except CatalogError as exc:
        raise CLIError(f"--training-catalog {path}: {exc}") from None
    seen = {(t.name, s.model) for t in training.tools for s in t.aliases.values()}
    tools = catalog.tools_for(kind)
    models = {t.name: sorted({s.model for s in t.aliases.values() if (t.name, s.model) not in seen}) for t in tools}
    out = {"training_catalog": str(path or "tools.json"),
           "training_catalog_sha256": content_hash(training.model_dump(mode="json")),
           "models": {k: v for k, v in models.items() if v},
           "tools": sorted(t.name for t in tools if t.name not in {x.name for x in training.tools}),
           "aliases": sorted(a for t in tools for a in t.aliases if a not in training.aliases)}
    if getattr(args, "catalog", None) is not None and not out["models"] and not out["tools"]:
        raise CLIError(f"--catalog {args.catalog}: every {kind} alias model is one the training catalog "
                       f"({out['training_catalog']}) offers through the same tool, and it adds no tool: nothing is "
                       f"unseen; use --tools "
                       f"for a seen catalog, or name the catalog training used with --training-catalog")
    return out


def run_config_entries(args: argparse.Namespace, catalog, kind: str,
                       preference: StatedPreference | None) -> dict[str, Any]:
    """The run_config.json keys of this module (compared on --resume like every other key)."""
    return {"preference": preference.record() if preference else None,
            "catalog_mode": "unseen" if getattr(args, "catalog", None) is not None else "given",
            "unseen_tools": unseen_tools(catalog, args, kind)}


# ---- the report ------------------------------------------------------------------------------

def tool_mix(records: list[dict]) -> dict[str, float]:
    """Share of all tool calls going to each tool (turns' `tool`), over answered tasks."""
    calls = Counter(t["tool"] for r in {r["id"]: r for r in records}.values() if r.get("status") != "error"
                    for t in r.get("turns") or [] if t.get("tool"))
    total = sum(calls.values())
    return {k: v / total for k, v in calls.most_common()} if total else {}


def _reward_input(record: dict) -> dict[str, Any]:
    ok = record.get("status") != "error"
    return {"tool_calls": {a: int(n) for a, n in (record.get("tool_calls") or {}).items()},
            "outcome": int(ok and bool(record.get("correct"))),
            "cost": float(record.get("cost") or 0.0), "latency": float(record.get("latency") or 0.0)}


def preference_scores(runs: list[tuple[dict, list[dict]]]) -> list[dict[str, Any] | None]:
    """The preference-following score of each run ((run_config, records) pairs), or None for a
    run without a preference.

    For every task (record id) that at least two runs of the same benchmark share, the group is
    that task's rollouts in all those runs; each run's rollout gets the paper's reward under the
    run's own vector, normalised over the group (orchestrator/preference_reward.py `preference_rewards`: every
    coordinate min-max over the group, 0 for a wrong or failed answer).  score = 100 x the mean
    over the shared tasks; `tasks` says how many, `alone` how many of the run's tasks no other
    run has (left out).  The number is relative to the runs reported together."""
    by_run = [{r["id"]: r for r in records} for _, records in runs]
    out: list[dict[str, Any] | None] = []
    for i, (config, _) in enumerate(runs):
        pref = config.get("preference")
        if not pref:
            out.append(None)
            continue
        peers = [j for j, (c, _) in enumerate(runs) if c.get("benchmark") == config.get("benchmark")]
        rewards, alone = [], 0
        for task_id, record in by_run[i].items():
            members = [j for j in peers if task_id in by_run[j]]
            if len(members) < 2:
                alone += 1
                continue
            group = [_reward_input(by_run[j][task_id]) for j in members]
            rewards.append(preference_rewards(group, pref["weights"])[members.index(i)])
        out.append({"score": 100 * sum(rewards) / len(rewards) if rewards else None, "tasks": len(rewards),
                    "alone": alone})
    return out


def preference_table(runs: list[tuple[str, dict, list[dict], dict]], console=None) -> list[dict[str, Any]]:
    """Rows of (label, run_config, records, summary) with a preference, or run under --catalog:
    per run its vector, accuracy, cost, latency, tool mix and preference-following score;
    printed as one table when `console` is given (or by default)."""
    scores = preference_scores([(c, r) for _, c, r, _ in runs])
    rows = []
    for index, ((label, config, records, s), score) in enumerate(zip(runs, scores)):
        if not config.get("preference") and config.get("catalog_mode") != "unseen":
            continue
        pref = config.get("preference") or {}
        unseen = config.get("unseen_tools") or {}
        rows.append({"index": index, "run": label, "preference": pref.get("name"), "weights": pref.get("weights"),
                     "catalog": "unseen" if config.get("catalog_mode") == "unseen" else "given",
                     "unseen_models": unseen.get("models") or {}, "tasks": s["tasks"], "accuracy": s["accuracy"],
                     "cost_per_query_cents": s["cost_per_query_cents"],
                     "latency_per_query_min": s["latency_per_query_min"], "tool_mix": tool_mix(records),
                     "preference_score": None if score is None else score["score"],
                     "preference_score_tasks": None if score is None else score["tasks"]})
    if rows:
        _print(rows, console)
    return rows


def _print(rows: list[dict[str, Any]], console=None) -> None:
    from rich.console import Console  # lazy: display only, slow to import
    from rich.table import Table

    table = Table(title="Per preference vector (preference-following score: PAPER.md §4 reward, normalised per "
                        "task over the runs shown)")
    for col in ("run", "preference", "vector", "catalog", "accuracy %", "cost / query (¢)", "latency / query (min)",
                "tool mix", "pref. score (tasks)"):
        table.add_column(col, justify="right" if "/" in col or "%" in col else "left")
    for r in rows:
        vector = ", ".join(f"{'accuracy' if k == 'outcome' else k}={w:g}" for k, w in (r["weights"] or {}).items())
        mix = ", ".join(f"{k} {100 * v:.0f}%" for k, v in r["tool_mix"].items())
        score = "n/a" if r["preference_score"] is None else f"{r['preference_score']:.1f}"
        acc = "n/a" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f}"
        table.add_row(r["run"], r["preference"] or "-", vector or "-", r["catalog"], acc,
                      f"{r['cost_per_query_cents']:.3f}", f"{r['latency_per_query_min']:.2f}", mix or "-",
                      f"{score} ({r['preference_score_tasks'] or 0})" if r["preference"] else "-")
    (console or Console()).print(table)


def run_folder_name(name: str) -> str:
    """A run folder name for a preference (a preset name or a vector)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip("_") or "preference"


def describe(preference: StatedPreference | None, entries: dict[str, Any]) -> list[str]:
    """Lines a run prints at its start about its preference and catalog."""
    lines = [f"preference {preference.name}: \"{preference.text}\" (weights {preference.weights})"] if preference else []
    unseen = entries["unseen_tools"]["models"]
    if unseen or entries["catalog_mode"] == "unseen":
        listed = "; ".join(f"{tool}: {', '.join(models)}" for tool, models in unseen.items())
        lines.append(f"catalog: {entries['catalog_mode']}; not in the training catalog "
                     f"({entries['unseen_tools']['training_catalog']}): {listed}")
    return lines
