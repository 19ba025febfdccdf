"""One prompt renderer and one generation stack: the same messages and tools give the same prompt
token ids, and with greedy decoding the same generated ids, through training's `TokenPolicy` (an
HFEngine) and through the gateway's in-process transformers backend (what run_hle.py,
run_frames.py and run_tau2.py use for a local checkpoint)."""
from __future__ import annotations

from _train_world import build_policy

from orchestrator.catalog import load_catalog
from orchestrator.chat_template import prompt_ids, render_prompt
from orchestrator.toolcall import allowed_call_strings


def test_training_and_the_gateway_render_the_same_prompt_and_generate_the_same_ids(tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from LLM_CALL import get_llm_response
    from orchestrator.engines.batcher import BatchingEngine
    from orchestrator.engines.hf import HFEngine
    from orchestrator.policy import TokenPolicy

    policy = build_policy(tmp_path / "policy")
    tok = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy)
    torch.manual_seed(0)
    with torch.no_grad():             # spread logits: a greedy reply of varied tokens, not one repeated
        for weight in model.parameters():
            weight.normal_(0, 0.5)
    model.save_pretrained(policy)
    assert "tools" not in tok.chat_template        # a template that drops tools: the renderer must add them
    catalog = load_catalog()
    tools = catalog.openai_tools()
    messages = [{"role": "system", "content": "You are the orchestrator."},
                {"role": "user", "content": "What is 2 + 2?"}]
    choices = allowed_call_strings({"search": ["search-1", "search-2"], "answer": ["answer-1"]})

    trained = TokenPolicy(HFEngine(model, tok, device="cpu"), "Qwen3-8B")
    free = trained.act(messages, tools, temperature=0.0, max_tokens=12)
    constrained = trained.act(messages, tools, choices=choices, temperature=0.0, max_tokens=48)

    (tmp_path / "models.yaml").write_text(f"models:\n  tiny:\n    backend: transformers\n    path: {policy}\n"
                                          "    max_retries: 0\n    price_model: Qwen3-8B\n")
    monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(tmp_path / "models.yaml"))
    seen = []                                       # (prompt ids, generated ids) of each gateway request
    generate = BatchingEngine.generate
    monkeypatch.setattr(BatchingEngine, "generate", lambda self, prompts, params, **kw: seen.append(
        (prompts[0], (out := generate(self, prompts, params, **kw))[0].token_ids)) or out)
    served = get_llm_response("tiny", messages, tools=tools, temperature=0.0, max_tokens=12)
    served_choice = get_llm_response("tiny", messages, tools=tools, temperature=0.0, max_tokens=48, choices=choices)

    assert len(set(free.response_ids)) > 3 and len(free.response_ids) == 12     # varied, not cut by an EOS
    assert seen == [(free.prompt_ids, free.response_ids), (constrained.prompt_ids, constrained.response_ids)]
    assert served.text == free.text and served.usage == free.usage
    assert served_choice.text == constrained.text and constrained.text in choices
    train_ids = free.prompt_ids
    text = tok.decode(train_ids)
    assert '"name": "search"' in text and "<tool_call>" in text and "What is 2 + 2?" in text   # tools and prices kept
    assert prompt_ids(tok, messages, tools) == train_ids
    # without a system message the tool block becomes one
    text = render_prompt(tok, messages[1:], tools)
    assert text.startswith("<|im_start|>system\n# Tools") and text.count("# Tools") == 1
