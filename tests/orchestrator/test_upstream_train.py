"""The paper profile's `qa.train` against upstream's *training* rollouts (NVlabs/ToolOrchestra 3d29bed,
training/lead_agent/llm_agent/generation_quick3.py, "gq3" below).

Two kinds of expected value:
- byte for byte against tests/fixtures/upstream/train_prompt.json (upstream's own code executed on
  fixed inputs; its README): the orchestrator chat, the GPT-5 answer expert's message, the judge's
  request;
- for what the fixture does not hold (every other expert's prompt, budget and temperature, and the
  cuts on long inputs), `gq3_*` below: a transcription of gq3's branches, written by reading gq3
  (contexts: execute_predictions 1656-1907; calls: call_tool 137-567; the orchestrator turn:
  run_llm_loop 1099-1135).  Upstream's model names are resume_h100.py's `model_config` keys.

As in the fixtures, the tokenizer is a character tokenizer (1 token = 1 character), so every token
budget of upstream's `cut_seq` (keep the last `l` tokens) acts on characters.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.catalog import parse_catalog
from orchestrator.context import Budgets, CodeBlock, Document, EpisodeState, Prompts, TokenCounter
from orchestrator.prompt_style import turn_messages
from orchestrator.records import LLMResponse, Usage
from orchestrator.settings import load_profile
from orchestrator.setup import build_runtime, load_prompts

REPO = Path(__file__).resolve().parents[2]
FIXTURE = json.loads((REPO / "tests" / "fixtures" / "upstream" / "train_prompt.json").read_text())


class CharTokenizer:
    """The fixtures' stand-in for the policy's tokenizer: one token per character."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


COUNTER = TokenCounter(CharTokenizer())


def train_section():
    return load_profile("paper").section("qa", "train")


# ------------------------------------------------------------------ gq3, transcribed (see the docstring)
GPT = ["o3", "o3-mini", "gpt-5", "gpt-5-mini"]
UPSTREAM_NAME = {   # our model name -> the name gq3's branches test (resume_h100.py 210-222; API models as is)
    "gpt-5": "gpt-5", "gpt-5-mini": "gpt-5-mini", "o3-mini": "o3-mini",
    "Qwen3-32B": "Qwen/Qwen3-32B", "Qwen3-235B-A22B": "Qwen/Qwen3-235B-A22B",
    "Qwen2.5-Coder-32B-Instruct": "Qwen/Qwen2.5-Coder-32B-Instruct",
    "Llama-3.3-70B-Instruct": "meta-llama/Llama-3.3-70B-Instruct",
    "Qwen2.5-Math-72B-Instruct": "Qwen/Qwen2.5-Math-72B-Instruct",
    "Qwen2.5-Math-7B-Instruct": "Qwen/Qwen2.5-Math-7B-Instruct",
}
CODE_ASK = ("Instead of directly answering the question, please write additional python code that will give "
            "intermidiate results after execution. Wrap the code within ```python and ```. The code should be "
            "self-contained with all the import and initialization.")
QUERY_ASK = ("Instead of directly answering the question, please write a query to search for a piece of relevant "
             "and missing information. The query should be a few key words about the information to search or a "
             "short sentence. Wrap the query within <query> and </query>.")
BOXED_ASK = "\nLet's think step by step and output the final answer within \\boxed{}."
TAGS_ASK = ("\nWrap the thinking process and explanation between <think> and </think> and wrap only the exact "
            "answer without any explanation within <answer> and </answer>.")


def cut_seq(seq: str, l: int) -> str:
    """gq3 96-107 with the character tokenizer: the last `l` characters."""
    return seq[-l:] if seq else ""


def code_str(codes) -> str:
    return "".join(f"```python\n{c}\n```\n\n```output\n{o}\n```\n\n" for c, o in codes)


