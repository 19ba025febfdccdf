"""The tau2-bench command line (run_tau2.py is a thin wrapper over `main`).

    python evaluation/run_tau2.py --domains airline --model Qwen3-8B --profile paper ...
    python evaluation/run_tau2.py --domains airline --num-trials 4 ...       # pass^1..4, as tau2 reports
    python evaluation/run_tau2.py --rescore RESULTS.json [RESULTS.json ...]

Settings come from the profile's `tau2.eval` section (`--profile NAME|path`, default `default`;
configs/profiles/, orchestrator/settings.py `Tau2Settings`); the budget flags below override
single values of it, and run_config.json records the section as it ran.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from evaluation.cli import (CLIError, add_common_args, check_common, check_serve, claim_output, content_hash,
                            default_output, load_run_profile, prepare_output, resolve_price_model, use_endpoint)
from evaluation.error_streak import ErrorStreak
from evaluation.preference import describe, resolve_preference, run_config_entries
from evaluation.runner import RESULTS_NAME, ResultsFile, RunError, read_records, run_tasks
from orchestrator.catalog import CatalogError, load_catalog
from orchestrator.episodes.tau2_common import rewrites
from orchestrator.gateway.errors import GatewayConfigError
from orchestrator.resources import raise_nofile_limit
from orchestrator.settings import ProfileError, Tau2Settings


def check_user_key(model: str) -> None:
    """The user simulator has its API key, or a server that answers, or fail before the run starts
    naming it (orchestrator/gateway/preflight.py, the check qa_cli and training run)."""
    from orchestrator.gateway.preflight import check_models

    check_models({model: "--user-model (the user simulator)"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python evaluation/run_tau2.py",
        description="Evaluate an orchestrator on tau2-bench (airline, retail, telecom) through the real tau2 "
                    "package: our orchestrator is the agent (domain tools + call_expert), the user simulator "
                    "is any LLM_CALL model; --num-trials k trials per task and tau2's pass^1..k per domain. "
                    "Or re-score saved tau2 results files.",
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
    d.add_argument("--toolscale-upstream", type=Path, metavar="CHECKOUT",
                   help="a ToolOrchestra checkout: --domains may then name its ToolScale domains (bank, movie, ...), "
                        "run on upstream's own tau2 tools imported from the checkout and scored by tau2's evaluator "
                        "(needs --toolscale-tasks)")
    d.add_argument("--toolscale-tasks", type=Path, metavar="PATH",
                   help="(--toolscale-upstream) the ToolScale domains' tau2 tasks: a tasks.json, or the folder of "
                        "<domain>/tasks.json that python -m data_synthesis.dataset --toolscale writes (OUT/domains)")
    d.add_argument("--num-trials", type=int, default=1,
                   help="trials (simulations) per task, each with tau2's seed for its index; the report gives "
                        "tau2's pass^1..k per domain. With --resume only the missing (task, trial) pairs run, "
                        "so raising it adds trials to a run (default: %(default)s)")
    parser.add_argument("--mode", choices=("all", "basic", "none"), default="all",
                        help="all: domain tools + call_expert; basic: every expert is the orchestrator itself; "
                             "none: domain tools only")
    add_common_args(parser)
    # None: the profile's tau2.eval value (resolve_settings)
    parser.set_defaults(max_turns=None, temperature=None, max_tokens=None)
    # In tau2 the cap counts every message (agent, user, environment): tau2's max_steps.
    parser._option_string_actions["--max-turns"].help = "tau2 max_steps per simulation (default: the profile's)"
    parser._option_string_actions["--temperature"].help = "orchestrator sampling temperature (default: the profile's)"
    parser._option_string_actions["--max-tokens"].help = ("completion tokens per orchestrator turn "
                                                          "(default: the profile's)")
    u = parser.add_argument_group("tau2 (default: the profile's tau2.eval values)")
    u.add_argument("--user-model", help="user simulator, a configs/models.yaml name (default: the profile's "
                                        "user.model, else --model)")
    u.add_argument("--stop-after-errors", type=int, default=3,
                   help="stop when this many tasks in a row fail with the same error (0: never; default %(default)s)")
    u.add_argument("--user-temperature", type=float, help="user simulator temperature")
    u.add_argument("--user-max-tokens", type=int, help="completion tokens per user simulator reply")
    u.add_argument("--expert-max-tokens", type=int, help="completion tokens per expert reply, every expert")
    u.add_argument("--max-errors", type=int, help="tau2: tool errors before a simulation stops")
    u.add_argument("--seed", type=int, help="tau2's run seed: trial t runs with tau2's t-th seed drawn from it")
    u.add_argument("--log-level", default="WARNING", help="tau2's log level (loguru)")
    return parser


def resolve_settings(args: argparse.Namespace, section: Tau2Settings) -> Tau2Settings:
    """The profile's tau2.eval section with the flags given on the command line applied (the
    user simulator defaulting to --model), and `args` filled with the values that run."""
    orch = section.orchestrator
    if orch is None:
        raise CLIError(f"--profile {args.profile or 'default'}: its tau2.eval section has no `orchestrator` "
                       f"settings (max_tokens, temperature); add them")
    for flag, value in (("--user-max-tokens", args.user_max_tokens), ("--expert-max-tokens", args.expert_max_tokens),
                        ("--max-errors", args.max_errors)):   # --max-turns, --max-tokens: check_common
        if value is not None and value < 1:
            raise CLIError(f"{flag} must be >= 1, got {value}")
    for flag, value in (("--temperature", args.temperature), ("--user-temperature", args.user_temperature)):
        if value is not None and value < 0:
            raise CLIError(f"{flag} must be >= 0, got {value}")
    pick = lambda flag, profile: profile if flag is None else flag   # noqa: E731
    orch = orch.model_copy(update={"max_tokens": pick(args.max_tokens, orch.max_tokens),
                                   "temperature": pick(args.temperature, orch.temperature)})
    user = section.user.model_copy(update={"model": args.user_model or section.user.model or args.model,
                                           "temperature": pick(args.user_temperature, section.user.temperature),
                                           "max_tokens": pick(args.user_max_tokens, section.user.max_tokens)})
    experts = section.experts
    if args.expert_max_tokens:   # one budget for every expert, over the profile's
        experts = {k: v.model_copy(update={"max_tokens": args.expert_max_tokens})
                   for k, v in (experts or {"default": section.expert("default")}).items()}
    settings = section.model_copy(update={
        "orchestrator": orch, "user": user, "experts": experts, "max_steps": pick(args.max_turns, section.max_steps),
        "max_errors": pick(args.max_errors, section.max_errors), "seed": pick(args.seed, section.seed)})
    args.max_turns, args.max_tokens, args.temperature = settings.max_steps, orch.max_tokens, orch.temperature
    args.user_model, args.user_temperature, args.user_max_tokens = user.model, user.temperature, user.max_tokens
    args.max_errors, args.seed = settings.max_errors, settings.seed
    return settings


def _shown(path: str) -> str:
    """A profile file as the run records it: relative to the repository when inside it."""
    full, repo = Path(path).resolve(), Path(__file__).resolve().parents[1]
    return str(full.relative_to(repo)) if full.is_relative_to(repo) else str(full)


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


def run(args: argparse.Namespace, owned: contextlib.ExitStack) -> int:
    from evaluation.tau2_run import (DOMAINS, Tau2Setup, load_jobs, register_toolscale, simulate, task_set_version,
                                     tau2_version, user_simulator_info, write_tau2_results)
    from loguru import logger

    from orchestrator.redaction import loguru_patcher

    logger.remove()
    logger.configure(patcher=loguru_patcher)     # keys out of tau2's log lines (orchestrator/redaction.py)
    logger.add(sys.stderr, level=args.log_level)
    check_common(args)
    if args.num_trials < 1:
        raise CLIError(f"--num-trials must be >= 1, got {args.num_trials}")
    domains = [d.strip() for d in args.domains.split(",") if d.strip()]
    toolscale, toolscale_domains = None, []
    if bool(args.toolscale_upstream) != bool(args.toolscale_tasks):
        raise CLIError("--toolscale-upstream CHECKOUT and --toolscale-tasks PATH go together (the domains' tools and "
                       "their tasks)")
    if args.toolscale_upstream:
        from orchestrator.domains.upstream import UpstreamError, checkout_domains
        try:
            toolscale_domains = checkout_domains(args.toolscale_upstream)
        except UpstreamError as exc:
            raise CLIError(str(exc)) from None
    unknown = [d for d in domains if d not in DOMAINS and d not in toolscale_domains]
    if unknown or not domains:
        raise CLIError(f"--domains {args.domains}: unknown {unknown}; choose from {list(DOMAINS) + toolscale_domains}"
                       + ("" if args.toolscale_upstream else " (ToolScale domains: --toolscale-upstream CHECKOUT)"))
    picked = [d for d in domains if d in toolscale_domains and d not in DOMAINS]
    if picked:
        try:
            toolscale = register_toolscale(args.toolscale_upstream, args.toolscale_tasks, picked)
        except ValueError as exc:   # UpstreamError too
            raise CLIError(str(exc)) from None
    catalog = load_catalog(args.tools)
    out_dir = args.output or default_output("tau2", args.model, args.mode)
    owned.enter_context(claim_output(out_dir, "tau2"))   # this process's until main returns; nothing before
    price_model = resolve_price_model(args, catalog)
    if args.endpoint:
        use_endpoint(args, out_dir, price_model)
    profile = load_run_profile(args)
    settings = resolve_settings(args, profile.section("tau2", "eval"))
    check_serve(catalog, args.serve, args.tools, args.pricing)
    preference = resolve_preference(args, catalog, "tau2")
    tool_config = run_config_entries(args, catalog, "tau2", preference)   # --catalog refused if nothing is unseen
    print(*describe(preference, tool_config), sep="\n") if preference or args.catalog else None
    task_ids = [t.strip() for t in args.task_ids.split(",")] if args.task_ids else None
    try:
        jobs = load_jobs(domains, task_ids, args.limit, num_trials=args.num_trials, seed=settings.seed)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    print(f"tau2 {tau2_version()}: {len(jobs) // args.num_trials} tasks x {args.num_trials} trial(s) = "
          f"{len(jobs)} simulations ({', '.join(domains)})")
    check_user_key(settings.user.model)
    orch, user = settings.orchestrator, settings.user
    config = {"benchmark": "tau2", "domains": domains, "model": args.model, "price_model": price_model,
              "mode": args.mode, "profile": profile.name, "profile_source": _shown(profile.source),
              "serve": args.serve, "pricing": profile.pricing, "endpoint": args.endpoint, "user_model": user.model,
              "max_steps": settings.max_steps, "max_errors": settings.max_errors, "seed": settings.seed,
              "temperature": orch.temperature, "max_tokens": orch.max_tokens,
              "expert_max_tokens": args.expert_max_tokens, "user_temperature": user.temperature,
              "user_max_tokens": user.max_tokens, "tools": str(args.tools or "tools.json"), "task_ids": task_ids,
              "catalog_sha256": content_hash(catalog.model_dump(mode="json")),
              "settings": settings.model_dump(mode="json"),
              # tau2 as tau2 reports it: trials, the package, the task set, the user simulator
              "num_trials": args.num_trials, "tau2_version": tau2_version(),
              "task_set": {d: task_set_version(d) for d in domains},
              "toolscale": {"checkout": str(args.toolscale_upstream.resolve()), "tasks": str(args.toolscale_tasks),
                            "domains": toolscale} if toolscale else None,
              "user_simulator": user_simulator_info(settings, user.model)}
    config.update(tool_config)
    prepare_output(out_dir, config, args.resume, force=args.force)
    setup = Tau2Setup(model=args.model, price_model=price_model, catalog=catalog, settings=settings, mode=args.mode,
                      profile=profile, serve=args.serve)
    # --preference: training's instruction (tools, prices, preference; no problem line) ends the system prompt
    setup.instruction = preference.instruction("") if preference else ""
    print(f"setting: profile {profile.name} ({_shown(profile.source)}); orchestrator {orch.max_tokens} tokens at "
          f"temperature {orch.temperature:g}; user {user.model} ({user.max_tokens} tokens at temperature "
          f"{user.temperature:g}); {args.num_trials} trial(s), seed {settings.seed}; max_steps "
          f"{settings.max_steps}; experts {args.expert_max_tokens or 'per-profile'} tokens; call_expert text "
          f"{settings.expert_text}; {settings.max_tool_calls} tool call(s) per message; context {settings.context}")
    if not rewrites(settings, args.model):
        print(f"note: the agent model {args.model!r} contains none of tau2.eval.rewrite_models "
              f"{settings.rewrite_models}: its system prompt is tau2's own, without the call-expert policy and the "
              f"format line (as upstream's, llm_utils.py:380); add a part of its name to rewrite_models to change "
              f"that", file=sys.stderr)
    with ResultsFile(out_dir / RESULTS_NAME, resume=args.resume, retry_errors=args.retry_errors) as results:
        for msg in results.repair.messages(results.path):
            print(msg, file=sys.stderr)
        # a record written before trials existed ("<domain>/<task id>") is that task's trial 0
        results.done |= {f"{i}#0" for i in results.done if "#" not in i}
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
    raise_nofile_limit()   # soft open-files limit up to the hard one; one line when it cannot
    try:
        if args.task_set and not args.rescore:
            raise CLIError("--task-set needs --rescore")
        if args.rescore:
            return print_rescore(args.rescore, args.task_set)
        with contextlib.ExitStack() as owned:   # the run folder's lock (claim_output)
            return run(args, owned)
    except (CLIError, CatalogError, RunError, GatewayConfigError, ProfileError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished simulations are saved; continue with --resume", file=sys.stderr)
        return 130
