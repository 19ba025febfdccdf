"""Tiny random causal LMs for the CPU quickstart, the tests and the benches.

    tok = tiny_tokenizer(["some text the prompts use", ...], vocab_size=400)   # BPE + ChatML template
    path = build_tiny_policy("runs/x/policy", tok, hidden=64, layers=2)

A Llama-architecture model built from a config with random weights (seeded), saved as a
normal `from_pretrained` folder, so the same code paths (engines, trainer, checkpoints)
run on it as on a real model.  `tiny_tokenizer` trains a byte-level BPE on the given
texts in well under a second; pass a real tokenizer (e.g. SmolLM2's) instead to count
tokens the way a real orchestrator would.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

# ChatML, the format SmolLM2 and Qwen use; tool schemas go into the system message
# (orchestrator.chat_template.render_prompt does that for templates that ignore `tools`).
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
          "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
          "{% endif %}")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_tokenizer(texts: list[str], vocab_size: int = 400):
    """A byte-level BPE tokenizer trained on `texts`, with ChatML specials and template.

    EOS is `<|im_end|>` (what ends an assistant turn), pad is `<|endoftext|>`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # lazy: heavy (seconds to import)
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  bos_token=None, unk_token=None)
    tok.chat_template = CHATML
    return tok


def build_tiny_policy(out_dir: str | Path, tokenizer, *, hidden: int = 64, layers: int = 2, heads: int = 4,
                      intermediate: int | None = None, max_positions: int = 4096, seed: int = 0,
                      local_window: int | None = None, embeddings: torch.Tensor | None = None,
                      global_layers: int = 1) -> Path:
    """Save a randomly initialised Llama-style causal LM (+ `tokenizer`) to `out_dir`.

    `local_window`: every layer but the last `global_layers` attends only to the previous
    `local_window` tokens (sliding-window attention, as Mistral / Qwen2 / Gemma local layers; a
    Qwen2 config, which is Llama's with q/k/v biases), those last ones to the whole context
    (`global_layers=0`: every layer local, as Mistral 7B's sliding window in all layers).  A random policy's
    attention starts near uniform, so over the quickstart's ~660-token prompt the ~30 tokens that
    end it (the problem, the preference line) get ~30/660 of a full layer's attention and ~30/64
    of a 64-token local layer's (arithmetic on uniform weights, not a measurement).
    `embeddings`: the token table to start from instead of a random one (`projected_embeddings`),
    one row per token of `tokenizer`, `hidden` wide; an output head tied to it starts the same."""
    # lazy: heavy (seconds to import)
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if local_window and not 0 <= global_layers < layers:
        raise ValueError(f"local_window={local_window} with layers={layers} and global_layers={global_layers}: "
                         f"global_layers must be 0 .. layers - 1, so that at least one layer is local")
    out_dir = Path(out_dir)
    common = dict(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=heads,
                  intermediate_size=intermediate or 4 * hidden, max_position_embeddings=max_positions,
                  tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    if local_window:
        config = Qwen2Config(**common, use_sliding_window=True, sliding_window=local_window,
                             layer_types=["sliding_attention"] * (layers - global_layers) + ["full_attention"] * global_layers)
    else:
        config = LlamaConfig(**common)
    torch.manual_seed(seed)
    model = (Qwen2ForCausalLM if local_window else LlamaForCausalLM)(config)
    if embeddings is not None:
        if tuple(embeddings.shape) != (len(tokenizer), hidden):
            raise ValueError(f"embeddings of shape {tuple(embeddings.shape)}: expected ({len(tokenizer)}, {hidden}), "
                             "one row per token of the tokenizer, hidden wide")
        with torch.no_grad():
            model.get_input_embeddings().weight.copy_(embeddings)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def projected_embeddings(model_dir: str | Path, hidden: int, std: float = 0.02) -> torch.Tensor:
    """A pretrained model's input embedding table, projected onto its `hidden` principal directions
    and scaled to a random init's per-entry `std`: a tiny policy that starts knowing which words are
    alike (the tokenizer must be the pretrained model's).  Each direction's sign is fixed (its
    largest-magnitude loading positive), so the result does not depend on the SVD routine's signs."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    table = None
    for f in files:
        with safe_open(f, framework="pt") as st:
            # safe_open is no dict: keys() is its listing
            name = next((k for k in st.keys() if k.endswith("embed_tokens.weight")), None)  # noqa: SIM118
            if name:
                table = st.get_tensor(name).float()
                break
    if table is None:
        raise ValueError(f"{model_dir}: no embed_tokens.weight in its *.safetensors; pass a transformers model folder")
    centred = table - table.mean(0)
    _, _, vh = torch.linalg.svd(centred.double(), full_matrices=False)
    basis = vh[:hidden].T                                     # (d, hidden)
    basis = basis * torch.sign(basis.gather(0, basis.abs().argmax(0, keepdim=True)))
    out = (centred.double() @ basis).float()
    return out * (std / out.std())
