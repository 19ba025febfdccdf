"""evaluation/mock_backend.py `registry_yaml`: the registry text that sends scripted models to the
mock server charges them at the one price table's orchestrator row unless a caller names one."""
from __future__ import annotations

import yaml

import orchestrator.catalog
from evaluation.mock_backend import registry_yaml


def test_scripted_models_are_charged_at_the_catalogs_orchestrator_price_model(monkeypatch):
    shipped = orchestrator.catalog.load_catalog()
    entries = yaml.safe_load(registry_yaml("http://x/v1", ["mock-orch", "mock-judge"]))["models"]
    assert {e["price_model"] for e in entries.values()} == {shipped.orchestrator_price_model}
    # read from tools.json at call time, not a copy of its value: another catalog, another row
    other = shipped.model_copy(update={"orchestrator_price_model": "gpt-5-mini"})
    monkeypatch.setattr(orchestrator.catalog, "load_catalog", lambda *a, **k: other)
    entries = yaml.safe_load(registry_yaml("http://x/v1", ["mock-orch"]))["models"]
    assert entries["mock-orch"]["price_model"] == "gpt-5-mini"
    named = yaml.safe_load(registry_yaml("http://x/v1", ["mock-orch"], price_model="gpt-5"))["models"]
    assert named["mock-orch"] == {"backend": "vllm", "model": "mock-orch", "base_url": "http://x/v1",
                                  "max_retries": 0, "timeout_s": 30, "price_model": "gpt-5"}
