"""The tau2-bench command line (run_tau2.py is a thin wrapper over `main`).

    python evaluation/run_tau2.py --domains airline --model Qwen3-8B --user-model gpt-5 ...
    python evaluation/run_tau2.py --rescore RESULTS.json [RESULTS.json ...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evaluation.cli import (CLIError, add_common_args, check_common, check_profile, content_hash, default_output,
                            prepare_output, resolve_price_model, use_endpoint)
from evaluation.error_streak import ErrorStreak
from evaluation.runner import RESULTS_NAME, ResultsFile, RunError, read_records, run_tasks
from orchestrator.catalog import CatalogError, load_catalog
from orchestrator.gateway.errors import GatewayConfigError


def check_user_key(model: str) -> None:
    """The user simulator's API key is in the environment, or fail before the run starts naming it."""
    import os

    from orchestrator.gateway.registry import load_registry

    entry = load_registry().models.get(model)
    env = entry.key_env() if entry else None
    if entry and env and entry.backend in ("openai", "azure", "anthropic") and not os.environ.get(env):
        raise CLIError(f"--user-model {model} needs the environment variable {env} (its API key); set it, "
                       f"or pass another --user-model")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python evaluation/run_tau2.py",
        description="Evaluate an orchestrator on tau2-bench (airline, retail, telecom) through the real tau2 "
                    "package: our orchestrator is the agent (domain tools + call_expert), the user simulator "
                    "is any LLM_CALL model; pass^1 per domain. Or re-score saved tau2 results files.",
        epilog="Docs: docs/evaluation.md")
    parser.add_argument("--rescore", nargs="+", type=Path, metavar="RESULTS.json",
                        help="re-score tau2 results files with tau2's evaluator and exit: pass^1 as labelled "
                             "and with each simulation matched to its task by content")
    parser.add_argument("--task-set", type=Path, metavar="TASKS.json",
                        help="with --rescore: the tau2 tasks.json of the version the run used (e.g. tau2 0.1.3's "
                             "retail, 115 tasks; default: the file's own tasks, else the installed tau2's)")
    d = parser.add_argument_group("tasks")
    d.add_argument("--domains", "--data", dest="domains", default="airline,retail,telecom",
                   help="comma-separated tau2 domains (default: %(default)s)")
    d.add_argument("--task-ids", help="comma-separated tau2 task ids (within each domain)")
    parser.add_argument("--mode", choices=("all", "basic", "none"), default="all",
                        help="all: domain tools + call_expert; basic: every expert is the orchestrator itself; "
                             "none: domain tools only")
    add_common_args(parser)
    parser.set_defaults(max_turns=200, temperature=0.0)
    # In tau2 the cap counts every message (agent, user, environment): tau2's max_steps.
    parser._option_string_actions["--max-turns"].help = "tau2 max_steps per simulation (default: %(default)s)"
    u = parser.add_argument_group("tau2")
    u.add_argument("--user-model", help="user simulator, a configs/models.yaml name (default: gpt-5 under "
                                        "--profile paper, as upstream; else --model)")
    u.add_argument("--stop-after-errors", type=int, default=3,
                   help="stop when this many tasks in a row fail with the same error (0: never; default %(default)s)")
    u.add_argument("--user-temperature", type=float, default=0.0)
    u.add_argument("--expert-max-tokens", type=int, default=1024, help="completion tokens per expert reply")
    u.add_argument("--max-errors", type=int, default=10, help="tau2: tool errors before a simulation stops")
    u.add_argument("--seed", type=int, default=300, help="tau2 simulation seed")
    u.add_argument("--log-level", default="WARNING", help="tau2's log level (loguru)")
    return parser


