"""`python -m retrieval.server --frontends N`: N HTTP processes feeding one batch-worker process.

Real processes over real HTTP (uvicorn, FastAPI, MiniLM, FAISS flat on the tiny corpus): the
answers equal the single-process server's, concurrent clients spread over the front ends are all
answered from shared micro-batches, worker errors reach the client as one process reports them,
a dead worker turns /health and /retrieve into 503 and stops the server, SIGTERM stops it cleanly,
a SIGKILLed supervisor takes every child with it, and the endpoint is registered only once the
server answers (a start-up failure never registers it).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from _retrieval_world import TINY, live, write_jsonl

from retrieval.build_index import build
from retrieval.encoders import Encoder
from retrieval.frontends import RemoteService, local_url, serve_connection
from retrieval.searcher import Searcher
from retrieval.server import Limits, create_app
from retrieval.service import RetrievalService

pytestmark = pytest.mark.usefixtures("one_cpu_thread")   # conftest.py
ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = {"What is the capital of Japan?": "tokyo", "Who created the Python language?": "python",
             "highest mountain in the Himalayas": "everest", "music from New Orleans": "jazz",
             "city on the Seine": "paris", "How do plants store light energy?": "photosynthesis"}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("frontends")
    corpus = write_jsonl(folder / "corpus.jsonl", TINY)
    (folder / "eids.json").write_text(json.dumps({"q-music": ["jazz", "python"]}))
    build(corpus, folder / "index", encoder=Encoder(), progress=False)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server(index_dir: Path, frontends: int, *extra: str, env: dict | None = None):
    """`python -m retrieval.server` as a subprocess; yields (base URL, process) once the supervisor
    registered it in an endpoints file (its own, unless `extra` names one): every front end
    answers and the supervisor is past start-up. A front end's /health answers 200 earlier, while
    the supervisor still waits for the others; a worker killed then is a start-up failure (exit 1
    at once, no grace), which is not what the tests below look at."""
    port = free_port()
    scratch = tempfile.TemporaryDirectory()
    if "--endpoints-file" in extra:
        endpoints = Path(extra[extra.index("--endpoints-file") + 1])
    else:
        endpoints = Path(scratch.name) / "endpoints.json"
        extra = (*extra, "--endpoints-file", str(endpoints))
    cmd = [sys.executable, "-m", "retrieval.server", "--index", str(index_dir / "index"), "--port", str(port),
           "--eid-file", str(index_dir / "eids.json"), "--frontends", str(frontends), *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while url not in registered(endpoints):
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the server never registered (never finished starting)"
            time.sleep(0.1)
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        scratch.cleanup()


@pytest.fixture(scope="module")
def multi(index_dir):
    with server(index_dir, 2, "--max-wait-ms", "50") as (url, _):
        yield url


BODIES = [   # answered alike by one process and by front ends: hits, filters, errors
    {"queries": list(QUESTIONS), "topk": 2, "return_scores": True},
    {"queries": ["What is the capital of Japan?"]},
    {"queries": ["jazz in New Orleans", "the capital of Japan"], "topk": 5, "eid": "q-music", "return_scores": True},
    {"queries": ["volcano"], "topk": 2, "min_length": 20, "return_scores": True},
    {"queries": ["volcano"], "topk": 3, "min_score": 0.3, "return_scores": True},
    {"queries": ["x"], "eid": "q-nope"},                       # 422 from the worker's check
    {"queries": [], "topk": 3},                                # 422 from the front end's schema
    {"queries": ["q"], "topk": 201},
]


@pytest.mark.slow
def test_front_ends_answer_exactly_as_one_process(index_dir, multi):
    with server(index_dir, 1) as (single, _):
        want = [httpx.post(single + "/retrieve", json=b, timeout=30) for b in BODIES]
        raw = httpx.post(single + "/retrieve", content=b"{not json", timeout=30)
    got = [httpx.post(multi + "/retrieve", json=b, timeout=30) for b in BODIES]
    assert [r.status_code for r in got] == [r.status_code for r in want] == [200] * 5 + [422] * 3
    for g, w in zip(got, want):
        assert g.json() == w.json()
    assert want[5].json()["error"].startswith("eid: unknown eid 'q-nope'")
    bad = httpx.post(multi + "/retrieve", content=b"{not json", timeout=30)
    assert (bad.status_code, bad.json()) == (raw.status_code, raw.json())


def test_concurrent_clients_on_every_front_end_are_answered_from_shared_batches(multi):
    before = httpx.get(multi + "/health").json()
    sent = 0

    def ask(pair):      # a new connection per request, so that both front ends accept some
        r = httpx.post(multi + "/retrieve", json={"queries": [pair[0]], "topk": 1}, timeout=60)
        return r.json()["result"][0][0]["id"], pair[1]

    for _ in range(5):  # which process accepts a connection is the kernel's choice: ask until both did
        questions = list(QUESTIONS.items()) * 8
        with ThreadPoolExecutor(len(questions)) as pool:
            answers = list(pool.map(ask, questions))
        assert all(got == want for got, want in answers)
        sent += len(questions)
        health = httpx.get(multi + "/health").json()
        served = [a - b for a, b in zip(health["requests_per_frontend"], before["requests_per_frontend"])]
        if min(served) > 0:
            break
    assert health["frontends"] == 2 and sum(served) == sent and min(served) > 0, served
    assert health["batches"] - before["batches"] < sent      # one worker batched across the front ends


def test_the_front_ends_tokenise_every_query_and_the_worker_uses_their_tokens(multi):
    """With front ends, each query arrives at the worker tokenised (its one GIL only pads and runs
    the encoder): /health counts them; the answers equal one process's (the test above)."""
    before = httpx.get(multi + "/health").json()["pretokenized"]
    body = {"queries": list(QUESTIONS)[:3], "topk": 1}
    assert httpx.post(multi + "/retrieve", json=body, timeout=30).status_code == 200
    assert httpx.get(multi + "/health").json()["pretokenized"] - before == 3


