"""Resources over one long evaluation under faults (issue 28 item 4): file descriptors, threads,
memory and inet connections of the evaluating process, sampled while one run_frames.py run (one
results.jsonl) goes on for about `--minutes` at `--concurrency`, and fitted against the tasks done.

The evaluation runs in this process (evaluation/qa_cli.py main, "all" mode: search, sandboxed code,
answer), as in bench/chaos_eval.py; everything it talks to runs in a harness subprocess (this
script with --harness), so that the samples are the evaluation's alone: the mock replicas and the
retrieval server (subprocesses of the harness), each behind a FaultProxy faulting `--rate` of the
requests (every kind, bursts of 2, seeded), replica 0 killed for a minute at 5 minutes and the
retrieval server restarted every 10 minutes.  The proxies keep a log entry per request, so in
this process they would grow with the run themselves.

The run's size: a warm-up run of 3 x concurrency tasks under the same faults measures tasks per
second; the long run gets that rate x `--minutes` tasks (the wall time moves with the machine's
load; the samples are fitted against tasks done, not time), or `--tasks`.  Tasks cycle over 256 questions (the
mock's scripted answers), each with an id of its own.

    python bench/resources_long.py --minutes 30 --concurrency 64 --out runs/resources_long.json
    python bench/resources_long.py --tasks 16000 --concurrency 64      # what docs/reliability.md shows
    python bench/resources_long.py --minutes 2 --concurrency 16        # a look
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from chaos_eval import faults_met, run_eval, start_servers, write_world  # noqa: E402

from faults import FaultPlan, FaultProxy, Schedule  # noqa: E402
from orchestrator.resources import raise_nofile_limit, sample  # noqa: E402

DISTINCT = 256          # questions the tasks cycle over (the mock's scripted answers)
METRICS = ("fds", "threads", "rss_mb", "connections", "objects")


# ---- the harness: servers and proxies in a process of their own ------------------------------------
def harness(folder: Path, replicas: int, rate: float, seed: int, delay_s: float) -> int:
    """Start the servers and proxies, write their URLs to folder/urls.json, start the schedule on
    SIGUSR1, stop on SIGTERM (writing folder/harness.json: faults met, restarts)."""
    stop, go = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: go.set())
    plan = FaultPlan(seed=seed, rate=rate, burst=2, retry_after=0.5, stall_s=4.0, trickle_s=0.5)
    with ExitStack() as stack:
        mocks, retrieval, port = start_servers(stack, folder, folder / "harness-logs", replicas, delay_s)
        llm = [stack.enter_context(FaultProxy(m.health_url.removesuffix("/health"),
                                              FaultPlan(**{**plan.__dict__, "seed": seed + r})))
               for r, m in enumerate(mocks)]
        rp = stack.enter_context(FaultProxy(f"http://127.0.0.1:{port}", FaultPlan(**{**plan.__dict__, "seed": seed + 100})))
        (folder / "urls.json").write_text(json.dumps({"llm": [p.url + "/v1" for p in llm], "retrieval": rp.url}))
        while not (go.is_set() or stop.is_set()):
            time.sleep(0.2)
        actions = [(t, retrieval.restart) for t in range(600, 6 * 3600, 600)]
        if replicas > 1:
            actions += [(300, mocks[0].kill), (360, mocks[0].start)]
        schedule = Schedule(actions).start()
        stop.wait()
        schedule.cancel()
        (folder / "harness.json").write_text(json.dumps({
            "requests": sum(len(p.log) for p in [*llm, rp]), "faults": faults_met([*llm, rp]), "schedule": schedule.done,
            "schedule_errors": schedule.errors,
            "max_attempts_llm": max((n for p in llm for n in p.attempts_per_body().values()), default=0),
            "max_attempts_search": max(rp.attempts_per_body().values(), default=0)}))
    return 0


# ---- the analysis ------------------------------------------------------------------------------------
def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys on xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def report(samples: list[dict], interval_min: float = 5.0, warmup_s: float = 120.0) -> list[str]:
    """Markdown: start/end, the median of each `interval_min` minutes, and each metric's growth per
    1,000 tasks fitted over the samples taken during the run after `warmup_s` (pools fill in the
    first minutes), and over the second half of those.  The last sample, taken after the run
    ended (what it left behind), is the `end` row and not fitted."""
    metrics = [m for m in METRICS if m in samples[0]]
    head = "| " + " | ".join(["{}"] * (2 + len(metrics))) + " |"
    titles = {"fds": "fds", "threads": "threads", "rss_mb": "RSS MB", "connections": "connections",
              "objects": "Python objects"}
    rows = ["| minutes | tasks done (by then) | " + " | ".join(titles[m] for m in metrics) + " |",
            "|---" * (2 + len(metrics)) + "|"]

    def row(name, part):
        return head.format(name, int(max(s["done"] for s in part)),
                           *(f"{statistics.median(s[m] for s in part):.0f}" for m in metrics))

    rows.append(head.format("start", samples[0]["done"], *(f"{samples[0][m]:.0f}" for m in metrics)))
    end_t = samples[-1]["t"]
    for k in range(math.ceil(end_t / (interval_min * 60))):
        part = [s for s in samples if k * interval_min * 60 <= s["t"] < (k + 1) * interval_min * 60]
        if part:
            rows.append(row(f"{k * interval_min:g}-{(k + 1) * interval_min:g} (median)", part))
    rows.append(head.format("end", samples[-1]["done"], *(f"{samples[-1][m]:.0f}" for m in metrics)))
    fit = [s for s in samples[:-1] if s["t"] >= warmup_s]
    for name, part in ((f"growth per 1,000 tasks (fit after {warmup_s:g} s)", fit),
                       ("growth per 1,000 tasks (fit over the second half)", fit[len(fit) // 2:])):
        if len(part) > 2:
            xs = [s["done"] / 1000 for s in part]
            rows.append(head.format(name, f"{part[0]['done']}-{part[-1]['done']}",
                                    *(f"{slope(xs, [s[m] for s in part]):+.2f}" for m in metrics)))
    return rows


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--tasks", type=int, help="the long run's tasks (default: the warm-up's rate x --minutes)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--rate", type=float, default=0.1, help="fraction of requests faulted (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--delay", type=float, default=1.0, help="seconds each mock reply takes (a model's latency)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--out", type=Path, help="write the samples and summary here (JSON)")
    p.add_argument("--workdir", type=Path, help="keep the runs here (default: a temporary folder)")
    p.add_argument("--harness", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.harness:
        return harness(args.harness, args.replicas, args.rate, args.seed, args.delay)
    print(raise_nofile_limit(), flush=True)
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.workdir or Path(tmp)
        warm_n = 3 * args.concurrency
        write_world(folder, warm_n, DISTINCT)
        (folder / "urls.json").unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        h = subprocess.Popen([sys.executable, __file__, "--harness", str(folder), "--replicas", str(args.replicas),
                              "--rate", str(args.rate), "--seed", str(args.seed), "--delay", str(args.delay)],
                             cwd=ROOT, env=env)
        try:
            while not (folder / "urls.json").exists():
                if h.poll() is not None:
                    raise SystemExit(f"the harness exited with {h.returncode}")
                time.sleep(0.5)
            urls = json.loads((folder / "urls.json").read_text())
            started = time.monotonic()
            code = run_eval(folder, folder / "warmup", urls["llm"], urls["retrieval"], args.concurrency)
            rate = warm_n / (time.monotonic() - started)
            n = args.tasks or max(warm_n, round(rate * args.minutes * 60))
            print(f"warm-up: {warm_n} tasks at {rate:.2f} tasks/s (exit {code}); the long run: {n} tasks", flush=True)
            write_world(folder, n, DISTINCT)
            out = folder / "long"
            samples: list[dict] = []
            done = threading.Event()
            t0 = time.monotonic()

            def sampler():
                while True:
                    s = asdict(sample(t=time.monotonic() - t0))
                    s["done"] = count_lines(out / "results.jsonl")
                    s["objects"] = len(gc.get_objects())     # Python objects the collector tracks
                    samples.append(s)
                    if done.wait(args.interval):
                        return

            thread = threading.Thread(target=sampler, daemon=True)
            h.send_signal(signal.SIGUSR1)         # the schedule's clock starts with the long run
            thread.start()
            code = run_eval(folder, out, urls["llm"], urls["retrieval"], args.concurrency)
            wall = time.monotonic() - t0
            done.set()
            thread.join()
            gc.collect()
            time.sleep(2.0)                                    # the run's pool threads end
            last = asdict(sample(t=time.monotonic() - t0))     # after the run: what it left behind
            last["done"] = count_lines(out / "results.jsonl")
            last["objects"] = len(gc.get_objects())
            samples.append(last)
        finally:
            h.send_signal(signal.SIGTERM)
            h.wait(120)
        harness_info = json.loads((folder / "harness.json").read_text()) if (folder / "harness.json").exists() else {}
        records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        ids = [r["id"] for r in records]
        summary = {"tasks": n, "records": len(records), "distinct_ids": len(set(ids)),
                   "correct": sum(bool(r.get("correct")) for r in records),
                   "errors": sum(r["status"] == "error" for r in records), "exit": code, "wall_s": round(wall, 1),
                   "concurrency": args.concurrency, "rate": args.rate, "harness": harness_info}
    print(json.dumps(summary, indent=1))
    print(*report(samples), sep="\n")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": summary, "samples": samples}))
    ok = code == 0 and summary["records"] == summary["distinct_ids"] == n
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
