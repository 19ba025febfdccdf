"""The model registry (configs/models.yaml) and endpoints files: validation and one-line errors."""
from __future__ import annotations

import json
import os

import pytest

from LLM_CALL import get_llm_response
from orchestrator.catalog import load_catalog
from orchestrator.gateway.endpoints import EndpointPool, read_endpoints, register_endpoint, unregister_endpoint
from orchestrator.gateway.errors import GatewayConfigError, UnknownModelError
from orchestrator.gateway.registry import DEFAULT_MODELS, load_registry, main

PAPER_MODELS = ["gpt-5", "gpt-5-mini", "Qwen3-32B", "Qwen2.5-Coder-32B-Instruct", "Llama-3.3-70B-Instruct",
                "Qwen2.5-Math-72B-Instruct", "Qwen2.5-Math-7B-Instruct", "Qwen3-8B", "claude-opus-4-1"]


def _load(tmp_path, text: str):
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path, lambda: load_registry(path)


def test_shipped_registry_has_the_paper_models_and_prices_for_all():
    reg = load_registry(DEFAULT_MODELS)
    catalog = load_catalog()
    for name in PAPER_MODELS + ["smollm2-135m", "smollm2-135m-vllm"]:
        assert name in reg.models, name
    assert reg.models["gpt-5"].backend == "openai" and reg.models["claude-opus-4-1"].backend == "anthropic"
    assert reg.models["Qwen3-32B"].backend == "vllm"
    assert reg.models["smollm2-135m"].backend == "transformers"
    assert reg.models["smollm2-135m"].path == "embedded:smollm2-135m"
    for name, entry in reg.models.items():   # every model can be priced without extra arguments
        assert (entry.price_model or name) in catalog.prices, name


def test_cli_validates_and_lists(capsys):
    assert main([str(DEFAULT_MODELS)]) == 0
    assert "smollm2-135m-vllm" in capsys.readouterr().out


@pytest.mark.parametrize("text, where, problem", [
    ("models:\n  m: {backend: ollama}\n", "models.m.backend", "Input should be 'openai'"),
    ("models:\n  m: {backend: transformers}\n", "models.m.path", "required for backend 'transformers'"),
    ("models:\n  m: {backend: azure, model: d}\n", "models.m.base_url", "needs base_url"),
    ("models:\n  m: {backend: vllm, bogus: 1}\n", "models.m.bogus", "Extra inputs are not permitted"),
    ("models:\n  m: {backend: vllm, timeout_s: 0}\n", "models.m.timeout_s", "greater than 0"),
    ("models:\n  m: {backend: openai, endpoints_file: e.json}\n", "models.m.endpoints_file", "only backend 'vllm'"),
    ("models:\n  m: {backend: openai, api_key_env: 'sk-abc'}\n", "models.m.api_key_env", "should match pattern"),
    ("models:\n  m: {backend: vllm, base_url: 'http://h:99999/v1'}\n", "models.m.base_url", "port in 1-65535"),
    ("models:\n  m: {backend: vllm, base_url: 'localhost:8000'}\n", "models.m.base_url", "http(s) URL"),
    ("models: {}\n", "models", "at least 1 item"),
    ("- a\n- b\n", "(top level)", "expected a mapping"),
])
def test_broken_registry_fails_with_one_line_naming_file_key_problem(tmp_path, text, where, problem):
    path, load = _load(tmp_path, text)
    with pytest.raises(GatewayConfigError) as info:
        load()
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: {where}: "), msg
    assert problem in msg


def test_invalid_yaml_names_line_and_column(tmp_path):
    path, load = _load(tmp_path, "models:\n  m: {backend: vllm\n")
    with pytest.raises(GatewayConfigError, match=r"models\.yaml: line 3 column 1: invalid YAML"):
        load()


def test_missing_registry_file_says_how_to_fix(tmp_path):
    with pytest.raises(GatewayConfigError, match="cannot read.*TOOLORCHESTRA_MODELS"):
        load_registry(tmp_path / "nope.yaml")


def test_unknown_model_lists_known_models_and_how_to_add(tmp_path, monkeypatch):
    path, _ = _load(tmp_path, "models:\n  a: {backend: vllm}\n  b: {backend: openai}\n")
    monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(path))
    with pytest.raises(UnknownModelError) as info:
        get_llm_response("gpt-6", [{"role": "user", "content": "x"}])
    msg = str(info.value)
    assert "unknown model 'gpt-6'" in msg and str(path) in msg and "known: a, b" in msg
    assert "add an entry under 'models:'" in msg and "backend:" in msg


