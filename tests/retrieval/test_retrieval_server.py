"""The /retrieve server: Search-R1 contract, filters, limits, micro-batching, web fallback, fuzzing."""
from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest
from _retrieval_world import TINY, live, write_jsonl
from fastapi.testclient import TestClient

from retrieval.build_index import build
from retrieval.encoders import Encoder
from retrieval.searcher import Query, Searcher
from retrieval.server import Limits, create_app
from retrieval.service import RetrievalService
from retrieval.web import WebSearch

pytestmark = pytest.mark.usefixtures("one_cpu_thread")   # conftest.py

QUESTIONS = {  # query -> the passage that must come first
    "What is the capital of Japan?": "tokyo", "Who created the Python language?": "python",
    "highest mountain in the Himalayas": "everest", "How do plants store light energy?": "photosynthesis",
    "music from New Orleans": "jazz", "city on the Seine": "paris",
}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("retrieval")
    corpus = write_jsonl(folder / "corpus.jsonl", TINY)
    (folder / "eids.json").write_text(json.dumps({"q-music": ["jazz", "python", "not-in-corpus"], "q-one": ["volcano"]}))
    build(corpus, folder / "index", encoder=Encoder(), progress=False)
    return folder


@pytest.fixture(scope="module")
def searcher(index_dir):
    return Searcher(index_dir / "index", eid_file=index_dir / "eids.json")


@contextmanager
def serve(searcher, web=None, limits=Limits(), **service_options):
    service = RetrievalService(searcher, web, **service_options)
    with TestClient(create_app(service, limits)) as client:
        yield client, service


@pytest.fixture(scope="module")
def client(searcher):
    with serve(searcher) as (c, _):
        yield c


def ids(row):
    return [h["document"]["id"] if "document" in h else h["id"] for h in row]


# ---- contract -------------------------------------------------------------------------
def test_retrieve_answers_search_r1_shape_with_scores(client):
    r = client.post("/retrieve", json={"queries": list(QUESTIONS), "topk": 2, "return_scores": True})
    assert r.status_code == 200
    body = r.json()
    assert body["usage"] == {"web_searches": 0, "pages": 0}
    assert [row[0]["document"]["id"] for row in body["result"]] == list(QUESTIONS.values())
    first = body["result"][0][0]
    assert set(first) == {"document", "score"} and set(first["document"]) == {"id", "contents"}
    assert first["document"]["contents"] == TINY[1]["contents"]
    assert all(len(row) == 2 and row[0]["score"] >= row[1]["score"] for row in body["result"])


def test_without_scores_hits_are_bare_documents_and_topk_defaults_to_3(client):
    body = client.post("/retrieve", json={"queries": ["What is the capital of Japan?"]}).json()
    assert len(body["result"][0]) == 3
    assert body["result"][0][0] == {"id": "tokyo", "contents": TINY[1]["contents"]}


def test_health_and_openapi(client):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["documents"] == 7 and health["method"] == "dense"
    assert health["eid_whitelists"] == 2 and health["web_fallback"] is False
    schema = client.get("/openapi.json").json()
    assert "/retrieve" in schema["paths"] and "/health" in schema["paths"]


# ---- filters --------------------------------------------------------------------------
def test_eid_whitelist_restricts_and_ranks_within_it(client):
    body = client.post("/retrieve", json={"queries": ["What is the capital of Japan?", "jazz in New Orleans"],
                                          "topk": 5, "eid": "q-music", "return_scores": True}).json()
    assert all(set(ids(row)) == {"jazz", "python"} for row in body["result"])
    assert ids(body["result"][1])[0] == "jazz"


def test_unknown_eid_is_a_422_naming_eid(client):
    r = client.post("/retrieve", json={"queries": ["x"], "eid": "q-nope"})
    assert r.status_code == 422 and r.json()["error"].startswith("eid: unknown eid 'q-nope'")


