"""Load on the orchestrator server (orchestrator/serve/): requests/s and latency p50/p99 at 1, 8
and 32 concurrent clients.

`python -m orchestrator.serve` runs as its own process with the mock backend
(evaluation/mock_backend.py, in this process) as orchestrator and every expert: each request is a
whole episode over real HTTP (enhance_reasoning, then answer: two orchestrator turns and two
expert calls through the gateway), so what is measured is the server, the loop and the gateway,
not a model.  `--delay` makes every backend call wait that long (a model's latency).  Each client
is a thread with its own `openai` SDK client sending requests one after another; a 503 (the
server's queue full) counts as an error, not as a latency.

    python bench/serve_load.py [--clients 1 8 32] [--requests 8] [--delay 0 0.2] [--write]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import httpx  # noqa: E402
import openai  # noqa: E402

from _report import load, machine, write_section  # noqa: E402
from evaluation.mock_backend import MockBackend, registry_yaml  # noqa: E402
from retrieval.server import _free_port  # noqa: E402

QUESTION, ANSWER = "Which city hosts the Louvre?", "Paris"
CALLS = 4          # backend calls per episode: orchestrator, expert, orchestrator, expert


def start_server(tmp: Path, backend: MockBackend, extra: list[str]) -> tuple[subprocess.Popen, str, list[str]]:
    (tmp / "models.yaml").write_text(registry_yaml(backend.base_url, ["mock-orch", "mock-expert"]))
    tools = json.loads((ROOT / "tools.json").read_text())
    tools["profiles"]["mock"] = {m: "mock-expert" for m in tools["prices"]}
    (tmp / "tools.json").write_text(json.dumps(tools))
    port = _free_port("127.0.0.1")
    cmd = [sys.executable, "-m", "orchestrator.serve", "--model", "mock-orch", "--profile", "default", "--serve", "mock",
           "--tools", str(tmp / "tools.json"), "--port", str(port), *extra]
    log = (tmp / "server.log").open("w")     # a file, not a pipe: an unread pipe fills and stalls the server
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "TOOLORCHESTRA_MODELS": str(tmp / "models.yaml")},
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {(tmp / 'server.log').read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health/ready", timeout=1).status_code == 200:     # listening and loaded
                return proc, url, cmd
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("server did not start within 120 s")
        time.sleep(0.2)


def one_level(url: str, clients: int, per_client: int) -> dict:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    lock = threading.Lock()

    def client() -> None:
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        for _ in range(per_client):
            started = time.perf_counter()
            try:
                r = sdk.chat.completions.create(model="mock-orch", messages=[{"role": "user", "content": QUESTION}])
                ok = r.choices[0].message.content == ANSWER
                kind = None if ok else "wrong answer"
            except openai.APIStatusError as exc:
                kind = str(exc.status_code)
            with lock:
                if kind is None:
                    latencies.append(time.perf_counter() - started)
                else:
                    errors[kind] = errors.get(kind, 0) + 1
        sdk.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    lat = sorted(latencies)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(round(p / 100 * (len(lat) - 1))))] if lat else float("nan")

    return {"clients": clients, "requests": clients * per_client, "ok": len(lat), "errors": errors, "wall_s": wall,
            "rps": len(lat) / wall, "p50": pct(50), "p99": pct(99), "mean": statistics.mean(lat) if lat else float("nan")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests", type=int, default=8, help="requests per client (default: %(default)s)")
    p.add_argument("--delay", type=float, nargs="+", default=[0.0, 0.2],
                   help="seconds each backend call waits, one run per value (default: %(default)s)")
    p.add_argument("--server-args", default="", help="more flags for orchestrator.serve (e.g. '--concurrency 32')")
    p.add_argument("--write", action="store_true", help="write the table to docs/benchmarks.md")
    args = p.parse_args()
    rows, cmd = [], None
    for delay in args.delay:
        with tempfile.TemporaryDirectory() as tmp, MockBackend(answers={QUESTION: ANSWER}, delay_s=delay) as backend:
            proc, url, cmd = start_server(Path(tmp), backend, shlex.split(args.server_args))
            try:
                limits = httpx.get(url + "/health").json()["limits"]
                one_level(url, 1, 2)                              # warm-up: imports, connections
                for clients in args.clients:
                    row = {"delay": delay, **one_level(url, clients, args.requests), "limits": limits,
                           "load": load()}
                    rows.append(row)
                    print(f"delay {delay:g} s, {clients:>2} clients: {row['rps']:.1f} req/s, p50 {row['p50']:.3f} s, "
                          f"p99 {row['p99']:.3f} s, errors {row['errors'] or 0}, peak backend in flight "
                          f"{backend.max_inflight}", flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    if args.write:
        write(rows, args, cmd)
    return 0


def write(rows: list[dict], args, server_cmd: list[str]) -> None:
    limits = rows[0]["limits"]
    lines = ["## Serving the orchestrator", "",
             f"`python bench/serve_load.py --clients {' '.join(map(str, args.clients))} --requests {args.requests} "
             f"--delay {' '.join(f'{d:g}' for d in args.delay)}"
             + (f" --server-args '{args.server_args}'" if args.server_args else "") + " --write`: "
             f"`python -m orchestrator.serve` (its own process; {limits['concurrency']} episodes at once, "
             f"{limits['queue']} queued: the defaults for a remote model) with the mock backend "
             "(evaluation/mock_backend.py) as orchestrator and every expert, so each request is a whole episode "
             "(two orchestrator turns, two expert calls, through the gateway over HTTP) and no model time but "
             "`delay` per backend call. Each client is a thread with its own `openai` SDK client sending "
             f"{args.requests} requests one after another; latency is per request, client side.",
             "", f"Machine: {machine()}; 1-minute load at each row in the table (the box is shared).", "",
             "| backend delay (s) | clients | requests | req/s | ceiling req/s | p50 (s) | p99 (s) | errors | load |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        errors = ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0"
        # an episode makes four backend calls one after another: at most min(clients, slots) / (4 x delay) per s
        ceiling = f"{min(r['clients'], limits['concurrency']) / (CALLS * r['delay']):.1f}" if r["delay"] else "-"
        lines.append(f"| {r['delay']:g} | {r['clients']} | {r['requests']} | {r['rps']:.1f} | {ceiling} | "
                     f"{r['p50']:.3f} | {r['p99']:.3f} | {errors} | {r['load']:.1f} |")
    lines += ["", "Reading: with no backend delay the CPU bounds the rate: the server's own work per request "
              "(FastAPI, the loop, four gateway calls and their JSON), shared with the mock backend and the client "
              "threads on the same cores. With a delay the episodes overlap up to the server's concurrency limit "
              "(the ceiling column: the rate if only the delay counted); below the ceiling is that same CPU; past "
              "the limit requests wait in the queue (p50, p99). "
              + ("No request was refused." if not any(r["errors"] for r in rows) else
                 "Errors are refused requests (503: the queue full) or wrong answers.")]
    print(f"wrote {write_section(chr(10).join(lines))}")


if __name__ == "__main__":
    raise SystemExit(main())
