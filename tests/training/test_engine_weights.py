"""The rollout engine generates with the learner's weights: after a resume, and when an
evaluation builds it over a trained model, not with `model.path`'s initial weights (an engine
that holds its own copy: `engine.share_weights: false`, or asynchronous training)."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from _train_world import fake_runtime, overrides
from orchestrator.engines.interface import SamplingParams
from training.config import load_config
from training.learner import LocalLearner, make_engine_for
from training.policy_setup import load_policy
from training.session import resume_point, run

OWN_COPY = {"sync": {"engine.share_weights": "false"},
            "async": {"engine.share_weights": "false", "algorithm.max_staleness": 1,
                      "algorithm.old_logprobs": "engine"}}


def _logprobs(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """log p of each generated id under `model` at temperature 1 (a plain full forward)."""
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(generated)[:, None])[:, 0]


def _engine_logprobs(engine, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    out = engine.generate([prompt], SamplingParams(temperature=1.0, max_tokens=12, seed=7))[0]
    return out.token_ids, torch.tensor(out.logprobs)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, train_world):
    """A run dir per setting holding the checkpoint of one PPO step, and its config."""
    runs = {}
    for name, settings in OWN_COPY.items():
        root = tmp_path_factory.mktemp(name)
        cfg = load_config(None, overrides(root, *train_world, **{"trainer.total_steps": 1, **settings}))
        run(cfg, runtime=fake_runtime())
        runs[name] = cfg
    return runs


def _assert_generates_with(engine, trained_model, initial_path, prompt):
    tokens, got = _engine_logprobs(engine, prompt)
    want = _logprobs(trained_model, prompt, tokens)
    initial = _logprobs(AutoModelForCausalLM.from_pretrained(initial_path, dtype=torch.float32), prompt, tokens)
    assert (want - initial).abs().max() > 1e-3, "the PPO step left these log-probs unchanged: no test"
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("mode", OWN_COPY)
def test_a_resumed_learner_engine_generates_with_the_checkpoint_weights(trained, mode):
    cfg = trained[mode]
    checkpoint, state = resume_point(cfg)
    assert checkpoint is not None and checkpoint.step == 1
    learner = LocalLearner(cfg, checkpoint, state, total_steps=2)
    try:
        prompt = learner.tokenizer("What is 3 + 3?")["input_ids"]
        _assert_generates_with(learner.engine, learner.model, cfg.model.path, prompt)
    finally:
        learner.close()


@pytest.mark.parametrize("mode", OWN_COPY)
def test_an_engine_over_a_trained_model_generates_with_its_weights(trained, mode):
    """What the quickstart's evaluation does: load the trained folder, build the engine over it."""
    cfg = trained[mode]
    checkpoint, _ = resume_point(cfg)
    model, tokenizer = load_policy(str(checkpoint.model_dir), cfg.model.dtype, cfg.run.device)
    engine = make_engine_for(cfg, model, tokenizer, checkpoint.model_dir)
    try:
        _assert_generates_with(engine, model, cfg.model.path, tokenizer("What is 3 + 3?")["input_ids"])
    finally:
        engine.close()


def test_each_update_logs_the_rows_decoded_per_path_since_the_last_one(tmp_path, train_world):
    """engine/static_rows and engine/loop_rows (a static decoder falling back shows as loop rows);
    nothing is logged for an engine without a static decoder (the CPU's)."""
    policy, tasks = train_world
    learner = LocalLearner(load_config(None, overrides(tmp_path, policy, tasks)), None, None, 3)
    assert not any(k.startswith("engine/") for k in learner.update([], 0))
    learner._decoder.static_expected = True          # as on CUDA; here every row still runs the loop
    learner.engine.generate([[1, 2, 3]] * 3, SamplingParams(temperature=0, max_tokens=2))
    first = learner.update([], 1)
    assert (first["engine/static_rows"], first["engine/loop_rows"]) == (0, 3)
    second = learner.update([], 2)
    assert (second["engine/static_rows"], second["engine/loop_rows"]) == (0, 0)   # per update, not cumulative
    learner.engine.close()