def test_query_tokens_made_outside_the_encoder_give_its_vectors_and_are_the_ones_used():
    from retrieval.encoders import QueryTokenizer
    encoder = Encoder()
    texts = list(QUESTIONS)
    tokenize = QueryTokenizer(**encoder.query_tokenizer_spec())
    want = encoder.encode_queries(texts)
    rows = tokenize(texts)
    np.testing.assert_array_equal(encoder.encode_queries(texts, rows), want)
    mixed = [rows[0], None, *rows[2:]]
    np.testing.assert_array_equal(encoder.encode_queries(texts, mixed), want)
    # the rows are used as given: query 0 carrying query 1's tokens gets query 1's vector
    swapped = [rows[1], *rows[1:]]
    np.testing.assert_array_equal(encoder.encode_queries(texts, swapped)[0], want[1])
    # rows of another tokenizer (other keys) are made again here
    foreign = [{"input_ids": r["input_ids"]} for r in rows]
    np.testing.assert_array_equal(encoder.encode_queries(texts, foreign), want)


def test_a_front_ends_query_tokenizer_loads_without_transformers_and_tokenises_as_it(tmp_path):
    """Front ends tokenise with the `tokenizers` backend the worker's spec carries: the rows equal
    transformers' (truncation included), and loading it imports neither transformers nor torch
    (~6 s and hundreds of MB per front end on a busy 2-core node)."""
    from retrieval.encoders import QueryTokenizer
    spec = Encoder().query_tokenizer_spec()
    texts = list(QUESTIONS) + ["", "word " * 600, "Ünïcödé — “quotes” 漢字 😀", "x" * 3000]
    via_transformers = QueryTokenizer(**{k: spec[k] for k in ("path", "prefix", "max_length")})
    assert via_transformers.tokenizer is not None
    assert QueryTokenizer(**spec)(texts) == via_transformers(texts)
    (tmp_path / "spec.pkl").write_bytes(pickle.dumps(spec))
    code = ("import pickle, sys; from retrieval.frontends import query_tokenizer; "
            f"q = query_tokenizer(pickle.load(open({str(tmp_path / 'spec.pkl')!r}, 'rb'))); q(['x']); "
            "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr[-2000:])


@contextmanager
def piped(service: RetrievalService, limits: Limits | None = None):
    """A front-end app over a real pipe to `serve_connection` (the worker's loop) in this process."""
    front, back = mp.Pipe(duplex=True)
    # closing `front` from this thread does not wake `remote`'s reader thread blocked in recv on it,
    # so the socket stays open and the worker loop would not see EOF (the join below waited its 10 s
    # out); shutting the socket down (through a duplicate of its descriptor) wakes both ends
    wake = socket.socket(fileno=os.dup(front.fileno()))
    worker = threading.Thread(target=serve_connection, args=(service, back, 0, [0]), daemon=True)
    worker.start()
    remote = RemoteService(front)
    try:
        with live(create_app(remote, limits or Limits())) as url:     # its shutdown closes `remote`
            yield url
    finally:
        remote.close()
        wake.shutdown(socket.SHUT_RDWR)
        wake.close()
        worker.join(10)
        back.close()
    assert not worker.is_alive(), "the worker loop did not end when its front end closed"


def test_worker_errors_reach_the_client_as_one_process_answers_them(index_dir):
    searcher = Searcher(index_dir / "index", eid_file=index_dir / "eids.json")
    real, seen = searcher.search, []

    def fragile(queries):
        seen.extend(q.text for q in queries)
        if any(q.text == "POISON" for q in queries):
            raise RuntimeError("index exploded")
        if any(q.text == "SLOW" for q in queries):
            time.sleep(2.0)
        return real(queries)

    searcher.search = fragile
    with piped(RetrievalService(searcher, max_wait_s=0.05)) as url:
        texts = ["POISON"] + list(QUESTIONS)
        with ThreadPoolExecutor(len(texts)) as pool:
            codes = list(pool.map(lambda t: httpx.post(url + "/retrieve", json={"queries": [t]}, timeout=30), texts))
        unknown = httpx.post(url + "/retrieve", json={"queries": ["x"], "eid": "q-nope"}, timeout=30)
        health = httpx.get(url + "/health", timeout=30)
    with piped(RetrievalService(searcher), Limits(request_timeout_s=0.5)) as url, ThreadPoolExecutor(2) as pool:
        # SLOW holds the worker for 2 s; LATE, queued behind it, times out and is cancelled
        slow = pool.submit(httpx.post, url + "/retrieve", json={"queries": ["SLOW"]}, timeout=30)
        deadline = time.monotonic() + 10
        while "SLOW" not in seen:          # SLOW's batch is being searched
            assert time.monotonic() < deadline
            time.sleep(0.01)
        late = pool.submit(httpx.post, url + "/retrieve", json={"queries": ["LATE"]}, timeout=30).result()
        slow = slow.result()
    assert codes[0].status_code == 500 and codes[0].text == "Internal Server Error"     # as in one process
    assert [c.status_code for c in codes[1:]] == [200] * len(QUESTIONS)
    assert unknown.status_code == 422 and unknown.json()["error"].startswith("eid: unknown eid 'q-nope'")
    assert unknown.json()["detail"][0]["loc"] == ["body", "eid"]
    assert slow.status_code == late.status_code == 503 and "longer than 0.5 s" in late.json()["error"]
    assert "LATE" not in seen          # its cancellation reached the worker before the batcher took it
    assert health.status_code == 200 and health.json()["requests_per_frontend"] == [len(texts) + 1]


def test_errors_cross_the_pipe_as_their_own_kind():
    from retrieval.batcher import Overloaded
    from retrieval.frontends import WorkerError, decode_error, encode_error
    from retrieval.searcher import QueryError
    back = decode_error(*encode_error(QueryError("eid", "unknown eid 'x'")))
    assert isinstance(back, QueryError) and back.field == "eid" and str(back) == "eid: unknown eid 'x'"
    back = decode_error(*encode_error(Overloaded("4096 requests already waiting")))
    assert isinstance(back, Overloaded) and str(back) == "4096 requests already waiting"
    back = decode_error(*encode_error(KeyError("gone")))
    assert type(back) is WorkerError and str(back) == "KeyError: 'gone'"


@pytest.mark.slow
def test_a_dead_worker_turns_health_and_requests_into_503_then_the_server_exits(index_dir):
    # a 10 s window (5 by default): on a loaded box the checks below may take longer than 5 s (they
    # must end inside it: the health poll is bounded at 3 s); the test then waits the window out
    with server(index_dir, 2, env={"RETRIEVAL_WORKER_GONE_GRACE_S": "10"}) as (url, proc):
        worker = httpx.get(url + "/health").json()["worker_pid"]
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 3
        while (health := httpx.get(url + "/health", timeout=10)).status_code == 200:
            assert time.monotonic() < deadline, "the front end did not notice the worker's death"
            time.sleep(0.05)
        r = httpx.post(url + "/retrieve", json={"queries": ["city on the Seine"]}, timeout=10)
        assert proc.wait(60) == 1
    assert health.status_code == 503 and health.json()["status"] == "down"
    assert r.status_code == 503 and r.json()["error"].startswith("the batch worker exited")
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=5)


