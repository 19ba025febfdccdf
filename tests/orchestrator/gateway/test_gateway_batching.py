"""The gateway's transformers backend over training's engine stack (a recording stub engine
behind the real `BatchingEngine`): concurrent requests share engine calls, seeded ones run
alone, the timeout reaches the engine as a deadline, stop strings and usage follow vLLM,
engine errors are not retried."""
from __future__ import annotations

import threading
import time

import pytest
from _gateway_fakes import write_registry

from LLM_CALL import LLMCallError, get_llm_response
from orchestrator.engines.interface import Generation
from orchestrator.gateway.backends import transformers_backend


class WordTokenizer:
    """One id per word (its length); a template that takes tools, so the prompt is the words."""

    chat_template = "{{ tools }}"

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, tokenize=False):
        return " ".join(m["content"] for m in messages)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [len(w) for w in text.split()]}


class StubEngine:
    """Records every call; replies `reply` to each row (its ids: 3 tokens), or what `finish` says."""

    tokenizer = WordTokenizer()

    def __init__(self, reply="a reply", finish="stop", delay=0.1, error=None):
        self.reply, self.finish, self.delay, self.error = reply, finish, delay, error
        self.calls: list[dict] = []

    def generate(self, prompts, params, *, seeds=None, deadlines=None):
        self.calls.append({"prompts": prompts, "params": params, "seeds": seeds, "deadlines": deadlines,
                           "at": time.monotonic()})
        time.sleep(self.delay)
        if self.error:
            raise self.error
        return [Generation(token_ids=[7, 8, 9], logprobs=[0.0] * 3, text=self.reply, finish_reason=self.finish)
                for _ in prompts]


@pytest.fixture
def serve(tmp_path, monkeypatch):
    """Register model `local` (max_retries 2): the backend builds its BatchingEngine as it does for a
    real model (`load_engine`), over the given stub instead of an HFEngine."""
    def make(engine: StubEngine) -> None:
        monkeypatch.setattr(transformers_backend, "HFEngine", lambda path, **kw: engine)
        monkeypatch.setattr(transformers_backend, "_engines", {})
        models = {"local": {"backend": "transformers", "path": "/stub", "price_model": "Qwen3-8B", "max_retries": 2}}
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(write_registry(tmp_path / "models.yaml", models)))
    return make


def ask(text: str, **kw):
    return get_llm_response("local", [{"role": "user", "content": text}], **{"temperature": 0, "max_tokens": 8, **kw})


def test_concurrent_requests_share_engine_calls_and_seeded_ones_run_alone(serve):
    engine = StubEngine()
    serve(engine)
    requests = [("one", {}), ("one two", {}), ("one two three", {}), ("s1", {"seed": 1}), ("s22", {"seed": 2})]
    start, results = threading.Barrier(len(requests)), [None] * len(requests)

    def go(i):
        start.wait()
        results[i] = ask(requests[i][0], **requests[i][1])
    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(r is not None and r.text == "a reply" for r in results)
    seeded = [c for c in engine.calls if c["params"].seed is not None]
    assert sorted((c["prompts"], c["seeds"]) for c in seeded) == [([[2]], [1]), ([[3]], [2])]   # alone, own seed
    unseeded = [p for c in engine.calls if c["params"].seed is None for p in c["prompts"]]
    assert sorted(unseeded) == [[3], [3, 3], [3, 3, 5]]
    assert len(engine.calls) < len(requests)                   # the unseeded requests shared a call
    assert [r.usage.prompt_tokens for r in results] == [1, 2, 3, 1, 1]
    assert all(r.usage.completion_tokens == 3 for r in results)


def test_the_timeout_is_the_engines_deadline_and_stop_strings_are_cut(serve):
    engine = StubEngine(reply="the answer STOP and more")
    serve(engine)
    before = time.monotonic()
    r = ask("hi", timeout=5.0, stop="STOP", top_p=0.5)
    call = engine.calls[0]
    assert before + 5.0 <= call["deadlines"][0] <= time.monotonic() + 5.0
    assert call["params"].stop == ["STOP"] and call["params"].top_p == 0.5 and call["params"].temperature == 0
    assert r.text == "the answer " and r.raw_finish_reason == "stop"      # vLLM: the stop string is cut


def test_a_reply_cut_by_the_deadline_is_a_timeout_error(serve):
    engine = StubEngine(finish="timeout")
    serve(engine)
    with pytest.raises(LLMCallError, match=r"local: .*timed out after 0.5 s \(3 tokens generated\)"):
        ask("hi", timeout=0.5)
    assert len(engine.calls) == 1                                 # not retried


def test_engine_value_errors_name_the_model_and_are_not_retried(serve):
    engine = StubEngine(error=ValueError("SamplingParams.top_p=2 must lie in (0, 1]"))
    serve(engine)
    with pytest.raises(LLMCallError, match=r"local: .*top_p=2 must lie in"):
        ask("hi", top_p=2)
    assert len(engine.calls) == 1


def test_extras_the_engine_does_not_sample_with_are_refused(serve):
    engine = StubEngine()
    serve(engine)
    with pytest.raises(LLMCallError, match=r"does not take \['top_k'\]; supported extras: \['top_p', 'stop', 'seed'\]"):
        ask("hi", top_k=5)
    assert engine.calls == []


class GenerateUntilCancelled(StubEngine):
    """Generates for up to a minute, unless the row's cancel event is set first (HFEngine: at its next token)."""

    def generate(self, prompts, params, *, seeds=None, deadlines=None, cancels=None):
        self.calls.append({"prompts": prompts, "cancels": cancels, "at": time.monotonic()})
        event = (cancels or [None])[0]
        stopped = event is not None and event.wait(60)
        return [Generation(token_ids=[7], logprobs=[0.0], text="a", finish_reason="cancelled" if stopped else "length")
                for _ in prompts]


def test_a_call_under_a_cancel_event_stops_generating_once_it_is_set(serve):
    """orchestrator/cancellation.py: the server runs an episode under its request's event; the event
    reaches the engine's row, and a cancelled call is an error at once, not retried (max_retries 2)."""
    from orchestrator.cancellation import cancellable

    engine = GenerateUntilCancelled()
    serve(engine)
    event, out = threading.Event(), {}

    def call():
        with cancellable(event):
            try:
                get_llm_response("local", [{"role": "user", "content": "think for a long time"}], max_tokens=100_000)
            except LLMCallError as exc:
                out["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 30
    while not engine.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.calls and engine.calls[0]["cancels"] == [event]    # generating, with the caller's event
    event.set()
    thread.join(timeout=30)
    assert not thread.is_alive() and "cancelled: the caller went away" in str(out["error"])
    assert len(engine.calls) == 1                                     # not retried
