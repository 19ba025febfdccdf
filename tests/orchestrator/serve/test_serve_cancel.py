"""A client that goes away frees its slot within seconds, its model call included (not at the
episode's next turn); and the server loads its models at start-up behind GET /health/ready."""
import dataclasses
import threading
import time

import httpx
import openai
import pytest

from _serve_world import ANSWER, ENDLESS, ask, client, health, wait_for
from orchestrator.serve import Background, ServeLimits, create_app

SLOW_S = 120.0      # the mock's reply delay: a model call that would hold the slot for two minutes


def test_a_disconnect_mid_call_frees_the_slot_at_once(served, backend):
    """Concurrency 1, the orchestrator's model call in flight (the backend answers in 120 s): the
    client goes away; the slot is free within seconds and a new request is served."""
    limits = ServeLimits(concurrency=1, queue=0)
    with Background(create_app(served[0], limits)) as srv:
        backend.delay_s = SLOW_S
        try:
            stream = ask(srv, question=ENDLESS, stream=True)
            next(iter(stream))                                        # the role chunk: the episode starts
            wait_for(lambda: backend.inflight >= 1)                   # its first model call is in flight
            stream.close()                                            # the client goes away
            wait_for(lambda: health(srv)["running"] == 0, seconds=5)  # not SLOW_S: the call was cancelled
        finally:
            backend.delay_s = 0.0
        assert ask(srv).choices[0].message.content == ANSWER         # concurrency 1: the slot is free again
        assert health(srv)["finished"] == {"disconnected": 1, "answer": 1}
        # a non-streaming client that gives up (its read timeout) is the same
        backend.delay_s = SLOW_S
        try:
            with pytest.raises(openai.APITimeoutError):
                client(srv, timeout=1.0).chat.completions.create(
                    model="mock-orch", messages=[{"role": "user", "content": ENDLESS}])
            wait_for(lambda: health(srv)["running"] == 0, seconds=5)
        finally:
            backend.delay_s = 0.0
        assert ask(srv).choices[0].message.content == ANSWER
        assert health(srv)["finished"] == {"disconnected": 2, "answer": 2}


def test_models_load_at_start_up_behind_the_readiness_endpoint(served):
    """Until `Served.load` ends, /health/ready and chat answer 503 (OpenAI's shape, Retry-After) and
    /health is live; then ready; a failed load stays 503 and says why."""
    gate = threading.Event()
    loads = []

    def load():
        loads.append(time.monotonic())
        assert gate.wait(30)

    app = create_app(dataclasses.replace(served[0], load=load), ServeLimits(concurrency=1, queue=1))
    with Background(app, ready=False) as srv:
        wait_for(lambda: loads)                                      # the start-up began loading, unasked
        r = httpx.get(srv.url + "/health/ready")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "loading" and r.json()["error"]["message"].startswith("loading: ")
        h = health(srv)
        assert h["status"] == "ok" and not h["ready"] and h["load_seconds"] is None
        with pytest.raises(openai.APIStatusError) as caught:
            ask(srv)
        assert caught.value.status_code == 503 and caught.value.body["code"] == "loading"
        gate.set()
        wait_for(lambda: httpx.get(srv.url + "/health/ready").status_code == 200)
        ready = httpx.get(srv.url + "/health/ready").json()
        assert ready["status"] == "ready" and ready["load_seconds"] > 0
        assert ask(srv).choices[0].message.content == ANSWER
        assert len(loads) == 1                                       # once, at start-up; not per request

    def broken():
        raise OSError("no model at /nowhere")

    with Background(create_app(dataclasses.replace(served[0], load=broken))) as srv:
        r = httpx.get(srv.url + "/health/ready")
        error = r.json()["error"]
        assert r.status_code == 503 and error["code"] == "load_failed"
        assert error["message"] == "loading the models failed: OSError: no model at /nowhere"
        with pytest.raises(openai.APIStatusError) as caught:
            ask(srv)
        assert caught.value.status_code == 503 and caught.value.body["code"] == "load_failed"