@pytest.mark.slow
def test_sigterm_stops_every_process_and_unregisters(index_dir, tmp_path):
    endpoints = tmp_path / "endpoints.json"
    with server(index_dir, 2, "--endpoints-file", str(endpoints)) as (url, proc):
        health = httpx.get(url + "/health").json()
        assert registered(endpoints) == [url]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert json.loads(endpoints.read_text()).get("retrieval", []) == []
    for pid in (health["worker_pid"], health["frontend_pid"]):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("argv, message", [
    (["--index", "/nonexistent/index", "--frontends", "2"], "/nonexistent/index: no meta.json"),
    (["--index", "/nonexistent/index", "--frontends", "0"], "--frontends 0: give 1"),
])
def test_bad_flags_exit_2_naming_them(argv, message):
    done = subprocess.run([sys.executable, "-m", "retrieval.server", *argv, "--port", "0"], cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_a_sigkilled_supervisor_takes_every_child_and_the_port_with_it(index_dir):
    with server(index_dir, 2) as (url, proc):
        health = httpx.get(url + "/health").json()
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert {health["worker_pid"], health["frontend_pid"]} <= set(children) and len(children) >= 3
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 5
        while left := [pid for pid in children if alive(pid)]:
            assert time.monotonic() < deadline, f"orphans still running: {left}"
            time.sleep(0.05)
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=5)
    with socket.socket() as s:          # nobody holds the port any more
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(url.rsplit(":", 1)[1])))


