"""Under the paper profile the orchestrator sees upstream's own prompts (orchestrator/upstream_prompts.py).

Each expected value below is upstream's construction, transcribed from NVlabs/ToolOrchestra
(3d29bed) evaluation/eval_hle.py and eval_frames.py (line numbers in each test), with
upstream's `cut_seq` (tail of `l` tokens) played by the same TokenCounter.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.catalog import load_catalog
from orchestrator.context import (
    UPSTREAM_PROMPTS_DIR,
    Budgets,
    CodeBlock,
    Document,
    EpisodeState,
    Prompts,
    TokenCounter,
)
from orchestrator.prompt_style import turn_messages
from orchestrator.records import LLMResponse
from orchestrator.runtime import ToolRuntime
from orchestrator.settings import ExpertSettings, QASettings
from orchestrator.upstream_prompts import (
    expert_context_upstream,
    extract_answer_upstream,
)

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_TOOLS = REPO.parent / "shared" / "benchmarks" / "upstream" / "tools.json"
C = TokenCounter()


def cut_seq(seq: str, l: int) -> dict:
    return {"effective_length": C.count(seq) if seq else 0, "string_after_cut": C.tail(seq, l) if seq else ""}


def upstream_hle_user(problem, doc_list, code_list):
    """eval_hle.py 430-474 (attempt_list is always empty in evaluation)."""
    doc_str = "".join(f"Doc {i+1}: {doc[:1200]} ...\n\n" for i, doc in enumerate(doc_list))
    code_str = "".join(f"```python\n{c['code']}\n```\n\n```output\n{c['output']}\n```\n\n" for c in code_list)
    str_cut = cut_seq(code_str, 12000)
    code_attempt_str, code_attempt_str_len = str_cut["string_after_cut"], str_cut["effective_length"]
    if not code_attempt_str.startswith("```") and len(code_attempt_str) > 0:
        code_attempt_str = "```\n" + code_attempt_str
    problem_length = C.count(problem)
    if code_attempt_str_len < 27000 - problem_length:
        if code_attempt_str:
            context_str = cut_seq(doc_str + "\npython code and execution outputs:\n" + code_attempt_str, 27000 - problem_length)
        else:
            context_str = cut_seq(doc_str, 27000 - problem_length)
        context_str = context_str["string_after_cut"]
        if len(doc_str) > 0:
            context_str = "Documents:\n" + context_str
    else:
        context_str = code_attempt_str
    return f"Problem: {problem}\n\n{context_str}\n\nChoose an appropriate tool.'"


def upstream_frames_user(problem, doc_list, code_list):
    """eval_frames.py 483-524."""
    doc_str = "".join(f"Doc {i+1}: {doc[:4000]}\n\n" for i, doc in enumerate(doc_list))
    code_str = "".join(f"```python\n{c['code']}\n```\n\n```output\n{c['output']}\n```\n\n" for c in code_list)
    str_cut = cut_seq(code_str, 12000)
    code_attempt_str, code_attempt_str_len = str_cut["string_after_cut"], str_cut["effective_length"]
    if not code_attempt_str.startswith("```") and len(code_attempt_str) > 0:
        code_attempt_str = "```\n" + code_attempt_str
    if code_attempt_str_len < 24000:
        context_str = cut_seq(doc_str + "\npython code and execution outputs:\n" + code_attempt_str, 24000)["string_after_cut"]
        if len(doc_str) > 0:
            context_str = "Documents:\n" + context_str
    else:
        context_str = code_attempt_str
    return f"Problem: {problem}\n\n{context_str}\n\nChoose an appropriate tool."


def state_with(n_docs=2, doc_len=1500, code_out_len=50, n_code=1):
    s = EpisodeState("What is the capital of Japan?", task_id="q1")
    s.documents = [Document(id=str(i), contents=f"doc{i} " + "x" * doc_len) for i in range(n_docs)]
    s.code_blocks = [CodeBlock(code=f"print({i})", output="y" * code_out_len) for i in range(n_code)]
    return s


def render(style, state):
    prompts = Prompts.load(UPSTREAM_PROMPTS_DIR / style.removeprefix("upstream-"), style=style)
    return turn_messages(state, prompts, Budgets(), C)


@pytest.mark.parametrize("style, reference", [("upstream-hle", upstream_hle_user), ("upstream-frames", upstream_frames_user)])
@pytest.mark.parametrize("shape", [{"n_docs": 0, "n_code": 0}, {}, {"n_docs": 0}, {"n_code": 0},
                                   {"n_docs": 40, "doc_len": 5000},                # documents overflow: tail kept
                                   {"n_code": 30, "code_out_len": 3000},           # code overflows its 12k
                                   {"n_docs": 5, "n_code": 40, "code_out_len": 8000}])  # code alone beyond the room
def test_orchestrator_prompt_equals_upstream_construction(style, reference, shape):
    state = state_with(**shape)
    messages = render(style, state)
    expected = reference(state.question, [d.contents for d in state.documents],
                         [{"code": c.code, "output": c.output} for c in state.code_blocks])
    assert messages == [{"role": "system", "content": "You are good at using tools."},
                        {"role": "user", "content": expected}]


def test_orchestrator_prompt_literal_example():
    s = EpisodeState("Q?")
    s.documents = [Document(id="a", contents="Alpha.")]
    s.code_blocks = [CodeBlock(code="print(1)", output="1")]
    user = render("upstream-hle", s)[1]["content"]
    assert user == ("Problem: Q?\n\nDocuments:\nDoc 1: Alpha. ...\n\n\npython code and execution outputs:\n"
                    "```python\nprint(1)\n```\n\n```output\n1\n```\n\n\n\nChoose an appropriate tool.'")


@pytest.mark.skipif(not UPSTREAM_TOOLS.exists(), reason=f"{UPSTREAM_TOOLS} absent (the ../shared folder is not here)")
def test_tool_schemas_equal_upstream_tools_json():
    catalog = load_catalog()
    runtime = ToolRuntime(catalog=catalog, prompts=Prompts.load(UPSTREAM_PROMPTS_DIR / "hle", style="upstream-hle"))
    qa = [t for t in catalog.tools if t.kind in ("search", "code", "answer")]
    expected = json.loads(UPSTREAM_TOOLS.read_text())
    # upstream's one typo in a price ("$$0.2" for answer-math-2) is not reproduced (docs/evaluation.md)
    text = json.dumps(expected).replace("$$0.2", "$0.2")
    assert json.dumps(runtime.tool_schemas(catalog, qa)) == text


def _runtime(style, experts, replies):
    seen = []

    def llm(model, messages, **kw):
        seen.append({"model": model, "messages": messages, **kw})
        return LLMResponse(model=model, text=replies.get(model, ""))
    catalog = load_catalog()
    prompts = Prompts.load(UPSTREAM_PROMPTS_DIR / style.removeprefix("upstream-"), style=style)
    return ToolRuntime(catalog=catalog, prompts=prompts, sections={"qa": QASettings(experts=experts)}, llm=llm), seen


def test_expert_prompts_equal_upstream_construction():
    state = state_with(n_docs=3, doc_len=1500, n_code=1)
    experts = {"gpt-5": ExpertSettings(max_tokens=40000, temperature=1.0, context_tokens=120000, code_tokens=40000,
                                       answer_format="tags"),
               "Qwen2.5-Math-7B-Instruct": ExpertSettings(max_tokens=2000, temperature=0.2, context_tokens=2000,
                                                          code_tokens=1000, doc_chars=1000, answer_format="boxed")}
    runtime, seen = _runtime("upstream-hle", experts, {"gpt-5": "<answer>Tokyo</answer>",
                                                       "Qwen2.5-Math-7B-Instruct": "so \\boxed{Tokyo}"})
    # eval_hle.py 585-603: documents (cut to 1,000 characters for the math model), code, tail of the budget
    def context(doc_cut, code_l, ctx_l):
        docs = "".join(f"Doc {i+1}: {d.contents[:doc_cut] if doc_cut else d.contents}\n\n" for i, d in enumerate(state.documents))
        code = cut_seq("".join(f"```python\n{c.code}\n```\n\n```output\n{c.output}\n```\n\n" for c in state.code_blocks),
                       code_l)["string_after_cut"]
        code = code if code.startswith("```") or not code else "```\n" + code
        return ("Documents:\n" + cut_seq(docs + code, ctx_l - C.count(state.question))["string_after_cut"]).strip()

    call, answer = runtime.call("answer", "answer-1", state)
    assert answer == "Tokyo" and call.error is None
    # eval_hle.py 185, 229-232
    assert seen[-1]["messages"] == [{"role": "user", "content": context(None, 40000, 120000) + "\n\nProblem:\n"
        + state.question + "\n\nTake a deep breath and think hard with high reasoning, wrap the thoughts within "
        "<think> and </think>, and wrap only the exact answer without any explanation within <answer> and </answer>."
        "Output using the following format:\n<think>\n...\n</think>\n<answer>\n...\n</answer>"}]
    assert (seen[-1]["max_tokens"], seen[-1]["temperature"]) == (40000, 1.0)

    call, answer = runtime.call("answer", "answer-math-2", state)
    assert answer == "Tokyo"
    # eval_hle.py 208-215
    assert seen[-1]["messages"] == [
        {"role": "system", "content": "Please reason step by step, and put your final answer within \\boxed{}."},
        {"role": "user", "content": context(1000, 1000, 2000) + "\n\nProblem:\n" + state.question}]
    assert (seen[-1]["max_tokens"], seen[-1]["temperature"]) == (2000, 0.2)
    assert expert_context_upstream(state, experts["gpt-5"], C) == context(None, 40000, 120000)


@pytest.mark.parametrize("reply, fmt, expected", [
    ("so \\boxed{42}.", "boxed", "42"),
    ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "boxed", "\\frac{1}{2}"),   # after the last box, to the last brace
    ("The answer is 42.", "boxed", ""),                                   # no box: empty (no last-line fallback)
    ("<think>x</think>\n<answer>\nParis\n</answer>", "tags", "Paris"),
    ("Paris", "tags", "Paris"),                                           # no tags: the whole reply (upstream)
])
def test_upstream_answer_extraction(reply, fmt, expected):
    assert extract_answer_upstream(reply, fmt) == expected
