"""training/tiny_policy.py: the random policies the CPU tests and the quickstart train."""
from __future__ import annotations

import pytest
import torch

from training.tiny_policy import build_tiny_policy, tiny_tokenizer


def _hidden(folder, ids):
    """Per layer, the hidden states after it: [layers + 1] of [T, H] (0 = the embeddings)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return [h[0] for h in model(torch.tensor([ids]), output_hidden_states=True).hidden_states]


def test_local_window_layers_see_only_the_last_tokens_and_the_last_layer_everything(tmp_path):
    tok = tiny_tokenizer(["alpha beta gamma delta epsilon zeta eta theta"], vocab_size=60)
    ids = list(range(5, 25))
    changed = [(i + 1) % 50 + 5 for i in ids[:10]] + ids[10:]          # the first 10 tokens differ
    folder = build_tiny_policy(tmp_path / "p", tok, hidden=32, layers=2, local_window=4)
    a, b = _hidden(folder, ids), _hidden(folder, changed)
    # after the first (local) layer, position 19 has read positions 16-19 only; 12 reads 9-12
    assert torch.allclose(a[1][19], b[1][19]) and not torch.allclose(a[1][12], b[1][12])
    # the last layer is full: position 19 reads the whole prompt again
    assert not torch.allclose(a[2][19], b[2][19])


def test_without_a_window_every_layer_reads_the_whole_prompt(tmp_path):
    tok = tiny_tokenizer(["alpha beta gamma"], vocab_size=60)
    ids = list(range(5, 25))
    folder = build_tiny_policy(tmp_path / "p", tok, hidden=32, layers=2)
    assert not torch.allclose(_hidden(folder, ids)[1][19], _hidden(folder, [6] + ids[1:])[1][19])


def test_a_window_on_a_one_layer_policy_is_refused_not_ignored(tmp_path):
    tok = tiny_tokenizer(["alpha beta gamma"], vocab_size=60)
    with pytest.raises(ValueError, match="local_window=8 with layers=1 and global_layers=1: global_layers must be"):
        build_tiny_policy(tmp_path / "p", tok, hidden=32, layers=1, local_window=8)
    assert not (tmp_path / "p").exists()


def test_with_no_global_layer_every_layer_is_local(tmp_path):
    tok = tiny_tokenizer(["alpha beta gamma delta epsilon zeta eta theta"], vocab_size=60)
    ids = list(range(5, 25))
    changed = [(i + 1) % 50 + 5 for i in ids[:10]] + ids[10:]          # the first 10 tokens differ
    folder = build_tiny_policy(tmp_path / "p", tok, hidden=32, layers=2, local_window=4, global_layers=0)
    a, b = _hidden(folder, ids), _hidden(folder, changed)
    # two 4-token layers: position 19 reads positions 13-19 (16-19, each of which read 3 back), 15 reads 9-15
    assert torch.allclose(a[2][19], b[2][19]) and not torch.allclose(a[2][15], b[2][15])
    with pytest.raises(ValueError, match="global_layers must be 0 .. layers - 1"):
        build_tiny_policy(tmp_path / "q", tok, hidden=32, layers=2, local_window=4, global_layers=2)


def _table_folder(tmp_path, table):
    from safetensors.torch import save_file

    save_file({"model.embed_tokens.weight": table}, tmp_path / "model.safetensors")
    return tmp_path


def test_projected_embeddings_keep_the_tables_main_directions_with_fixed_signs(tmp_path):
    from training.tiny_policy import projected_embeddings

    # 4 tokens in 3 dims, mean (1, 0, 0); centred rows (±2, 0, 0) and (0, ±1, 0): the first principal
    # direction is x (variance 8 against 2), the second y, z carries nothing
    table = torch.tensor([[3.0, 0, 0], [-1, 0, 0], [1, 1, 0], [1, -1, 0]])
    out = projected_embeddings(_table_folder(tmp_path, table), hidden=2, std=1.0)
    raw = torch.tensor([[2.0, 0], [-2, 0], [0, 1], [0, -1]])          # coordinates, largest loading positive
    assert torch.allclose(out, raw / raw.std(), atol=1e-6)
    assert out.std().item() == pytest.approx(1.0)


def test_projected_embeddings_do_not_depend_on_the_svd_routines_signs(tmp_path, monkeypatch):
    from training.tiny_policy import projected_embeddings

    table = torch.randn(50, 6, generator=torch.Generator().manual_seed(2))
    folder = _table_folder(tmp_path, table)
    plain = projected_embeddings(folder, hidden=3)
    svd = torch.linalg.svd

    def flipped(a, **kw):                     # another LAPACK may return any direction negated
        u, s, vh = svd(a, **kw)
        signs = torch.tensor([-1.0, 1.0, -1.0, 1.0, -1.0, 1.0], dtype=vh.dtype)[:, None]
        return u * signs.T, s, vh * signs

    monkeypatch.setattr(torch.linalg, "svd", flipped)
    assert torch.allclose(projected_embeddings(folder, hidden=3), plain, atol=1e-6)


def test_projected_embeddings_refuse_a_folder_without_an_embedding_table(tmp_path):
    from safetensors.torch import save_file

    from training.tiny_policy import projected_embeddings

    save_file({"lm_head.weight": torch.zeros(4, 3)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="no embed_tokens.weight"):
        projected_embeddings(tmp_path, hidden=2)


def test_given_embeddings_start_the_policy_and_its_tied_output_head(tmp_path):
    from transformers import AutoModelForCausalLM

    tok = tiny_tokenizer(["alpha beta gamma"], vocab_size=60)
    table = torch.randn(len(tok), 32, generator=torch.Generator().manual_seed(1)) * 0.02
    folder = build_tiny_policy(tmp_path / "p", tok, hidden=32, layers=2, local_window=4, embeddings=table)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert torch.equal(model.get_input_embeddings().weight, table)
    assert torch.equal(model.get_output_embeddings().weight, table)
    with pytest.raises(ValueError, match=r"expected \(\d+, 16\)"):
        build_tiny_policy(tmp_path / "q", tok, hidden=16, layers=2, embeddings=table)
    assert not (tmp_path / "q").exists()