GRANDCHILD = """
import os, sys, time
from retrieval.lifeline import die_with_parent
kernel = sys.argv[1] == "prctl"
print("armed", die_with_parent(os.getppid(), poll_s=600 if kernel else 0.1, use_prctl=kernel), flush=True)
time.sleep(120)
"""
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
print(child.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("mechanism", ["prctl", "watcher"])
def test_each_lifeline_mechanism_alone_kills_the_child_with_its_parent(mechanism):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, GRANDCHILD, mechanism], cwd=ROOT, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE)
    try:
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().split() == ["armed", str(mechanism == "prctl")]
        assert alive(child)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 5
        while alive(child):
            assert time.monotonic() < deadline, f"{mechanism}: the child outlived its parent"
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.wait(10)


HOOKS = """
import os, time
import retrieval.frontends as frontends
real_frontend, real_worker = frontends.frontend_main, frontends.worker_main


def slow_frontend_main(*args):          # a front end slow to start (imports on a busy node)
    time.sleep(float(os.environ["HOOK_DELAY_S"]))
    with open(os.path.join(os.environ["HOOK_DIR"], f"up-{os.getpid()}"), "w") as out:
        out.write(repr(time.time()))
    real_frontend(*args)


def crashing_frontend_main(*args):
    raise SystemExit(3)


def failing_worker_main(*args):         # the index load raises what a GPU may raise
    def broken(_args):
        raise RuntimeError("CUDA error: out of memory (test hook)")
    real_worker(*args[:-1], broken)     # (the last argument is the service loader)
"""