def gq3_context_cuts(tool: str, name: str):
    """execute_predictions 1656-1907: (doc cut, code tokens, total tokens) per tool and family;
    None where gq3 builds no call."""
    n = name.lower()
    if tool == "enhance_reasoning":
        if name in GPT:
            return None, 40000, 100000          # 1660-1672
        if "qwen2.5" in n:
            return 200, 16000, 24000            # 1692-1704
        if "llama" in n:
            return 200, 8000, 12000             # 1724-1736
        return None                             # Qwen3: no branch, the call is dropped
    if tool == "answer":
        if "math" in n:
            return 500, 1000, 2000              # 1760-1772
        if "qwen" in n:
            return 4000, 16000, 24000           # 1776-1788
        if name in GPT:
            return None, 40000, 100000          # 1792-1804
        if "llama" in n or "nemotron" in n or "phi" in n:
            return None, 40000, 80000           # 1808-1820
    if tool == "search":
        if "qwen" in n:
            return 4000, 16000, 24000           # 1845-1857
        if name in GPT:
            return None, 40000, 100000          # 1861-1873
        if "llama" in n or "nemotron" in n or "phi" in n:
            return None, 40000, 80000           # 1877-1889
    raise AssertionError((tool, name))


def gq3_context(tool: str, name: str, docs, codes) -> str:
    doc_cut, code_l, total_l = gq3_context_cuts(tool, name)
    doc_s = "".join(f"Doc {i + 1}: {d[:doc_cut] if doc_cut else d}\n\n" for i, d in enumerate(docs))
    code_s = cut_seq(code_str(codes), code_l)
    if not code_s.startswith("```") and len(code_s) > 0:
        code_s = "```\n" + code_s
    context = cut_seq(doc_s + code_s, total_l)
    return "Documents:\n" + context if doc_s else context


def gq3_request(tool: str, name: str, context_str: str, problem: str):
    """call_tool 137-567: (the one user message, max_length, temperature).  A string `messages`
    becomes one user message (LLM_CALL.py 298-299); no temperature passed = LLM_CALL's 1.0."""
    n = name.lower()
    if tool == "enhance_reasoning":
        prompt = context_str.strip() + "\n\n" + f"Question: {problem}\n{CODE_ASK}"        # 147-148, 182-183
        if name in GPT:
            return prompt, 28000, 1.0                                                      # 150
        if "qwen2.5-coder" in n or "llama" in n:
            return prompt, 8000, 0.2                                                       # 185
    if tool == "answer":
        prompt = context_str.strip() + "\n\n" + problem                                    # 255
        if "math" in n:
            return prompt + BOXED_ASK, 2000, 0.2                                           # 265-267
        if "qwen" in n or "phi" in n:
            return prompt + BOXED_ASK, 8000, 0.2                                           # 296-298
        if "meta-llama" in n:
            return prompt + TAGS_ASK, 40000, 0.2                                           # 327-329
        if name in GPT:
            return prompt + TAGS_ASK, 28000, 1.0                                           # 366-368
    if tool == "search":
        prompt = context_str.strip() + "\n\n" + f"Question: {problem}\n{QUERY_ASK}"       # 467-468
        if name in GPT:
            return prompt, 28000, 1.0                                                      # 475
        if "qwen" in n or "llama" in n or "phi" in n:
            return prompt, 8000, 0.2                                                       # 524
    raise AssertionError((tool, name))


def gq3_orchestrator_user(problem: str, docs, codes) -> str:
    """run_llm_loop 1105-1134 (no attempts: our episodes end at the answer tool)."""
    doc_s = "".join(f"Doc {i + 1}: {d[:4000]}\n\n" for i, d in enumerate(docs))
    full = code_str(codes)
    code_attempt_str, code_attempt_len = cut_seq(full, 16000), len(full)
    if not code_attempt_str.startswith("```") and len(code_attempt_str) > 0:
        code_attempt_str = "```\n" + code_attempt_str
    if code_attempt_len < 24000:
        context_str = cut_seq(doc_s + code_attempt_str, 24000)
        if len(doc_s) > 0:
            context_str = "Documents:\n" + context_str
    else:
        context_str = code_attempt_str
    return f"Problem: {problem}\n\n{context_str}\n\nChoose an approriate tool."


