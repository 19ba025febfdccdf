"""Evaluation under chaos (issue 28 item 2): the same FRAMES-style run twice, clean and under faults,
and what differs.

Both runs go through run_frames.py's code (evaluation/qa_cli.py main, in this process) in "all"
mode: each task searches (the retrieval server, a subprocess), runs code in the sandbox and
answers; the orchestrator, experts and their answers are the scripted mock (evaluation/
mock_backend.py, `--search`, one subprocess per replica), judged by the `contains` rule.  Every
LLM replica and the retrieval server sit behind a FaultProxy (bench/faults.py): rate 0 in
the clean run; in the chaos run `--rate` of the requests faulted (every kind, in bursts of 2,
seeded), the retrieval server killed and restarted at given retrieval-request indices, and one of
the replicas killed for `--kill-replica-s` seconds.

Checked (and printed): the same records (status, prediction, correct, tools, tokens, every turn's
tool, output and error), none lost or duplicated, no call with more attempts than its budget
(model calls: max_retries + 1, per request body over all replicas; searches: the client's
attempts), the tokens the replicas served = the clean run's + those wasted on replies the client
never got whole (and their dollars at the entry's price), the wall-time ratio, and this process's
fds / threads / RSS / connections over the runs.

    python bench/chaos_eval.py                       # the long version: 200 tasks, concurrency 32,
                                                     # 2 replicas, one killed 60 s, retrieval restarted twice
    python bench/chaos_eval.py --tasks 30 --concurrency 8 --replicas 1 --kill-replica-s 0 --restarts 1
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from faults import FaultPlan, FaultProxy, Schedule, ServerProcess  # noqa: E402
from orchestrator.resources import ResourceSampler, raise_nofile_limit  # noqa: E402

MAX_RETRIES = 6                 # per model call (registry), so at most 7 attempts
RETRIEVAL_ATTEMPTS = 20         # RetrievalClient's default
LLM = ["mock-orch", "mock-expert"]
PRICE_MODEL = "Qwen3-8B"


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_world(folder: Path, n: int, distinct: int | None = None) -> tuple[Path, Path, dict[str, str]]:
    """Tasks (frames.jsonl), their answers, and the indexed corpus the searches read.  `distinct`:
    the tasks cycle over that many questions (each task keeps an id of its own); default n."""
    from retrieval.build_index import build

    distinct = distinct or n
    folder.mkdir(parents=True, exist_ok=True)
    tasks = [{"id": f"c{i:03d}", "question": f"What is the secret word of item {i % distinct:03d}?",
              "answer": f"word{i % distinct}"} for i in range(n)]
    (folder / "frames.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    answers = {t["question"]: t["answer"] for t in tasks}
    (folder / "answers.json").write_text(json.dumps(answers))
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i:03d}", "contents": f"Item {i:03d}: the secret word of item "
                                                                         f"{i:03d} is word{i}."}) + "\n"
                              for i in range(distinct)))
    build(corpus=corpus, out=folder / "index", progress=False)   # the same corpus again: reused
    tools = json.loads((ROOT / "tools.json").read_text())
    tools["profiles"]["mock"] = {m: "mock-expert" for m in tools["prices"]}
    (folder / "tools.json").write_text(json.dumps(tools))
    return folder / "frames.jsonl", folder / "index", answers


def run_eval(folder: Path, out: Path, llm_urls: list[str], retriever: str, concurrency: int,
             limit: int | None = None) -> int:
    """run_frames.py's main() on the world in `folder`, every model behind `llm_urls` (a pool)."""
    from evaluation.mock_backend import registry_yaml
    from evaluation.qa_cli import main

    endpoints = out.with_name(out.name + "-endpoints.json")
    endpoints.write_text(json.dumps({name: [{"base_url": u} for u in llm_urls] for name in LLM}))
    registry = registry_yaml("X", LLM, max_retries=MAX_RETRIES, price_model=PRICE_MODEL, timeout_s=3,
                             backoff_initial_s=0.1, backoff_max_s=1.0)
    models = out.with_name(out.name + "-models.yaml")
    models.write_text(registry.replace("    base_url: X", f"    endpoints_file: {endpoints}"))
    before = os.environ.get("TOOLORCHESTRA_MODELS")
    os.environ["TOOLORCHESTRA_MODELS"] = str(models)
    try:
        return main("frames", ["--data", str(folder / "frames.jsonl"), "--tools", str(folder / "tools.json"),
                               "--profile", "default", "--serve", "mock", "--model", "mock-orch",
                               "--judge-model", "contains", "--retriever", retriever, "--topk", "3",
                               "--concurrency", str(concurrency), "--output", str(out), "--no-progress",
                               "--no-report", "--stop-after-errors", "0", *(["--limit", str(limit)] if limit else [])])
    finally:
        if before is None:
            os.environ.pop("TOOLORCHESTRA_MODELS", None)
        else:
            os.environ["TOOLORCHESTRA_MODELS"] = before