def test_edits_to_the_registry_apply_without_restart(tmp_path):
    path, load = _load(tmp_path, "models:\n  a: {backend: vllm}\n")
    assert list(load().models) == ["a"]
    path.write_text("models:\n  a: {backend: vllm}\n  bb: {backend: openai}\n")
    assert list(load().models) == ["a", "bb"]


def test_an_edit_keeping_size_and_modification_time_is_seen(tmp_path):
    import os

    path, load = _load(tmp_path, "models:\n  a: {backend: vllm}\n")
    assert list(load().models) == ["a"]
    stamp = path.stat()
    path.write_text("models:\n  b: {backend: vllm}\n")                 # same size
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))            # same mtime (a coarse clock)
    assert path.stat().st_size == stamp.st_size
    assert list(load().models) == ["b"]


def test_model_without_price_fails_before_calling(tmp_path, monkeypatch):
    path, _ = _load(tmp_path, "models:\n  free: {backend: vllm, base_url: 'http://127.0.0.1:9/v1'}\n")
    monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(path))
    with pytest.raises(GatewayConfigError, match="no price for 'free'.*price_model"):
        get_llm_response("free", [{"role": "user", "content": "x"}])


@pytest.mark.parametrize("kwargs, field", [
    (dict(messages=[]), "messages"), (dict(max_tokens=0), "max_tokens"),
    (dict(timeout=-1), "timeout"), (dict(choices=[]), "choices"),
])
def test_bad_arguments_name_the_argument(kwargs, field):
    args = dict(model="gpt-5", messages=[{"role": "user", "content": "x"}]) | kwargs
    with pytest.raises(ValueError, match=f"^{field}:"):
        get_llm_response(**args)


# ---- endpoints files -------------------------------------------------------------------------
def test_register_and_unregister_rewrite_the_file_atomically(tmp_path):
    f = tmp_path / "endpoints.json"
    register_endpoint(f, "m", "http://a:1/v1")
    register_endpoint(f, "m", "http://b:2/v1", pid=42)
    register_endpoint(f, "m", "http://a:1/v1")            # no duplicates; moves to the end
    assert [r["base_url"] for r in json.loads(f.read_text())["m"]] == ["http://b:2/v1", "http://a:1/v1"]
    unregister_endpoint(f, "m", "http://b:2/v1")
    unregister_endpoint(f, "m", "http://a:1/v1")
    assert json.loads(f.read_text()) == {}
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".endpoints.json.")]   # no temp files left


@pytest.mark.parametrize("text, problem", [
    ("{not json", "line 1 column 2: invalid JSON"),
    ('{"m": {"base_url": "http://a/v1"}}', "m: expected a list"),
    ('{"m": [{"base_url": "ftp://a"}]}', "m: base_url: String should match pattern"),
    ('["x"]', "expected an object"),
])
def test_broken_endpoints_file_fails_with_one_line(tmp_path, text, problem):
    f = tmp_path / "endpoints.json"
    f.write_text(text)
    with pytest.raises(GatewayConfigError) as info:
        read_endpoints(f)
    assert str(info.value).startswith(f"{f}: ") and problem in str(info.value)


def test_pool_prefers_first_key_and_cools_down_failed_replicas(tmp_path):
    f = tmp_path / "endpoints.json"
    f.write_text(json.dumps({"name": [{"base_url": "http://a/v1"}, {"base_url": "http://b/v1"}],
                             "served": [{"base_url": "http://z/v1"}]}))
    pool = EndpointPool(f, ["name", "served"], cooldown_s=60)
    assert [pool.next() for _ in range(3)] == ["http://a/v1", "http://b/v1", "http://a/v1"]
    pool.mark_failed("http://a/v1")
    assert [pool.next() for _ in range(2)] == ["http://b/v1", "http://b/v1"]
    pool.mark_failed("http://b/v1")          # every replica failed: the one that failed longest ago
    assert [pool.next(), pool.next()] == ["http://a/v1", "http://a/v1"]
    pool.mark_failed("http://a/v1")          # a dead replica fails each time: the other one is tried
    assert [pool.next(), pool.next()] == ["http://b/v1", "http://b/v1"]
    assert EndpointPool(f, ["missing", "served"]).next() == "http://z/v1"


def test_a_registry_that_is_not_utf8_is_one_line_naming_file_place_and_fix(tmp_path, capsys):
    path = tmp_path / "models.yaml"
    path.write_bytes("models:\n  m: {backend: vllm, model: caf\xe9}\n".encode("latin-1"))
    with pytest.raises(GatewayConfigError, match=r"models\.yaml: line 2 column 32: not UTF-8 text \(byte 0xe9\)"):
        load_registry(path)
    assert main([str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "save it as UTF-8" in err
