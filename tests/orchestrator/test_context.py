from pathlib import Path

import pytest

from orchestrator.context import (Budgets, CodeBlock, Document, EpisodeState, PromptError, Prompts, TokenCounter,
                                  build_messages, evidence_line)
from orchestrator.embedded import smollm2_path
from orchestrator.extract import extract_answer, extract_boxed, extract_code, extract_query


def test_messages_are_two_fresh_messages_with_problem_docs_and_code():
    state = EpisodeState("Who wrote Hamlet?")
    state.add_documents([Document("d1", "Hamlet is a tragedy by William Shakespeare.")])
    state.code_blocks.append(CodeBlock("print(1+1)", "2"))
    msgs = build_messages(state, Prompts.load(), Budgets(), TokenCounter())
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"] == "You are good at using tools."
    user = msgs[1]["content"]
    assert user.startswith("Problem: Who wrote Hamlet?")
    assert "Document 1 (id d1):\nHamlet is a tragedy" in user and "print(1+1)" in user and "Output:\n2" in user


def test_duplicate_documents_are_not_added_twice():
    state = EpisodeState("q")
    assert state.add_documents([Document("a", "x"), Document("b", "y")]) == 2
    assert state.add_documents([Document("a", "x"), Document("c", "z")]) == 1
    assert [d.id for d in state.documents] == ["a", "b", "c"]


def test_document_budget_keeps_head_total_budget_keeps_tail():
    counter = TokenCounter()  # 4 characters per token
    state = EpisodeState("q")
    state.add_documents([Document(str(i), f"DOC{i:02d}" + "x" * 400) for i in range(20)])
    msgs = build_messages(state, Prompts.load(), Budgets(doc_tokens=10, context_tokens=200), counter)
    user = msgs[1]["content"]
    assert "DOC19" + "x" * 35 + "\n" in user                    # head of each doc: 10 tokens = 40 chars
    assert "DOC19" + "x" * 36 not in user
    assert "DOC00" not in user                                      # oldest docs cut first
    assert user.startswith("Problem: q")                            # the problem always stays
    assert counter.count(msgs[0]["content"]) + counter.count(user) <= 200 + 60  # template slack


def test_token_budgets_with_a_real_tokenizer():
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(smollm2_path())
    counter = TokenCounter(tok)
    text = "alpha beta gamma delta " * 50
    assert counter.count(counter.head(text, 7)) <= 7 and counter.head(text, 7).startswith("alpha")
    assert counter.count(counter.tail(text, 7)) <= 8 and counter.tail(text, 7).rstrip().endswith("delta")


def test_custom_prompt_folder_overrides_and_validates(tmp_path: Path):
    (tmp_path / "system.txt").write_text("Be frugal.")
    assert Prompts.load(tmp_path).render("system") == "Be frugal."
    (tmp_path / "user.txt").write_text("Problem: {question} {nope}")
    with pytest.raises(PromptError, match=r"user.txt: unknown placeholder\(s\) \['nope'\]"):
        Prompts.load(tmp_path)
    (tmp_path / "user.txt").write_text("no question here {documents}{code}")
    with pytest.raises(PromptError, match="must contain the {question}"):
        Prompts.load(tmp_path)


def test_evidence_tally_placeholder_counts_documents_and_code(tmp_path: Path):
    state = EpisodeState("q")
    assert evidence_line(state) == "Evidence so far: none."
    state.add_documents([Document("a", "x")])
    assert evidence_line(state) == "Evidence so far: 1 document."
    state.add_documents([Document("b", "y")])
    state.code_blocks.append(CodeBlock("print(1)", "1"))
    assert evidence_line(state) == "Evidence so far: 2 documents, 1 code result."
    (tmp_path / "user.txt").write_text("{documents}{code}Problem: {question}\n{evidence}")
    user = build_messages(state, Prompts.load(tmp_path), Budgets(), TokenCounter())[1]["content"]
    assert user.endswith("Problem: q\nEvidence so far: 2 documents, 1 code result.")
    # the default prompt does not use it: its user message is unchanged
    assert "Evidence so far" not in build_messages(state, Prompts.load(), Budgets(), TokenCounter())[1]["content"]


def test_extractors():
    assert extract_query("x <query>capital of France</query>", "q") == "capital of France"
    assert extract_query("nothing", "the question") == "the question"
    assert len(extract_query("<query>" + "a" * 1000 + "</query>", "q")) == 390
    assert extract_code("Here:\n```python\nprint(2)\n```") == "print(2)"
    assert extract_code("no code") is None
    assert extract_boxed(r"so \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert extract_answer("<think>hmm</think>The answer is <answer>Paris</answer>") == "Paris"
    assert extract_answer(r"thus \boxed{42}") == "42"
    assert extract_answer("line one\nParis\n") == "Paris"


def test_the_counter_encodes_each_text_once_however_often_a_turn_rebuilds_the_context():
    """An episode re-renders its documents every turn; the counter remembers their token ids,
    with the same counts and cuts as encoding afresh."""
    from orchestrator.context import TokenCounter

    class Spy:
        calls = 0

        def encode(self, text, add_special_tokens=False):
            Spy.calls += 1
            return [ord(ch) for ch in text]

        def decode(self, ids):
            return "".join(chr(i) for i in ids)

    counter = TokenCounter(Spy())
    doc = "abcdefghij" * 3
    for _ in range(5):
        assert counter.count(doc) == 30
        assert counter.head(doc, 4) == "abcd" and counter.tail(doc, 3) == "hij"
        assert counter.head(doc, 40) == doc
    assert Spy.calls == 1
    assert counter.count("xyz") == 3 and Spy.calls == 2