@contextmanager
def hooked(index_dir: Path, tmp_path: Path, patches: dict, *extra: str):
    """The server with retrieval.frontends functions replaced (in the children too: spawn pickles
    a target by module and name, so the child imports it from `hooks`); yields (url, process, stderr file)."""
    (tmp_path / "hooks.py").write_text(HOOKS)
    lines = "; ".join(f"frontends.{name} = hooks.{hook}" for name, hook in patches.items())
    driver = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import hooks, retrieval.frontends as frontends; "
              f"import retrieval.server as server; {lines}; sys.exit(server.main(sys.argv[1:]))")
    port = free_port()
    stderr = tmp_path / "stderr.txt"
    with open(stderr, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", driver, "--index", str(index_dir / "index"), "--port", str(port),
                                 "--frontends", "2", *extra], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "HOOK_DIR": str(tmp_path),
                                     "HOOK_DELAY_S": "4"})
    try:
        yield f"http://127.0.0.1:{port}", proc, stderr
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)


def registered(endpoints: Path) -> list[str]:
    try:
        return [r["base_url"] for r in json.loads(endpoints.read_text()).get("retrieval", [])]
    except FileNotFoundError:
        return []


@pytest.mark.slow
def test_the_endpoint_is_registered_only_once_every_front_end_answers(index_dir, tmp_path):
    endpoints = tmp_path / "endpoints.json"
    with hooked(index_dir, tmp_path, {"frontend_main": "slow_frontend_main"},
                "--endpoints-file", str(endpoints)) as (url, proc, stderr):
        deadline = time.monotonic() + 180
        while not registered(endpoints):
            assert proc.poll() is None, stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, "never registered"
            time.sleep(0.02)
        seen = time.time()
        health = httpx.get(url + "/health", timeout=30)
        assert registered(endpoints) == [url]
    up = [float(f.read_text()) for f in tmp_path.glob("up-*")]
    assert len(up) == 2 and seen > max(up), "registered while a front end was still starting"
    assert health.status_code == 200 and health.json()["frontends"] == 2


@pytest.mark.parametrize("patches, code, message", [
    ({"worker_main": "failing_worker_main"}, 1, "error: RuntimeError: CUDA error: out of memory (test hook)"),
    ({"frontend_main": "crashing_frontend_main"}, 1, "error: retrieval-frontend-"),
])
def test_a_start_up_failure_never_registers_and_exits_with_its_error(index_dir, tmp_path, patches, code, message):
    endpoints = tmp_path / "endpoints.json"
    with hooked(index_dir, tmp_path, patches, "--endpoints-file", str(endpoints)) as (_, proc, stderr):
        assert proc.wait(180) == code, stderr.read_text()[-3000:]
    assert message in stderr.read_text() and registered(endpoints) == []


@pytest.mark.parametrize("host, url", [("127.0.0.1", "http://127.0.0.1:80"), ("0.0.0.0", "http://127.0.0.1:80"),
                                       ("::", "http://[::1]:80"), ("node7", "http://node7:80")])
def test_the_supervisor_checks_health_on_its_own_address(host, url):
    assert local_url(host, 80) == url