def start_servers(stack: ExitStack, folder: Path, logs: Path, replicas: int,
                  delay_s: float) -> tuple[list[ServerProcess], ServerProcess, int]:
    """The mock replicas and the retrieval server on the world in `folder` (stopped with `stack`);
    their output in `logs`.  Returns (replicas, retrieval server, its port)."""
    logs.mkdir(exist_ok=True)
    mocks = []
    for r in range(replicas):
        port = free_port()
        mocks.append(stack.enter_context(ServerProcess(
            [sys.executable, "-m", "evaluation.mock_backend", "--port", str(port), "--answers",
             str(folder / "answers.json"), "--search", "--delay", str(delay_s)], health_url=f"http://127.0.0.1:{port}/health",
            log=logs / f"replica{r}.log", cwd=ROOT)))
    port = free_port()
    retrieval = stack.enter_context(ServerProcess(
        [sys.executable, "-m", "retrieval.server", "--index", str(folder / "index"), "--port", str(port),
         "--threads", "1", "--workers", "1"], health_url=f"http://127.0.0.1:{port}/health",
        log=logs / "retrieval.log", cwd=ROOT))
    return mocks, retrieval, port


def faults_met(proxies: list[FaultProxy]) -> dict[str, int]:
    """Requests per injected fault kind, and those that met a dead upstream (`upstream_down`)."""
    faults: dict[str, int] = {}
    for p in proxies:
        for e in p.log:
            key = e.fault or ("upstream_down" if e.upstream_down else None)
            if key:
                faults[key] = faults.get(key, 0) + 1
    return faults


def _threads_settled(timeout_s: float = 15.0, poll_s: float = 0.5) -> None:
    """Wait until this process's thread count stops falling (a finished run's pool threads exit
    some time after it returns, later on a busy CPU; a leaked thread never does, so it stays
    counted), at most `timeout_s`."""
    import psutil

    proc, deadline = psutil.Process(), time.monotonic() + timeout_s
    last = proc.num_threads()
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        now = proc.num_threads()
        if now >= last:
            return
        last = now


def one_run(folder: Path, name: str, *, concurrency: int, replicas: int, plan: FaultPlan,
            restarts_at: list[int] = (), restart_times: list[float] = (), kill_replica: tuple[float, float] | None = None,
            sampler: ResourceSampler | None = None, delay_s: float = 0.0, repeat: int = 1,
            limit: int | None = None) -> dict:
    """One evaluation with its servers and proxies; returns records, logs and timings.  `repeat`:
    the same evaluation again (output `name-2`, ...) on the same servers, the sampler marked after
    each (`name end`, `name-2 end`, ...): the resource test's "same task set twice"."""
    logs = folder / f"{name}-logs"
    with ExitStack() as stack:
        mocks, retrieval, port = start_servers(stack, folder, logs, replicas, delay_s)
        llm_proxies = [stack.enter_context(FaultProxy(
            m.health_url.removesuffix("/health"), FaultPlan(**{**plan.__dict__, "seed": plan.seed + r}),
            log_path=logs / f"llm{r}-faults.jsonl")) for r, m in enumerate(mocks)]
        # a restart at each index; the retrieval proxy's own faults use another seed
        r_proxy = stack.enter_context(FaultProxy(
            f"http://127.0.0.1:{port}", FaultPlan(**{**plan.__dict__, "seed": plan.seed + 100}),
            at_request={i: retrieval.restart for i in restarts_at}, log_path=logs / "retrieval-faults.jsonl"))
        actions = [(t, retrieval.restart) for t in restart_times]
        if kill_replica:
            at, down = kill_replica
            actions += [(at, mocks[0].kill), (at + down, mocks[0].start)]
        schedule = Schedule(actions).start() if actions else None
        if sampler:
            sampler.mark(f"{name} start")
        walls = []
        for k in range(repeat):
            started = time.monotonic()
            out = folder / (name if k == 0 else f"{name}-{k + 1}")
            code = run_eval(folder, out, [p.url + "/v1" for p in llm_proxies], r_proxy.url, concurrency, limit)
            walls.append(time.monotonic() - started)
            if sampler:          # after what the run dropped is collected and its worker threads ended
                gc.collect()
                _threads_settled()
                sampler.mark(f"{out.name} end")
        wall = walls[0]
        if schedule:
            schedule.join(600)
    lines = (folder / name / "results.jsonl").read_text().splitlines()
    config = json.loads((folder / name / "run_config.json").read_text())
    return {"code": code, "wall_s": wall, "walls": walls, "lines": lines, "records": [json.loads(x) for x in lines],
            "llm": llm_proxies, "retrieval": r_proxy, "retrieval_events": retrieval.events,
            "replica_events": mocks[0].events, "schedule": schedule, "config": config}