# ------------------------------------------------------------------ inputs
PROBLEM = FIXTURE["inputs"]["problem"]
DOCS = FIXTURE["inputs"]["documents"]
CODES = [(c["code"], c["output"]) for c in FIXTURE["inputs"]["code"]]
# long enough that every cut of every family bites: docs past 100,000 characters, code past 40,000
LONG_DOCS = [f"Long document {k}\n" + "".join(f"[{k}.{i:05d}] storm record; " for i in range(2500)) for k in range(3)]
LONG_CODES = CODES + [("for i in range(3000): print('row', i, 'x' * 5)", "".join(f"row {i} xxxxx\n" for i in range(3000))),
                      ("print('done')", "done\n")]
INPUTS = {"fixture": (DOCS, CODES), "long": (LONG_DOCS, LONG_CODES), "empty": ([], [])}


def state_of(docs, codes) -> EpisodeState:
    state = EpisodeState(PROBLEM)
    state.documents = [Document(id=f"d{i}", contents=d) for i, d in enumerate(docs)]
    state.code_blocks = [CodeBlock(code=c, output=o) for c, o in codes]
    return state


def test_long_inputs_exceed_every_budget():
    assert sum(len(d) for d in LONG_DOCS) > 100000 and len(code_str(LONG_CODES)) > 40000
    assert all(len(d) > 4000 for d in LONG_DOCS)


# ------------------------------------------------------------------ orchestrator turn
def orchestrator_messages(docs, codes):
    prompts = load_prompts(train_section())
    assert prompts.style == "upstream-train"
    return turn_messages(state_of(docs, codes), prompts, Budgets(), COUNTER)


@pytest.mark.parametrize("variant, docs, codes", [("a_3docs_1code", DOCS, CODES), ("c_empty", [], [])])
def test_orchestrator_chat_is_upstreams_own_output(variant, docs, codes):
    """Byte for byte against the fixture (gq3 1099-1142 executed).  Its variant b carries an answer
    attempt, which our episodes never hold (the answer tool ends them)."""
    assert orchestrator_messages(docs, codes) == FIXTURE["outputs"]["orchestrator_chat"][variant]


@pytest.mark.parametrize("inputs", sorted(INPUTS))
def test_orchestrator_chat_follows_gq3_on_long_inputs(inputs):
    docs, codes = INPUTS[inputs]
    assert orchestrator_messages(docs, codes) == [
        {"role": "system", "content": "You are good at using tools. "},
        {"role": "user", "content": gq3_orchestrator_user(PROBLEM, docs, codes)}]


def test_train_prompt_files_are_upstreams_literals():
    p = load_prompts(train_section())
    assert p.render("system") == "You are good at using tools. "
    assert p.render("user", question="Q", documents="D", code="", evidence="") == "Problem: Q\n\nD\n\nChoose an approriate tool."
    assert p.render("expert_search", context="C", question="Q") == f"C\n\nQuestion: Q\n{QUERY_ASK}"
    assert p.render("expert_code", context="C", question="Q") == f"C\n\nQuestion: Q\n{CODE_ASK}"
    assert p.render("expert_answer_boxed_steps", context="C", question="Q") == "C\n\nQ" + BOXED_ASK
    assert p.render("expert_answer_tags_brief", context="C", question="Q") == "C\n\nQ" + TAGS_ASK
    # ours has the new template too (a folder may override only some files)
    assert "{question}" in Prompts.load().templates["expert_answer_boxed_steps"]


# ------------------------------------------------------------------ experts
class Recorder:
    def __init__(self, reply):
        self.reply, self.seen = reply, []

    def __call__(self, model, messages, *, temperature, max_tokens, price_model, **kw):
        self.seen.append({"model": price_model, "messages": messages, "temperature": temperature,
                          "max_tokens": max_tokens})
        return LLMResponse(model=model, text=self.reply, usage=Usage(1, 1))


