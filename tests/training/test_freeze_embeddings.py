"""model.freeze_embeddings / the quickstart's --freeze-embeddings: the token table stays as loaded,
the layers learn (training/policy_setup.py make_optimizer, training/quickstart/warmup.py)."""
from __future__ import annotations

import pytest
import torch

from training.tiny_policy import build_tiny_policy, tiny_tokenizer


def _policy(tmp_path):
    from transformers import AutoModelForCausalLM

    tok = tiny_tokenizer(["alpha beta gamma delta"], vocab_size=60)
    return AutoModelForCausalLM.from_pretrained(build_tiny_policy(tmp_path / "p", tok, hidden=16, layers=2, seed=3))


def _changed_after_one_step(tmp_path, freeze: bool) -> tuple[bool, bool]:
    from training.config import load_config
    from training.policy_setup import make_optimizer

    model = _policy(tmp_path)
    cfg = load_config("training/configs/quickstart.yaml", [f"model.freeze_embeddings={str(freeze).lower()}"])
    table, layer = (model.get_input_embeddings().weight.detach().clone(),
                    model.model.layers[0].mlp.up_proj.weight.detach().clone())
    optimizer = make_optimizer(model, cfg)
    model(input_ids=torch.tensor([[5, 6, 7, 8]]), labels=torch.tensor([[5, 6, 7, 8]])).loss.backward()
    optimizer.step()
    return (not torch.equal(model.get_input_embeddings().weight, table),
            not torch.equal(model.model.layers[0].mlp.up_proj.weight, layer))


@pytest.mark.parametrize("freeze, table_moves", [(True, False), (False, True)])
def test_the_trainers_optimizer_leaves_a_frozen_table_alone_and_moves_the_layers(tmp_path, freeze, table_moves):
    assert _changed_after_one_step(tmp_path, freeze) == (table_moves, True)


def test_the_warm_up_leaves_a_frozen_table_alone_and_teaches_the_layers(tmp_path):
    from transformers import AutoModelForCausalLM

    from training.quickstart.warmup import Demonstration, supervised_warmup

    tok = tiny_tokenizer(["alpha beta gamma delta"], vocab_size=60)
    start = build_tiny_policy(tmp_path / "p", tok, hidden=16, layers=2, seed=3)
    demos = [Demonstration([20, 21, 22 + i], [7, 8, 9 + i, 0], {1: {8: 1.0}, 2: {9: 0.25, 10: 0.75}}, "answer")
             for i in range(2)]
    saved = {}
    for freeze in (True, False):
        out = supervised_warmup(start, tmp_path / f"w{freeze}", demos, epochs=2, lr=1e-2, batch_size=2, seed=0,
                                freeze_embeddings=freeze, log=lambda line: None)
        saved[freeze] = AutoModelForCausalLM.from_pretrained(out)
    before = AutoModelForCausalLM.from_pretrained(start)
    table = before.get_input_embeddings().weight
    assert torch.equal(saved[True].get_input_embeddings().weight, table)
    assert not torch.equal(saved[False].get_input_embeddings().weight, table)
    layer = before.model.layers[0].mlp.up_proj.weight
    assert not torch.equal(saved[True].model.layers[0].mlp.up_proj.weight, layer)
