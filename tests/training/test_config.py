"""training/config.py values read from elsewhere."""
from __future__ import annotations

import pytest

from training.config import TrainConfig


def test_price_model_comes_from_tools_json_unless_the_config_names_one():
    """`model.price_model` unset: collect_rollouts prices the orchestrator as tools.json's
    `orchestrator_price_model`; neither set: a clear error before any episode runs."""
    from types import SimpleNamespace

    from training.rollouts import collect_rollouts

    assert TrainConfig().model.price_model is None
    runtime = SimpleNamespace(catalog=SimpleNamespace(orchestrator_price_model=None))
    with pytest.raises(ValueError, match="orchestrator_price_model in tools.json"):
        collect_rollouts([], None, runtime, None, rollouts_per_task=1, seed=0, step=0, price_model=None,
                         concurrency=1)
    runtime.catalog.orchestrator_price_model = "Qwen3-8B"
    assert collect_rollouts([], None, runtime, None, rollouts_per_task=1, seed=0, step=0, price_model=None,
                            concurrency=1) == []
