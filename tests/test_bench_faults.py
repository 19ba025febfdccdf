"""bench/faults.py, the fault injection of the chaos tests and benchmarks: the seeded fault proxy
(each fault as a client sees it, the log, the accounting), the gateway through it, and servers
killed and restarted on schedule."""
from __future__ import annotations

import json
import signal
import socket
import sys
import time

import httpx
import pytest

from evaluation.mock_backend import MockBackend, registry_yaml
from faults import KINDS, FaultPlan, FaultProxy, Schedule, ServerProcess, http_ok

QUESTION = "What is the capital of Japan?"
BODY = {"model": "m", "messages": [{"role": "user", "content": f"{QUESTION} <answer></answer>"}]}


@pytest.fixture(scope="module")
def backend():
    with MockBackend(answers={QUESTION: "Tokyo"}) as server:
        yield server


def upstream(backend) -> str:
    return backend.base_url.removesuffix("/v1")


def test_the_fault_sequence_is_a_function_of_seed_and_index_at_the_configured_rate_and_bursts():
    plan = FaultPlan(seed=3, rate=0.1, burst=3)
    seq = plan.sequence(20000)
    assert seq == FaultPlan(seed=3, rate=0.1, burst=3).sequence(20000)       # same seed, same faults
    assert seq != FaultPlan(seed=4, rate=0.1, burst=3).sequence(20000)
    assert [plan.fault(i) for i in (17, 5, 17)] == [seq[17], seq[5], seq[17]]  # any order of asking
    faulted = sum(f is not None for f in seq) / len(seq)
    assert 0.08 < faulted < 0.11          # bursts overlapping now and then make it a little under 0.1
    runs, run = [], 0
    for f in seq + [None]:
        if f is None:
            runs.append(run) if run else None
            run = 0
        else:
            run += 1
    assert min(runs) >= 3 and sum(r == 3 for r in runs) > 0.8 * len(runs)     # bursts of 3
    assert set(seq) - {None} == set(KINDS)
    assert FaultPlan(rate=0.0).sequence(1000) == [None] * 1000
    assert FaultPlan(rate=1.0, kinds=("429",)).sequence(5) == ["429"] * 5
    with pytest.raises(ValueError, match="kinds: \\['teapot'\\]; choose from 429"):
        FaultPlan(kinds=("teapot",))
    with pytest.raises(ValueError, match="rate"):
        FaultPlan(rate=1.5)


def ask(proxy: FaultProxy, timeout: float = 5.0):
    return httpx.post(proxy.url + "/v1/chat/completions", json=BODY, timeout=timeout)


@pytest.mark.parametrize("kind", ["429", "500", "502", "503", "html"])
def test_status_and_wrong_content_type_faults_are_answered_by_the_proxy(backend, kind):
    before = backend.requests
    with FaultProxy(upstream(backend), FaultPlan(rate=1.0, kinds=(kind,), retry_after=2.5)) as proxy:
        reply = ask(proxy)
    assert backend.requests == before                     # never forwarded
    if kind == "html":
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/html")
    else:
        assert reply.status_code == int(kind) and reply.json()["error"]["type"] == "injected"
        assert reply.headers.get("retry-after") == ("2.5" if kind == "429" else None)
    (entry,) = proxy.log
    assert (entry.fault, entry.forwarded, entry.delivered, entry.usage) == (kind, False, False, None)


def test_reset_and_stall_close_the_connection_without_a_reply(backend):
    with FaultProxy(upstream(backend), FaultPlan(rate=1.0, kinds=("reset",))) as proxy:
        with pytest.raises(httpx.TransportError):
            ask(proxy)
    with FaultProxy(upstream(backend), FaultPlan(rate=1.0, kinds=("stall",), stall_s=0.5)) as proxy:
        started = time.monotonic()
        with pytest.raises(httpx.TransportError):
            ask(proxy)
        assert time.monotonic() - started >= 0.5
        with pytest.raises(httpx.ReadTimeout):            # a client with a shorter deadline gives up first
            ask(proxy, timeout=0.2)
    assert [e.status for e in proxy.log] == [None, None]


