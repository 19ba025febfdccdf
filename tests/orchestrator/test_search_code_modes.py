"""How a search or code call lands in the episode, ours and upstream's way (settings `search.*`,
`code.*`), on hand-worked inputs.  tests/orchestrator/test_upstream_fixtures.py checks the same
paths against upstream's own output."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.catalog import load_catalog
from orchestrator.context import Document, EpisodeState, interleave_documents
from orchestrator.episodes.base import LoopConfig, Task
from orchestrator.extract import split_code, split_query
from orchestrator.loop import run_episode
from orchestrator.policy import PolicyOutput
from orchestrator.records import ExpertCall, LLMResponse, Usage
from orchestrator.settings import CodeSettings, QASettings, RetrievalSettings, SearchSettings
from orchestrator.setup import build_runtime


def docs(*pairs):
    return [Document(id=i, contents=c) for i, c in pairs]


def test_ours_appends_in_rank_order_skipping_ids_held():
    state = EpisodeState("q", documents=docs(("A", "a")))
    assert state.add_documents(docs(("B", "b"), ("A", "a again"), ("C", "a"))) == 2
    assert [d.id for d in state.documents] == ["A", "B", "C"]      # C's text repeats A's: kept (ids differ)


def test_upstream_eval_appends_last_rank_first_skipping_contents_held():
    # hits ranked [B, C, D, E]; reversed: E, D, C, B.  D repeats A's content, C repeats E's (added just before)
    state = EpisodeState("q", documents=docs(("A", "a")))
    hits = docs(("B", "b"), ("C", "e"), ("D", "a"), ("E", "e"))
    assert state.add_documents(hits[::-1], by="content") == 2
    assert [d.id for d in state.documents] == ["A", "E", "B"]


def test_upstream_training_interleaves_new_documents_into_held_ones():
    # 6 held, 3 new: each new one, then its share of 6 // 3 = 2 held ones
    assert interleave_documents(list("abcdef"), list("xyz")) == list("xabycdzef")
    # fewer held than new: held then new, as they are (no de-duplication)
    assert interleave_documents(list("ab"), list("xya")) == list("abxya")
    # a new one already placed is skipped; the held tail past the shares is appended unchecked
    assert interleave_documents(list("abcde"), list("xb")) == list("xabcde")
    # share 2: x a b | e (new here) c d | the tail "e" appended although held already
    assert interleave_documents(list("abcde"), list("xe")) == list("xabecde")
    assert interleave_documents(list("abc"), []) == list("abc")


def test_upstream_splits_take_what_upstream_takes():
    assert split_query("I will search.<query>capital of Japan</query>") == "capital of Japan"
    assert split_query("capital of Japan") == "capital of Japan"                  # no tag: the whole reply
    assert split_query("<query> x </query> and <query>y</query>") == "y"         # the last tag, unstripped
    two = "```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```"
    assert split_code(two) == "\nprint(2)\n"                                     # the last block, unstripped
    assert split_code("no fence here") == "no fence here"                        # upstream's quirk: all of it


class Recorder:
    """Experts that reply from a script and a retriever that records its requests."""

    def __init__(self, replies, hits=None):
        self.replies, self.hits, self.requests, self.prompts = list(replies), hits or [], [], []

    def llm(self, model, messages, **kw):
        self.prompts.append(messages[-1]["content"])
        return LLMResponse(model=model, text=self.replies.pop(0), usage=Usage(10, 5))

    def retrieve(self, queries, topk, **kw):
        self.requests.append({"queries": queries, "topk": topk, **kw})
        return [[{"document": {"id": d.id, "contents": d.contents}} for d in self.hits]]


def runtime(settings, rec, run_code=None):
    return build_runtime(None, {"qa": settings}, load_catalog(), retriever=rec, llm=rec.llm,
                         run_code=run_code or (lambda code, timeout: pytest.fail("no code expected")))


def test_a_query_shorter_than_the_minimum_searches_nothing():
    rec = Recorder(["<query>abc</query>"], hits=docs(("A", "a")))
    settings = QASettings(search=SearchSettings(query="upstream", min_query_chars=5))
    state = EpisodeState("the question", task_id="t1")
    call, _ = runtime(settings, rec).call("search", "search-1", state)
    assert rec.requests == [] and state.documents == [] and "shorter than 5" in call.output


def test_search_sends_eid_and_filters_as_the_settings_say():
    rec = Recorder(["<query>capital of Japan</query>"], hits=docs(("A", "a"), ("B", "b")))
    settings = QASettings(retrieval=RetrievalSettings(topk=7, send_eid=True, min_score=0.1, min_length=100),
                          search=SearchSettings(doc_order="reverse", dedupe="content"))
    state = EpisodeState("q", task_id="t1")
    runtime(settings, rec).call("search", "search-1", state)
    assert rec.requests == [{"queries": ["capital of Japan"], "topk": 7, "eid": "t1", "min_score": 0.1, "min_length": 100}]
    assert [d.id for d in state.documents] == ["B", "A"]
    rec = Recorder(["no tag"], hits=[])
    runtime(QASettings(), rec).call("search", "search-1", EpisodeState("the question", task_id="t1"))
    assert rec.requests == [{"queries": ["the question"], "topk": 3}]          # ours: no eid, no filters, the question


@pytest.mark.parametrize("code, stdout, exit_code, kept", [
    (CodeSettings(), "", 1, ""),                                                   # ours: every run kept ...
    (CodeSettings(extraction="upstream", output="stdout", keep_empty=False), "", 1, None),   # upstream: blank -> dropped
    (CodeSettings(extraction="upstream", output="stdout", keep_empty=False), "42\n", 0, "42\n"),
])
def test_code_output_kept_as_the_settings_say(code, stdout, exit_code, kept):
    reply = "```python\nprint(41)\n```\n```python\nprint(42)\n```"
    rec = Recorder([reply])
    ran = []

    def run_code(source, timeout):
        ran.append((source, timeout))
        return SimpleNamespace(stdout=stdout, stderr="Traceback: boom", exit_code=exit_code, timed_out=False,
                               duration_s=0.5)

    state = EpisodeState("q")
    runtime(QASettings(code=code), rec, run_code).call("enhance_reasoning", "reasoner-1", state)
    first = code.extraction == "ours"
    assert ran == [("print(41)" if first else "\nprint(42)\n", code.timeout)]
    if kept is None:
        assert state.code_blocks == []
    elif first:
        assert state.code_blocks[0].output == "[exit 1] Traceback: boom"      # ours: stderr and exit code appended
    else:
        assert state.code_blocks[0].output == kept


class OneCall:
    """A policy that calls `tool`/`alias` every turn and records the tools it was offered."""

    price_model = "Qwen3-8B"

    def __init__(self, plan):
        self.plan, self.offered = list(plan), []

    def act(self, messages, tools, **kw):
        self.offered.append(sorted(t["function"]["name"] for t in tools))
        tool, alias = self.plan.pop(0) if len(self.plan) > 1 else self.plan[0]
        text = f'<tool_call>{{"name": "{tool}", "arguments": {{"model": "{alias}"}}}}</tool_call>'
        return PolicyOutput(text=text, usage=Usage(5, 5), latency=0.0)


def test_no_retriever_no_search_tool_and_single_search_withdraws_it():
    rec = Recorder(["<answer>x</answer>"])
    policy = OneCall([("answer", "answer-1")])
    run_episode(Task("t", "q"), policy, build_runtime(None, {"qa": QASettings()}, load_catalog(), llm=rec.llm),
                LoopConfig(max_turns=1))
    assert "search" not in policy.offered[0] and "answer" in policy.offered[0]
    rec = Recorder(["<query>capital of Japan</query>", "<answer>x</answer>"], hits=docs(("A", "a")))
    policy = OneCall([("search", "search-1"), ("answer", "answer-1")])
    run_episode(Task("t", "q"), policy, runtime(QASettings(search=SearchSettings(single_search=True)), rec),
                LoopConfig(max_turns=2))
    assert "search" in policy.offered[0] and "search" not in policy.offered[1]
    policy = OneCall([("search", "search-1"), ("answer", "answer-1")])
    rec = Recorder(["<query>capital of Japan</query>", "<answer>x</answer>"], hits=docs(("A", "a")))
    run_episode(Task("t", "q"), policy, runtime(QASettings(), rec), LoopConfig(max_turns=2))
    assert "search" in policy.offered[1]                                        # ours: search stays offered


def test_expert_call_records_tool_for_per_tool_settings():
    assert ExpertCall(tool="answer", alias="a", model="m").tool == "answer"