def comparable(record: dict) -> dict:
    """What must not change under faults (wall times and the sandbox's seconds in `cost` may)."""
    return {"status": record["status"], "prediction": record.get("prediction"), "correct": record.get("correct"),
            "tool_calls": record.get("tool_calls"), "expert_models": record.get("expert_models"),
            "tokens": record.get("tokens"), "error": record.get("error"),
            "turns": [(t["tool"], t["alias"], t["output"], t["error"], t["tokens"]) for t in record.get("turns", [])]}


def usage_sum(proxies: list[FaultProxy], which: str) -> dict[str, int]:
    total = {"prompt_tokens": 0, "completion_tokens": 0}
    for p in proxies:
        for k, v in getattr(p, f"{which}_usage")().items():
            total[k] += v
    return total


def compare(clean: dict, chaos: dict) -> dict:
    """The numbers the issue asks for; `problems` lists every check that failed."""
    from orchestrator.catalog import load_catalog
    from orchestrator.records import Usage

    problems = []
    ids = [r["id"] for r in chaos["records"]]
    by_clean = {r["id"]: comparable(r) for r in clean["records"]}
    by_chaos = {r["id"]: comparable(r) for r in chaos["records"]}
    if len(ids) != len(set(ids)):
        problems.append(f"duplicated records: {sorted({i for i in ids if ids.count(i) > 1})}")
    if set(by_clean) != set(by_chaos):
        problems.append(f"lost: {sorted(set(by_clean) - set(by_chaos))}; extra: {sorted(set(by_chaos) - set(by_clean))}")
    differ = sorted(i for i in by_clean if i in by_chaos and by_clean[i] != by_chaos[i])
    if differ:
        problems.append(f"{len(differ)} records differ, e.g. {differ[0]}: {by_clean[differ[0]]} vs {by_chaos[differ[0]]}")
    attempts: dict[str, int] = {}
    for p in chaos["llm"]:
        for body, n in p.attempts_per_body().items():
            attempts[body] = attempts.get(body, 0) + n
    worst_llm = max(attempts.values(), default=0)
    worst_search = max(chaos["retrieval"].attempts_per_body().values(), default=0)
    if worst_llm > MAX_RETRIES + 1:
        problems.append(f"a model call made {worst_llm} attempts > max_retries + 1 = {MAX_RETRIES + 1}")
    if worst_search > RETRIEVAL_ATTEMPTS:
        problems.append(f"a search made {worst_search} attempts > {RETRIEVAL_ATTEMPTS}")
    recorded = {"prompt_tokens": sum(r["tokens"]["prompt"] for r in chaos["records"]),
                "completion_tokens": sum(r["tokens"]["completion"] for r in chaos["records"])}
    delivered, wasted = usage_sum(chaos["llm"], "delivered"), usage_sum(chaos["llm"], "wasted")
    clean_served = usage_sum(clean["llm"], "served")
    if not (recorded == delivered == clean_served):
        problems.append(f"tokens: records {recorded}, delivered {delivered}, clean run served {clean_served}")
    served = usage_sum(chaos["llm"], "served")
    if any(served[k] != clean_served[k] + wasted[k] for k in served):
        problems.append(f"tokens served {served} != clean {clean_served} + wasted {wasted}")
    price = load_catalog(ROOT / "tools.json")
    wasted_usd = price.llm_cost(PRICE_MODEL, Usage(wasted["prompt_tokens"], wasted["completion_tokens"]))
    clean_usd = price.llm_cost(PRICE_MODEL, Usage(clean_served["prompt_tokens"], clean_served["completion_tokens"]))
    faults = faults_met([*chaos["llm"], chaos["retrieval"]])
    requests = sum(len(p.log) for p in [*chaos["llm"], chaos["retrieval"]])
    clean_requests = sum(len(p.log) for p in [*clean["llm"], clean["retrieval"]])
    return {"problems": problems, "tasks": len(by_chaos), "correct": sum(bool(r["correct"]) for r in by_chaos.values()),
            "errors": sum(r["status"] == "error" for r in by_chaos.values()), "requests": requests,
            "clean_requests": clean_requests, "retried_requests": requests - clean_requests, "faults": faults,
            "max_attempts_llm": worst_llm, "max_attempts_search": worst_search,
            "wasted_tokens": wasted, "wasted_usd": wasted_usd, "clean_usd": clean_usd,
            "wall_clean_s": clean["wall_s"], "wall_chaos_s": chaos["wall_s"],
            "wall_ratio": chaos["wall_s"] / clean["wall_s"]}


