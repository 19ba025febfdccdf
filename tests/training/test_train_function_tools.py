"""Training with a function tool in the catalog (docs/tools.md): a tiny token policy under
grammar-constrained decoding sees the tool's own argument schema, emits only valid calls (of the
alias tools or the calculator, arguments typed as its schema says), the grammar is recorded on each
turn, and the trainer's replay of it masks the forced tokens; the tool's cost is in the rollout."""
import json
from pathlib import Path
from types import SimpleNamespace

from _train_world import build_policy
from orchestrator.catalog import parse_catalog
from orchestrator.loop import LoopConfig, Task, run_episode
from orchestrator.records import LLMResponse, Usage
from orchestrator.runtime import ToolRuntime

REPO = Path(__file__).resolve().parents[2]


def catalog():
    data = json.loads((REPO / "tools.json").read_text())
    data["tools"].append({"name": "calculator", "kind": "python", "handler": "examples.tools.calculator:calculate"})
    data["prices"]["calculator"] = {"per_call": 0.0001}
    return parse_catalog(data)


def test_a_constrained_tiny_policy_calls_function_tools_validly_and_trains_only_its_choices(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchestrator.engines.hf import HFEngine
    from orchestrator.policy import TokenPolicy
    from orchestrator.toolcall import call_grammar
    from training.rollouts import SeededEngine, mask_forced_tokens

    monkeypatch.syspath_prepend(str(REPO))
    cat = catalog()
    schema_text = json.dumps([{"name": "calculator", "parameters": {"expression": "string", "precision": "integer"}}])
    folder = build_policy(tmp_path / "policy", [schema_text * 20], max_positions=8192, vocab_size=1500)
    tok = AutoTokenizer.from_pretrained(folder)
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(folder), tok, device="cpu")
    sandbox = lambda code, timeout, **kw: SimpleNamespace(stdout="1\n", stderr="", exit_code=0, timed_out=False, duration_s=1.0)
    llm = lambda model, messages, **kw: LLMResponse(model=model, text="<answer>4</answer>", usage=Usage(10, 5))
    runtime = ToolRuntime(catalog=cat, serve="local", llm=llm, run_code=sandbox)
    config = LoopConfig(max_turns=4, max_tokens=300, constrained=True, max_string_chars=16)
    # a task offering one alias tool (training's per-task tools): the catalog's function tools come along
    coder = {"enhance_reasoning": {"reasoner-3": "Qwen2.5-Coder-32B-Instruct"}}
    rollouts = [run_episode(Task(f"t{seed}", "What is 2 + 2?", tools=coder),
                            TokenPolicy(SeededEngine(engine, seed), "Qwen3-8B"), runtime, config) for seed in range(4)]
    turns = [t for r in rollouts for t in r.turns]
    assert turns and all(t.valid for t in turns), [t.invalid_reason for t in turns]
    grammars = {t.constraint["grammar"] for t in turns}
    assert len(grammars) == 1 and "calculator" in next(iter(grammars))
    # the grammar offered: one call of the alias tools (enum of aliases) or the calculator, typed as its schema
    from orchestrator.episodes.qa import function_schema

    from orchestrator.loop import task_catalog

    sub = task_catalog(cat, Task("x", "q", tools=coder))
    assert next(iter(grammars)) == call_grammar(
        sub.openai_tools(tools=[sub.tool("enhance_reasoning")]) + [function_schema(f, sub) for f in runtime.functions(sub)], 16)
    calls = [t for t in turns if t.tool_call.name == "calculator"]
    assert calls, [t.tool_call.name for t in turns]
    for t in calls:       # typed arguments; its cost (the per-call price at least) on the record
        assert isinstance(t.tool_call.arguments["expression"], str) and t.expert.cost >= 0.0001
    mask_forced_tokens([[r] for r in rollouts], tok)
    for t in turns:       # the replayed grammar: the closing tokens forced, the choices trained
        assert 0 < sum(t.loss_mask) < len(t.response_ids)