def test_min_score_drops_weak_hits(client):
    rows = client.post("/retrieve", json={"queries": ["What is the capital of Japan?"], "topk": 3,
                                          "return_scores": True}).json()["result"][0]
    cut = (rows[0]["score"] + rows[1]["score"]) / 2
    kept = client.post("/retrieve", json={"queries": ["What is the capital of Japan?"], "topk": 3,
                                          "return_scores": True, "min_score": cut}).json()["result"][0]
    assert ids(kept) == ["tokyo"]


def test_min_length_drops_short_documents_but_still_fills_topk(client):
    plain = client.post("/retrieve", json={"queries": ["volcano"], "topk": 2}).json()["result"][0]
    assert ids(plain)[0] == "volcano"
    longer = client.post("/retrieve", json={"queries": ["volcano"], "topk": 2, "min_length": 20}).json()["result"][0]
    assert "volcano" not in ids(longer) and len(longer) == 2


@pytest.mark.parametrize("use", ["hle", "frames", "train"])
def test_the_paper_profiles_length_cut_keeps_what_upstreams_strict_cut_keeps(tmp_path, use):
    """Upstream keeps a document when len(content) > 100 (retrieval_hle.py:358, retrieval_wiki.py:343,
    retrieval_general_thought.py:345); our server keeps len >= min_length, so the profile sends 101."""
    from orchestrator.settings import load_profile
    cut = load_profile("paper").section("qa", use).retrieval.min_length
    base = "Volcanoes erupt lava and ash from the crust of the Earth"
    docs = [{"id": f"len{n}", "contents": (base + " " + "x" * n)[:n]} for n in (99, 100, 101, 140)]
    assert [len(d["contents"]) for d in docs] == [99, 100, 101, 140]
    build(write_jsonl(tmp_path / "c.jsonl", docs), tmp_path / "index", encoder=Encoder(), progress=False)
    [hits] = Searcher(tmp_path / "index").search([Query("volcano lava", 4, min_length=cut)])
    assert sorted(ids(hits)) == sorted(d["id"] for d in docs if len(d["contents"]) > 100)


# ---- limits: 422 naming the field, 413, nothing crashes -------------------------------
BAD_BODIES = [
    ({"queries": []}, "queries"),
    ({"queries": ["q"] * 65}, "queries"),
    ({"queries": ["q" * 4097]}, "queries.0"),
    ({"queries": ["q"], "topk": 0}, "topk"),
    ({"queries": ["q"], "topk": 201}, "topk"),
    ({"queries": ["q"], "topk": "many"}, "topk"),
    ({"queries": "just a string"}, "queries"),
    ({"queries": [1, 2]}, "queries.0"),
    ({"queries": ["q"], "min_length": -1}, "min_length"),
    ({"queries": ["q"], "eid": ""}, "eid"),
    ({"topk": 3}, "queries"),
]


@pytest.mark.parametrize("body, field", BAD_BODIES)
def test_limits_answer_422_naming_the_field(client, body, field):
    r = client.post("/retrieve", json=body)
    assert r.status_code == 422
    assert r.json()["error"].startswith(f"{field}: ")


def test_the_provider_emulators_retrieve_answers_as_this_server_does(client):
    """tests/provider_emulator.py stands in for this server in the evaluation tests: the same 422s
    for the same bodies, and the same min_score / min_length filters."""
    from provider_emulator import ProviderEmulator
    with ProviderEmulator({}, doc_chars=140) as emu:
        for body, _ in BAD_BODIES:
            real, emulated = client.post("/retrieve", json=body), httpx.post(emu.root + "/retrieve", json=body)
            assert (emulated.status_code, emulated.json()["error"]) == (real.status_code, real.json()["error"]), body
        assert len(emu.rejected) == len(BAD_BODIES)
        rows = {}
        for extra in ({}, {"min_length": 10_000}, {"min_length": 50}, {"min_score": 0.9985}):
            r = httpx.post(emu.root + "/retrieve", json={"queries": ["q"], "topk": 4, **extra})
            rows[tuple(extra.items())] = r.json()["result"][0]
    full = rows[()]
    assert len(full) == 4 and all(len(h["document"]["contents"]) >= 50 for h in full)
    assert rows[(("min_length", 10_000),)] == [] and rows[(("min_length", 50),)] == full
    assert [h["score"] for h in rows[(("min_score", 0.9985),)]] == [h["score"] for h in full if h["score"] >= 0.9985]
    assert 0 < len(rows[(("min_score", 0.9985),)]) < 4


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"queries": ["a"], "min_score": NaN}',
                                 b'{"queries": ["\\ud800"]}', b"[]", b"null"])