def resources_summary(sampler: ResourceSampler) -> list[str]:
    rows = []
    for s in sampler.samples:
        if s.label:
            rows.append(f"| {s.label} | {s.t:.0f} | {s.fds} | {s.threads} | {s.rss_mb:.0f} | {s.connections} |")
    body = [s for s in sampler.samples if not s.label]
    if body:
        half = len(body) // 2
        for name, part in (("first half (median)", body[:half]), ("second half (median)", body[half:])):
            if part:
                rows.append(f"| {name} | | {statistics.median(s.fds for s in part):.0f} | "
                            f"{statistics.median(s.threads for s in part):.0f} | "
                            f"{statistics.median(s.rss_mb for s in part):.0f} | "
                            f"{statistics.median(s.connections for s in part):.0f} |")
    return ["| when | s | fds | threads | RSS MB | connections |", "|---|---|---|---|---|---|", *rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--rate", type=float, default=0.1, help="fraction of requests faulted (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--restarts", type=int, default=2, help="retrieval server restarts in the chaos run")
    p.add_argument("--kill-replica-s", type=float, default=60.0, help="replica 0 down this long (0: not killed)")
    p.add_argument("--kill-at-s", type=float, default=10.0, help="when replica 0 is killed")
    p.add_argument("--delay", type=float, default=1.0, help="seconds each mock reply takes (a model's latency)")
    p.add_argument("--workdir", type=Path, help="keep the runs here (default: a temporary folder)")
    args = p.parse_args(argv)
    print(raise_nofile_limit())
    plan = FaultPlan(seed=args.seed, rate=args.rate, burst=2, retry_after=0.5, stall_s=4.0, trickle_s=0.5)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.workdir or Path(tmp)
        write_world(folder, args.tasks)
        sampler = ResourceSampler(interval_s=1.0).start()
        clean = one_run(folder, "clean", concurrency=args.concurrency, replicas=args.replicas,
                        plan=FaultPlan(rate=0.0), sampler=sampler, delay_s=args.delay)
        # restarts spread over the clean run's wall time
        restarts = [round(clean["wall_s"] * (k + 1) / (args.restarts + 1), 1) for k in range(args.restarts)]
        kill = (args.kill_at_s, args.kill_replica_s) if args.kill_replica_s > 0 and args.replicas > 1 else None
        chaos = one_run(folder, "chaos", concurrency=args.concurrency, replicas=args.replicas, plan=plan,
                        restart_times=restarts, kill_replica=kill, sampler=sampler, delay_s=args.delay)
        sampler.stop()
        result = compare(clean, chaos)
        print(f"{args.tasks} tasks, concurrency {args.concurrency}, {args.replicas} replica(s), rate {args.rate:g} "
              f"(seed {args.seed}), reply delay {args.delay:g} s, retrieval restarted at {restarts} s, "
              f"replica 0 killed: {kill or 'no'}")
        print(json.dumps({k: v for k, v in result.items()}, indent=1, default=str))
        print("retrieval server:", [e for _, e in chaos["retrieval_events"]])
        print("replica 0:", [e for _, e in chaos["replica_events"]])
        print(*resources_summary(sampler), sep="\n")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