def test_trickle_delivers_the_whole_reply_slowly_and_truncated_cuts_it_with_the_usage_counted(backend):
    direct = httpx.post(backend.base_url + "/chat/completions", json=BODY).json()
    with FaultProxy(upstream(backend), FaultPlan(rate=1.0, kinds=("trickle",), trickle_s=0.5)) as proxy:
        started = time.monotonic()
        reply = ask(proxy)
        assert time.monotonic() - started >= 0.45
    assert reply.json()["choices"] == direct["choices"]
    (entry,) = proxy.log
    assert entry.forwarded and entry.delivered and entry.usage == {k: direct["usage"][k] for k in entry.usage}
    with FaultProxy(upstream(backend), FaultPlan(rate=1.0, kinds=("truncated",))) as proxy:
        reply = ask(proxy)
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        reply.json()
    (entry,) = proxy.log
    assert entry.forwarded and not entry.delivered
    assert proxy.wasted_usage() == proxy.served_usage() == entry.usage and entry.usage["completion_tokens"] > 0


def test_the_gateway_gets_through_half_the_requests_failing_within_its_retry_budget(backend, tmp_path, monkeypatch):
    """Every kind of fault at 50%, in bursts of 2: each call ends with the mock's answer, no call
    has more attempts than max_retries + 1, the log is the plan's sequence, and the tokens the
    backend served are the ones delivered plus the ones wasted on cut replies."""
    from LLM_CALL import get_llm_response

    plan = FaultPlan(seed=11, rate=0.5, burst=2, retry_after=0.05, stall_s=2.0, trickle_s=0.2)
    with FaultProxy(upstream(backend), plan, log_path=tmp_path / "faults.jsonl") as proxy:
        (tmp_path / "models.yaml").write_text(registry_yaml(proxy.url + "/v1", ["m"], max_retries=8, timeout_s=1,
                                                            backoff_initial_s=0.01, backoff_max_s=0.05))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(tmp_path / "models.yaml"))
        replies = [get_llm_response("m", [{"role": "user", "content": f"{QUESTION} <answer></answer> call {i}"}],
                                    max_tokens=16) for i in range(12)]
    assert all(r.text == "The answer is <answer>Tokyo</answer>" for r in replies)
    logged = [json.loads(line) for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert [e["fault"] for e in logged] == plan.sequence(len(logged)) == proxy.faults()
    assert len({e["fault"] for e in logged} - {None}) >= 5 and len(logged) > 12
    per_call = proxy.attempts_per_body()
    assert len(per_call) == 12 and max(per_call.values()) <= 9
    delivered = proxy.delivered_usage()
    assert delivered["completion_tokens"] == sum(r.usage.completion_tokens for r in replies)
    assert delivered["prompt_tokens"] == sum(r.usage.prompt_tokens for r in replies)
    served, wasted = proxy.served_usage(), proxy.wasted_usage()
    assert all(served[k] == delivered[k] + wasted[k] for k in served)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_a_server_killed_and_restarted_on_schedule_and_at_a_request_index(tmp_path, backend):
    port = free_port()
    server = ServerProcess([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                           health_url=f"http://127.0.0.1:{port}/", log=tmp_path / "server.log", cwd=tmp_path)
    with server:
        first = server.proc.pid
        schedule = Schedule([(0.2, server.kill), (0.5, server.start)]).start()
        time.sleep(0.35)
        assert refused(port) and not server.alive
        schedule.join(60)
        assert schedule.errors == [] and [name for _, name in schedule.done] == ["kill", "start"]
        assert http_ok(f"http://127.0.0.1:{port}/") and server.proc.pid != first
        # an action at request 1 of a proxy: deterministic relative to the fault sequence
        with FaultProxy(f"http://127.0.0.1:{port}", at_request={1: lambda: server.kill(signal.SIGTERM)}) as proxy:
            assert httpx.get(proxy.url + "/").status_code == 200
            httpx.get(proxy.url + "/")                    # starts the kill
            proxy.actions[0].join(30)
            down = httpx.get(proxy.url + "/")
        assert down.status_code == 502 and proxy.log[2].upstream_down
        assert [label for _, label in server.events] == ["ready", "killed (SIGKILL)", "ready", "killed (SIGTERM)"]


def test_the_old_name_says_where_it_moved_and_still_works():
    """orchestrator.faults (before issue 46) warns, naming bench/faults.py, and is that module."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = ("import warnings; warnings.simplefilter('always')\n"
            "import orchestrator.faults as old, faults\nassert old is faults and old.FaultPlan(seed=1).fault(0) in "
            "(None, *faults.KINDS)\nprint('same module')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})
    assert proc.returncode == 0 and proc.stdout.strip() == "same module", proc.stderr
    assert "FutureWarning: orchestrator.faults moved to bench/faults.py" in proc.stderr