class Retriever:
    def retrieve(self, queries, topk, **kw):
        return [[{"document": {"id": "new", "contents": "new document"}, "score": 1.0}]]


def catalog_with_every_pair():
    """tools.json with every covered model offered by each QA tool (an alias per (tool, model)),
    so a (tool, model) pair tools.json does not list can be called too."""
    data = json.loads((REPO / "tools.json").read_text())
    for tool in data["tools"]:
        if tool["name"] in ("search", "enhance_reasoning", "answer"):
            for i, model in enumerate(UPSTREAM_NAME):
                tool["aliases"][f"{tool['name']}-x{i}"] = {"model": model, "latency_s": 1.0}
    return parse_catalog(data)


CATALOG = catalog_with_every_pair()
REPLIES = {"search": "<query>Carrington Event date</query>", "enhance_reasoning": "```python\nprint(130)\n```",
           "answer": "<think>1989-1859</think>\n<answer>130 years</answer> \\boxed{130}"}
PAIRS = [(tool, model) for tool in ("search", "enhance_reasoning", "answer") for model in UPSTREAM_NAME
         if not (tool == "enhance_reasoning" and gq3_context_cuts(tool, UPSTREAM_NAME[model]) is None)
         and not (tool == "enhance_reasoning" and "math" in model.lower())]   # gq3 144-235: no call branch


def call_expert(tool: str, model: str, docs, codes):
    llm = Recorder(REPLIES[tool])
    runtime = build_runtime(load_profile("paper"), {"qa": train_section()}, CATALOG, llm=llm, retriever=Retriever(),
                            run_code=lambda code, timeout: SimpleNamespace(stdout="130\n", stderr="", exit_code=0,
                                                                           timed_out=False, duration_s=0.01),
                            counter=COUNTER)
    alias = next(a for a, spec in CATALOG.tool(tool).aliases.items() if spec.model == model)
    call, answer = runtime.call(tool, alias, state_of(docs, codes))
    assert call.error is None, call.error
    assert len(llm.seen) == 1
    return llm.seen[0], answer


def test_pairs_cover_tools_json():
    data = json.loads((REPO / "tools.json").read_text())
    listed = {(t["name"], a["model"]) for t in data["tools"] if t["name"] in ("search", "enhance_reasoning", "answer")
              for a in t["aliases"].values()}
    assert listed <= set(PAIRS)


@pytest.mark.parametrize("inputs", sorted(INPUTS))
@pytest.mark.parametrize("tool, model", PAIRS)
def test_each_expert_request_is_gq3s(tool, model, inputs):
    """Message, budget and temperature of every (tool, model) gq3 calls, from `qa.train.experts`."""
    docs, codes = INPUTS[inputs]
    name = UPSTREAM_NAME[model]
    seen, _ = call_expert(tool, model, docs, codes)
    prompt, max_length, temperature = gq3_request(tool, name, gq3_context(tool, name, docs, codes), PROBLEM)
    assert seen["messages"] == [{"role": "user", "content": prompt}]
    assert (seen["max_tokens"], seen["temperature"]) == (max_length, temperature)


def test_gpt5_answer_message_is_upstreams_own_output():
    """The fixture's call_tool(answer, gpt-5) ran on context_str "Documents:\\nDoc 1: (context)"; one
    document "(context)" gives our runtime that context."""
    seen, answer = call_expert("answer", "gpt-5", ["(context)"], [])
    assert seen["messages"] == FIXTURE["outputs"]["answer_call_messages (gpt-5 answer expert)"]
    assert answer == FIXTURE["outputs"]["call_tool_return"]["pred"] == "130 years"


@pytest.mark.parametrize("model, expected", [("gpt-5", "130 years"), ("Llama-3.3-70B-Instruct", "130 years"),
                                             ("Qwen3-32B", "130"), ("Qwen2.5-Math-7B-Instruct", "130")])
def test_answer_extraction_per_family(model, expected):
    """gq3 289-293 (boxed: after the last \\boxed{ up to the last }) and 363, 390 (<answer> tags)."""
    _, answer = call_expert("answer", model, DOCS, CODES)
    assert answer == expected


