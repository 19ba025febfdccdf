"""A provider that echoes the API key in a 200 text/html page (issue 45, finding 1): a whole HLE
evaluation runs as a subprocess against the provider emulator, and no file the run wrote, nor its
stdout, nor its stderr (where the gateway's retry warnings are logged), holds the key."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from provider_emulator import ProviderEmulator, emulator_registry

REPO = Path(__file__).resolve().parents[3]
KEY = "emu-Zq7-private-credential-5521"     # no sk-/Bearer/api_key= form: only its registration masks it
ROWS = [{"id": "q1", "question": "What is the capital of Japan?", "answer": "Tokyo", "image": ""},
        {"id": "q2", "question": "Which city hosts the Louvre?", "answer": "Paris", "image": ""}]


def test_a_key_echoed_by_the_provider_is_in_no_file_log_or_stream_of_the_run(tmp_path):
    answers = {r["question"]: r["answer"] for r in ROWS}
    with ProviderEmulator(answers, plan=[("search", "search-1"), ("answer", "answer-1")],
                          faults={"gpt-5": "html_echo_key"}) as emu:       # gpt-5: search-1 and the judge
        registry = emulator_registry(emu.root)
        registry["models"]["gpt-5"].update(max_retries=1, backoff_initial_s=0.05, backoff_max_s=0.1)  # a logged retry
        (tmp_path / "models.yaml").write_text(yaml.safe_dump(registry))
        (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
        env = {**os.environ, "TOOLORCHESTRA_MODELS": str(tmp_path / "models.yaml"), "EMULATOR_KEY": KEY}
        run = subprocess.run([sys.executable, str(REPO / "evaluation" / "run_hle.py"), "--profile", "paper",
                              "--model", "Qwen3-8B", "--data", "data.jsonl", "--retriever", emu.root,
                              "--output", "out", "--no-progress", "--max-turns", "3"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert emu.fault_hits >= 2                      # the page echoing the key was served (and retried)
    written = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert tmp_path / "out" / "results.jsonl" in written and tmp_path / "out" / "viewer.html" in written
    texts = {"stdout": run.stdout, "stderr": run.stderr,
             **{str(p.relative_to(tmp_path)): p.read_bytes().decode("utf-8", "replace") for p in written}}
    assert [name for name, text in texts.items() if KEY in text] == []
    # the provider's page itself was kept, masked: in the records, the viewer and the logged retries
    for name in ("out/results.jsonl", "out/viewer.html", "stderr"):
        assert "Signed in as ***REDACTED***" in texts[name], name


def test_reply_text_and_tool_arguments_echoing_the_key_are_masked(tmp_path, monkeypatch):
    from _gateway_fakes import FakeServer, write_registry

    from LLM_CALL import get_llm_response
    from orchestrator.redaction import MASK

    monkeypatch.setenv("LEAK_TEST_KEY", KEY)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps({"k": f"use {KEY}"})}}
    with FakeServer(["ok"], text=f"your key is {KEY}; api_key=os.environ['K']", tool_calls=[call]) as srv:
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(write_registry(tmp_path / "models.yaml", {
            "m": {"backend": "openai", "base_url": srv.url, "api_key_env": "LEAK_TEST_KEY", "price_model": "gpt-5"}})))
        r = get_llm_response("m", [{"role": "user", "content": "hi"}])
    assert srv.requests[0]["headers"]["authorization"] == f"Bearer {KEY}"       # the key was sent
    assert r.text == f"your key is {MASK}; api_key=os.environ['K']"           # by value only: the code stays
    assert r.tool_calls[0].arguments == {"k": f"use {MASK}"}