def _pass1(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def print_rescore(paths: list[Path], task_set: Path | None = None) -> int:
    """Re-score each file; print pass^1 per domain (as labelled and as matched by content) and
    the tasks whose reward changed."""
    from evaluation.tau2_run import rescore

    if task_set is not None and not task_set.exists():
        raise CLIError(f"--task-set {task_set}: no such file")
    per_domain: dict[str, list[dict]] = {}
    for path in paths:
        if not path.exists():
            raise CLIError(f"--rescore {path}: no such file")
        try:
            result = rescore(path, task_set)
        except (ValueError, KeyError) as exc:
            raise CLIError(f"--rescore {path}: not a tau2 results file it can score ({type(exc).__name__}: "
                           f"{str(exc)[:300]})") from None
        per_domain.setdefault(result["domain"], []).append(result)
        stored = "n/a" if result["stored_pass1"] is None else f"{result['stored_pass1']:.4f}"
        print(f"{path}: {result['domain']}: {result['simulations']} simulations, pass^1 {result['pass1']:.4f} "
              f"(stored {stored}); reward changed for {len(result['changed'])}")
        for c in result["changed"]:
            print(f"  task {c['task_id']}: stored {c['stored']} -> rescored {c['rescored']}")
        how = ", ".join(f"{k} {v}" for k, v in sorted(result["match_how"].items()))
        print(f"  matched by content ({how}): pass^1 {_pass1(result['matched_pass1'])} over {result['matched']} "
              f"simulations, {result['unmatched']} unmatched; {result['mislabelled']} labels disagree with their "
              f"content; stored reward recovered for {result['matched_reward_recovered']}/{result['matched']}")
        if result["mislabelled"]:
            shown = ", ".join(f"{r['label']}->{r['task_id'] if r['task_id'] is not None else '?'}"
                              for r in result["relabelled"][:10])
            print(f"  warning: task_id labels do not match the conversations (label->task: {shown}"
                  f"{', ...' if result['mislabelled'] > 10 else ''}); the labelled pass^1 grades them against other "
                  f"tasks. Is this file from another tau2 task set? (--task-set)")
    for domain, results in sorted(per_domain.items()):
        n = sum(r["simulations"] for r in results)
        pass1 = sum((r["pass1"] or 0.0) * r["simulations"] for r in results) / max(n, 1)
        changed = sum(len(r["changed"]) for r in results)
        m = sum(r["matched"] for r in results)
        m_pass1 = sum((r["matched_pass1"] or 0.0) * r["matched"] for r in results) / m if m else None
        print(f"{domain}: pass^1 {pass1:.4f} over {n} simulations; {changed} changed reward; as matched "
              f"{_pass1(m_pass1)} over {m} ({sum(r['unmatched'] for r in results)} unmatched)")
    return 0


def run(args: argparse.Namespace) -> int:
    from evaluation.tau2_run import DOMAINS, Tau2Setup, load_jobs, simulate, write_tau2_results
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level=args.log_level)
    check_common(args)
    domains = [d.strip() for d in args.domains.split(",") if d.strip()]
    unknown = [d for d in domains if d not in DOMAINS]
    if unknown or not domains:
        raise CLIError(f"--domains {args.domains}: unknown {unknown}; choose from {list(DOMAINS)}")
    catalog = load_catalog(args.tools)
    out_dir = args.output or default_output("tau2", args.model, args.mode)
    out_dir.mkdir(parents=True, exist_ok=True)
    price_model = resolve_price_model(args, catalog)
    if args.endpoint:
        use_endpoint(args, out_dir, price_model)
    check_profile(catalog, args.profile, args.tools)
    task_ids = [t.strip() for t in args.task_ids.split(",")] if args.task_ids else None
    try:
        jobs = load_jobs(domains, task_ids, args.limit)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    print(f"tau2: {len(jobs)} tasks ({', '.join(domains)})")
    user_model = args.user_model or ("gpt-5" if args.profile == "paper" else args.model)
    check_user_key(user_model)
    config = {"benchmark": "tau2", "domains": domains, "model": args.model, "price_model": price_model,
              "mode": args.mode, "profile": args.profile, "endpoint": args.endpoint, "user_model": user_model,
              "max_steps": args.max_turns, "max_errors": args.max_errors, "seed": args.seed,
              "temperature": args.temperature, "tools": str(args.tools or "tools.json"), "task_ids": task_ids,
              "catalog_sha256": content_hash(catalog.model_dump(mode="json")), "max_tokens": args.max_tokens,
              "expert_max_tokens": args.expert_max_tokens, "user_temperature": args.user_temperature}
    prepare_output(out_dir, config, args.resume, force=args.force)
    setup = Tau2Setup(model=args.model, price_model=price_model, catalog=catalog, mode=args.mode,
                      profile=args.profile, temperature=args.temperature, max_tokens=args.max_tokens,
                      expert_max_tokens=args.expert_max_tokens, user_model=user_model, user_temperature=args.user_temperature, max_steps=args.max_turns,
                      max_errors=args.max_errors, seed=args.seed)
    with ResultsFile(out_dir / RESULTS_NAME, resume=args.resume, retry_errors=args.retry_errors) as results:
        for msg in results.repair.messages(results.path):
            print(msg, file=sys.stderr)
        stats = run_tasks(jobs, lambda job: simulate(setup, job), results, concurrency=args.concurrency,
                          progress=not args.no_progress, desc="tau2",
                          stop_when=ErrorStreak(args.stop_after_errors).observe)
    print(f"{stats.ok + stats.errors} simulations in {stats.wall_s:.1f} s ({stats.skipped_done} already done): "
          f"{stats.correct} successful, {stats.errors} errors -> {results.path}")
    records, _ = read_records(out_dir / RESULTS_NAME)
    for path in write_tau2_results(out_dir, records, setup):
        print(f"tau2 results file: {path}  (check: python evaluation/run_tau2.py --rescore {path})")
    if stats.stopped:
        print(stats.stopped, file=sys.stderr)
    if not args.no_report:
        from evaluation.report import report

        report([out_dir])
    return 3 if stats.stopped else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.task_set and not args.rescore:
            raise CLIError("--task-set needs --rescore")
        return print_rescore(args.rescore, args.task_set) if args.rescore else run(args)
    except (CLIError, CatalogError, RunError, GatewayConfigError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished simulations are saved; continue with --resume", file=sys.stderr)
        return 130