def test_boxed_steps_has_no_system_prompt_and_no_box_means_no_answer():
    llm = Recorder("the answer is 130")
    runtime = build_runtime(load_profile("paper"), {"qa": train_section()}, CATALOG, llm=llm, counter=COUNTER)
    alias = next(a for a, s in CATALOG.tool("answer").aliases.items() if s.model == "Qwen2.5-Math-72B-Instruct")
    _, answer = runtime.call("answer", alias, state_of(DOCS, CODES))
    assert [m["role"] for m in llm.seen[0]["messages"]] == ["user"] and answer == ""   # gq3 287-288


# ------------------------------------------------------------------ judge
def test_profile_judge_is_gq3s():
    judge = train_section().judge
    assert (judge.model, judge.prompt, judge.max_tokens) == ("gpt-5", "upstream-train", 40000)


def test_training_judge_request_is_upstreams_own_output(monkeypatch):
    """make_judge (training/scoring.py) with the profile's judge sends the fixture's judge request
    (gq3 436-440: gpt-5, temperature 1, LLM_CALL's 40000 for gpt-5)."""
    import evaluation.scoring.judge as judge_module
    from orchestrator.episodes.base import Task
    from training.scoring import make_judge

    seen = []

    def call(model, messages, *, temperature, max_tokens, **kw):
        seen.append({"model": model, "messages": messages, "temperature": temperature, "max_completion_tokens": max_tokens})
        return LLMResponse(model=model, text="<correct>True</correct>")

    monkeypatch.setattr(judge_module, "_default_call", lambda: call)
    settings = train_section().judge
    judge = make_judge("llm", settings.model, style=settings.prompt, max_tokens=settings.max_tokens)
    inputs = FIXTURE["inputs"]["judge"]
    rollout = SimpleNamespace(final_answer=FIXTURE["outputs"]["call_tool_return"]["pred"])
    assert judge(Task("t", inputs["problem"], answer=inputs["answer"]), rollout) is True
    assert seen == [FIXTURE["outputs"]["judge_call"]]


@pytest.mark.parametrize("reply, expected", [
    ("<correct>True</correct>", True),
    ("Reasoning first.\n<correct>true</correct>", True),
    ("TRUE", True),                                         # no tag: the whole reply, lower-cased
    ("<correct>True", True),                                # no closing tag: the rest of the reply
    ("<correct> True </correct>", False),                   # unstripped (gq3 441-442)
    ("<correct>True</correct> wait: <correct>False</correct>", False),   # the last tag decides
    ("It is True", False), ("", False),                     # anything else: False, never a judge error
])
def test_training_judge_reads_the_reply_as_gq3(reply, expected):
    from evaluation.scoring.judge import Judge

    verdict = Judge("gpt-5", call=lambda *a, **k: LLMResponse(model="gpt-5", text=reply),
                    style="upstream-train")("q", "a", "b")
    assert (verdict.correct, verdict.rule, verdict.raw) == (expected, "llm", reply)


def test_training_judge_rules_count_words_as_gq3():
    """gq3 431-434: `len(pred.split(' ')) > 500` (a double space counts an empty word; a newline none)."""
    from evaluation.scoring.judge import Judge

    def call(*a, **k):
        return LLMResponse(model="gpt-5", text="<correct>True</correct>")

    train, hle = Judge("gpt-5", call=call, style="upstream-train"), Judge("gpt-5", call=call, style="upstream")
    spaced = "  ".join(["w"] * 251)                          # 251 words, 501 pieces
    assert (train("q", spaced, "x").rule, hle("q", spaced, "x").rule) == ("too_long", "llm")
    lines = "\n".join(["w"] * 600)                           # one piece for split(' ')
    assert (train("q", lines, "x").rule, hle("q", lines, "x").rule) == ("llm", "too_long")
    assert train("q", "  Paris ", "paris").rule == "exact" and train("q", " \n", "x").rule == "empty"
