"""RetrievalClient: replicas from the endpoints file, failover, bounded retries, in-process mode."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager

import pytest
from _retrieval_world import dead_url, live, write_jsonl

from retrieval.build_index import build
from retrieval.client import RetrievalClient, RetrievalError, Retrieved
from retrieval.searcher import Searcher
from retrieval.server import create_app
from retrieval.service import RetrievalService

pytestmark = pytest.mark.usefixtures("one_cpu_thread")   # conftest.py

DOCS = [
    {"id": "0", "contents": "The Nile is the longest river in Africa, flowing north into the Mediterranean."},
    {"id": "1", "contents": "Marie Curie won Nobel Prizes in both physics and chemistry."},
    {"id": "2", "contents": "The Great Wall of China was built over many centuries to guard the northern border."},
]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("client")
    build(write_jsonl(folder / "c.jsonl", DOCS), folder / "index", progress=False)
    return folder / "index"


@contextmanager
def live_server(index_dir):
    with live(create_app(RetrievalService(Searcher(index_dir)))) as url:
        yield url


@pytest.fixture(scope="module")
def server_url(index_dir):
    with live_server(index_dir) as url:
        yield url


def test_http_and_in_process_modes_answer_the_same(index_dir, server_url):
    question = ["Who won Nobel prizes in physics and chemistry?", "longest river in Africa"]
    with RetrievalClient([server_url]) as http, RetrievalClient.in_process(index_dir) as local:
        remote, here = http.retrieve(question, topk=2), local.retrieve(question, topk=2)
    assert isinstance(remote, Retrieved) and (remote.web_searches, remote.pages) == (0, 0)
    assert [row[0]["document"]["id"] for row in remote] == ["1", "0"] and all(len(r) == 2 for r in remote)
    for a, b in zip(remote, here):
        assert [h["document"] for h in a] == [h["document"] for h in b]
        assert [h["score"] for h in a] == pytest.approx([h["score"] for h in b], abs=1e-5)


def test_replicas_come_from_the_endpoints_file_and_a_dead_one_is_skipped(tmp_path, server_url, monkeypatch):
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({"retrieval": [{"base_url": dead_url()}, {"base_url": server_url}]}))
    monkeypatch.setenv("TOOLORCHESTRA_ENDPOINTS", str(endpoints))
    client = RetrievalClient(timeout_s=5, attempts=3)
    for _ in range(3):                      # round-robin hits the dead replica; the retry moves on
        hits = client.retrieve(["Great Wall of China"], topk=1)
        assert hits[0][0]["document"]["id"] == "2"


def test_bad_request_is_not_retried_and_says_why(server_url):
    client = RetrievalClient([server_url])
    started = time.monotonic()
    with pytest.raises(RetrievalError, match=r"HTTP 422\): topk: Input should be less than or equal to 200"):
        client.retrieve(["x"], topk=1000)
    assert time.monotonic() - started < 1.0
    with pytest.raises(TypeError, match="list of strings"):
        client.retrieve("a bare string")


def test_all_replicas_down_fails_after_bounded_attempts():
    client = RetrievalClient([dead_url(), dead_url()], timeout_s=2, attempts=3)
    started = time.monotonic()
    with pytest.raises(RetrievalError, match="failed after 3 attempts"):
        client.retrieve(["anything"])
    assert time.monotonic() - started < 10


def test_no_replicas_configured_explains_how_to_register(tmp_path):
    client = RetrievalClient(endpoints_file=tmp_path / "none.json", attempts=1)
    with pytest.raises(RetrievalError, match="registers itself"):
        client.retrieve(["q"])


def test_in_process_mode_reports_query_errors(index_dir):
    with RetrievalClient.in_process(index_dir) as local:
        with pytest.raises(RetrievalError, match="eid: this server has no eid whitelists"):
            local.retrieve(["q"], eid="e1")
        assert local.retrieve([]) == []


def test_server_cli_registers_in_the_endpoints_file_and_unregisters_on_stop(index_dir, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    endpoints = tmp_path / "endpoints.json"
    proc = subprocess.Popen([sys.executable, "-m", "retrieval.server", "--index", str(index_dir), "--port", "0",
                             "--endpoints-file", str(endpoints)], stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        deadline = time.monotonic() + 120
        while not (endpoints.exists() and json.loads(endpoints.read_text()).get("retrieval")):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "server did not register within 120 s"
            time.sleep(0.2)
        hits = RetrievalClient(endpoints_file=endpoints).retrieve(["river in Africa"], topk=1)
        assert hits[0][0]["document"]["id"] == "0"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert json.loads(endpoints.read_text()).get("retrieval") is None


def test_server_cli_explains_a_missing_index(tmp_path, capsys):
    from retrieval.server import main
    assert main(["--index", str(tmp_path / "nope")]) == 2
    assert "no meta.json" in capsys.readouterr().err


def test_replies_that_are_not_json_are_retried_and_proxy_variables_are_ignored(server_url, monkeypatch):
    """A 200 whose body is cut short or is an HTML page is a failed attempt, retried (before: a bare
    JSONDecodeError); HTTP(S)_PROXY / ALL_PROXY pointing at a dead port change nothing (before: httpx
    honoured them and every search went to the proxy)."""
    from faults import FaultPlan, FaultProxy

    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(var, dead_url())
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with FaultProxy(server_url, FaultPlan(rate=1.0, kinds=("truncated",))) as broken:
        with pytest.raises(RetrievalError, match=r"failed after 2 attempts: .*reply is not JSON \(Content-Type "
                                                 r"application/json\)"):
            RetrievalClient([broken.url], attempts=2).retrieve(["Great Wall of China"], topk=1)
    faults = iter(["html", "truncated"])
    with FaultProxy(server_url, FaultPlan(rate=0.0)) as proxy:
        proxy.plan = type("Two", (), {"fault": lambda self, i: next(faults, None), "methods": ("POST",)})()
        hits = RetrievalClient([proxy.url], attempts=3).retrieve(["Great Wall of China"], topk=1)
    assert hits[0][0]["document"]["id"] == "2"
    assert [(e.fault, e.status) for e in proxy.log] == [("html", 200), ("truncated", 200), (None, 200)]


def test_a_reply_over_max_reply_bytes_is_refused_once_whether_it_declares_its_length_or_streams(server_url):
    """A body past the cap is refused from its Content-Length, or cut while it streams in (chunked, no
    length), and not retried (the same query gets the same reply); our real server's reply of the same
    query passes under a cap just above its size and fails just below it."""
    from fastapi import FastAPI
    from fastapi.responses import Response, StreamingResponse

    app, calls = FastAPI(), []
    big = json.dumps({"result": [[{"document": {"id": "x", "contents": "a" * 5000}, "score": 1.0}]]}).encode()

    @app.post("/declared/retrieve")
    def declared():
        calls.append("declared")
        return Response(big, media_type="application/json")

    @app.post("/streamed/retrieve")
    def streamed():
        calls.append("streamed")
        return StreamingResponse((big[i:i + 1000] for i in range(0, len(big), 1000)), media_type="application/json")

    with live(app) as url:
        with pytest.raises(RetrievalError, match=r"declares Content-Length 50\d\d, over max_reply_bytes 4096: ask for fewer"):
            RetrievalClient([f"{url}/declared"], attempts=3, max_reply_bytes=4096).retrieve(["q"], topk=1)
        with pytest.raises(RetrievalError, match=r"reply body over max_reply_bytes 4096, stopped reading at the cap"):
            RetrievalClient([f"{url}/streamed"], attempts=3, max_reply_bytes=4096).retrieve(["q"], topk=1)
        assert calls == ["declared", "streamed"]                   # once each: not retried
        hits = RetrievalClient([f"{url}/streamed"], max_reply_bytes=len(big)).retrieve(["q"], topk=1)
        assert hits[0][0]["document"]["contents"] == "a" * 5000    # at the cap exactly: read whole

    import httpx

    size = len(httpx.post(server_url + "/retrieve", json={"queries": ["Great Wall of China"], "topk": 3,
                                                           "return_scores": True}, trust_env=False).content)
    assert len(RetrievalClient([server_url], max_reply_bytes=size).retrieve(["Great Wall of China"], topk=3)[0]) == 3
    with pytest.raises(RetrievalError, match="over max_reply_bytes"):
        RetrievalClient([server_url], max_reply_bytes=size - 1).retrieve(["Great Wall of China"], topk=3)
    with pytest.raises(ValueError, match=r"max_reply_bytes=0: must be >= 1"):
        RetrievalClient([server_url], max_reply_bytes=0)