def test_malformed_bodies_are_4xx_not_crashes(client, raw):
    r = client.post("/retrieve", content=raw, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500
    assert client.get("/health").status_code == 200


def test_oversized_body_is_413(client):
    r = client.post("/retrieve", content=b'{"queries": ["' + b"a" * (2 << 20) + b'"]}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 413


@pytest.mark.parametrize("raw", [b"{not json", b'{"queries": ["\xff"]}', b'{"queries": ["a"]', b"", b"null"])
def test_unparsable_json_is_422_on_body_as_documented(client, raw):
    r = client.post("/retrieve", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"].startswith("body: "), r.text


def test_oversized_chunked_body_is_413(client):
    def chunks():   # no content-length: the server learns the size only while reading
        for _ in range(40):
            yield b"a" * 65536
    r = client.post("/retrieve", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "over 1048576 bytes" in r.json()["error"]


# ---- concurrency ----------------------------------------------------------------------
@pytest.mark.parametrize("workers", [1, 2])
def test_concurrent_requests_are_micro_batched_and_answered_correctly(searcher, workers):
    calls = []
    real = searcher.encoder.encode_queries
    searcher.encoder.encode_queries = lambda texts: (calls.append(len(texts)), real(texts))[1]
    try:
        service = RetrievalService(searcher, max_wait_s=0.05, workers=workers)
        questions = list(QUESTIONS.items()) * 8          # 48 concurrent requests
        with live(create_app(service)) as url, httpx.Client(base_url=url, timeout=30) as http:
            def ask(pair):
                r = http.post("/retrieve", json={"queries": [pair[0]], "topk": 1})
                return r.json()["result"][0][0]["id"], pair[1]
            with ThreadPoolExecutor(len(questions)) as pool:
                answers = list(pool.map(ask, questions))
    finally:
        searcher.encoder.encode_queries = real
    assert all(got == want for got, want in answers)
    assert sum(calls) == len(questions)          # every query encoded exactly once
    assert len(calls) < len(questions) / 2       # ... in far fewer encoder calls than requests
    assert service.batcher.batches == len(calls)


def test_one_failing_request_does_not_fail_its_batch_mates(searcher):
    real = searcher.search

    def fragile(queries):
        if any(q.text == "POISON" for q in queries):
            raise RuntimeError("index exploded")
        return real(queries)

    searcher.search = fragile
    try:
        service = RetrievalService(searcher, max_wait_s=0.05)
        with live(create_app(service)) as url, httpx.Client(base_url=url, timeout=30) as http:
            texts = ["POISON"] + list(QUESTIONS)
            with ThreadPoolExecutor(len(texts)) as pool:
                codes = list(pool.map(lambda t: http.post("/retrieve", json={"queries": [t]}).status_code, texts))
            assert http.get("/health").status_code == 200
    finally:
        searcher.search = real
    assert codes[0] == 500 and codes[1:] == [200] * len(QUESTIONS)


def _half_sent(port: int) -> socket.socket:
    """A request whose headers promise 100 body bytes, of which 10 are sent: then silence."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n" + b'{"queries"')
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_half_sent_requests_get_408_and_their_connections_close(searcher):
    """50 stalled clients: each is answered 408 within the body deadline and disconnected,
    and a normal client is served meanwhile."""
    service = RetrievalService(searcher, None)
    with live(create_app(service, Limits(body_timeout_s=1.0))) as url:
        port = int(url.rsplit(":", 1)[1])
        started = time.monotonic()
        stalled = [_half_sent(port) for _ in range(50)]
        ok = httpx.post(f"{url}/retrieve", json={"queries": ["city on the Seine"], "topk": 1}, timeout=30)
        assert ok.status_code == 200
        answers = [_read_until_closed(sock) for sock in stalled]   # returns once the server closes
        elapsed = time.monotonic() - started
        for sock in stalled:
            sock.close()
    assert all(a.startswith(b"HTTP/1.1 408 ") and b"not received within 1 s" in a for a in answers), answers[0]
    assert elapsed < 1.0 + 5.0, elapsed


def test_slow_search_times_out_with_503(searcher):
    real = searcher.search
    searcher.search = lambda queries: (time.sleep(0.5), real(queries))[1]
    try:
        with serve(searcher, limits=Limits(request_timeout_s=0.1)) as (c, _):
            r = c.post("/retrieve", json={"queries": ["slow"]})
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert "longer than 0.1 s" in r.json()["error"]
    finally:
        searcher.search = real


def test_batcher_refuses_when_full_and_skips_cancelled_requests():
    from retrieval.batcher import MicroBatcher, Overloaded
    gate, seen = threading.Event(), []

    def fn(items):
        gate.wait(5)
        seen.extend(items)
        return [x * 10 for x in items]

    batcher = MicroBatcher(fn, max_pending=1)
    first = batcher.submit([1])
    deadline = time.monotonic() + 5
    while batcher._queue.qsize() and time.monotonic() < deadline:   # worker took `first`
        time.sleep(0.01)
    cancelled = batcher.submit([2])
    with pytest.raises(Overloaded):
        batcher.submit([3])
    assert cancelled.cancel()
    gate.set()
    assert first.result(5) == [10]
    assert batcher.submit([4, 5]).result(5) == [40, 50]
    batcher.close()
    assert seen == [1, 4, 5]          # the cancelled request never reached the index


# ---- web fallback through the real tavily-python client, against Tavily's API emulated locally ----
WEB_PAGES = {f"https://example.org/{i}": f"page text of volcano page {i}" + " eruption" * (3 - i) for i in range(3)}


def test_web_fallback_fills_topk_marks_web_hits_and_reports_fees(searcher):
    pytest.importorskip("tavily", reason="the web fallback needs tavily-python")
    from tavily_emulator import TavilyEmulator
    from orchestrator.catalog import load_catalog
    with TavilyEmulator(WEB_PAGES) as api:
        web = WebSearch("tvly-test", min_docs=3, base_url=api.base_url)
        with serve(searcher, web=web) as (c, _):
            body = c.post("/retrieve", json={"queries": ["volcano eruption"], "topk": 3, "eid": "q-one",
                                             "return_scores": True}).json()
            enough = c.post("/retrieve", json={"queries": ["volcano"], "topk": 3}).json()
    row = body["result"][0]
    assert ids(row) == ["volcano", "web:https://example.org/0", "web:https://example.org/1"]
    assert row[1]["document"] == {"id": "web:https://example.org/0", "url": "https://example.org/0",
                                  "contents": WEB_PAGES["https://example.org/0"], "source": "web"}
    assert "source" not in row[0]["document"]
    assert body["usage"] == {"web_searches": 1, "pages": 2}
    assert [path for path, _, _ in api.calls] == ["/search", "/extract"]
    assert enough["usage"] == {"web_searches": 0, "pages": 0}      # 3 index hits: no web call
    # tools.json fees: $0.01 per search + $0.002 per extracted page = 0.01 + 2 x 0.002
    assert load_catalog().search_cost(**body["usage"]) == pytest.approx(0.014)


def test_web_fallback_is_off_without_a_key(monkeypatch):
    pytest.importorskip("tavily", reason="the web fallback needs tavily-python")
    from retrieval.client import WebRetriever, web_retriever_from_env
    from retrieval.web import web_search_from_env
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    assert web_search_from_env() is None and web_retriever_from_env() is None
    monkeypatch.setenv("TAVILY_API_KEY", "tvly-x")
    assert isinstance(web_search_from_env(), WebSearch)
    assert isinstance(web_retriever_from_env(), WebRetriever)   # run_gaia.py's search: the web as the corpus


# ---- fuzzing the served OpenAPI schema: no input gives a 5xx ---------------------------
def test_openapi_fuzzing_finds_no_server_error(searcher):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings

    # Small limits keep each generated request cheap; the schema advertises them, so the
    # fuzzer also probes every boundary.
    limits = Limits(max_queries=4, max_query_chars=200, max_topk=10)
    service = RetrievalService(searcher)
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(service, limits))
    op = schema["/retrieve"]["POST"]

    @given(case=op.as_strategy())
    @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
    def fuzz(case):
        response = case.call()
        assert response.status_code < 500, (case.body, response.text[:300])

    try:
        fuzz()
    finally:
        service.close()


def test_slowloris_connections_are_closed_within_the_header_timeout(searcher):
    """Half a request line, headers trickled byte by byte, or nothing at all: each connection is
    closed by the server within `header_timeout_s` (+ slack); the client never gets to hold it.
    (A recv that outlives the socket timeout, i.e. a connection still held, fails the test.)"""
    from retrieval.server import server_config

    limits = Limits(header_timeout_s=1.0)
    app = create_app(RetrievalService(searcher, None), limits)
    with live(app, server_config(app, "127.0.0.1", 0, limits)) as url:   # as `python -m retrieval.server` runs
        port = int(url.rsplit(":", 1)[1])
        silent = socket.create_connection(("127.0.0.1", port), timeout=10)
        half = socket.create_connection(("127.0.0.1", port), timeout=10)
        half.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Ty")
        trickle = socket.create_connection(("127.0.0.1", port), timeout=10)
        trickled = b""
        try:
            for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n":   # a byte per 0.1 s: 4 s
                trickle.sendall(bytes([byte]))
                trickled += bytes([byte])
                time.sleep(0.1)
        except OSError:          # the server closed it: the rest of the headers never got in
            pass
        # a kept-alive connection that answered one request, then starts another and stalls
        kept = socket.create_connection(("127.0.0.1", port), timeout=10)
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first = kept.recv(65536)
        kept.sendall(b"GET /health HTTP/1.1\r\nHo")
        # headers without end past max_header_bytes: refused at once, not held until the deadline
        huge = socket.create_connection(("127.0.0.1", port), timeout=10)
        huge.sendall(b"GET /health HTTP/1.1\r\nX-Pad: " + b"a" * (limits.max_header_bytes + 100))
        answers = [_read_until_closed(s) for s in (silent, half, kept)]
        too_large = _read_until_closed(huge)
        try:
            _read_until_closed(trickle)
        except ConnectionResetError:   # the bytes it sent after the close made the server's side reset
            pass
        for s in (silent, half, trickle, kept, huge):
            s.close()
        ok = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)   # still serving
        # a body far larger than the header limit, sent with its headers, is the body's business
        big = httpx.post(f"http://127.0.0.1:{port}/retrieve", timeout=30,
                         json={"queries": ["city on the Seine"], "topk": 1, "pad": "x" * 200_000})
    assert first.startswith(b"HTTP/1.1 200 ") and ok.status_code == 200 and big.status_code == 200
    assert too_large.startswith(b"HTTP/1.1 431 ") and b"request headers over 16384 bytes" in too_large
    assert not trickled.endswith(b"\r\n\r\n"), "the trickled request was let in"   # closed mid-headers
    assert answers[0] == b""                                           # nothing sent: closed silently
    for answer in answers[1:]:
        assert answer.startswith(b"HTTP/1.1 408 ") and b"headers not received within 1 s" in answer, answer
