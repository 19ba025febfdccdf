"""A task that fails part-way keeps what it spent; accuracy over nothing answered is "n/a"."""
import io
import json
from types import SimpleNamespace

import pytest
from rich.console import Console

from evaluation.qa import QASetup, solve
from evaluation.report import print_table, summarize
from evaluation.runner import ResultsFile, read_records, run_tasks
from evaluation.scoring.judge import Judge
from orchestrator.benchmarks import BenchmarkTask
from orchestrator.catalog import load_catalog
from orchestrator.context import Prompts
from orchestrator.loop import LoopConfig
from orchestrator.policy import PolicyOutput
from orchestrator.records import LLMResponse, Usage
from orchestrator.runtime import ToolRuntime
from orchestrator.toolcall import format_tool_call


class PolicyDiesOnTurn3:
    """Two valid tool calls (100 prompt + 10 completion tokens each), then the server gives up."""
    price_model = "Qwen3-8B"

    def __init__(self):
        self.replies = [format_tool_call("search", {"model": "search-3"}),
                        format_tool_call("enhance_reasoning", {"model": "reasoner-2"})]

    def act(self, messages, tools, **kw):
        if not self.replies:
            raise TimeoutError("orchestrator call timed out after 120 s")
        return PolicyOutput(text=self.replies.pop(0), usage=Usage(100, 10), latency=0.01)


def expert_llm(model, messages, **kw):
    text = "<query>capital</query>" if "<query>" in messages[-1]["content"] else "```python\nprint(6)\n```"
    return LLMResponse(model=model, text=text, usage=Usage(1000, 200))


class OneDoc:
    def retrieve(self, queries, topk):
        return [[{"document": {"id": "p1", "contents": "Paris is the capital of France."}, "score": 0.9}]]


def setup(policy):
    catalog = load_catalog()
    sandbox = lambda code, timeout: SimpleNamespace(stdout="6\n", stderr="", exit_code=0, timed_out=False,
                                                    duration_s=2.0)
    runtime = ToolRuntime(catalog=catalog, serve="local", retriever=OneDoc(), llm=expert_llm, run_code=sandbox)
    return QASetup(mode="all", model="smollm2-135m", price_model="Qwen3-8B", catalog=catalog, runtime=runtime,
                   policy=policy, loop=LoopConfig(max_turns=5), judge=Judge("exact"), prompts=Prompts.load())


def test_error_record_keeps_cost_tokens_and_turns(tmp_path):
    task = BenchmarkTask(id="q1", question="What is the capital of France?", answer="Paris", meta={})
    with ResultsFile(tmp_path / "results.jsonl") as results:
        stats = run_tasks([task], lambda t: solve(setup(PolicyDiesOnTurn3()), t), results, progress=False)
    assert stats.errors == 1
    (rec,), _ = read_records(tmp_path / "results.jsonl")
    assert rec["status"] == "error" and "TimeoutError" in rec["error"] and "after 2 turns" in rec["error"]
    assert [t["tool"] for t in rec["turns"]] == ["search", "enhance_reasoning"]
    # by hand (tools.json prices per 1M tokens):
    #   orchestrator (Qwen3-8B, 0.2/0.2): 2 x 110 tokens            = 2 x 2.2e-5  = 4.4e-5
    #   search-3 (Qwen3-32B, 0.8/0.8): 1000 + 200 tokens            = 9.6e-4
    #   reasoner-2 (gpt-5-mini, 0.25/2.0): 1000 x 0.25 + 200 x 2.0  = 6.5e-4, + 2 s of code x 8.3e-6 = 1.66e-5
    assert rec["cost"] == pytest.approx(4.4e-5 + 9.6e-4 + 6.5e-4 + 1.66e-5, rel=1e-9)
    assert rec["tokens"] == {"prompt": 2 * 100 + 2 * 1000, "completion": 2 * 10 + 2 * 200}

    summary = summarize([rec])
    assert summary["accuracy"] is None and summary["accuracy_errors_as_wrong"] == 0.0
    assert summary["error_cost_usd"] == pytest.approx(rec["cost"]) and summary["total_cost_usd"] == pytest.approx(rec["cost"])
    assert summary["error_turns"] == 2 and summary["error_tokens"] == rec["tokens"]
    out = io.StringIO()
    print_table([("hle smollm2 all", summary)], Console(file=out, width=200))
    row = next(line for line in out.getvalue().splitlines() if "hle smollm2" in line)
    assert "n/a" in row and "0.0017" in row      # accuracy, and the errors' dollars


def test_judge_failure_keeps_the_episode():
    class BrokenJudge(Judge):
        def __call__(self, *a, **kw):
            raise ConnectionError("judge server down")

    class Answers(PolicyDiesOnTurn3):
        def __init__(self):
            self.replies = [format_tool_call("answer", {"model": "answer-4"})]

    s = setup(Answers())
    s.judge = BrokenJudge("exact")
    with pytest.raises(Exception) as err:
        solve(s, BenchmarkTask(id="q", question="Capital of France?", answer="Paris", meta={}))
    partial = err.value.partial
    assert "judge server down" in str(err.value) and len(partial["turns"]) == 1 and partial["cost"] > 0
    json.dumps(partial)   # it goes into the results file as is
