"""One prompt renderer: the same messages and tools give the same token ids through training's
`TokenPolicy` and through the gateway's in-process transformers backend (what run_hle.py,
run_frames.py and run_tau2.py use for a local checkpoint)."""
from __future__ import annotations

from _train_world import build_policy

from orchestrator.catalog import load_catalog
from orchestrator.chat_template import prompt_ids, render_prompt


def test_training_and_the_gateway_render_the_same_prompt_ids(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from LLM_CALL import get_llm_response
    from orchestrator.gateway.backends import transformers_batching
    from orchestrator.policy import TokenPolicy
    from orchestrator.engines.hf import HFEngine

    policy = build_policy(tmp_path / "policy")
    tok = AutoTokenizer.from_pretrained(policy)
    assert "tools" not in tok.chat_template        # a template that drops tools: the renderer must add them
    catalog = load_catalog()
    tools = catalog.openai_tools()
    messages = [{"role": "system", "content": "You are the orchestrator."},
                {"role": "user", "content": "What is 2 + 2?"}]

    trained = TokenPolicy(HFEngine(AutoModelForCausalLM.from_pretrained(policy), tok, device="cpu"), "Qwen3-8B")
    train_ids = trained.act(messages, tools, temperature=0.0, max_tokens=1).prompt_ids

    (tmp_path / "models.yaml").write_text(f"models:\n  tiny:\n    backend: transformers\n    path: {policy}\n"
                                          "    max_retries: 0\n    price_model: Qwen3-8B\n")
    monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(tmp_path / "models.yaml"))
    seen = []
    run = transformers_batching.Batcher.run
    monkeypatch.setattr(transformers_batching.Batcher, "run", lambda self, job: seen.append(job.prompt) or run(self, job))
    get_llm_response("tiny", messages, tools=tools, temperature=0.0, max_tokens=1)

    assert seen == [train_ids]
    text = tok.decode(train_ids)
    assert '"name": "search"' in text and "<tool_call>" in text and "What is 2 + 2?" in text   # tools and prices kept
    assert prompt_ids(tok, messages, tools) == train_ids
    # without a system message the tool block becomes one
    text = render_prompt(tok, messages[1:], tools)
    assert text.startswith("<|im_start|>system\n# Tools") and text.count("# Tools") == 1
