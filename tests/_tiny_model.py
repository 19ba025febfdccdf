"""A tiny random Llama (2 layers, 64 wide) with the real SmolLM2 tokenizer, for engine and
log-prob tests: quick on CPU, its logits spread (init std 0.5) so greedy paths have no near-ties."""
from __future__ import annotations

import torch


def tiny_model(seed: int):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from orchestrator.embedded import smollm2_path

    tok = AutoTokenizer.from_pretrained(smollm2_path())
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         initializer_range=0.5)
    return LlamaForCausalLM(config).eval(), tok
